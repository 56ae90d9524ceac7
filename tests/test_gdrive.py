"""A Google Drive source against a local Drive (tests/fakes/gdrive.py: the token endpoint checks the JWT
signed by the test's own key), on real Weaviate and Redis: a folder tree with Google Docs, Sheets and
Slides (exported) and stored files indexed and cited by their Drive links; a second refresh with nothing
changed is one changes call; an edit, a sharing change, a trash, a deletion and a move out followed;
rate limits waited out; bad credentials, a file that will not export or convert, one too large, and a
page token Drive no longer takes each give a line while the rest is indexed; a download sent off
Google's hosts is refused."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.knowledge.status import format_status, knowledge_status
from bot.settings import SettingsError
from pipelines.sources.gdrive import GDRIVE, DriveEntry, DriveSettings
from pipelines.sources.gdrive.permissions import ReadersUnknown, principals
from pipelines.sources.kind import SourceContext, SourceItem
from tests.conftest import settings_with_source
from tests.fakes.gdrive import DOC, SHEET, SLIDES, FakeDrive, anyone, domain, group, service_account_json, user
from tests.gdrive_world import KEY_ENV, docx, drive_source, pptx, xlsx
from tests.refresh_helpers import SERVICES_MISSING, Site, Stack, isolated_stack

SEALS = "The HL-K8 compressor seal must be replaced every 7,200 operating hours."
ALARMS = "# HL-K8 alarms\n\nAlarm K8-44 on the HL-K8 compressor means the oil separator is saturated.\n"
PUBLIC = [anyone()]  # found by anyone: public, as the operator allows (anyone_public) in these tests


@pytest.fixture
async def drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeDrive, Stack, str]]:
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    with FakeDrive(max_page=3).run_in_thread() as server:
        kb = server.folder("Service KB", "root")
        async with isolated_stack(tmp_path, "Gdrive") as stack:
            stack.settings.sources = [drive_source(server, kb.id, monkeypatch, anyone_public=True)]
            yield server, stack, kb.id


async def test_a_folder_tree_is_indexed_cited_by_link_and_followed_through_the_changes_feed(drive):
    server, stack, kb = drive
    manuals = server.folder("Manuals", kb)
    seals = server.add("HL-K8 seal replacement", kb, docx("Seals", SEALS), mime=DOC, permissions=PUBLIC)
    params = server.add("HL-K8 parameters", manuals.id, xlsx([["Parameter", "Default"], ["P7-31 brake threshold",
                                                                                     "764 V"]]),
                        mime=SHEET, permissions=PUBLIC)
    training = server.add("HL-K8 training", manuals.id, pptx(("Encoder", "Re-learn the HL-K8 encoder offset after "
                                                                         "every motor swap.")),
                          mime=SLIDES, permissions=PUBLIC)
    alarms = server.add("hl-k8-alarms.md", manuals.id, ALARMS.encode(), mime="text/markdown", permissions=PUBLIC)
    inlet = server.add("inlet.txt", manuals.id, b"The HL-K8 inlet filter mesh is 40 micron.", permissions=PUBLIC)
    server.add("photo.png", manuals.id, b"\x89PNG not indexed", permissions=PUBLIC)
    server.add("roadmap.md", "root", b"# Roadmap\n\nThe HL-K9 compressor ships in spring.\n", permissions=PUBLIC)

    first = await stack.refresher.run("drive")
    assert first is not None and first.ok, first
    assert (first.added, first.failed) == (5, []), first
    assert {k: v["documents"] for k, v in first.formats.items()} == {"docx": 1, "xlsx": 1, "pptx": 1, "md": 1,
                                                                     "txt": 1}
    assert server.calls("/changes/startPageToken")[0][3] < server.calls("/drive/v3/files?")[0][3], \
        "the start token is taken before the crawl"
    answer = await stack.ask("How often must the HL-K8 compressor seal be replaced?")
    top = answer.citations[0]
    assert top.source == top.url == server.files[seals.id].json()["webViewLink"], top
    assert top.title == "HL-K8 seal replacement"
    answer = await stack.ask("What does alarm K8-44 on the HL-K8 mean?")
    assert answer.citations[0].title == "hl-k8-alarms" and "oil separator" in answer.text
    answer = await stack.ask("When does the HL-K9 compressor ship?")
    assert all("Roadmap" not in c.title for c in answer.citations)  # outside the folder: never indexed

    # Nothing changed: one changes call, nothing else asked of Drive, nothing embedded.
    embedded, sent = stack.embedded, len(server.log)
    second = await stack.refresher.run("drive")
    assert second is not None and second.ok and (second.unchanged, second.added, second.changed) == (5, 0, 0)
    assert [path.split("?")[0] for _, path, _, _ in server.log[sent:]] == ["/drive/v3/changes"]
    assert stack.embedded == embedded

    # An edit, a sharing change, a trash, a deletion, and a move out of the folder.
    server.edit(alarms, ALARMS.replace("the oil separator is saturated", "the suction pressure is too low").encode())
    server.share(seals, [anyone(), user("carol@example.com")])
    server.trash(params)
    server.delete(training)
    server.move(inlet, "root")
    sent = len(server.log)
    third = await stack.refresher.run("drive")
    assert third is not None and third.ok, third
    assert (third.changed, third.permissions, third.removed, third.unchanged) == (1, 1, 3, 0), third
    since = [path for _, path, _, _ in server.log[sent:]]
    assert not [p for p in since if "/export" in p], "a sharing change exports nothing"
    assert sum("alt=media" in p for p in since) == 1, "only the edited file is downloaded"
    record = stack.runtime.store.record(f"gdrive:drive:file:{seals.id}")
    assert sorted(record.readers) == ["public", "user:carol@example.com"]
    answer = await stack.ask("What does alarm K8-44 on the HL-K8 mean?")
    assert "suction pressure" in answer.text and "oil separator" not in answer.text
    for question in ("What is the default of parameter P7-31?", "When must the HL-K8 encoder offset be re-learned?",
                     "What mesh size has the HL-K8 inlet filter?"):
        answer = await stack.ask(question)
        assert all(c.title in ("HL-K8 seal replacement", "hl-k8-alarms") for c in answer.citations), question


async def test_a_shared_drive_is_listed_with_its_drive_and_a_folder_moved_in_is_crawled(tmp_path: Path,
                                                                                       monkeypatch):
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    with FakeDrive().run_in_thread() as server:
        shared = "0AServiceDrive"
        server.drives.add(shared)
        server.add("seals.md", shared, f"# Seals\n\n{SEALS}\n".encode(), drive=shared, permissions=PUBLIC)
        elsewhere = server.folder("Drafts", "0AOtherDrive", drive=shared)
        deeper = server.folder("Valves", elsewhere.id, drive=shared)
        server.add("valves.md", deeper.id, b"# Valves\n\nValve RV-28 opens at 128 kPa.\n", drive=shared,
                   permissions=PUBLIC)
        async with isolated_stack(tmp_path, "GdriveShared") as stack:
            stack.settings.sources = [drive_source(server, shared, monkeypatch, drive=shared, anyone_public=True)]
            record = await stack.refresher.run("drive")
            assert record.ok and record.added == 1, record
            listing = server.calls("/drive/v3/files?")[0][1]
            for part in ("corpora=drive", f"driveId={shared}", "includeItemsFromAllDrives=true",
                         "supportsAllDrives=true"):
                assert part in listing, listing
            assert f"driveId={shared}" in server.calls("/changes/startPageToken")[0][1]

            server.move(elsewhere, shared)  # a folder moved in: its files are not in the feed, they are crawled
            record = await stack.refresher.run("drive")
            assert record.ok and (record.added, record.unchanged) == (1, 1), record
            assert f"driveId={shared}" in server.calls("/drive/v3/changes?")[-1][1]
            answer = await stack.ask("At what pressure does valve RV-28 open?")
            assert "128 kPa" in answer.text and answer.citations[0].title == "valves"


async def test_rate_limits_back_off_and_honour_retry_after(drive):
    server, stack, kb = drive
    server.add("hl-k8-alarms.md", kb, ALARMS.encode(), permissions=PUBLIC)
    server.throttle(1, 403, "userRateLimitExceeded")  # no Retry-After: exponential backoff, 1-2 s
    server.throttle(1, 429, "rateLimitExceeded", retry_after="1")
    started = time.monotonic()
    record = await stack.refresher.run("drive")
    assert record is not None and record.ok and record.added == 1, record
    drive_calls = server.calls()
    assert [status for _, _, status, _ in drive_calls[:3]] == [403, 429, 200]
    first_wait = drive_calls[1][3] - drive_calls[0][3]
    second_wait = drive_calls[2][3] - drive_calls[1][3]
    assert 1.0 <= first_wait < 2.5, first_wait
    assert 0.95 <= second_wait < 1.9, second_wait  # Retry-After, not the 2-3 s the backoff would wait
    assert time.monotonic() - started >= 2

    # Beyond the longest wait allowed: the run fails with the reason, nothing is revoked.
    server.throttle(1, 429, "rateLimitExceeded", retry_after="3600")
    record = await stack.refresher.run("drive")
    assert record is not None and not record.ok and record.removed == 0
    assert "rate limited" in (record.error or "") and "3600" in (record.error or ""), record.error
    assert (await stack.ask("What does alarm K8-44 on the HL-K8 mean?")).citations


async def test_bad_credentials_fail_the_run_with_a_clear_line_and_revoke_nothing(drive,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    server, stack, kb = drive
    server.add("hl-k8-alarms.md", kb, ALARMS.encode(), permissions=PUBLIC)
    assert (await stack.refresher.run("drive")).added == 1

    server.revoke_key()  # the key is deleted: its token stops working, and no new one is issued
    record = await stack.refresher.run("drive")
    assert not record.ok and record.removed == 0
    assert "Google refused the service account's credentials (invalid_grant" in record.error, record.error
    assert "create a new key" in record.error

    monkeypatch.delenv(KEY_ENV)
    record = await stack.refresher.run("drive")
    assert not record.ok and f"{KEY_ENV} (the service account's JSON key) is not set" in record.error
    monkeypatch.setenv(KEY_ENV, "{not json")
    assert "is not a JSON key" in (await stack.refresher.run("drive")).error

    server.revoked = False  # a good key, but a subject the domain never delegated to
    monkeypatch.setenv(KEY_ENV, service_account_json(server))
    stack.settings.sources[0].gdrive.subject = "ops@example.com"
    record = await stack.refresher.run("drive")
    assert not record.ok and "unauthorized_client" in record.error and "domain-wide delegation" in record.error
    server.delegated.add("ops@example.com")
    record = await stack.refresher.run("drive")
    assert record.ok and record.removed == 0, record
    assert (await stack.ask("What does alarm K8-44 on the HL-K8 mean?")).citations


async def test_bad_files_and_a_dead_page_token_give_a_line_each_and_the_rest_is_indexed(drive):
    server, stack, kb = drive
    server.export_limit = 60_000
    stack.settings.indexing.max_file_mb = 0.1
    good = server.add("hl-k8-alarms.md", kb, ALARMS.encode(), permissions=PUBLIC)
    huge = server.add("HL-K8 parts catalogue", kb, docx("Parts", *(f"HL-K8 part {os.urandom(32).hex()}" for _ in range(3000))), mime=DOC,
                      permissions=PUBLIC)
    assert len(huge.data) > server.export_limit
    server.add("HL-K8 contract", kb, docx("Contract", "confidential"), mime=DOC, permissions=PUBLIC,
               export_blocked=True)
    server.add("wiring.pdf", kb, b"%PDF-1.4 this is no PDF at all", permissions=PUBLIC)
    server.add("log.txt", kb, b"HL-K8 log line\n" * 10_000, permissions=PUBLIC)
    hidden = server.add("hl-k8-bonus.md", kb, b"# Bonus\n\nThe HL-K8 bonus is 1,250 euros.\n", permissions_hidden=True)

    record = await stack.refresher.run("drive")
    assert record is not None and record.ok, record
    assert record.added == 2, record  # the good file, and the hidden one (held back: readable by nobody)
    reasons = {f["source"].split("/d/")[1].split("/")[0]: f["reason"] for f in record.failed}
    assert "exportSizeLimitExceeded" in reasons[huge.id], reasons
    assert any("cannotExportFile" in r for r in reasons.values()), reasons
    assert any("file too large" in r and "0.1 MB limit" in r for r in reasons.values()), reasons
    assert any("PDF" in r or "pdf" in r for r in reasons.values()), reasons
    assert len(record.failed) == 4
    assert stack.runtime.store.record(f"gdrive:drive:file:{hidden.id}").readers == ["nobody"]
    assert any("Drive refused to list its permissions (HTTP 403 insufficientFilePermissions)" in line
               for line in record.held_lines()), record.held_lines()
    status = format_status(await knowledge_status(stack.settings, store=stack.runtime.store,
                                                  runs=stack.refresher.runs, redis=stack.runtime.redis))
    assert "exportSizeLimitExceeded" in status and "1 documents held back" in status, status

    # The failed files are tried again by the next run; the held one keeps its reason while unchanged.
    record = await stack.refresher.run("drive")
    assert record.ok and len(record.failed) == 4 and sum(record.held.values()) == 1, record

    # Drive no longer takes the saved page token: one full resync, said so, and nothing lost.
    server.expire_tokens()
    server.edit(good, ALARMS.replace("oil separator is saturated", "suction pressure is too low").encode())
    record = await stack.refresher.run("drive")
    assert record is not None and record.ok, record
    assert record.changed == 1 and record.removed == 0, record
    assert any("no longer accepts the saved changes page token" in f["reason"] and "full resync" in f["reason"]
               for f in record.failed), record.failed
    again = await stack.refresher.run("drive")
    assert again.ok and not any("page token" in f["reason"] for f in again.failed), "once"
    assert "suction pressure" in (await stack.ask("What does alarm K8-44 on the HL-K8 mean?")).text


async def test_a_download_redirected_off_googles_hosts_is_refused(monkeypatch: pytest.MonkeyPatch):
    internal = Site()
    internal.set("/latest/meta-data/iam", b"aws_secret_access_key = wJalrXUtnFEMI")
    async with internal, FakeDrive() as server:
        kb = server.folder("KB", "root")
        server.add("manual.md", kb.id, b"# Manual\n\nRegrease the bearings every 3,000 hours.\n")
        planted = server.add("controller.md", kb.id, b"# ordinary")
        elsewhere = server.add("mirror.md", kb.id, b"# ordinary")
        planted.redirect = internal.url("/latest/meta-data/iam").replace("127.0.0.1", "localhost")
        elsewhere.redirect = "https://attacker.example/steal"
        monkeypatch.setenv(KEY_ENV, service_account_json(server))
        entry = DriveEntry(name="drive", gdrive=DriveSettings(folder=kb.id, api_url=server.base_url,
                                                              service_account_env=KEY_ENV))
        # Even a host the operator allows for private addresses is not Google's.
        context = SourceContext(extensions=(".md",), allow_hosts=("127.0.0.1", "localhost"))

        def scan() -> dict[str, SourceItem]:
            source = GDRIVE.build(entry, context, {})
            try:
                return {item.source.split("/d/")[1].split("/")[0]: item for item in source.scan({}, "default")}
            finally:
                source.close()

        items = await asyncio.to_thread(scan)
    assert internal.served("/latest/meta-data/iam") == [], "the internal address was never requested"
    for refused in (items[planted.id], items[elsewhere.id]):
        assert refused.gone and refused.data is None
        assert "is not a Google Drive host; nothing was read from it" in (refused.error or ""), refused.error
    assert b"3,000 hours" in (next(i for i in items.values() if not i.gone).data or b"")


def test_drive_permissions_become_principals_and_fail_closed():
    assert principals([user("Carol@Example.com"), group("Support@Example.com", "commenter"),
                       domain("example.com"), domain("partner.org", discoverable=False), anyone(False),
                       anyone(True)]) == ["domain:example.com", "group:support@example.com", "user:carol@example.com"]
    assert principals([anyone(True)], anyone_public=True) == ["public"]
    assert principals([anyone(False)], anyone_public=True) == [], "a link is no grant"
    assert principals([{**user("gone@example.com"), "deleted": True}]) == []
    with pytest.raises(ReadersUnknown, match="type kbbot does not know"):
        principals([{"type": "audience", "role": "reader"}])


@pytest.mark.parametrize("entry, message", [
    ({"gdrive": {}}, "folder"),
    ({"gdrive": {"folder": "abc/../x"}}, "folder"),
    ({"gdrive": {"folder": "abc", "api_url": "ftp://x"}}, "base URL"),
    ({"gdrive": {"folder": "abc", "token": "secret"}}, "unknown setting"),
    ({"gdrive": {"folder": "abc", "subject": "not-an-email"}}, "subject"),
    ({"gdrive": {"folder": "abc"}, "acl": {"hr/": ["group:hr"]}}, "acl applies to folders and URLs"),
    ({"path": ".", "gdrive": {"folder": "abc"}}, "exactly one of path"),
])
def test_drive_settings_are_checked(tmp_path: Path, entry: dict, message: str):
    with pytest.raises(SettingsError, match=message):
        settings_with_source(tmp_path, {"name": "drive", **entry})


def test_a_key_file_is_read_and_checked(tmp_path: Path):
    from pipelines.sources.gdrive import MissingKey, service_account_info

    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "authorized_user", "client_email": "x"}))
    with pytest.raises(MissingKey, match="is not a service account key"):
        service_account_info(DriveSettings(folder="abc", service_account_file=str(key)))
    with pytest.raises(MissingKey, match="cannot read the service account key file"):
        service_account_info(DriveSettings(folder="abc", service_account_file=str(tmp_path / "none.json")))
