"""A Confluence source against a local Confluence (tests/fakes/confluence_server.py), on real Weaviate
and Redis: spaces and attachments indexed and cited with their links, an unchanged page costing no
request beyond the listing, edits followed, deleted / moved / restricted pages revoked, 429 with
Retry-After waited out, and a token or limit problem failing the run without revoking anything."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.settings import SettingsError, SourceSettings
from pipelines.sources.confluence import ConfluenceSettings
from pipelines.sources.confluence.source import storage_to_markdown
from tests.conftest import settings_with_source
from tests.fakes.confluence_server import FakeConfluence
from tests.refresh_helpers import SERVICES_MISSING, Stack, isolated_stack

SEALS = ("<h1>Seal replacement</h1><p>The HL-K8 compressor seal must be replaced every 7,200 operating hours.</p>"
         "<h2>Torque values</h2><table><tbody><tr><th>Screw</th><th>Torque</th></tr>"
         "<tr><td>HL-K8 cover screw</td><td>14 Nm</td></tr></tbody></table>")
ALARMS = "<h1>Alarms</h1><p>Alarm K8-44 on the HL-K8 compressor means the oil separator is saturated.</p>"
NOISE = "<p>A whistling HL-K8 compressor has a leaking discharge valve; tighten the HL-K8 valve nut.</p>"
OTHER_SPACE = "<p>Secret roadmap: the HL-K9 compressor ships in spring.</p>"


def pdf_attachment() -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    for text in ("HL-K8 wiring diagram, overview page.", "The HL-K8 fan motor is wired to terminal X17."):
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())


def confluence_source(server: FakeConfluence, **options) -> SourceSettings:
    # The console asks as no one in particular: the pages of every Confluence account are public here.
    options.setdefault("everyone_readers", ["public"])
    settings = ConfluenceSettings(url=server.base_url, spaces=["OPS"], token_env="KBBOT_TEST_CONFLUENCE_TOKEN",
                                  max_retry_wait_s=5, **options)
    return SourceSettings(name="wiki", confluence=settings, interval="1h")


@pytest.fixture
async def wiki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeConfluence, Stack]]:
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "conf-token")
    with FakeConfluence(cloud=True, user="ops@example.com").run_in_thread() as server:
        async with isolated_stack(tmp_path, "Confluence") as stack:
            stack.settings.sources = [confluence_source(server, user="ops@example.com")]
            yield server, stack


async def test_a_space_is_indexed_cited_by_link_and_page_and_refreshed_by_version(wiki):
    server, stack = wiki
    seals = server.add_page("OPS", "HL-K8 seal replacement", SEALS)
    alarms = server.add_page("OPS", "HL-K8 alarms", ALARMS)
    noise = server.add_page("OPS", "HL-K8 noise", NOISE)
    moved = server.add_page("OPS", "HL-K8 moved page", "<p>The HL-K8 inlet filter mesh is 40 micron.</p>")
    server.add_page("LAB", "Roadmap", OTHER_SPACE)
    server.attach(seals, "hl-k8-wiring.pdf", pdf_attachment())
    server.attach(seals, "photo.png", b"\x89PNG not indexed")
    refresher = stack.refresher
    assert refresher is not None

    first = await refresher.run("wiki")
    assert first is not None and first.ok, first
    assert (first.added, first.failed) == (5, [])  # four pages and the PDF; the picture is no document
    assert first.formats["md"]["documents"] == 4 and first.formats["pdf"]["documents"] == 1

    answer = await stack.ask("How often must the HL-K8 compressor seal be replaced?")
    top = answer.citations[0]
    assert top.source == server.web_link(seals) and top.url == server.web_link(seals)
    assert top.title == "HL-K8 seal replacement" and top.locator.endswith("Seal replacement")
    answer = await stack.ask("Which terminal is the HL-K8 fan motor wired to?")
    wiring = next((c for c in answer.citations if "/download/attachments/" in c.source), None)
    assert wiring is not None, [(c.label, c.source) for c in answer.citations]
    assert wiring.page == 2 and wiring.locator == "p. 2"
    assert wiring.url is not None and wiring.url.endswith("#page=2") and "/download/attachments/" in wiring.url
    answer = await stack.ask("What is the HL-K9 roadmap?")
    assert all("Roadmap" not in c.title for c in answer.citations)  # another space: never indexed

    # Nothing changed: one listing of pages and one of attachments, and who may read them (the space's
    # permissions once, each page's read restrictions once); no body, no download, no embedding.
    embedded, requests = stack.embedded, len(server.log)
    second = await refresher.run("wiki")
    assert second is not None and second.ok and (second.unchanged, second.added, second.changed) == (5, 0, 0)
    since = server.log[requests:]
    assert all(status == 200 for _, status, _ in since)
    assert sum("/content/search" in p for p, _, _ in since) == 2
    assert sum("/rest/api/space/OPS" in p for p, _, _ in since) == 1
    assert sorted(p.split("/")[-4] for p, _, _ in since if "/restriction/byOperation/read" in p) == sorted(
        [seals.id, alarms.id, noise.id, moved.id])
    assert len(since) == 7
    assert stack.embedded == embedded

    # An edit, a deletion, a move to another space and a restriction.
    server.edit(alarms, "<h1>Alarms</h1><p>Alarm K8-44 on the HL-K8 compressor means the suction pressure is "
                        "too low.</p>")
    del server.pages[noise.id]
    moved.space = "LAB"
    seals.restricted = True
    third = await refresher.run("wiki")
    assert third is not None and third.ok, third
    assert (third.changed, third.removed, third.unchanged) == (1, 4, 0)  # seals, its PDF, noise, moved
    answer = await stack.ask("What does alarm K8-44 on the HL-K8 mean?")
    assert answer.citations[0].source == server.web_link(alarms)
    assert "suction pressure" in answer.text and "oil separator" not in answer.text
    for question in ("How often must the HL-K8 compressor seal be replaced?", "Why does the HL-K8 whistle?",
                     "What mesh size has the HL-K8 inlet filter?"):
        answer = await stack.ask(question)
        assert {c.source for c in answer.citations} <= {server.web_link(alarms)}, question


async def test_rate_limits_are_waited_out_as_retry_after_asks(wiki):
    server, stack = wiki
    server.add_page("OPS", "HL-K8 alarms", ALARMS)
    server.throttle(2, retry_after="1")
    started = time.monotonic()
    record = await stack.refresher.run("wiki")
    assert record is not None and record.ok and record.added == 1, record
    statuses = [status for _, status, _ in server.log]
    assert statuses[:3] == [429, 429, 200]
    assert server.log[1][2] - server.log[0][2] >= 0.95 and server.log[2][2] - server.log[1][2] >= 0.95
    assert time.monotonic() - started >= 2

    # A Retry-After beyond the longest wait allowed fails the run with the reason; nothing is revoked.
    server.throttle(1, retry_after="3600")
    record = await stack.refresher.run("wiki")
    assert record is not None and not record.ok
    assert "rate limited" in (record.error or "") and "3600" in (record.error or "") and record.removed == 0
    answer = await stack.ask("What does alarm K8-44 on the HL-K8 mean?")
    assert answer.citations and answer.citations[0].title == "HL-K8 alarms"


async def test_a_missing_or_refused_token_fails_the_run_without_revoking(wiki, monkeypatch: pytest.MonkeyPatch):
    server, stack = wiki
    server.add_page("OPS", "HL-K8 alarms", ALARMS)
    assert (await stack.refresher.run("wiki")).added == 1
    monkeypatch.delenv("KBBOT_TEST_CONFLUENCE_TOKEN")
    record = await stack.refresher.run("wiki")
    assert not record.ok and "KBBOT_TEST_CONFLUENCE_TOKEN" in record.error and record.removed == 0
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "wrong")
    record = await stack.refresher.run("wiki")
    assert not record.ok and "HTTP 401" in record.error and record.removed == 0
    assert (await stack.ask("What does alarm K8-44 on the HL-K8 mean?")).citations


async def test_data_center_with_a_bearer_token_a_cql_scope_and_pagination(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    if SERVICES_MISSING:
        pytest.skip(SERVICES_MISSING)
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "pat-123")
    with FakeConfluence(cloud=False, token="pat-123", max_limit=10).run_in_thread() as server:
        for i in range(50):  # 25 labelled: three pages of the listing, as the server serves 10 at most
            server.add_page("KB", f"Valve note {i}", f"<p>Valve RV-{i:03d} opens at {100 + i} kPa.</p>",
                            labels=["valves"] if i % 2 == 0 else [])
        async with isolated_stack(tmp_path, "ConfluenceDc") as stack:
            source = SourceSettings(name="dc", interval="1h", confluence=ConfluenceSettings(
                url=server.base_url, cql='space = KB and label = "valves"', token_env="KBBOT_TEST_CONFLUENCE_TOKEN",
                attachments=False, everyone_readers=["public"]))
            stack.settings.sources = [source]
            record = await stack.refresher.run("dc")
            assert record is not None and record.ok and record.added == 25, record
            assert len(server.requests_to("/rest/api/content/search")) == 3
            answer = await stack.ask("At what pressure does valve RV-028 open?")
            assert answer.citations[0].title == "Valve note 28" and "128 kPa" in answer.text


def test_storage_format_becomes_markdown_under_the_page_title():
    text = storage_to_markdown("Pump", SEALS)
    assert text.startswith("# Pump\n") and "\n## Seal replacement\n" in text and "\n### Torque values\n" in text
    assert "| HL-K8 cover screw | 14 Nm |" in text


@pytest.mark.parametrize("entry, message", [
    ({"confluence": {"url": "https://x.atlassian.net/wiki"}}, "exactly one of spaces"),
    ({"confluence": {"url": "https://x.atlassian.net/wiki", "spaces": ["A"], "cql": "label = x"}}, "exactly one of"),
    ({"confluence": {"url": "ftp://x", "spaces": ["A"]}}, "base URL"),
    ({"confluence": {"url": "https://x/wiki", "spaces": ["A"], "token": "secret"}}, "unknown setting"),
    ({"path": ".", "confluence": {"url": "https://x/wiki", "spaces": ["A"]}}, "exactly one of path"),
])
def test_confluence_settings_are_checked(tmp_path: Path, entry: dict, message: str):
    with pytest.raises(SettingsError, match=message):
        settings_with_source(tmp_path, {"name": "wiki", **entry})



async def test_a_pages_author_and_space_reach_its_chunks_and_name_its_owners(wiki):
    from bot.knowledge.loop.owners import owners_resolver

    server, stack = wiki
    seals = server.add_page("OPS", "HL-K8 seal replacement", SEALS, author="Grace Hopper", editor="Alan Turing")
    server.add_page("OPS", "HL-K8 alarms", ALARMS)  # by the fake's default author, Ada Author
    server.attach(seals, "hl-k8-wiring.pdf", pdf_attachment())
    record = await stack.refresher.run("wiki")
    assert record.ok, record
    answer = await stack.ask("How often must the HL-K8 compressor seal be replaced?")
    by_source = {c["source"]: c for c in answer.trace.ranked}
    top = by_source[server.web_link(seals)]
    assert top["author"] == "Grace Hopper" and top["confluence_space"] == "OPS", "the creator, not the last editor"
    wiring = next(c for c in answer.trace.ranked if "/download/attachments/" in c["source"]) \
        if any("/download/attachments/" in c["source"] for c in answer.trace.ranked) else None
    if wiring is not None:
        assert wiring["author"] == "Grace Hopper", "an attachment belongs to its page's author"

    source = stack.settings.sources[0].model_copy(update={"owners": {"author:Grace Hopper": ["U0GRACE"],
                                                                     "space:OPS": ["4242"]}})
    owners_of = owners_resolver([source], stack.settings.resolve)
    assert owners_of(top) == ["U0GRACE"], "the author's own owners first"
    alarms = {**top, "author": "Ada Author"}
    assert owners_of(alarms) == ["4242"], "else the space's"
    assert owners_of({**top, "author": None, "confluence_space": "LAB"}) == []
