"""Readers that cannot be established mean nobody, never ``public`` (issue 39, item 1), on real Weaviate
and the embedded store, with the Confluence fake:

- a space whose read permissions the API user is not shown (Data Center; Cloud without the right) used
  to make its pages public; they are indexed readable by nobody (held back) until the operator maps the
  space (``confluence.hidden_space_readers``) to a principal such as ``space:<key>``, and an asker granted
  that principal in ``permissions.principals`` reads them;
- a space readable by ``confluence-users`` means every Confluence account, not everyone who reaches
  kbbot: its pages are readable by ``confluence.everyone_readers`` (``confluence:everyone``), not public;
- a page no one may read (the space's readers and the page's restriction do not meet) used to come out
  as no readers, which the writer stamped public: nobody;
- ``kbbot refresh``, ``kbbot status`` and the admin page say how many documents are held back and why.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.knowledge.status import format_status, knowledge_status
from bot.settings import PermissionsSettings, SourceSettings
from bot.types import Answer
from pipelines.sources.confluence import ConfluenceSettings
from tests.admin_site import admin_site
from tests.fakes.confluence_server import FakeConfluence
from tests.fakes.slack_server import FakeSlack
from tests.refresh_helpers import SERVICES_MISSING, RefreshedWorld, refreshed, world_settings
from tests.test_admin_page import login

SEALS = "<p>The HL-K8 compressor seal must be replaced every 7,200 operating hours.</p>"
PAY = "<p>Service technicians of the DC depot are paid on pay scale T9 from March onwards.</p>"
BONUS = "<p>The HL-K8 commissioning bonus is 1,250 euros per machine for the night shift.</p>"
SEALS_QUESTION = "How often must the HL-K8 compressor seal be replaced?"
PAY_QUESTION = "Which pay scale are the service technicians of the DC depot paid on?"
BONUS_QUESTION = "How much is the HL-K8 commissioning bonus per machine?"
HIDDEN = "the read permissions of Confluence space DC are not visible to the API user"


@dataclass
class World(RefreshedWorld):
    confluence: FakeConfluence
    slack: FakeSlack
    pages: dict[str, Any]

    def doc(self, name: str) -> str:
        return f"confluence:wiki:page:{self.pages[name].id}"

    def reads(self, answer: Answer, name: str) -> bool:
        doc = self.doc(name)
        return doc in {c.doc_id for c in answer.citations} or doc in {r["doc_id"] for r in answer.trace.ranked}


@contextlib.asynccontextmanager
async def world_on(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "conf-token")
    with FakeConfluence(cloud=False).run_in_thread() as confluence:
        async with FakeSlack(team_id="T0HELD", bot_user_id="UKBBOT") as slack:
            pages = {"seals": confluence.add_page("OPS", "HL-K8 seal replacement", SEALS),  # confluence-users
                     "pay": confluence.add_page("DC", "DC depot pay scales", PAY),
                     "bonus": confluence.add_page("HR", "HL-K8 commissioning bonus", BONUS,
                                                  read_users=["dave@example.com"])}
            confluence.hidden_permissions = {"DC"}
            confluence.set_space_readers("HR", groups=["staff"])
            confluence.groups = {"staff": ["alice@example.com"], "confluence-users": []}
            settings = world_settings(tmp_path, kind, "Held", {"api:depot": ["space:dc"],
                                                               "api:staff": ["confluence:everyone"],
                                                               "api:dave": ["user:dave@example.com"]})
            settings.sources = [SourceSettings(name="wiki", interval="1h", confluence=ConfluenceSettings(
                url=confluence.base_url, spaces=["OPS", "DC", "HR"], token_env="KBBOT_TEST_CONFLUENCE_TOKEN"))]
            async with refreshed(settings, kind, "wiki") as (runtime, refresher):
                yield World(runtime, refresher, confluence, slack, pages)


@pytest.fixture(params=["weaviate", "memory"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if request.param == "weaviate" and SERVICES_MISSING is not None:
        pytest.skip(SERVICES_MISSING)
    async with world_on(request.param, tmp_path, monkeypatch) as w:
        yield w


async def test_pages_whose_readers_cannot_be_established_are_held_back_not_public(world):
    assert world.readers("pay") == ["nobody"], "a space whose permissions are hidden"
    assert world.readers("bonus") == ["nobody"], "space staff, page dave: no one passes both"
    assert world.readers("seals") == ["confluence:everyone"], "every Confluence account, not everyone"
    chunks = world.runtime.store.document_store.filter_documents(
        {"field": "meta.doc_id", "operator": "==", "value": world.doc("pay")})
    assert chunks and all(c.meta["readers"] == ["nobody"] for c in chunks)

    for caller in ("stranger", "staff", "depot", "dave"):  # unmapped, every account, the space, the page's user
        answer = await world.ask(caller, PAY_QUESTION)
        assert not world.reads(answer, "pay") and "T9" not in answer.text, caller
        answer = await world.ask(caller, BONUS_QUESTION)
        assert not world.reads(answer, "bonus") and "1,250" not in answer.text, caller
    stranger = await world.ask("stranger", SEALS_QUESTION)
    assert not world.reads(stranger, "seals") and "7,200" not in stranger.text
    staff = await world.ask("staff", SEALS_QUESTION)
    assert world.doc("seals") in {c.doc_id for c in staff.citations}, "confluence:everyone, granted, reads it"

    # How many and why: the refresh's summary, kbbot status, the admin page.
    run = await world.refresher.last_run("wiki")
    assert "2 held back (readable by nobody)" in run.summary(), run.summary()
    assert any(HIDDEN in line and "confluence.hidden_space_readers" in line for line in run.held_lines())
    assert any("no one passes every read restriction" in line for line in run.held_lines()), run.held_lines()
    status = format_status(await knowledge_status(world.refresher.settings, store=world.runtime.store,
                                                  runs=world.refresher.runs, redis=world.runtime.redis))
    assert "2 documents held back (readable by nobody)" in status and f"1: {HIDDEN}" in status, status
    async with admin_site(world.runtime, world.slack) as site:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as admin:
            await login(admin, site.url)
            async with admin.get(f"{site.url}/admin/sources") as resp:
                page = await resp.text()
    assert "2 held back (readable by nobody)" in page and HIDDEN in page


async def test_a_hidden_space_mapped_by_the_operator_is_read_by_whoever_holds_that_principal(world):
    world.refresher.settings.sources[0].confluence.hidden_space_readers = {"dc": ["space:DC"]}
    embedded = world.runtime.document_embedder.embedded_texts
    record = await world.refresher.run("wiki", permissions_only=True)
    assert record is not None and record.ok, record
    assert world.runtime.document_embedder.embedded_texts == embedded, "opened in place, nothing embedded"
    assert world.readers("pay") == ["space:dc"]
    assert record.held and sum(record.held.values()) == 1  # the bonus page only

    depot = await world.ask("depot", PAY_QUESTION)
    assert world.doc("pay") in {c.doc_id for c in depot.citations} and "T9" in depot.text, depot.text
    for caller in ("stranger", "staff"):
        answer = await world.ask(caller, PAY_QUESTION)
        assert not world.reads(answer, "pay") and "T9" not in answer.text, caller

    # Every hidden space as every Confluence account: the page restrictions decide from then on.
    world.confluence.restrict(world.pages["pay"], users=["dave@example.com"])
    world.refresher.settings.sources[0].confluence.hidden_space_readers = {"*": ["confluence:everyone"]}
    assert (await world.refresher.run("wiki", permissions_only=True)).ok
    assert world.readers("pay") == ["user:dave@example.com"]
    dave = await world.ask("dave", PAY_QUESTION)
    assert world.doc("pay") in {c.doc_id for c in dave.citations}
    assert not world.reads(await world.ask("staff", PAY_QUESTION), "pay")


def test_confluence_principals_pass_the_settings_and_nobody_cannot_be_granted():
    from pipelines.acl import principal

    assert principal("space:DC") == "space:dc" and principal("Confluence:Everyone") == "confluence:everyone"
    checked = PermissionsSettings(principals={"telegram:42": ["space:DC", "confluence:everyone"]})
    assert checked.principals == {"telegram:42": ["space:dc", "confluence:everyone"]}
    settings = ConfluenceSettings(url="https://wiki.example.com", spaces=["DC"],
                                  hidden_space_readers={"dc": ["space:dc"], "*": ["confluence:everyone"]})
    assert settings.hidden_space_readers == {"DC": ["space:dc"], "*": ["confluence:everyone"]}
    assert settings.everyone_readers == ["confluence:everyone"]
    for bad in ({"principals": {"telegram:42": ["nobody"]}},):
        with pytest.raises(ValueError, match="is not a principal"):
            PermissionsSettings(**bad)
    with pytest.raises(ValueError, match="is not a principal"):
        ConfluenceSettings(url="https://wiki.example.com", spaces=["DC"], hidden_space_readers={"DC": ["nobody"]})
    with pytest.raises(ValueError, match="is not a principal"):
        SourceSettings(name="docs", path="docs", interval="1h", acl={"hr/": ["nobody"]})


def test_every_source_kind_states_its_readers_and_unknown_readers_are_nobody(tmp_path: Path):
    """A source that yields content without stating its readers gives nobody, not public; a folder
    without ``acl:`` is public to its space because the operator said so, and says it explicitly."""
    from pipelines.sources.folder import FolderSource
    from pipelines.sources.kind import SourceItem

    assert SourceItem(doc_id="x", source="x", root=None, data=b"x").principals == ["nobody"]
    assert SourceItem(doc_id="x", source="x", root=None, data=b"x", readers=[]).principals == ["nobody"]
    (tmp_path / "a.md").write_text("# A\n\ntext\n")
    [item] = list(FolderSource([tmp_path]).scan({}, "default"))
    assert item.readers == ["public"]


def test_a_document_written_without_readers_is_readable_by_nobody(tmp_path: Path):
    """The last layer fails closed too: chunks reaching the writer with no readers in their meta (a caller
    that forgot them) are published for nobody; an evaluation corpus, which has no permissions, says public."""
    from haystack import Document

    from pipelines.components.writer import KnowledgeWriter
    from pipelines.evaluation import corpus_documents
    from pipelines.store import InMemoryKnowledgeStore

    store = InMemoryKnowledgeStore()
    meta = {"doc_id": "forgot", "content_hash": "h", "title": "T", "chunk_index": 0}
    [record] = KnowledgeWriter(store).run([Document(content="HL-K8 text", meta=meta)])["published"]
    assert record.readers == ["nobody"]
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "corpus.jsonl").write_text('{"id": "p1", "title": "P", "text": "passage"}\n')
    assert corpus_documents(tmp_path / "set")[0].meta["readers"] == ["public"]
