"""A SharePoint source against a local Microsoft Graph (tests/fakes/graph.py: sites, drives, delta,
permissions, content redirects; the login service over HTTPS for the real MSAL), on real Weaviate and
Redis: a library's folder indexed and cited by the files' web URLs, a second run with nothing changed
costing one delta call, edits, deletions, moves and renames followed (a folder moved into the folder has
its files listed in the same run), site pages read as HTML by the readers named (held back with none), a sharing change moving readers
without embedding, throttling waited out, and an expired secret, revoked consent, a file that fails to
convert, one too large and a delta token Graph forgot each giving a clear line while the rest stands."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.settings import SourceSettings
from pipelines.sources.sharepoint import SharePointSettings
from pipelines.sources.sharepoint.permissions import SharePointReaders
from tests.fakes.graph import (
    FakeDrive,
    FakeGraph,
    group_permission,
    link_permission,
    site_group,
    site_user_permission,
    user_permission,
)
from tests.office_files import write_docx
from tests.refresh_helpers import SERVICES_MISSING, Stack, isolated_stack

EVERYONE = site_user_permission("c:0-.f|rolemanager|spo-grid-all-users/0d1e2f30", name="Everyone except external users")
PUMP = b"# HL-K8 pump\n\nThe HL-K8 pump impeller must be inspected every 3,000 operating hours.\n"
FAN = b"# HL-K8 fan\n\nThe HL-K8 condenser fan runs at 1,450 rpm at full load.\n"
VALVE = b"# HL-K8 valve\n\nThe HL-K8 relief valve opens at 16 bar.\n"
ROADMAP = b"# Roadmap\n\nThe HL-K9 compressor ships in spring.\n"
SECRET = "KBBOT_TEST_SHAREPOINT_SECRET"


def sharepoint_source(graph: FakeGraph, **options: Any) -> SourceSettings:
    # The console asks as no one in particular: what the whole organisation reads is public here.
    options.setdefault("organization_readers", ["public"])
    options.setdefault("site", "https://contoso.sharepoint.com/sites/service")
    options.setdefault("folder", "Manuals")
    settings = SharePointSettings(tenant_id=graph.tenant_id, client_id=graph.app_id, client_secret_env=SECRET,
                                  graph_url=graph.graph_url, login_url=graph.login_url,
                                  download_hosts=["localhost"], max_retry_wait_s=5, **options)
    return SourceSettings(name="service", sharepoint=settings, interval="1h")


@dataclass
class World:
    graph: FakeGraph
    docs: FakeDrive
    stack: Stack

    def doc(self, item) -> str:
        return f"sharepoint:service:{self.docs.id}:{item.id}"

    def readers(self, item) -> list[str]:
        return self.stack.runtime.store.record(self.doc(item)).readers

    async def run(self, **options: Any):
        record = await self.stack.refresher.run("service", **options)
        assert record is not None
        return record

    def calls_since(self, mark: int) -> list[str]:
        return [c.path for c in self.graph.calls[mark:]]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    async with FakeGraph(tls=True) as graph:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", graph.ca_file)  # MSAL's requests trusts the fake login
        monkeypatch.setenv(SECRET, graph.app_secret)
        site = graph.add_site("contoso.sharepoint.com", "sites/service", permissions=[EVERYONE])
        docs = graph.add_drive("Documents", site=site)
        async with isolated_stack(tmp_path, "SharePoint") as stack:
            stack.settings.refresh.allow_hosts = ["127.0.0.1", "localhost"]
            stack.settings.sources = [sharepoint_source(graph)]
            yield World(graph, docs, stack)


async def test_a_folder_is_indexed_cited_by_web_url_and_refreshed_by_delta(world: World, tmp_path: Path):
    graph, docs = world.graph, world.docs
    pump = graph.add_file(docs, "Manuals/Pumps/HL-K8 pump.md", PUMP)
    fan = graph.add_file(docs, "Manuals/HL-K8 fan.md", FAN)
    valve = graph.add_file(docs, "Manuals/HL-K8 valve.md", VALVE)
    gearbox = graph.add_file(docs, "Manuals/Gearbox manual.docx", write_docx(tmp_path / "g.docx").read_bytes())
    graph.add_file(docs, "Plans/roadmap.md", ROADMAP)  # outside the folder
    graph.add_file(docs, "Manuals/photo.png", b"\x89PNG not indexed")

    first = await world.run()
    assert first.ok and (first.added, first.failed) == (4, []), first
    answer = await world.stack.ask("How often must the HL-K8 pump impeller be inspected?")
    top = answer.citations[0]
    assert top.source == pump.web_url and top.url == pump.web_url
    assert top.source.startswith("https://contoso.sharepoint.com/sites/service/Documents/Manuals/Pumps/")
    assert top.title == "HL-K8 pump", "the file's name without its suffix"
    answer = await world.stack.ask("How often must the HL-X900 gear oil be changed?")
    assert answer.citations and answer.citations[0].title == "Gearbox manual"
    assert all("HL-K9" not in c.title for c in (await world.stack.ask("When does the HL-K9 ship?")).citations)
    assert graph.downloads and not any(with_token for _, with_token in graph.downloads), \
        "the download URL is pre-authenticated: the app's token never goes there"

    # Nothing changed: one delta call for the drive, nothing else (drive and folder ids were kept).
    mark, embedded = len(graph.calls), world.stack.embedded
    second = await world.run()
    assert second.ok and (second.unchanged, second.added, second.changed, second.removed) == (4, 0, 0, 0), second
    assert world.calls_since(mark) == [f"/v1.0/drives/{docs.id}/root/delta"]
    assert world.stack.embedded == embedded

    # An edit re-reads only that file: its permissions, its content; nothing else is embedded again.
    graph.edit(fan, FAN.replace(b"1,450", b"1,720"))
    mark = len(graph.calls)
    third = await world.run()
    assert third.ok and (third.changed, third.unchanged) == (1, 3), third
    assert world.calls_since(mark) == [f"/v1.0/drives/{docs.id}/root/delta",
                                       f"/v1.0/drives/{docs.id}/items/{fan.id}/permissions",
                                       f"/v1.0/drives/{docs.id}/items/{fan.id}/content"]
    answer = await world.stack.ask("At what speed does the HL-K8 condenser fan run?")
    assert answer.citations[0].source == fan.web_url and "1,720" in answer.text

    # A deletion, a move out of the folder, a rename to a type not indexed: each is revoked.
    graph.delete(valve)
    graph.move(pump, "Archive")
    graph.rename(gearbox, "Gearbox manual.docx.bak")
    fourth = await world.run()
    assert fourth.ok and (fourth.removed, fourth.unchanged) == (3, 1), fourth
    for question in ("At what pressure does the HL-K8 relief valve open?",
                     "How often must the HL-K8 pump impeller be inspected?",
                     "How often must the HL-X900 gear oil be changed?"):
        answer = await world.stack.ask(question)
        assert {c.source for c in answer.citations} <= {fan.web_url}, question

    # Back into the folder: indexed again.
    graph.move(pump, "Manuals")
    assert (await world.run()).added == 1


async def test_a_folder_moved_into_the_folder_has_its_files_indexed_in_the_same_run(world: World):
    graph, docs = world.graph, world.docs
    graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    fan = graph.add_file(docs, "Incoming/Cooling/HL-K8 fan.md", FAN, permissions=[user_permission("alice@contoso.com")])
    valve = graph.add_file(docs, "Incoming/Cooling/Valves/HL-K8 valve.md", VALVE)
    assert (await world.run()).added == 1

    # Graph's delta names the moved folder only; its files (one a folder deeper) come from its children,
    # a page of one at a time here.
    cooling = docs.path_of("Incoming/Cooling")
    assert cooling is not None
    graph.move(cooling, "Manuals")
    graph.default_page_size = 1
    mark = len(graph.calls)
    record = await world.run()
    assert record.ok and (record.added, record.unchanged, record.failed) == (2, 1, []), record
    assert world.readers(fan) == ["user:alice@contoso.com"] and world.readers(valve) == ["public"]
    children = [c for c in graph.calls[mark:] if c.path.endswith("/children")]
    assert {c.path.split("/")[-2] for c in children} == {cooling.id, docs.path_of("Manuals/Cooling/Valves").id}
    assert any("$skiptoken" in c.query for c in children), "the children are paged"
    answer = await world.stack.ask("At what pressure does the HL-K8 relief valve open?")
    assert answer.citations and answer.citations[0].source == valve.web_url == docs.web_url + \
        "/Manuals/Cooling/Valves/HL-K8%20valve.md"

    # Nothing moved since: one delta call, no listing.
    mark = len(graph.calls)
    assert (await world.run()).unchanged == 3
    assert world.calls_since(mark) == [f"/v1.0/drives/{docs.id}/root/delta"]

    # Out again: both revoked, by the folder's move alone.
    graph.move(cooling, "Incoming")
    record = await world.run()
    assert record.ok and (record.removed, record.unchanged) == (2, 1), record
    assert {c.source for c in (await world.stack.ask("At what pressure does the HL-K8 relief valve open?")).citations
            } & {valve.web_url, fan.web_url} == set()


async def test_a_sharing_change_moves_readers_in_place_without_embedding(world: World):
    graph, docs = world.graph, world.docs
    pump = graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    fan = graph.add_file(docs, "Manuals/Restricted/HL-K8 fan.md", FAN)
    assert (await world.run()).added == 2
    assert world.readers(pump) == ["public"]

    embedded = world.stack.embedded
    graph.share(pump, [user_permission("Alice@Contoso.com"), group_permission("6f1c3a3e-0000-4000-8000-00000000f00d")])
    record = await world.run()
    assert record.ok and record.permissions == 1 and (record.changed, record.added) == (0, 0), record
    assert world.readers(pump) == ["group:6f1c3a3e-0000-4000-8000-00000000f00d", "user:alice@contoso.com"]
    assert world.stack.embedded == embedded
    assert not (await world.stack.ask("How often must the HL-K8 pump impeller be inspected?")).citations

    # A folder's permissions change: its files inherit them, which delta does not report for each file;
    # a permissions-only run reads them without a delta call (the delta link stays for the next run).
    folder = graph.add_folder(docs, "Manuals/Restricted", permissions=[site_group("Service Owners")])
    mark = len(graph.calls)
    record = await world.run(permissions_only=True)
    assert record.ok and record.permissions == 1, record
    assert world.readers(fan) == ["group:https://contoso.sharepoint.com/sites/service::service owners"]
    assert not [p for p in world.calls_since(mark) if p.endswith(("/delta", "/content"))]
    assert world.stack.embedded == embedded
    assert folder.id
    record = await world.run()  # the folder's change comes through delta now, and changes nothing more
    assert record.ok and (record.unchanged, record.permissions) == (2, 0), record


MEMBERS = "group:5a7e0c11-0000-4000-8000-00000000a11d"


async def test_site_pages_are_indexed_as_html_read_by_the_readers_named(world: World):
    graph, docs = world.graph, world.docs
    site = next(iter(graph.sites.values()))
    graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    safety = graph.add_page(site, "Site safety", ["<p>Hearing protection is required in <b>hall 4</b>.</p>"],
                            vertical=["<p>Questions: the safety desk, extension 4410.</p>"],
                            others=[{"@odata.type": "#microsoft.graph.standardWebPart", "id": "w1",
                                     "webPartType": "d1d91016-032f-456d-98a4-721247c305e8",
                                     "data": {"title": "Image", "serverProcessedContent": {}}}])
    shifts = graph.add_page(site, "Shift handover", ["<h2>Handover</h2><p>The night shift hands over at 06:15.</p>"])
    broken = graph.add_page(site, "Broken page", ["<p>unused</p>"])
    broken.corrupt = True
    world.stack.settings.permissions.principals = {"console:console": [MEMBERS]}
    world.stack.settings.sources = [sharepoint_source(world.graph, pages={"enabled": True, "readers": [MEMBERS]})]

    first = await world.run()
    assert first.ok and first.added == 3, first
    [line] = first.failed
    assert line["source"] == broken.web_url and "page not read" in line["reason"] and "HTTP 500" in line["reason"]
    assert not [c for c in graph.calls if "canvasLayout" in c.query.get("$expand", "") and c.path.endswith("/pages/"
                "microsoft.graph.sitePage")], "the list is never expanded: one corrupt page would fail it whole"
    page_doc = f"sharepoint:service:page:{safety.id}"
    assert world.stack.runtime.store.record(page_doc).readers == [MEMBERS]
    answer = await world.stack.ask("Which extension does the safety desk have?")
    assert answer.citations and answer.citations[0].source == safety.web_url
    assert answer.citations[0].title == "Site safety" and "4410" in answer.text
    answer = await world.stack.ask("At what time does the night shift hand over?")
    assert answer.citations[0].source == shifts.web_url and answer.citations[0].url == shifts.web_url

    # Nothing changed: the delta and the pages' list, nothing read (the broken page is tried again).
    broken.corrupt = False
    broken.deleted = True
    mark, embedded = len(graph.calls), world.stack.embedded
    second = await world.run()
    assert second.ok and (second.unchanged, second.added, second.failed) == (3, 0, []), second
    assert world.calls_since(mark) == [f"/v1.0/drives/{docs.id}/root/delta",
                                       f"/v1.0/sites/{site['id']}/pages/microsoft.graph.sitePage"]
    assert world.stack.embedded == embedded

    # An edited page is read again, alone; a page no longer listed is revoked.
    graph.edit_page(shifts, ["<p>The night shift hands over at 05:45.</p>"])
    safety.deleted = True
    mark = len(graph.calls)
    third = await world.run()
    assert third.ok and (third.changed, third.removed, third.unchanged) == (1, 1, 1), third
    assert world.calls_since(mark)[2:] == [f"/v1.0/sites/{site['id']}/pages/{shifts.id}/microsoft.graph.sitePage"]
    assert "05:45" in (await world.stack.ask("At what time does the night shift hand over?")).text
    assert not (await world.stack.ask("Which extension does the safety desk have?")).citations

    # A permissions-only run keeps the pages (no page call), with the readers configured now.
    world.stack.settings.sources = [sharepoint_source(world.graph, pages={"enabled": True,
                                                                          "readers": [MEMBERS, "user:bo@contoso.com"]})]
    mark = len(graph.calls)
    record = await world.run(permissions_only=True)
    assert record.ok and record.removed == 0 and record.permissions == 1, record
    assert not [p for p in world.calls_since(mark) if "/pages" in p]
    assert world.stack.runtime.store.record(f"sharepoint:service:page:{shifts.id}").readers == [
        MEMBERS, "user:bo@contoso.com"]

    # Pages turned off: revoked; the files stand.
    world.stack.settings.sources = [sharepoint_source(world.graph)]
    record = await world.run()
    assert record.ok and (record.removed, record.unchanged) == (1, 1), record


async def test_site_pages_without_readers_are_held_back_and_an_unlisted_site_keeps_them(world: World):
    graph = world.graph
    site = next(iter(graph.sites.values()))
    graph.add_file(world.docs, "Manuals/HL-K8 pump.md", PUMP)
    graph.add_page(site, "Shift handover", ["<p>The night shift hands over at 06:15.</p>"])
    world.stack.settings.sources = [sharepoint_source(graph, pages={"enabled": True})]
    record = await world.run()
    assert record.ok and record.added == 2, record
    [(reason, count)] = record.held.items()
    assert count == 1 and "sharepoint.pages.readers" in reason, record.held
    assert not (await world.stack.ask("At what time does the night shift hand over?")).citations

    # The pages cannot be listed (the app's consent does not reach them): a line, and they stand.
    world.stack.settings.sources = [sharepoint_source(graph, pages={"enabled": True, "readers": ["public"]})]
    graph.pages_forbidden = True
    record = await world.run()
    assert record.ok and record.removed == 0 and record.permissions == 1, record
    [line] = record.failed
    assert "pages could not be listed" in line["reason"] and "HTTP 403" in line["reason"], line
    assert (await world.stack.ask("At what time does the night shift hand over?")).citations


async def test_throttling_is_waited_out_as_retry_after_asks(world: World):
    world.graph.add_file(world.docs, "Manuals/HL-K8 pump.md", PUMP)
    world.graph.throttle(times=2, retry_after=1)
    started = time.monotonic()
    record = await world.run()
    assert record.ok and record.added == 1, record
    statuses = [c.status for c in world.graph.calls]
    assert statuses[:3] == [429, 429, 200]
    assert world.graph.calls[2].at - world.graph.calls[1].at >= 0.95
    assert time.monotonic() - started >= 2

    world.graph.throttle(times=1, retry_after=3600)
    record = await world.run()
    assert not record.ok and "throttled" in record.error and "3600" in record.error and record.removed == 0
    assert (await world.stack.ask("How often must the HL-K8 pump impeller be inspected?")).citations


async def test_an_expired_secret_or_revoked_consent_fails_the_run_and_revokes_nothing(world: World,
                                                                                      monkeypatch: pytest.MonkeyPatch):
    world.graph.add_file(world.docs, "Manuals/HL-K8 pump.md", PUMP)
    assert (await world.run()).added == 1

    world.graph.expire_secret()
    record = await world.run()
    assert not record.ok and "AADSTS7000222" in record.error and "expired" in record.error, record.error
    assert record.removed == 0 and world.graph.app_secret not in record.error
    world.graph.expire_secret(False)

    world.graph.forbid()
    record = await world.run()
    assert not record.ok and "HTTP 403" in record.error and "Files.Read.All" in record.error, record.error
    assert record.removed == 0
    world.graph.forbid(False)

    monkeypatch.delenv(SECRET)
    record = await world.run()
    assert not record.ok and SECRET in record.error and record.removed == 0
    assert (await world.stack.ask("How often must the HL-K8 pump impeller be inspected?")).citations


async def test_a_broken_or_too_large_file_is_a_clear_line_and_the_rest_is_indexed(world: World):
    graph, docs = world.graph, world.docs
    world.stack.settings.indexing.max_file_mb = 1
    graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    broken = graph.add_file(docs, "Manuals/broken.docx", b"PK\x03\x04 not a zip at all")
    huge = graph.add_file(docs, "Manuals/scan.pdf", b"%PDF-1.4", size=300 * 1024 * 1024)
    record = await world.run()
    assert record.ok and record.added == 1, record
    reasons = {f["source"]: f["reason"] for f in record.failed}
    assert "Word" in reasons[broken.web_url], reasons
    assert "too large" in reasons[huge.web_url] and "300.0 MB" in reasons[huge.web_url], reasons
    assert not any(p.endswith(f"/download/{docs.id}/{huge.id}") for p, _ in graph.downloads)
    assert "2 failed" in record.summary()
    # Tried again each run (its content is not indexed), with the same line; the rest costs nothing.
    again = await world.run()
    assert again.ok and again.unchanged == 1 and len(again.failed) == 2, again


async def test_a_delta_token_graph_forgot_means_one_full_resync(world: World):
    graph, docs = world.graph, world.docs
    pump = graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    fan = graph.add_file(docs, "Manuals/HL-K8 fan.md", FAN)
    valve = graph.add_file(docs, "Manuals/HL-K8 valve.md", VALVE)
    assert (await world.run()).added == 3
    graph.edit(fan, FAN.replace(b"1,450", b"1,720"))
    graph.delete(valve)
    graph.expire_delta_tokens(docs)
    embedded = world.stack.embedded
    mark = len(graph.calls)
    record = await world.run()
    assert record.ok and (record.changed, record.removed, record.unchanged) == (1, 1, 1), record
    [line] = record.failed
    assert "no longer accepted" in line["reason"] and "read in full once again" in line["reason"], line
    assert "resyncChangesApplyDifferences" in line["reason"]
    deltas = [c for c in graph.calls[mark:] if c.path.endswith("/delta")]
    assert [c.status for c in deltas] == [410, 200], "one resync"
    assert world.stack.embedded > embedded
    assert sum(1 for p in world.calls_since(mark) if p.endswith("/content")) == 1, "only the edited file"
    assert pump.id
    # The new link works: the next run is one delta call again.
    mark = len(graph.calls)
    record = await world.run()
    assert record.ok and record.failed == [] and world.calls_since(mark) == [f"/v1.0/drives/{docs.id}/root/delta"]


async def test_a_download_url_off_sharepoint_hosts_is_refused(world: World):
    graph, docs = world.graph, world.docs
    pump = graph.add_file(docs, "Manuals/HL-K8 pump.md", PUMP)
    graph.add_file(docs, "Manuals/HL-K8 fan.md", FAN)
    graph.download_root = f"http://metadata.internal.example:{graph.root_url.rsplit(':', 1)[1]}"
    record = await world.run()
    assert record.ok and record.added == 0, record
    reasons = {f["source"]: f["reason"] for f in record.failed}
    assert "refused" in reasons[pump.web_url] and "metadata.internal.example" in reasons[pump.web_url]
    assert graph.downloads == []

    # A SharePoint host name is not enough: it must also resolve to a public address (the network guard).
    graph.download_root = graph.root_url.replace("127.0.0.1", "localhost")
    world.stack.settings.refresh.allow_hosts = ["127.0.0.1"]
    record = await world.run()
    assert record.added == 0 and all("loopback" in f["reason"] for f in record.failed), record.failed
    assert graph.downloads == []

    world.stack.settings.refresh.allow_hosts = ["127.0.0.1", "localhost"]
    graph.download_root = None
    assert (await world.run()).added == 2


async def test_a_onedrive_with_a_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    from tests.fakes.graph import tls_files

    cert_path, key_path = tls_files()  # any RSA certificate does: the app registration holds its public half
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    thumbprint = cert.fingerprint(hashes.SHA1()).hex().upper()  # noqa: S303 - Entra's thumbprints are SHA-1
    async with FakeGraph(tls=True) as graph:
        graph.add_certificate(cert.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo),
                              thumbprint)
        graph.app_secret = "not-used"
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", graph.ca_file)
        monkeypatch.setenv("KBBOT_TEST_SHAREPOINT_KEY", key_path.read_text())
        drive = graph.add_drive("OneDrive", user="li.wei@contoso.com")
        notes = graph.add_file(drive, "Notes/HL-K8 pump.md", PUMP)
        async with isolated_stack(tmp_path, "OneDrive") as stack:
            stack.settings.refresh.allow_hosts = ["127.0.0.1", "localhost"]
            stack.settings.permissions.principals = {"console:console": ["user:li.wei@contoso.com"]}
            settings = SharePointSettings(tenant_id=graph.tenant_id, client_id=graph.app_id,
                                          certificate_env="KBBOT_TEST_SHAREPOINT_KEY",
                                          certificate_thumbprint=":".join(thumbprint[i:i + 2] for i in range(0, 40, 2)),
                                          user="li.wei@contoso.com", graph_url=graph.graph_url,
                                          login_url=graph.login_url, download_hosts=["localhost"])
            stack.settings.sources = [SourceSettings(name="li", sharepoint=settings, interval="1h")]
            record = await stack.refresher.run("li")
            assert record is not None and record.ok and record.added == 1, record
            assert stack.runtime.store.record(f"sharepoint:li:{drive.id}:{notes.id}").readers == [
                "user:li.wei@contoso.com"]
            assert "/v1.0/users/li.wei@contoso.com/drive" in [c.path for c in graph.calls]


def test_graph_permissions_become_principals_and_unknown_readers_are_nobody():
    readers = SharePointReaders(site_groups={"Service Members": ["group:6f1c3a3e"]})
    site = "https://contoso.sharepoint.com/sites/Service"
    assert readers.of([link_permission("organization")], site) == (["sharepoint:organization"], "")
    # Anyone with the link: not public unless the operator says so; the people it was sent to read it.
    assert readers.of([link_permission("anonymous", recipients=("bo@contoso.com",))], site) == (
        ["user:bo@contoso.com"], "")
    assert SharePointReaders(anyone_public=True).of([link_permission("anonymous")], site) == (["public"], "")
    found, held = readers.of([link_permission("anonymous")], site)
    assert found == [] and "held back" in held
    assert readers.of([site_group("Service Members")], site)[0] == [
        "group:6f1c3a3e", "group:https://contoso.sharepoint.com/sites/service::service members"]
    assert readers.of([site_user_permission("i:0#.f|membership|Ann@Contoso.com")], site)[0] == ["user:ann@contoso.com"]
    assert readers.of([site_user_permission("c:0t.c|tenant|6F1C3A3E-AA")], site)[0] == ["group:6f1c3a3e-aa"]
    assert readers.of([site_user_permission("c:0o.c|federateddirectoryclaimprovider|abc_o")], site)[0] == []
    assert readers.of([site_user_permission("c:0(.s|true")], site)[0] == ["sharepoint:organization"]
    assert readers.of([user_permission("")], site)[1].startswith("SharePoint grants it only to 1")
    assert readers.of([], site) == ([], readers.of([], site)[1]) and "Sites.Selected" in readers.of([], site)[1]
    application = {"id": "p", "roles": ["read"], "grantedToV2": {"application": {"id": "app"}}}
    assert readers.of([application, user_permission("a@contoso.com")], site)[0] == ["user:a@contoso.com"]


@pytest.mark.parametrize("options, message", [
    ({}, "exactly one of site"),
    ({"site": "https://c.sharepoint.com/sites/a", "user": "a@c.com"}, "exactly one of site"),
    ({"user": "a@c.com", "drives": ["Documents"]}, "a user has one OneDrive"),
    ({"site": "https://c.sharepoint.com/sites/a", "certificate_env": "K"}, "certificate_thumbprint"),
    ({"site": "ftp://c/sites/a"}, "http"),
    ({"site": "https://c.sharepoint.com/sites/a", "organization_readers": ["nobody"]}, "is not a principal"),
    ({"site": "https://c.sharepoint.com/sites/a", "client_secret": "x"}, "Extra inputs"),
    ({"user": "a@c.com", "pages": {"enabled": True}}, "a OneDrive"),
    ({"site": "https://c.sharepoint.com/sites/a", "pages": {"enabled": True, "readers": ["x"]}}, "is not a principal"),
])
def test_sharepoint_settings_are_checked(options: dict, message: str):
    with pytest.raises(ValueError, match=message):
        SharePointSettings(tenant_id="t", client_id="c", **options)
