"""Incremental refresh of configured sources against real Weaviate and Redis: a folder and a local
website change, and the answers follow; unchanged documents cost no embedding and a 304 no download;
a refresh that dies halfway leaves the previous versions answering."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.refresh_helpers import (
    SERVICES_MISSING,
    Site,
    Stack,
    cited,
    isolated_stack,
    url_source,
)

pytestmark = pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")

FAULT_V1 = "# Fault code E-917\n\nFault E-917 means the cooling fan of the HL-D50 drive is blocked. Clean the fan grille.\n"
FAULT_V2 = ("# Fault code E-917\n\nFault E-917 means the brake resistor of the HL-D50 drive is overheating. "
            "Check the braking duty cycle.\n")
WARRANTY = "# Extended warranty\n\nThe HL-M200 motor has an extended warranty of 60 months when registered online.\n"
GREASE = "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 operating hours.\n"
VIBRATION = "# Vibration limits\n\nThe HL-M200 motor vibration must stay below 2.8 mm/s RMS at the bearing housing.\n"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with isolated_stack(tmp_path, "Refresh", {}) as s:
        yield s


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text, encoding="utf-8")


async def test_folder_changes_are_answered_deletions_never_cited_and_unchanged_files_not_embedded(stack: Stack,
                                                                                                  tmp_path: Path):
    docs = tmp_path / "docs"
    write(docs, "fault-e917.md", FAULT_V1)
    write(docs, "warranty.md", WARRANTY)
    write(docs, "grease.txt", GREASE)
    (docs / "drafts").mkdir()
    write(docs / "drafts", "draft.md", "# Draft\n\nNot for customers.\n")
    stack.settings.sources[0].exclude = ["drafts/**"]
    refresher = stack.refresher
    assert refresher is not None

    first = await refresher.run("docs")
    assert first is not None and first.ok
    assert (first.added, first.changed, first.removed, first.failed) == (3, 0, 0, [])
    embedded = stack.embedded
    assert embedded >= 3
    version_1 = first.knowledge_version

    answer = await stack.ask("What does fault E-917 mean?")
    assert answer.outcome.value == "answered", answer.text
    assert "fault-e917.md" in cited(answer) and "cooling fan" in answer.text

    write(docs, "fault-e917.md", FAULT_V2)  # changed
    (docs / "warranty.md").unlink()  # deleted at the source
    write(docs, "vibration.md", VIBRATION)  # new
    second = await refresher.run("docs")
    assert second is not None and second.ok
    assert (second.added, second.changed, second.removed, second.unchanged) == (1, 1, 1, 1)
    records = {Path(r.doc_id).name: r for r in stack.runtime.store.records().values()}
    assert set(records) == {"fault-e917.md", "grease.txt", "vibration.md"}
    assert records["grease.txt"].version == 1, "the unchanged file was not published again"
    assert records["fault-e917.md"].version == 2
    new_chunks = records["fault-e917.md"].chunks + records["vibration.md"].chunks
    assert stack.embedded - embedded == new_chunks, "only the changed and the new file were embedded"
    assert second.knowledge_version == version_1 + 1

    answer = await stack.ask("What does fault E-917 mean?")
    assert answer.outcome.value == "answered"
    assert "brake resistor" in answer.text and "cooling fan" not in answer.text
    [citation] = [c for c in answer.citations if c.doc_id.endswith("fault-e917.md")]
    assert citation.version == 2
    for question in ("How long is the extended warranty of the HL-M200?", "HL-M200 extended warranty 60 months"):
        answer = await stack.ask(question)
        assert "warranty.md" not in cited(answer), "a deleted document is never cited again"
        assert "60 months" not in answer.text

    embedded = stack.embedded
    third = await refresher.run("docs")
    assert third is not None and (third.added, third.changed, third.removed, third.unchanged) == (0, 0, 0, 3)
    assert stack.embedded == embedded and third.knowledge_version == second.knowledge_version

    last = await refresher.last_run("docs")
    assert last is not None and last.to_dict() == third.to_dict(), "the last run is kept in Redis"


async def test_url_source_pages_and_sitemap_with_conditional_requests_and_clear_errors(stack: Stack):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        site.set("/e917.html", f"<html><head><title>E-917</title></head><body><article><h1>Fault E-917</h1>"
                               f"<p>{FAULT_V1.splitlines()[2]}</p></article></body></html>")
        site.set("/grease.md", GREASE, content_type="text/markdown", etag=False)  # Last-Modified only
        site.set("/vibration.html", f"<html><body><article><h1>Vibration</h1><p>{VIBRATION.splitlines()[2]}</p>"
                                    "</article></body></html>")
        site.set("/sitemap.xml", '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 f"<url><loc>{site.url('/vibration.html')}</loc></url>"
                                 f"<url><loc>{site.url('/missing.html')}</loc></url></urlset>",
                 content_type="application/xml")
        site.set("/broken-sitemap.xml", "<urlset><url><loc>oops", content_type="application/xml")
        site.set("/not-a-sitemap.xml", "<html><body>hello</body></html>", content_type="application/xml")
        site.set("/slow.html", "<html><body><p>late</p></body></html>", delay_s=5)
        site.set("/huge.html", "<html><body>" + "<p>lorem ipsum</p>" * 100_000 + "</body></html>")
        site.set("/logo.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, content_type="image/png")
        stack.settings.refresh.max_download_mb = 1
        urls = ["/e917.html", "/grease.md", "/sitemap.xml", "/broken-sitemap.xml", "/not-a-sitemap.xml",
                "/slow.html", "/huge.html", "/logo.png"]
        stack.settings.sources = [url_source("site", [site.url(u) for u in urls]
                                             + ["http://127.0.0.1:9/refused.html"])]

        first = await refresher.run("site")
        assert first is not None and first.added == 3, first
        # A host that cannot be reached has no readable robots.txt: the run says so (RFC 9309: disallowed).
        assert not first.ok and (first.error or "").startswith("robots.txt of http://127.0.0.1:9 unreachable "
                                                               "(cannot connect")
        reasons = {f["source"].removeprefix(site.base): f["reason"] for f in first.failed}
        assert set(reasons) == {"/missing.html", "/broken-sitemap.xml", "/not-a-sitemap.xml", "/slow.html",
                                "/huge.html", "/logo.png", "http://127.0.0.1:9/refused.html"}, reasons
        assert reasons["/missing.html"].startswith("HTTP 404")
        assert reasons["/broken-sitemap.xml"].startswith("not a sitemap: invalid XML")
        assert reasons["/not-a-sitemap.xml"] == ("not a sitemap: the root element is <html>, expected <urlset> "
                                                 "or <sitemapindex>")
        assert reasons["/slow.html"].startswith("timed out after 2 s")
        assert reasons["/huge.html"].startswith("too large (1.8 MB > 1.0 MB limit)")
        assert reasons["/logo.png"] == "unsupported content type image/png"
        assert "robots.txt of http://127.0.0.1:9 is unreachable (cannot connect" in reasons[
            "http://127.0.0.1:9/refused.html"]

        answer = await stack.ask("What does fault E-917 mean?")
        assert answer.outcome.value == "answered" and site.url("/e917.html") in cited(answer)
        assert "cooling fan" in answer.text

        # Nothing changed: every page answers 304 to its validators and costs no download.
        embedded = stack.embedded
        served_before = len(site.log)
        second = await refresher.run("site")
        assert second is not None and (second.added, second.changed, second.unchanged) == (0, 0, 3), second.failed
        again = site.log[served_before:]
        for path in ("/e917.html", "/grease.md", "/vibration.html", "/sitemap.xml"):
            [hit] = [s for s in again if s.path == path]
            assert (hit.status, hit.body_bytes, hit.conditional) == (304, 0, True), (path, hit)
        assert stack.embedded == embedded

        # A page changes, another disappears from the server.
        site.set("/e917.html", f"<html><head><title>E-917</title></head><body><article><h1>Fault E-917</h1>"
                               f"<p>{FAULT_V2.splitlines()[2]}</p></article></body></html>")
        del site.pages["/grease.md"]
        third = await refresher.run("site")
        assert third is not None and (third.added, third.changed, third.removed, third.unchanged) == (0, 1, 1, 1)
        answer = await stack.ask("What does fault E-917 mean?")
        assert "brake resistor" in answer.text and "cooling fan" not in answer.text
        answer = await stack.ask("How much polyurea grease do the HL-M300 bearings need?")
        assert site.url("/grease.md") not in cited(answer) and "polyurea" not in answer.text

        # The sitemap stops listing a page: it is revoked.
        site.set("/sitemap.xml", '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 "</urlset>", content_type="application/xml")
        fourth = await refresher.run("site")
        assert fourth is not None and fourth.removed == 1
        assert set(stack.runtime.store.records()) == {site.url("/e917.html")}


async def test_a_sitemap_outage_neither_revokes_nor_freezes_its_pages(stack: Stack):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        site.set("/vibration.html", f"<html><body><article><p>{VIBRATION.splitlines()[2]}</p></article></body></html>")
        site.set("/sitemap.xml", '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 f"<url><loc>{site.url('/vibration.html')}</loc></url></urlset>",
                 content_type="application/xml")
        stack.settings.sources = [url_source("site", [site.url("/sitemap.xml")])]
        assert (await refresher.run("site")).added == 1  # type: ignore[union-attr]
        del site.pages["/sitemap.xml"]
        site.set("/vibration.html", f"<html><body><article><p>{VIBRATION.splitlines()[2]} Measure it monthly."
                                    "</p></article></body></html>")
        run = await refresher.run("site")
        assert run is not None and run.removed == 0 and run.changed == 1
        assert [f["source"] for f in run.failed] == [site.url("/sitemap.xml")]
        assert run.failed[0]["reason"].startswith("HTTP 404")


async def test_a_refresh_killed_halfway_leaves_the_previous_versions_answering(stack: Stack, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch):
    docs = tmp_path / "docs"
    write(docs, "a-fault-e917.md", FAULT_V1)
    write(docs, "b-grease.txt", GREASE)
    refresher = stack.refresher
    assert refresher is not None
    assert (await refresher.run("docs")).added == 2  # type: ignore[union-attr]
    version = stack.runtime.store.knowledge_version

    write(docs, "a-fault-e917.md", FAULT_V2)
    write(docs, "b-grease.txt", GREASE.replace("20 g of polyurea", "35 g of lithium-complex"))

    class Killed(BaseException):
        """What a dying worker looks like from inside: nothing after it runs."""

    embedder = stack.runtime.document_embedder
    real_run = embedder.run

    def dies_on_the_grease_file(documents):  # noqa: ANN001, ANN202
        if any("lithium-complex" in (d.content or "") for d in documents):
            raise Killed()
        return real_run(documents)

    monkeypatch.setattr(embedder, "run", dies_on_the_grease_file)
    with pytest.raises(Killed):
        await refresher.run("docs")

    # The document published before the kill is whole at its new version; the other one is whole
    # at its previous version; the lock is free again.
    records = {Path(r.doc_id).name: r for r in stack.runtime.store.records().values()}
    assert (records["a-fault-e917.md"].version, records["b-grease.txt"].version) == (2, 1)
    answer = await stack.ask("How much grease do the HL-M300 bearings need?")
    assert answer.outcome.value == "answered" and "b-grease.txt" in cited(answer)
    assert "20 g of polyurea" in answer.text and "lithium" not in answer.text
    assert stack.runtime.store.knowledge_version == version + 1  # what was published is committed
    assert not await refresher.lock().locked()  # type: ignore[attr-defined]

    # A document whose indexing raises an ordinary error fails alone, with its reason; the next run heals.
    def breaks_on_the_grease_file(documents):  # noqa: ANN001, ANN202
        if any("lithium-complex" in (d.content or "") for d in documents):
            raise RuntimeError("embedding service answered 500")
        return real_run(documents)

    monkeypatch.setattr(embedder, "run", breaks_on_the_grease_file)
    run = await refresher.run("docs")
    assert run is not None and run.ok and run.unchanged == 1
    [failure] = run.failed
    assert failure["source"].endswith("b-grease.txt") and "embedding service answered 500" in failure["reason"]
    answer = await stack.ask("How much grease do the HL-M300 bearings need?")
    assert "20 g of polyurea" in answer.text

    monkeypatch.setattr(embedder, "run", real_run)
    run = await refresher.run("docs")
    assert run is not None and (run.changed, run.failed) == (1, [])
    answer = await stack.ask("How much grease do the HL-M300 bearings need?")
    assert "35 g of lithium-complex" in answer.text


async def test_a_missing_folder_fails_the_run_and_revokes_nothing(stack: Stack, tmp_path: Path):
    docs = tmp_path / "docs"
    write(docs, "grease.txt", GREASE)
    refresher = stack.refresher
    assert refresher is not None
    assert (await refresher.run("docs")).added == 1  # type: ignore[union-attr]
    docs.rename(tmp_path / "unmounted")
    run = await refresher.run("docs")
    assert run is not None and not run.ok and "no such file or folder" in (run.error or "")
    assert len(stack.runtime.store.records()) == 1, "an unreadable source is not an empty one"
    assert (await refresher.last_run("docs")).error == run.error  # type: ignore[union-attr]
