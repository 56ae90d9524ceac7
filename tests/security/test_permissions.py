"""Answers only from what the asker may read (issue 30), on real Weaviate and the embedded store, with
the Confluence and Slack fakes speaking their wire formats:

- Confluence read restrictions (a page's own, inherited by its children) and space permissions are
  recorded per document at refresh, and a restriction added at the source is in force after a
  permissions-only refresh that embeds nothing;
- the permission filter is applied inside the store's query: the top-k of someone who may not read a
  restricted page is full of what they may read, never the page;
- a restricted page is never retrieved, cited, kept in history or served from the approved-answer
  cache for someone who may not read it, in a channel (where every member must be allowed) or a DM;
  the same asker gets it in a DM when allowed, and is told so in the channel;
- an asker who cannot be mapped reads public documents only and is told so once; API callers and
  Telegram users are mapped by ``permissions.principals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.cli import SilentReply
from adapters.slack.directory import SlackDirectory
from bot.knowledge.refresh import Refresher
from bot.knowledge.scheduler import RefreshScheduler
from bot.knowledge.status import format_status, knowledge_status
from bot.runtime import Runtime, build_runtime
from bot.settings import SourceSettings
from bot.types import Answer, Inquiry, Outcome
from pipelines.components.facts import FactLookup
from pipelines.components.retrievers import retriever_for
from pipelines.filters import and_filters, readers_filter, space_filter
from pipelines.sources.confluence import ConfluenceSettings
from tests.conftest import make_settings
from tests.fakes.confluence_server import FakeConfluence
from tests.fakes.slack_server import FakeSlack
from tests.refresh_helpers import REDIS_URL, SERVICES_MISSING, WEAVIATE_URL, drop_prefix

pytestmark = pytest.mark.skipif(SERVICES_MISSING is not None, reason=SERVICES_MISSING or "")

TEAM = "T0PERM"
SEALS = "<p>The HL-K8 compressor seal must be replaced every 7,200 operating hours.</p>"
CLAIMS = ("<p>Warranty claims for the HL-K8 compressor are approved up to 4,800 euros by the service manager "
          "without further review.</p><h2>Claim limits</h2><table><tbody><tr><th>Model</th><th>Claim limit</th></tr>"
          "<tr><td>HL-K8</td><td>4,800 euros</td></tr></tbody></table>")
ESCALATION = "<p>HL-K8 warranty claims above 4,800 euros are escalated to the finance director Marta Ruiz.</p>"
SECRET_WORDS = ("4,800", "Marta Ruiz")
CLAIMS_QUESTION = "Up to which amount are HL-K8 warranty claims approved without further review?"
SEALS_QUESTION = "How often must the HL-K8 compressor seal be replaced?"

ALICE, BOB, CAROL, NOMAIL = "UALICE", "UBOB", "UCAROL", "UNOMAIL"


@dataclass
class World:
    kind: str
    runtime: Runtime
    refresher: Refresher
    confluence: FakeConfluence
    slack: FakeSlack
    pages: dict[str, Any]

    async def ask(self, user: str, question: str, *, channel: str = "CALL", private: bool = False,
                  thread: str | None = None, platform: str = "slack", tenant: str = TEAM) -> Answer:
        thread = thread or uuid.uuid4().hex[:8]
        inquiry = Inquiry(platform=platform, tenant=tenant, channel=channel,
                          thread_key=f"{platform}:{tenant}:{channel}:{thread}", user_id=user, text=question,
                          private=private)
        return await self.runtime.answerer.answer(inquiry, SilentReply())

    def doc(self, name: str) -> str:
        return f"confluence:wiki:page:{self.pages[name].id}"


def leaked(answer: Answer, world: World, *names: str) -> list[str]:
    """What of the restricted pages ``names`` reached the asker: cited, ranked (what the prompt is
    built from), or in the text."""
    ids = {world.doc(n) for n in names}
    found = [c.doc_id for c in answer.citations if c.doc_id in ids]
    found += [r["doc_id"] for r in answer.trace.ranked if r["doc_id"] in ids]
    found += [w for w in SECRET_WORDS if w in answer.text]
    return found


@contextlib.asynccontextmanager
async def world_on(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    tag = uuid.uuid4().hex[:10]
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "conf-token")
    with FakeConfluence(cloud=True, user="ops@example.com").run_in_thread() as confluence:
        async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
            pages = {"seals": confluence.add_page("OPS", "HL-K8 seal replacement", SEALS),
                     "claims": confluence.add_page("OPS", "HL-K8 warranty claims", CLAIMS,
                                                   read_users=["alice@example.com"], read_groups=["hr"])}
            pages["escalation"] = confluence.add_page("OPS", "HL-K8 claim escalation", ESCALATION,
                                                      parent=pages["claims"].id)
            confluence.groups = {"hr": ["carol@example.com"], "confluence-users": []}
            slack.add_user(ALICE, "alice@example.com")
            slack.add_user(BOB, "Bob@Example.com")
            slack.add_user(CAROL, "carol@example.com")
            slack.add_user(NOMAIL)
            slack.usergroups = {"hr": [CAROL]}
            slack.add_channel("CALL", [ALICE, BOB, "UKBBOT"], private=True)
            slack.add_channel("CHR", [ALICE, CAROL, "UKBBOT"], private=True)

            env = {"REDIS_URL": REDIS_URL or ""}
            if kind == "weaviate":
                env["WEAVIATE_URL"] = WEAVIATE_URL or ""
            settings = make_settings(tmp_path / "data", **env)
            settings.store.collection = f"Perm{tag}"
            settings.redis_prefix = f"kbbot-test-{tag}:"
            settings.refresh.allow_hosts = ["127.0.0.1"]
            settings.refresh.fetch_timeout_s = 5
            settings.permissions.cache_s = 0  # members read afresh: a join counts at once here
            settings.permissions.principals = {"api:helpdesk": ["group:hr"], "telegram:42": ["user:alice@example.com"]}
            settings.permissions.slack_groups = {"hr": ["group:hr"]}
            # Everyone who reaches this kbbot has a Confluence account: the operator says so (issue 39).
            settings.sources = [SourceSettings(name="wiki", interval="1h", confluence=ConfluenceSettings(
                url=confluence.base_url, spaces=["OPS"], token_env="KBBOT_TEST_CONFLUENCE_TOKEN",
                user="ops@example.com", everyone_readers=["public"]))]
            runtime = build_runtime(settings)
            await runtime.start()
            client = AsyncWebClient(token=slack.token, base_url=slack.base_url)
            runtime.audiences.register("slack", SlackDirectory(client, cache_s=0,
                                                               groups=settings.permissions.slack_groups))
            refresher = Refresher(settings, runtime.store, runtime.indexer, redis=runtime.redis)
            try:
                record = await refresher.run("wiki")
                assert record is not None and record.ok, record
                yield World(kind, runtime, refresher, confluence, slack, pages)
            finally:
                if kind == "weaviate":
                    runtime.store.drop()
                await runtime.close()
                await drop_prefix(REDIS_URL or "", settings.redis_prefix)


@pytest.fixture(params=["weaviate", "memory"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    async with world_on(request.param, tmp_path, monkeypatch) as w:
        yield w


async def test_confluence_restrictions_inherited_and_recorded_on_every_chunk(world):
    records = world.runtime.store.records()
    assert records[world.doc("seals")].readers == ["public"]
    # The child page has no restriction of its own: its parent's applies.
    assert records[world.doc("claims")].readers == ["group:hr", "user:alice@example.com"]
    assert records[world.doc("escalation")].readers == ["group:hr", "user:alice@example.com"]
    assert world.confluence.requests_to("/restriction/byOperation/read")
    chunks = world.runtime.store.document_store.filter_documents(
        {"field": "meta.doc_id", "operator": "==", "value": world.doc("claims")})
    assert chunks and all(sorted(c.meta["readers"]) == ["group:hr", "user:alice@example.com"] for c in chunks)


async def test_the_filter_is_inside_the_query_so_top_k_stays_full(world):
    retriever = retriever_for(world.runtime.store, mode="bm25", candidates=2)
    spaces = space_filter(["default"])
    bob = and_filters(spaces, readers_filter({"public", "user:bob@example.com"}))
    alice = and_filters(spaces, readers_filter({"public", "user:alice@example.com"}))
    found_bob = retriever.run(query="HL-K8 warranty claims euros", filters=bob, top_k=2)["documents"]
    found_alice = retriever.run(query="HL-K8 warranty claims euros", filters=alice, top_k=2)["documents"]
    assert {d.meta["doc_id"] for d in found_alice} <= {world.doc("claims"), world.doc("escalation")}
    assert found_alice, "alice may read the claims pages"
    # The two best chunks overall are restricted: had they been removed after retrieval, Bob's list
    # would be empty; filtered in the query, it holds what Bob may read.
    assert [d.meta["doc_id"] for d in found_bob] == [world.doc("seals")]


async def test_facts_come_only_from_documents_the_audience_may_read(world):
    facts = FactLookup(world.runtime.store)
    spaces = space_filter(["default"])
    bob = facts.run("HL-K8 claim limit", ["default"], filters=and_filters(spaces, readers_filter({"public"})))
    alice = facts.run("HL-K8 claim limit", ["default"],
                      filters=and_filters(spaces, readers_filter({"public", "user:alice@example.com"})))
    assert any("4,800" in line for line in alice["facts"]), alice
    assert not any("4,800" in line for line in bob["facts"]), bob


async def test_restricted_page_never_reaches_channel_or_unauthorised_dm(world):
    bob_dm = await world.ask(BOB, CLAIMS_QUESTION, channel="DBOB", private=True, thread="bobdm")
    assert leaked(bob_dm, world, "claims", "escalation") == []
    assert bob_dm.outcome is Outcome.NOT_FOUND
    assert "direct message" not in bob_dm.text

    # Alice may read it, but Bob is in the channel: nothing of it there, and an offer of a DM.
    in_channel = await world.ask(ALICE, CLAIMS_QUESTION, channel="CALL", thread="t1")
    assert leaked(in_channel, world, "claims", "escalation") == []
    assert in_channel.outcome is Outcome.NOT_FOUND
    assert "direct message" in in_channel.text

    # Bob in the same channel gets no offer: he could not read it in private either.
    bob_channel = await world.ask(BOB, CLAIMS_QUESTION, channel="CALL", thread="t2")
    assert leaked(bob_channel, world, "claims", "escalation") == [] and "direct message" not in bob_channel.text

    # In a DM Alice gets it, cited.
    alice_dm = await world.ask(ALICE, CLAIMS_QUESTION, channel="DALICE", private=True, thread="alicedm")
    assert alice_dm.outcome is Outcome.ANSWERED, alice_dm.text
    assert world.doc("claims") in {c.doc_id for c in alice_dm.citations}

    # The turn record (admin page, reports) names the restricted passage but keeps none of its text.
    kept = [r for r in alice_dm.trace.ranked if r["doc_id"] == world.doc("claims")]
    assert kept and all(r["excerpt"] == "" and r["readers"] for r in kept)

    # A channel whose every member may read it (Alice by name, Carol through the hr group).
    hr_channel = await world.ask(CAROL, CLAIMS_QUESTION, channel="CHR", thread="t3")
    assert hr_channel.outcome is Outcome.ANSWERED and world.doc("claims") in {c.doc_id for c in hr_channel.citations}

    # History keeps each audience's own: Bob's channel thread and DM hold nothing of the page.
    for thread in ("slack:T0PERM:CALL:t1", "slack:T0PERM:CALL:t2", "slack:T0PERM:DBOB:bobdm"):
        text = " ".join(m.text or "" for m in await world.runtime.history.load(thread))
        assert not any(w in text for w in SECRET_WORDS), (thread, text)


class Posted:
    """A chat platform's delivery layer as the gap follow-ups use it: what would be posted, and where."""

    name = "slack"

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, Any], Answer]] = []

    async def post_answer(self, target: dict[str, Any], answer: Answer) -> None:
        self.posts.append((target, answer))


BOLTS = "<p>The HL-K8 claim plate bolts are tightened to 35 newton metres.</p>"
BOLTS_QUESTION = "What torque are the HL-K8 claim plate bolts tightened to?"


async def test_a_gap_is_answered_again_only_for_readers_of_the_restricted_page_that_closed_it(world):
    """A question nobody could answer, asked in two channels; the page that answers it arrives restricted
    to the hr readers. The refresh answers the gap again where every member may read the page (the hr
    channel), and nowhere else: the general channel's thread gets no follow-up and nothing of the page."""
    follow_ups = world.runtime.gap_follow_ups()
    assert follow_ups is not None, "turn records are on by default"
    follow_ups.serve(posted := Posted())
    world.refresher.after_change.append(follow_ups.after_refresh)
    gaps = {}
    for user, channel in ((BOB, "CALL"), (CAROL, "CHR")):
        inquiry = Inquiry(platform="slack", tenant=TEAM, channel=channel, thread_key=f"slack:{TEAM}:{channel}:g1",
                          user_id=user, text=BOLTS_QUESTION, reply_to={"channel": channel, "thread_ts": "g1"})
        gaps[channel] = await world.runtime.answerer.answer(inquiry, SilentReply())
        assert gaps[channel].outcome is Outcome.NOT_FOUND, (channel, gaps[channel].text)

    bolts = world.confluence.add_page("OPS", "HL-K8 claim plate bolts", BOLTS, read_users=["alice@example.com"],
                                      read_groups=["hr"])
    record = await world.refresher.run("wiki")
    assert record is not None and record.ok, record

    assert [target["channel"] for target, _ in posted.posts] == ["CHR"], "the hr channel only"
    [(_, answer)] = posted.posts
    assert f"confluence:wiki:page:{bolts.id}" in {c.doc_id for c in answer.citations} and "35" in answer.text
    records = {r.channel: r for r in await world.runtime.turns.log.window(0, time.time() + 60)
               if r.question == BOLTS_QUESTION and r.turn_id in {a.trace.turn_id for a in gaps.values()}}
    assert records["CHR"].follow_up is not None and records["CALL"].follow_up is None
    history = " ".join(m.text or "" for m in await world.runtime.history.load(f"slack:{TEAM}:CALL:g1"))
    assert "35 newton" not in history


async def test_history_written_for_one_audience_is_not_shown_to_another(world):
    # Alice's answer in the hr channel; then Bob joins the channel and asks a follow-up in that thread.
    first = await world.ask(ALICE, CLAIMS_QUESTION, channel="CHR", thread="h1")
    assert first.outcome is Outcome.ANSWERED
    world.slack.channel_members["CHR"].append(BOB)
    follow = await world.ask(BOB, "And who handles the claims above that?", channel="CHR", thread="h1")
    assert follow.trace.history_turns == 0  # the earlier turn was written for other readers
    assert leaked(follow, world, "claims", "escalation") == []


async def test_an_approved_answer_is_served_only_to_the_audience_it_was_approved_for(world):
    cache = world.runtime._approved
    alice = await world.ask(ALICE, CLAIMS_QUESTION, channel="DALICE", private=True)
    assert alice.approvable, alice.outcome
    assert await cache.approve(alice.trace.turn_id, "URVW", "Reviewer", tenant=f"slack:{TEAM}") is not None
    again = await world.ask(ALICE, CLAIMS_QUESTION, channel="DALICE", private=True)
    assert again.outcome is Outcome.CACHED  # the same audience: served
    bob = await world.ask(BOB, CLAIMS_QUESTION, channel="DBOB", private=True)
    assert bob.outcome is not Outcome.CACHED and leaked(bob, world, "claims", "escalation") == []
    channel = await world.ask(ALICE, CLAIMS_QUESTION, channel="CALL")
    assert channel.outcome is not Outcome.CACHED and leaked(channel, world, "claims", "escalation") == []


async def test_a_restriction_added_at_the_source_is_in_force_after_a_permissions_refresh(world):
    before = await world.ask(BOB, SEALS_QUESTION, channel="CALL")
    assert world.doc("seals") in {c.doc_id for c in before.citations}
    approved = await world.ask(BOB, SEALS_QUESTION, channel="DBOB", private=True)
    assert await world.runtime._approved.approve(approved.trace.turn_id, "URVW", "Reviewer",
                                                 tenant=f"slack:{TEAM}") is not None
    assert (await world.ask(BOB, SEALS_QUESTION, channel="DBOB", private=True)).outcome is Outcome.CACHED
    version = world.runtime.store.knowledge_version
    embedded = world.runtime.document_embedder.embedded_texts
    world.confluence.restrict(world.pages["seals"], users=["alice@example.com"])
    sent = len(world.confluence.log)

    record = await world.refresher.run("wiki", permissions_only=True)
    assert record is not None and record.ok, record
    assert world.runtime.document_embedder.embedded_texts == embedded  # nothing embedded again
    assert not [p for p, *_ in world.confluence.log[sent:] if "body.storage" in p]  # no body read
    assert world.runtime.store.knowledge_version == version + 1  # a change of the knowledge for caches
    assert world.runtime.store.record(world.doc("seals")).readers == ["user:alice@example.com"]

    after = await world.ask(BOB, SEALS_QUESTION, channel="CALL")
    assert world.doc("seals") not in {c.doc_id for c in after.citations}
    assert world.doc("seals") not in {r["doc_id"] for r in after.trace.ranked}
    alice = await world.ask(ALICE, SEALS_QUESTION, channel="DALICE", private=True)
    assert world.doc("seals") in {c.doc_id for c in alice.citations}
    # Bob's approved answer cites the page as it was, and no version moved: it outlives the refresh, but
    # it is not served to him now that he may not read what it cites.
    again = await world.ask(BOB, SEALS_QUESTION, channel="DBOB", private=True)
    assert again.outcome is not Outcome.CACHED and world.doc("seals") not in {c.doc_id for c in again.citations}

    # A full refresh changing nothing keeps the readers and embeds nothing either.
    record = await world.refresher.run("wiki")
    assert record is not None and record.ok and world.runtime.document_embedder.embedded_texts == embedded
    assert world.runtime.store.record(world.doc("seals")).readers == ["user:alice@example.com"]


async def test_permissions_are_read_again_on_their_own_schedule_between_refreshes(world):
    world.refresher.settings.sources[0].permissions_interval = "2s"  # the content refresh stays hourly
    embedded = world.runtime.document_embedder.embedded_texts
    world.confluence.restrict(world.pages["seals"], users=["alice@example.com"])
    sent = len(world.confluence.log)
    scheduler = RefreshScheduler(world.refresher)
    await scheduler.start()
    try:
        assert set(scheduler.next_runs()) == {"wiki", "wiki/permissions"}
        deadline = time.monotonic() + 30
        # Until the run has ended and been recorded, not only until the readers changed (that is
        # midway through the run: stopping the scheduler there left no run recorded).
        while world.runtime.store.record(world.doc("seals")).readers != ["user:alice@example.com"] \
                or not scheduler.runs:
            assert time.monotonic() < deadline, "the scheduled permissions refresh did not run"
            await asyncio.sleep(0.2)
    finally:
        await scheduler.stop()
    assert scheduler.runs and {r.source for r in scheduler.runs} == {"wiki/permissions"}, scheduler.runs
    assert world.runtime.document_embedder.embedded_texts == embedded
    assert not [p for p, *_ in world.confluence.log[sent:] if "body.storage" in p]  # no page body read
    after = await world.ask(BOB, SEALS_QUESTION, channel="CALL")
    assert world.doc("seals") not in {c.doc_id for c in after.citations}
    # Its own record: the source's last (content) run and its next one are unmoved.
    assert (await world.refresher.last_run("wiki")).trigger != "schedule"
    status = format_status(await knowledge_status(world.refresher.settings, store=world.runtime.store,
                                                  runs=world.refresher.runs, redis=world.runtime.redis))
    assert "permissions alone read" in status and "(schedule)" in status, status


async def test_an_unmapped_asker_reads_public_documents_only_and_is_told_once(world):
    first = await world.ask(NOMAIL, CLAIMS_QUESTION, channel="DNOMAIL", private=True)
    assert leaked(first, world, "claims", "escalation") == [] and "public documents only" in first.text
    second = await world.ask(NOMAIL, SEALS_QUESTION, channel="DNOMAIL", private=True)
    assert "public documents only" not in second.text
    assert world.doc("seals") in {c.doc_id for c in second.citations}


async def test_api_callers_and_telegram_users_are_mapped_by_the_settings(world):
    helpdesk = await world.ask("someone", CLAIMS_QUESTION, platform="api", tenant="helpdesk", channel="helpdesk",
                               private=True)
    assert world.doc("claims") in {c.doc_id for c in helpdesk.citations}
    other = await world.ask("someone", CLAIMS_QUESTION, platform="api", tenant="other", channel="other",
                            private=True)
    assert leaked(other, world, "claims", "escalation") == []
    telegram = await world.ask("42", CLAIMS_QUESTION, platform="telegram", tenant="7", channel="42", private=True)
    assert world.doc("claims") in {c.doc_id for c in telegram.citations}
    # A Telegram group: members cannot be listed, so only what the whole group may read.
    group = await world.ask("42", CLAIMS_QUESTION, platform="telegram", tenant="7", channel="-100", private=False)
    assert leaked(group, world, "claims", "escalation") == []


def test_leaving_out_principals_no_document_names_changes_nothing_that_matches():
    import random

    from haystack import Document

    from bot.permissions import Audience
    from pipelines.filters import compile_filter

    rng = random.Random(7)
    pool = [f"user:u{i}@example.com" for i in range(60)] + [f"group:g{i}" for i in range(20)]
    docs = [Document(content="", meta={"readers": ["public"] if rng.random() < 0.3 else rng.sample(pool[:40], 2)})
            for _ in range(300)]
    known = frozenset(p for d in docs for p in d.meta["readers"])
    members = tuple(frozenset(rng.sample(pool, 5)) for _ in range(3))
    for audience in (Audience(private=True, everyone=frozenset({"public", *members[0]}), asker=members[0]),
                     Audience(private=False, everyone=frozenset({"public", "channel:c1"}), each=members),
                     Audience(private=False, everyone=frozenset({"public", "channel:c1"}),
                              each=(members[0], frozenset()))):
        full, narrowed = compile_filter(audience.filter()), compile_filter(audience.filter(known))
        assert [full(d) for d in docs] == [narrowed(d) for d in docs]
        assert any(full(d) for d in docs) and not all(full(d) for d in docs)


def test_space_permissions_and_page_restrictions_are_intersected_with_groups_expanded():
    from pipelines.sources.confluence.client import ConfluenceClient
    from pipelines.sources.confluence.permissions import ConfluencePermissions
    from pipelines.sources.confluence.source import Entry

    with FakeConfluence(cloud=True, user="ops@example.com").run_in_thread() as server:
        server.groups = {"staff": ["alice@example.com", "bob@example.com", "carol@example.com"],
                         "hr": ["carol@example.com"]}
        server.set_space_readers("HR", groups=["staff"])
        page = server.add_page("HR", "Pay", "<p>pay</p>", read_users=["alice@example.com", "dave@example.com"],
                               read_groups=["hr"])
        plain = server.add_page("HR", "Holidays", "<p>holidays</p>")
        server.set_space_readers("OPEN", anonymous=True)
        open_page = server.add_page("OPEN", "Hello", "<p>hi</p>")
        server.add_page("ALL", "Everyone", "<p>all</p>")  # no permissions set: confluence-users may read
        client = ConfluenceClient(server.base_url, "conf-token", user="ops@example.com", allow_hosts=["127.0.0.1"])
        try:
            perms = ConfluencePermissions(client)

            def entry(p: Any) -> Entry:
                return Entry(f"x:{p.id}", "page", p.id, 1, p.title, "", space=p.space, page_id=p.id)

            # Space: staff. Page: alice, dave, hr. Dave is not staff; Bob is not named by the page.
            assert perms.readers(entry(page)) == ["user:alice@example.com", "user:carol@example.com"]
            assert perms.readers(entry(plain)) == ["group:staff"]
            assert perms.readers(entry(open_page)) == ["public"]  # anonymous access: public to its space
            everyone = next(p for p in server.pages.values() if p.space == "ALL")
            # Every Confluence account, not everyone who reaches kbbot (issue 39).
            assert perms.readers(entry(everyone)) == ["confluence:everyone"]
        finally:
            client.close()


async def test_url_and_folder_sources_take_their_readers_from_the_settings_acl(world, tmp_path):
    from tests.refresh_helpers import Site, folder_source, url_source

    docs = tmp_path / "handbook"
    (docs / "hr").mkdir(parents=True)
    (docs / "hr" / "pay.md").write_text("# Pay\nTechnicians are paid on scale T4.\n", encoding="utf-8")
    (docs / "hrm.md").write_text("# HRM\nThe HRM module logs hours.\n", encoding="utf-8")
    async with Site() as site:
        site.set("/public.html", "<html><body><h1>Intro</h1><p>Welcome to the HL-K8 portal.</p></body></html>")
        site.set("/private/contract.html", "<html><body><h1>Contract</h1><p>ACME pays 3% less.</p></body></html>")
        world.runtime.settings.sources += [
            url_source("site", [site.url("/public.html"), site.url("/private/contract.html")],
                       respect_robots=False, acl={site.url("/private/"): ["group:sales"]}),
            folder_source("handbook", docs, acl={"hr": ["group:HR", "carol@example.com"]})]
        for name in ("site", "handbook"):
            record = await world.refresher.run(name)
            assert record is not None and record.ok, record
    readers = {r.source.rsplit("/", 1)[-1]: r.readers for r in world.runtime.store.records().values()
               if r.root and not r.root.startswith("confluence:")}
    assert readers == {"public.html": ["public"], "contract.html": ["group:sales"],
                       "pay.md": ["group:hr", "user:carol@example.com"], "hrm.md": ["public"]}


def test_approved_answers_are_shared_by_audiences_that_read_the_same_documents():
    """The approved-answer cache is keyed by what an audience may read (``Audience.projected``), not by
    who it is: with nothing restricted every channel and every asker share approvals, as before
    permissions; a restriction naming a channel or a person keys that audience apart."""
    from bot.permissions import Audience

    channel_a = Audience(private=False, everyone=frozenset({"public", "channel:ca"}),
                         each=(frozenset({"user:ann@example.com"}), frozenset()))
    channel_b = Audience(private=False, everyone=frozenset({"public", "channel:cb"}),
                         each=(frozenset({"user:bob@example.com"}),))
    ann_alone = Audience(private=True, everyone=frozenset({"public", "user:ann@example.com"}),
                         asker=frozenset({"user:ann@example.com"}))
    nothing_named: frozenset[str] = frozenset()
    keys = {a.projected(nothing_named).key for a in (channel_a, channel_b, ann_alone, Audience.public())}
    assert len(keys) == 1, "nothing restricted: one key for all"
    ann_named = frozenset({"user:ann@example.com"})
    assert ann_alone.projected(ann_named).key != channel_b.projected(ann_named).key
    assert channel_a.projected(ann_named).key == Audience.public().projected(ann_named).key, \
        "a channel where someone reads nothing named reads what the public does"
    assert channel_a.projected(frozenset({"channel:ca"})).key != channel_b.projected(frozenset({"channel:ca"})).key


async def test_a_channels_members_are_looked_up_only_when_some_document_names_a_person_or_group():
    """Where no document names a user or a group, the members of a channel could read only what the
    channel reads: they are not listed (in a channel of hundreds, as many users.info calls before the
    first answer), and the audience reads exactly what it would have read with them."""
    from bot.permissions import Audiences

    class Directory:
        def __init__(self) -> None:
            self.listed = 0

        async def principals(self, tenant: str, user: str) -> frozenset[str] | None:
            return frozenset({f"user:{user.lower()}@example.com"})

        async def members(self, tenant: str, channel: str) -> list[str] | None:
            self.listed += 1
            return ["UANN", "UBOB"]

    directory = Directory()
    audiences = Audiences({"slack": directory})
    inquiry = Inquiry("slack", "T1", "C1", "slack:T1:C1:1", "UANN", "q")
    unrestricted = frozenset({"public", "channel:c9"})
    skipped = await audiences.of(inquiry, unrestricted)
    assert directory.listed == 0
    listed = await audiences.of(inquiry)
    assert directory.listed == 1 and len(listed.each) == 2
    assert skipped.filter(unrestricted) == listed.filter(unrestricted)
    assert skipped.projected(unrestricted).key == listed.projected(unrestricted).key
    named = await audiences.of(inquiry, unrestricted | {"user:uann@example.com"})
    assert directory.listed == 2 and named.each == listed.each


async def test_a_big_channels_members_are_read_from_users_list_not_one_by_one():
    """A channel of 250 with a cold cache: three users.list pages (Tier 2) instead of 250 users.info
    calls (Tier 4: two and a half minutes of them), members Slack's list did not hold looked up one by
    one; the principals come from what the pages brought."""
    async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
        members = [f"UMEMBER{i:03d}" for i in range(250)]
        for user in members[:240]:  # the last 10 are not in the fake's directory: users.info describes them
            slack.add_user(user, f"{user.lower()}@example.com")
        for i in range(300):  # the rest of the workspace
            slack.add_user(f"UOTHER{i:03d}", f"other{i}@example.com")
        slack.add_channel("CBIG", [*members, "UKBBOT"], private=True)
        slack.add_channel("CSMALL", [f"UOTHER{i:03d}" for i in range(5)], private=True)
        directory = SlackDirectory(AsyncWebClient(token=slack.token, base_url=slack.base_url), cache_s=300)

        assert await directory.members(TEAM, "CBIG") == members
        assert len(slack.calls_to("users.list")) == 3  # 541 users, 200 a page
        assert sorted(c.args["user"] for c in slack.calls_to("users.info")) == members[240:]
        assert await directory.principals(TEAM, members[0]) == {f"user:{members[0].lower()}@example.com"}
        assert len(slack.calls_to("users.info")) == 10, "the principals came from the pages read"

        # A channel whose few members are known already costs nothing more.
        assert await directory.members(TEAM, "CSMALL") == slack.channel_members["CSMALL"]
        assert len(slack.calls_to("users.list")) == 3 and len(slack.calls_to("users.info")) == 10


async def test_users_list_is_read_no_longer_than_looking_members_up_would_take_and_falls_back_when_refused(caplog):
    async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
        for i in range(2000):  # a big workspace whose directory does not hold the channel's 25 (guests)
            slack.add_user(f"UOTHER{i:04d}", f"other{i}@example.com")
        guests = [f"UGUEST{i:02d}" for i in range(25)]
        slack.add_channel("CGUESTS", guests, private=True)
        slack.add_channel("CLIMITED", [f"UOTHER{i:04d}" for i in range(30)], private=True)
        client = AsyncWebClient(token=slack.token, base_url=slack.base_url)

        directory = SlackDirectory(client, cache_s=300)
        assert await directory.members(TEAM, "CGUESTS") == guests
        # 25 users.info calls are worth five pages (Tier 2 is a fifth of Tier 4): paging stops there.
        assert len(slack.calls_to("users.list")) == 5 and len(slack.calls_to("users.info")) == 25

        slack.rate_limit("users.list", times=1, retry_after=1)
        refused = SlackDirectory(client, cache_s=300)
        assert await refused.members(TEAM, "CLIMITED") == slack.channel_members["CLIMITED"]
        assert await refused.principals(TEAM, "UOTHER0007") == {"user:other7@example.com"}
        assert "Slack refused users.list (ratelimited): users are looked up one by one" in caplog.text


async def test_a_public_shared_or_guest_channel_reads_what_the_channel_may_not_what_its_members_may(world):
    """Issue 39, item 2. Alice and Carol may both read the claims page (by name, and through the hr
    group), and are the only people in each channel below: only the private one, shared with no other
    organisation and without guests, is answered from it. Anyone in the workspace may open a public
    channel and read its history; another organisation reads a Slack Connect channel; a guest (here put
    in the hr Slack group) is no reader of what the source restricts. Carol is offered a direct message."""
    slack = world.slack
    slack.add_user("UGUEST", "dan@partner.example", guest="multi")
    slack.usergroups["hr"].append("UGUEST")
    both = [ALICE, CAROL, "UKBBOT"]
    slack.add_channel("CPUBLIC", both)
    slack.add_channel("CCONNECT", both, private=True, ext_shared=True)
    slack.add_channel("CGUESTS", [*both, "UGUEST"], private=True)
    slack.add_channel("CDARK", both, private=True)
    slack.add_channel("CPRIV", both, private=True)
    for channel in ("CPUBLIC", "CCONNECT", "CGUESTS", "CDARK"):
        if channel == "CDARK":  # a channel Slack will not describe: what the channel may read
            slack.fail("conversations.info", error="internal_error")
        answer = await world.ask(CAROL, CLAIMS_QUESTION, channel=channel)
        assert leaked(answer, world, "claims", "escalation") == [], channel
        assert answer.outcome is Outcome.NOT_FOUND and "direct message" in answer.text, (channel, answer.text)
    private = await world.ask(CAROL, CLAIMS_QUESTION, channel="CPRIV")
    assert private.outcome is Outcome.ANSWERED and world.doc("claims") in {c.doc_id for c in private.citations}


async def test_a_conversation_does_not_bring_back_a_page_its_asker_may_no_longer_read(world):
    """Issue 39, item 3. Carol read the claims page through the hr group in a conversation; the page is
    then restricted to Alice and the permissions refreshed. Carol's next question in that conversation
    is answered without the earlier answer (it cites the page), and a new conversation neither has it."""
    first = await world.ask(CAROL, CLAIMS_QUESTION, channel="DCAROL", private=True, thread="c1")
    assert first.outcome is Outcome.ANSWERED and world.doc("claims") in {c.doc_id for c in first.citations}
    seals = await world.ask(BOB, SEALS_QUESTION, channel="DBOB", private=True, thread="b1")
    assert seals.outcome is Outcome.ANSWERED and world.doc("claims") not in {c.doc_id for c in seals.citations}

    world.confluence.restrict(world.pages["claims"], users=["alice@example.com"])
    record = await world.refresher.run("wiki", permissions_only=True)
    assert record is not None and record.ok, record

    follow = await world.ask(CAROL, "And which amount is that limit exactly?", channel="DCAROL", private=True,
                             thread="c1")
    assert follow.trace.history_turns == 0, "the earlier answer cites a page Carol may no longer read"
    assert leaked(follow, world, "claims", "escalation") == []
    fresh = await world.ask(CAROL, CLAIMS_QUESTION, channel="DCAROL", private=True)
    assert leaked(fresh, world, "claims", "escalation") == []
    # A conversation whose answers cite only what its asker may still read goes on as before.
    more = await world.ask(BOB, "And how long does that take?", channel="DBOB", private=True, thread="b1")
    assert more.trace.history_turns == 1
