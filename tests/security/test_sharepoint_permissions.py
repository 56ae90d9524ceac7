"""A restricted SharePoint file never reaches an audience that may not read it (issue 42), on real Weaviate
and the embedded store, with the fake Microsoft Graph (tests/fakes/graph.py) as in tests/test_sharepoint.py:

- a file inherits its folder's and site's permissions: a Finance folder shared with an Entra group (the
  ``group:<object id>`` Teams users hold) is read by that group's askers only; the site's "Everyone except
  external users" gives ``sharepoint:organization``, which only the askers granted it hold, never public;
- an "anyone with the link" file is readable by nobody (held back, with its reason) unless the operator
  says such links are public;
- a file re-shared at the source moves its readers at the next refresh, in place: the old reader no
  longer gets it, the new one does, nothing is embedded again; a file edited is the one embedded again,
  a file deleted is never cited again;
- a site page (Graph shows no permissions of pages) is read only by the readers the operator names
  (``sharepoint.pages.readers``); with none named it is held back, never public;
- whatever reaches an asker (citations, ranked passages, the text) is searched for the restricted words.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.settings import SourceSettings
from bot.types import Answer
from pipelines.sources.sharepoint import SharePointPages, SharePointSettings
from tests.fakes.graph import FakeGraph, FakeItem, group_permission, link_permission, site_user_permission, user_permission
from tests.refresh_helpers import REDIS_URL, SERVICES_MISSING, RefreshedWorld, refreshed, world_settings

FINANCE = "6f1c3a3e-0000-4000-8000-00000000f14a"
HANDBOOK = b"# Handbook\n\nThe HL-K8 compressor seal must be replaced every 7,200 operating hours.\n"
CLAIMS = b"# Claims\n\nHL-K8 warranty claims are approved up to 4,800 euros without further review.\n"
ESCALATION = b"# Escalation\n\nHL-K8 warranty claims above the limit go to the finance director Marta Ruiz.\n"
LINKED = b"# Bonus\n\nThe HL-K8 commissioning bonus is 1,250 euros per machine.\n"
SECRETS = {"claims": ("4,800",), "escalation": ("Marta Ruiz",), "linked": ("1,250",)}
QUESTIONS = {"handbook": "How often must the HL-K8 compressor seal be replaced?",
             "claims": "Up to which amount are HL-K8 warranty claims approved without further review?",
             "escalation": "Who do HL-K8 warranty claims above the limit go to?",
             "linked": "How much is the HL-K8 commissioning bonus per machine?"}


@dataclass
class World(RefreshedWorld):
    graph: FakeGraph
    files: dict[str, FakeItem]

    def doc(self, name: str) -> str:
        item = self.files[name]
        return f"sharepoint:service:{item.drive.id}:{item.id}"

    def leaked(self, answer: Answer, name: str) -> list[str]:
        doc = self.doc(name)
        found = [c.doc_id for c in answer.citations if c.doc_id == doc]
        found += [r["doc_id"] for r in answer.trace.ranked if r["doc_id"] == doc]
        return found + [w for w in SECRETS.get(name, ()) if w in answer.text]


@contextlib.asynccontextmanager
async def world_on(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    async with FakeGraph(tls=True) as graph:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", graph.ca_file)
        monkeypatch.setenv("KBBOT_TEST_SHAREPOINT_SECRET", graph.app_secret)
        site = graph.add_site("contoso.sharepoint.com", "sites/service", permissions=[
            site_user_permission("c:0-.f|rolemanager|spo-grid-all-users/0d1e2f30")])
        docs = graph.add_drive("Documents", site=site)
        graph.add_folder(docs, "Finance", permissions=[group_permission(FINANCE, name="Finance")])
        files = {"handbook": graph.add_file(docs, "Handbook.md", HANDBOOK),
                 "claims": graph.add_file(docs, "Finance/Claims.md", CLAIMS),
                 "escalation": graph.add_file(docs, "Finance/Escalation.md", ESCALATION,
                                              permissions=[user_permission("carol@contoso.com")]),
                 "linked": graph.add_file(docs, "Bonus.md", LINKED, permissions=[link_permission("anonymous")])}
        settings = world_settings(tmp_path, kind, "SpPerm", {
            "api:staff": ["sharepoint:organization"], "api:finance": ["sharepoint:organization", f"group:{FINANCE}"],
            "api:carol": ["user:carol@contoso.com"]}, allow_hosts=("127.0.0.1", "localhost"))
        settings.sources = [SourceSettings(name="service", interval="1h", sharepoint=SharePointSettings(
            tenant_id=graph.tenant_id, client_id=graph.app_id, client_secret_env="KBBOT_TEST_SHAREPOINT_SECRET",
            site="https://contoso.sharepoint.com/sites/service", graph_url=graph.graph_url,
            login_url=graph.login_url, download_hosts=["localhost"]))]
        async with refreshed(settings, kind, "service", added=4) as (runtime, refresher):
            yield World(runtime, refresher, graph, files)


@pytest.fixture(params=["weaviate", "memory"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if SERVICES_MISSING is not None and (request.param == "weaviate" or not REDIS_URL):
        pytest.skip(SERVICES_MISSING)
    async with world_on(request.param, tmp_path, monkeypatch) as w:
        yield w


async def test_a_restricted_file_never_reaches_an_audience_that_may_not_read_it(world: World):
    assert world.readers("handbook") == ["sharepoint:organization"], "the organisation, never public"
    assert world.readers("claims") == [f"group:{FINANCE}"], "inherited from its folder"
    assert world.readers("escalation") == ["user:carol@contoso.com"], "its own permissions"
    assert world.readers("linked") == ["nobody"], "an anyone-link: held back, not public"

    may_read = {"stranger": set(), "staff": {"handbook"}, "finance": {"handbook", "claims"},
                "carol": {"escalation"}}
    for caller, allowed in may_read.items():
        for name in QUESTIONS:
            answer = await world.ask(caller, QUESTIONS[name])
            if name in allowed:
                assert world.doc(name) in {c.doc_id for c in answer.citations}, (caller, name)
            else:
                assert not world.leaked(answer, name), (caller, name, world.leaked(answer, name))

    run = await world.refresher.last_run("service")
    assert "1 held back (readable by nobody)" in run.summary(), run.summary()
    assert any("links or apps" in line for line in run.held_lines()), run.held_lines()


async def test_an_edited_file_alone_is_read_again_and_a_deleted_one_is_never_cited_again(world: World):
    """On both stores: a file edited at the source is the one document embedded again, and its new text
    is what answers; a file deleted at the source is revoked."""
    embedded = world.runtime.document_embedder.embedded_texts
    world.graph.edit(world.files["handbook"], HANDBOOK.replace(b"7,200", b"6,400"))
    record = await world.refresher.run("service")
    assert record is not None and record.ok and (record.changed, record.added, record.removed) == (1, 0, 0), record
    assert world.runtime.document_embedder.embedded_texts > embedded, "the edited file embedded again"
    answer = await world.ask("staff", QUESTIONS["handbook"])
    assert "6,400" in answer.text and "7,200" not in answer.text, answer.text

    world.graph.delete(world.files["handbook"])
    record = await world.refresher.run("service")
    assert record is not None and record.ok and (record.changed, record.removed) == (0, 1), record
    answer = await world.ask("staff", QUESTIONS["handbook"])
    assert world.doc("handbook") not in {c.doc_id for c in answer.citations} and "6,400" not in answer.text


async def test_a_file_reshared_at_the_source_moves_its_readers_in_place(world: World):
    embedded = world.runtime.document_embedder.embedded_texts
    world.graph.share(world.files["escalation"], [group_permission(FINANCE, name="Finance")])
    record = await world.refresher.run("service")
    assert record is not None and record.ok and record.permissions == 1 and record.changed == 0, record
    assert world.runtime.document_embedder.embedded_texts == embedded, "nothing embedded again"
    assert world.readers("escalation") == [f"group:{FINANCE}"]
    assert not world.leaked(await world.ask("carol", QUESTIONS["escalation"]), "escalation"), "no longer shared with carol"
    answer = await world.ask("finance", QUESTIONS["escalation"])
    assert world.doc("escalation") in {c.doc_id for c in answer.citations} and "Marta Ruiz" in answer.text

    # The Finance folder shared with carol alone: its files follow at a permissions-only run.
    world.graph.add_folder(world.files["claims"].drive, "Finance", permissions=[user_permission("carol@contoso.com")])
    record = await world.refresher.run("service", permissions_only=True)
    assert record is not None and record.ok, record
    assert world.readers("claims") == ["user:carol@contoso.com"]
    assert not world.leaked(await world.ask("finance", QUESTIONS["claims"]), "claims")


async def test_a_site_page_reaches_only_the_readers_named_and_none_named_is_nobody(world: World):
    site = next(iter(world.graph.sites.values()))
    page = world.graph.add_page(site, "Payroll calendar", ["<p>HL-K8 payroll closes on the 23rd at 14:00.</p>"])
    question = "When does the HL-K8 payroll close?"
    settings = world.refresher.settings.sources[0].sharepoint
    assert settings is not None
    doc = f"sharepoint:service:page:{page.id}"

    def leaked(answer: Answer) -> list[str]:
        return [c.doc_id for c in answer.citations if c.doc_id == doc] + (["23rd"] if "23rd" in answer.text else [])

    settings.pages = SharePointPages(enabled=True, readers=[f"group:{FINANCE}"])
    record = await world.refresher.run("service")
    assert record is not None and record.ok and record.added == 1, record
    assert world.runtime.store.record(doc).readers == [f"group:{FINANCE}"]
    for caller in ("stranger", "staff", "carol"):
        assert not leaked(await world.ask(caller, question)), caller
    assert doc in {c.doc_id for c in (await world.ask("finance", question)).citations}

    settings.pages = SharePointPages(enabled=True)
    record = await world.refresher.run("service")
    assert record is not None and record.ok and record.permissions == 1, record
    assert world.runtime.store.record(doc).readers == ["nobody"]
    assert any("sharepoint.pages.readers" in line for line in record.held_lines()), record.held_lines()
    for caller in ("stranger", "staff", "finance", "carol"):
        assert not leaked(await world.ask(caller, question)), caller
