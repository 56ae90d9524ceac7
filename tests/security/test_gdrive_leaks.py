"""A restricted Google Drive file never reaches an audience that may not read it (issue 42), on real
Weaviate and the embedded store, with the local Drive (tests/fakes/gdrive.py):

- a file shared with one user is read by that user only; one shared with a whole domain (found by
  its people) by askers whose e-mail is of that domain, not by an outsider or an unmapped asker;
- "anyone with the link" is no grant, nor is "anyone" while the operator has not said it is public;
  a file whose permissions Drive will not list (403) is held back: readable by nobody;
- a sharing change moves the readers without embedding anything, through the changes feed and
  through ``kbbot refresh --permissions-only`` (no content read); a file edited is the one embedded
  again, a file trashed is never cited again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fakes.gdrive import FakeDrive, FakeFile, anyone, domain, user
from tests.gdrive_world import drive_source
from tests.refresh_helpers import SERVICES_MISSING, RefreshedWorld, refreshed, world_settings

BONUS = "# HL-K8 commissioning bonus\n\nThe HL-K8 commissioning bonus is 1,250 euros per machine.\n"
PAY = "# DC depot pay\n\nService technicians of the DC depot are paid on pay scale T9 from March.\n"
SEALS = "# HL-K8 seals\n\nThe HL-K8 compressor seal must be replaced every 7,200 operating hours.\n"
ROADMAP = "# Roadmap\n\nThe HL-K9 compressor ships in spring with a 90 kW motor.\n"
LEAKED = "# Salaries\n\nThe HL-K8 team lead earns 98,400 euros a year.\n"
QUESTIONS = {"bonus": ("How much is the HL-K8 commissioning bonus per machine?", "1,250"),
             "pay": ("Which pay scale are the service technicians of the DC depot paid on?", "T9"),
             "seals": ("How often must the HL-K8 compressor seal be replaced?", "7,200"),
             "roadmap": ("When does the HL-K9 compressor ship and with which motor?", "90 kW"),
             "salaries": ("How much does the HL-K8 team lead earn?", "98,400")}
HIDDEN = "Drive refused to list its permissions (HTTP 403 insufficientFilePermissions)"


@dataclass
class World(RefreshedWorld):
    drive: FakeDrive
    files: dict[str, FakeFile]

    def doc(self, name: str) -> str:
        return f"gdrive:drive:file:{self.files[name].id}"

    async def reads(self, caller: str, name: str) -> bool:
        question, fact = QUESTIONS[name]
        answer = await self.ask(caller, question)
        doc = self.doc(name)
        seen = doc in {c.doc_id for c in answer.citations} or doc in {r["doc_id"] for r in answer.trace.ranked}
        assert seen or fact not in answer.text, (caller, name, answer.text)
        return seen


@contextlib.asynccontextmanager
async def world_on(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    with FakeDrive().run_in_thread() as drive:
        kb = drive.folder("HR", "root")
        files = {"bonus": drive.add("bonus.md", kb.id, BONUS.encode(), permissions=[user("carol@example.com")]),
                 "pay": drive.add("pay.md", kb.id, PAY.encode(), permissions=[domain("example.com"),
                                                                           user("eve@partner.org", "owner")]),
                 "seals": drive.add("seals.md", kb.id, SEALS.encode(), permissions=[anyone(True)]),
                 "roadmap": drive.add("roadmap.md", kb.id, ROADMAP.encode(),
                                      permissions=[anyone(False), domain("example.com", discoverable=False)]),
                 "salaries": drive.add("salaries.md", kb.id, LEAKED.encode(), permissions_hidden=True)}
        settings = world_settings(tmp_path, kind, "DriveLeak", {"api:carol": ["user:carol@example.com"],
                                                                "api:dave": ["user:dave@example.com"],
                                                                "api:eve": ["user:eve@partner.org"]})
        settings.sources = [drive_source(drive, kb.id, monkeypatch)]  # anyone_public: false, the default
        async with refreshed(settings, kind, "drive", added=5) as (runtime, refresher):
            yield World(runtime, refresher, drive, files)


@pytest.fixture(params=["weaviate", "memory"])
async def world(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if request.param == "weaviate" and SERVICES_MISSING is not None:
        pytest.skip(SERVICES_MISSING)
    async with world_on(request.param, tmp_path, monkeypatch) as w:
        yield w


async def test_a_restricted_drive_file_never_reaches_an_audience_that_may_not_read_it(world):
    assert world.readers("bonus") == ["user:carol@example.com"]
    assert world.readers("pay") == ["domain:example.com", "user:eve@partner.org"]
    assert world.readers("seals") == ["nobody"], "'anyone' is public only when the operator says so"
    assert world.readers("roadmap") == ["nobody"], "link-only sharing grants no one"
    assert world.readers("salaries") == ["nobody"], "permissions Drive would not list"
    chunks = world.runtime.store.document_store.filter_documents(
        {"field": "meta.doc_id", "operator": "==", "value": world.doc("salaries")})
    assert chunks and all(c.meta["readers"] == ["nobody"] for c in chunks)

    expected = {"carol": {"bonus", "pay"}, "dave": {"pay"}, "eve": {"pay"}, "stranger": set()}
    for caller, allowed in expected.items():
        for name in QUESTIONS:
            assert await world.reads(caller, name) == (name in allowed), (caller, name)
    run = await world.refresher.last_run("drive")
    assert "3 held back (readable by nobody)" in run.summary(), run.summary()
    assert any(HIDDEN in line for line in run.held_lines()), run.held_lines()


async def test_an_edited_file_alone_is_read_again_and_a_trashed_one_is_never_cited_again(world):
    """On both stores: a file edited in Drive is the one document embedded again, and its new text is
    what answers; a file trashed is revoked."""
    embedded = world.runtime.document_embedder.embedded_texts
    world.drive.edit(world.files["bonus"], BONUS.replace("1,250", "1,400").encode())
    record = await world.refresher.run("drive")
    assert record is not None and record.ok and (record.changed, record.added, record.removed) == (1, 0, 0), record
    assert world.runtime.document_embedder.embedded_texts > embedded, "the edited file embedded again"
    answer = await world.ask("carol", QUESTIONS["bonus"][0])
    assert "1,400" in answer.text and "1,250" not in answer.text, answer.text

    world.drive.trash(world.files["bonus"])
    record = await world.refresher.run("drive")
    assert record is not None and record.ok and (record.changed, record.removed) == (0, 1), record
    answer = await world.ask("carol", QUESTIONS["bonus"][0])
    assert world.doc("bonus") not in {c.doc_id for c in answer.citations} and "1,400" not in answer.text


async def test_a_sharing_change_moves_the_readers_without_embedding(world):
    embedded = world.runtime.document_embedder.embedded_texts
    world.drive.share(world.files["bonus"], [user("dave@example.com")])  # carol out, dave in
    record = await world.refresher.run("drive")
    assert record is not None and record.ok and record.permissions == 1, record
    assert world.runtime.document_embedder.embedded_texts == embedded, "written in place, nothing embedded"
    assert world.readers("bonus") == ["user:dave@example.com"]
    assert not await world.reads("carol", "bonus") and await world.reads("dave", "bonus")

    # Permissions alone: every indexed file's permissions read again, no content, the page token kept.
    world.drive.files[world.files["pay"].id].permissions = [user("carol@example.com")]  # not in the feed
    sent = len(world.drive.log)
    record = await world.refresher.run("drive", permissions_only=True)
    assert record is not None and record.ok and record.permissions == 1, record
    since = [path for _, path, _, _ in world.drive.log[sent:]]
    assert since and all("/permissions" in p for p in since), since
    assert world.runtime.document_embedder.embedded_texts == embedded
    assert not await world.reads("dave", "pay") and await world.reads("carol", "pay")
    record = await world.refresher.run("drive")
    assert record.ok and (record.unchanged, record.changed, record.removed) == (5, 0, 0), record
