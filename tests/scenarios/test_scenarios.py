"""What a user sees, written once and run on every chat platform's fake (``platforms.DRIVERS``): a question
answered where it was asked, streamed, with sources and feedback buttons; a not-found question whose
expert's reply is offered to reviewers; a take-over after a replica died; rate limits spent; an audience's
permissions; a follow-up after a refresh. Each runs as ``kbbot serve`` wires it (``platforms.serving``),
on real Haystack pipelines, and, where it says so, Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from adapters.platforms import Settings
from bot.types import Outcome
from tests.fakes.anthropic_server import Script
from tests.model_router import steps
from tests.refresh_helpers import folder_source
from tests.replies import Stuck
from tests.scenarios.platforms import Driver, serving
from tests.security.loop_world import folder_runtime
from tests.test_refresh import FAULT_V1, GREASE, VIBRATION, WARRANTY

QUESTION = "How often should the bearings be greased?"
GAP = "What is the part number of the HL-M200 shaft seal kit?"
SEAL = ("# HL-M200 shaft seal kit\n\nThe shaft seal kit of the HL-M200 motor has the part number SK-2040. "
        "Replace the shaft seal every 16,000 operating hours.\n")
DOCS = {"fault.md": FAULT_V1, "warranty.md": WARRANTY, "grease.txt": GREASE, "vibration.md": VIBRATION}
COVERS = "📚 The knowledge base now covers a question asked here on"


def knowledge(tmp_path: Path, files: dict[str, str] = DOCS, configure: Callable[[Settings, Path], None] | None = None):
    """A started runtime (extractive answers, embedded store, state in memory) on a folder source ``docs``
    holding ``files``, refreshed once; "Add to the knowledge base" writes there too."""

    def configured(settings: Settings, docs: Path) -> None:
        settings.sources = [folder_source("docs", docs)]
        settings.insights.capture_source = "docs"
        if configure is not None:
            configure(settings, docs)

    return folder_runtime("memory", tmp_path, files, configured)


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


# --- 1. a question answered where it was asked -----------------------------------------------------------
async def test_a_question_is_answered_where_it_was_asked_streamed_with_sources_and_feedback(claude, platform: Driver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=60)  # about 4 s of streaming
    alice, bob = platform.user_id("alice"), platform.user_id("bob")
    async with serving(runtime, platform) as bot:
        asked = await bot.ask(QUESTION, user=alice)
        [turn] = bot.turns
        answer = turn.answer
        assert answer is not None and answer.outcome is Outcome.ANSWERED and turn.inquiry.text == QUESTION

        [shown] = bot.answers(asked)
        assert shown.text.startswith(platform.shows(answer.text)), "the whole answer, in one message"
        assert platform.states(asked) >= 3, "it grew on screen before its final state"
        assert answer.citations
        for citation in answer.citations:
            assert f"[{citation.index}] {citation.title}" in shown.sources
        turn_id = answer.trace.turn_id
        assert shown.feedback == [("up", turn_id), ("down", turn_id)]

        await bot.click_feedback(shown, "down", user=bob)
    assert [(f.turn_id, f.rating, f.user_id, f.platform, f.message_id) for f in bot.feedback.items] == \
        [(turn_id, "down", bob, platform.name, shown.id)]


# --- 2. a not-found question; an expert's reply offered to reviewers --------------------------------------
async def test_an_experts_reply_to_a_not_found_question_is_offered_to_reviewers_and_served_once_approved(
        tmp_path, platform: Driver):
    alice, bob, carol, rita = (platform.user_id(n) for n in ("alice", "bob", "carol", "rita"))
    reply = "It is SK-2040; order it from the spare parts desk and replace it every 16,000 hours."
    async with knowledge(tmp_path) as (runtime, _), serving(runtime, platform, reviewers=[rita]) as bot:
        asked = await bot.ask(GAP, user=alice, place=platform.shared)
        assert [t.answer.outcome for t in bot.turns] == [Outcome.NOT_FOUND]
        assert len(bot.answers(asked)) == 1, "kbbot says it does not know"

        await bot.reply(asked, reply, user=bob)
        assert len(bot.turns) == 1, "an expert's reply is kept, not answered"
        [note] = platform.notes(rita)
        assert "SK-2040" in note.text and GAP in note.text and set(note.actions) == {"approve", "capture"}

        assert (await bot.click_note(note, "approve", user=bob)).startswith("Only reviewers")
        assert (await bot.click_note(note, "approve", user=rita)).startswith("Saved:")
        await bot.start_over(platform.shared, user=carol)
        again = await bot.ask(GAP, user=carol, place=platform.shared)
        served = bot.turns[-1].answer
        assert served.outcome is Outcome.CACHED and "SK-2040" in served.text
        assert "SK-2040" in bot.answers(again)[-1].text


# --- 3. a take-over after a replica dies ---------------------------------------------------------------
LEASE = 3.0  # a real turn on a loaded machine holds its event loop for a while
PARTIAL = "Grease the bearings every 2,000 operating hours with the lithium grease named in the manual. " * 4


async def test_the_question_of_a_replica_that_died_mid_answer_is_answered_once_by_another(kb_runtime,
                                                                                         platform: Driver):
    stuck = Stuck(PARTIAL)
    alice = platform.user_id("alice")
    async with serving(kb_runtime, platform, answerer=stuck, replica="A", claim_lease_s=LEASE) as a:
        asked = await a.ask(QUESTION, user=alice, place=platform.shared, settle=False)
        await until(lambda: a.answers(asked))
        [orphan] = a.answers(asked)
        await asyncio.sleep(0.5)  # A's lease records the message's id
        a.kill()
    async with serving(kb_runtime, platform, replica="B", claim_lease_s=LEASE) as b:
        await asyncio.sleep(LEASE * 1.6)  # A's pending turn expires
        assert await b.recover() == 1

    [answer] = b.answers(asked)
    assert answer.id != orphan.id and orphan.id in [s.id for s in b.shown(asked) if s.deleted], \
        "the half-written message is gone"
    assert PARTIAL[:40] not in answer.text and answer.sources
    [turn] = b.turns
    assert turn.answer.outcome is Outcome.ANSWERED and turn.inquiry.text == QUESTION
    assert stuck.cancelled_at is not None and not a.turns, "A wrote nothing after it died"


# --- 4. rate limits spent ----------------------------------------------------------------------------
async def test_an_answer_through_a_429_storm_arrives_whole_after_each_retry_after(claude, platform: Driver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 12), tokens_per_second=150)
    platform.rate_limit_answers(times=2, retry_after=1)
    async with serving(runtime, platform) as bot:
        asked = await bot.ask(QUESTION, user=platform.user_id("alice"))
    [turn] = bot.turns
    assert turn.answer.outcome is Outcome.ANSWERED
    [shown] = bot.answers(asked)
    assert shown.text.startswith(platform.shows(turn.answer.text)) and shown.sources and shown.feedback
    refused = platform.refused()
    assert len(refused) >= 3
    assert platform.delivered_at(asked) - refused[0] >= 2 - 0.05, "each Retry-After was waited out"


# --- 5. an audience's permissions ----------------------------------------------------------------------
CLAIMS = ("# HL-K8 warranty claims\n\nWarranty claims for the HL-K8 compressor are approved up to 4,800 euros "
          "by the service manager without further review.\n")
CLAIMS_QUESTION = "Up to which amount are HL-K8 warranty claims approved without further review?"


async def test_a_restricted_document_is_shown_only_where_every_reader_may_read_it(tmp_path, platform: Driver):
    alice, bob = platform.user_id("alice"), platform.user_id("bob")

    def restricted(settings: Settings, docs: Path) -> None:
        settings.sources = [folder_source("docs", docs, acl={"finance/": ["group:finance"]})]
        settings.permissions.principals = {f"{platform.name}:{alice}": ["group:finance"]}
        settings.permissions.cache_s = 0

    files = {**DOCS, "finance/claims.md": CLAIMS}
    async with knowledge(tmp_path, files, restricted) as (runtime, _), serving(runtime, platform) as bot:
        await bot.ask(CLAIMS_QUESTION, user=alice, place=platform.shared)
        in_public = bot.turns[-1].answer
        assert in_public.outcome is Outcome.NOT_FOUND, "others read the shared place"
        assert "4,800" not in platform.everything_sent()
        assert "ask me in a direct message" in in_public.text, "the asker may read it in private"

        await bot.ask(CLAIMS_QUESTION, user=bob, place=platform.private(bob))
        assert bot.turns[-1].answer.outcome is Outcome.NOT_FOUND and "4,800" not in platform.everything_sent()

        asked = await bot.ask(CLAIMS_QUESTION, user=alice, place=platform.private(alice))
        answer = bot.turns[-1].answer
        assert answer.outcome is Outcome.ANSWERED and "4,800" in answer.text
        assert "4,800" in bot.answers(asked)[-1].text and "HL-K8 warranty claims" in bot.answers(asked)[-1].sources


# --- 6. a follow-up after a refresh ----------------------------------------------------------------------
async def test_a_not_found_question_is_answered_where_it_was_asked_once_a_refresh_brings_the_answer(
        tmp_path, platform: Driver):
    alice = platform.user_id("alice")
    async with knowledge(tmp_path) as (runtime, docs), serving(runtime, platform) as bot:
        asked = await bot.ask(GAP, user=alice)
        assert [t.answer.outcome for t in bot.turns] == [Outcome.NOT_FOUND]
        before = len(bot.answers(asked))

        (docs / "seal-kit.md").write_text(SEAL, encoding="utf-8")
        assert (await bot.refresh("docs")).added == 1
        shown = bot.answers(asked)
        assert len(shown) == before + 1, "exactly one follow-up where the question was asked"
        follow_up = shown[-1]
        assert follow_up.text.startswith(COVERS) and GAP in follow_up.text and "SK-2040" in follow_up.text
        assert "HL-M200 shaft seal kit" in follow_up.sources

        (docs / "seal-kit.md").write_text(SEAL + "\nThe kit includes two O-rings.\n", encoding="utf-8")
        assert (await bot.refresh("docs")).changed == 1
        assert len(bot.answers(asked)) == before + 1, "answered once, not after every refresh"
