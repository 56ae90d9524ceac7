"""A refresh reconciles the configuration, against real Weaviate and Redis and a local website: the
documents of a source that is renamed or removed are revoked, but only once what replaces them is
published, never while a source could not read them, and never those indexed ad hoc."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.knowledge.refresh import FileRunLog
from bot.knowledge.status import knowledge_status
from pipelines.sources.folder import FolderSource
from tests.refresh_helpers import (
    SERVICES_MISSING,
    Site,
    Stack,
    cited,
    folder_source,
    isolated_stack,
    url_source,
)

needs_services = pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")

FAULT = ("<html><head><title>E-917</title></head><body><article><h1>Fault E-917</h1><p>Fault E-917 means the "
         "cooling fan of the HL-D50 drive is blocked. Clean the fan grille.</p></article></body></html>")
GREASE = "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 operating hours.\n"
WARRANTY = "# Extended warranty\n\nThe HL-M200 motor has an extended warranty of 60 months when registered online.\n"
TORQUE = "# Terminal torque\n\nTighten the HL-M200 terminal screws to 2.5 N·m.\n"


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with isolated_stack(tmp_path, "Reconcile", {"warranty.md": WARRANTY}) as s:
        yield s


def roots(stack: Stack) -> dict[str, str | None]:
    return {doc_id: r.root for doc_id, r in stack.runtime.store.records().items()}


@needs_services
async def test_a_renamed_source_keeps_answering_throughout_and_leaves_no_orphan(stack: Stack, tmp_path: Path,
                                                                               caplog: pytest.LogCaptureFixture):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        e917, grease, torque = site.url("/e917.html"), site.url("/grease.md"), site.url("/torque.md")
        site.set("/e917.html", FAULT)
        site.set("/grease.md", GREASE, content_type="text/markdown")
        site.set("/torque.md", TORQUE, content_type="text/markdown")
        docs = stack.settings.sources[0]
        stack.settings.sources = [docs, url_source("support", [e917, grease, torque])]
        assert (await refresher.run("docs")).added == 1  # type: ignore[union-attr]
        assert (await refresher.run("support")).added == 3  # type: ignore[union-attr]

        # Renamed (and the torque page dropped on the way): until "helpdesk" has run, nothing is revoked,
        # whichever source runs first.
        stack.settings.sources = [docs, url_source("helpdesk", [e917, grease])]
        caplog.set_level(logging.INFO, logger="kbbot.refresh")
        other = await refresher.run("docs")
        assert other is not None and other.ok and other.orphaned == 0
        assert set(roots(stack).values()) == {"urls:support", docs.path}
        assert any("3 documents of sources no longer configured (urls:support) are kept until helpdesk completed "
                   "a run" in r.getMessage() for r in caplog.records)

        # While the renamed source runs, every page stays answerable: each is published under the new name
        # before the old one goes, and the orphan is revoked only after that, in the same run.
        for page in ("/e917.html", "/grease.md"):
            site.pages[page].delay_s = 0.3
        seen_missing: list[set[str]] = []

        async def watch() -> None:
            while True:
                present = set(stack.runtime.store.records())
                if not {e917, grease} <= present:
                    seen_missing.append({e917, grease} - present)
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        run = asyncio.create_task(refresher.run("helpdesk"))
        try:
            answer = await stack.ask("What does fault E-917 mean?")
            record = await run
        finally:
            watcher.cancel()
        assert answer.outcome.value == "answered" and "cooling fan" in answer.text
        assert seen_missing == [], "a page of the renamed source was missing for a moment"
        assert record is not None and record.ok
        assert (record.changed, record.orphaned, record.removed) == (2, 1, 0), record
        assert "1 removed with a source no longer configured" in record.summary()
        assert roots(stack) == {e917: "urls:helpdesk", grease: "urls:helpdesk",
                                str(Path(docs.path or "") / "warranty.md"): docs.path}, "no orphan is left"
        answer = await stack.ask("What torque for the HL-M200 terminal screws?")
        assert torque not in cited(answer) and "2.5 N·m" not in answer.text
        assert any(r.getMessage().startswith("refresh source=helpdesk trigger=manual status=ok")
                   and "orphaned=1 disallowed=0" in r.getMessage() for r in caplog.records)
        assert any("revoking 1 documents of urls:support, which is no configured source's" in r.getMessage()
                   for r in caplog.records)

        status = await knowledge_status(stack.settings, store=stack.runtime.store, runs=refresher.runs,
                                        redis=stack.runtime.redis)
        helpdesk = next(s for s in status["sources"] if s["name"] == "helpdesk")
        assert (helpdesk["documents"], helpdesk["last_run"]["orphaned"]) == (2, 1)
        assert set(await refresher.runs.completed_roots()) == {"urls:helpdesk", docs.path}, \
            "the old name is forgotten once nothing of it is left"


@needs_services
async def test_a_removed_source_is_revoked_and_ad_hoc_folders_are_left_alone(stack: Stack, tmp_path: Path):
    refresher = stack.refresher
    assert refresher is not None
    manuals = tmp_path / "manuals"
    manuals.mkdir()
    (manuals / "grease.txt").write_text(GREASE, encoding="utf-8")
    adhoc = tmp_path / "adhoc"
    adhoc.mkdir()
    (adhoc / "torque.md").write_text(TORQUE, encoding="utf-8")
    docs = stack.settings.sources[0]
    stack.settings.sources = [docs, folder_source("manuals", manuals)]
    assert (await refresher.run("docs")).added == 1  # type: ignore[union-attr]
    assert (await refresher.run("manuals")).added == 1  # type: ignore[union-attr]
    assert len((await refresher.run_source(FolderSource([adhoc]), space="default")).added) == 1  # kbbot index adhoc
    assert len(stack.runtime.store.records()) == 3
    answer = await stack.ask("How much grease do the HL-M300 bearings need?")
    assert "grease.txt" in [Path(c).name for c in cited(answer)]

    stack.settings.sources = [docs]  # "manuals" removed from the settings
    run = await refresher.run("docs")
    assert run is not None and run.ok and (run.orphaned, run.removed, run.unchanged) == (1, 0, 1), run
    names = sorted(Path(d).name for d in stack.runtime.store.records())
    assert names == ["torque.md", "warranty.md"], "the removed source is gone, the ad-hoc folder stays"
    answer = await stack.ask("How much grease do the HL-M300 bearings need?")
    assert "grease.txt" not in [Path(c).name for c in cited(answer)] and "polyurea" not in answer.text

    # A folder source moved to another path: the old path's documents go once the new one is indexed.
    moved = tmp_path / "docs-v2"
    shutil.copytree(Path(docs.path or ""), moved)
    stack.settings.sources = [folder_source("docs", moved)]
    run = await refresher.run("docs")
    assert run is not None and (run.added, run.orphaned) == (1, 1), run
    assert {Path(d).parent.name for d in stack.runtime.store.records()} == {"docs-v2", "adhoc"}


@needs_services
async def test_a_failed_fetch_revokes_nothing_even_under_a_new_name(stack: Stack, caplog: pytest.LogCaptureFixture):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        e917, grease, sitemap = site.url("/e917.html"), site.url("/grease.md"), site.url("/sitemap.xml")
        site.set("/e917.html", FAULT)
        site.set("/grease.md", GREASE, content_type="text/markdown")
        site.set("/sitemap.xml", '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 f"<url><loc>{e917}</loc></url><url><loc>{grease}</loc></url></urlset>",
                 content_type="application/xml")
        docs = stack.settings.sources[0]
        stack.settings.sources = [docs, url_source("support", [sitemap])]
        assert (await refresher.run("support")).added == 2  # type: ignore[union-attr]
        assert (await refresher.run("docs")).added == 1  # type: ignore[union-attr]

        # Renamed while the sitemap answers 500: the new name lists nothing yet, so nothing is revoked.
        stack.settings.sources = [docs, url_source("helpdesk", [sitemap])]
        site.pages["/sitemap.xml"].status = 500
        caplog.set_level(logging.WARNING, logger="kbbot.refresh")
        run = await refresher.run("helpdesk")
        assert run is not None and (run.orphaned, run.removed) == (0, 0), run
        assert [f["source"] for f in run.failed] == [sitemap]
        assert set(stack.runtime.store.records()) >= {e917, grease}
        assert any("kept until helpdesk completed a run" in r.getMessage() for r in caplog.records)

        # The sitemap is back but one page answers 503: that page keeps its version (under the old name)
        # even when another source's run reconciles afterwards.
        site.pages["/sitemap.xml"].status = 200
        site.pages["/e917.html"].status = 503
        run = await refresher.run("helpdesk")
        assert run is not None and run.ok and (run.changed, run.orphaned, run.removed) == (1, 0, 0), run
        assert [f["reason"] for f in run.failed] == ["HTTP 503 Service Unavailable"]
        assert (await refresher.run("docs")).orphaned == 0  # type: ignore[union-attr]
        assert roots(stack)[e917] == "urls:support" and roots(stack)[grease] == "urls:helpdesk"
        answer = await stack.ask("What does fault E-917 mean?")
        assert e917 in cited(answer) and "cooling fan" in answer.text

        # The page answers again: it moves to the new name and the old name is gone for good.
        site.pages["/e917.html"].status = 200
        run = await refresher.run("helpdesk")
        assert run is not None and run.ok and (run.changed, run.orphaned, run.unchanged) == (1, 0, 1), run
        assert set(roots(stack).values()) == {"urls:helpdesk", docs.path}
        assert "urls:support" not in await refresher.runs.completed_roots()


@needs_services
async def test_a_source_that_fails_as_a_whole_revokes_nothing(stack: Stack, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture):
    refresher = stack.refresher
    assert refresher is not None
    manuals = tmp_path / "manuals"
    manuals.mkdir()
    (manuals / "grease.txt").write_text(GREASE, encoding="utf-8")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "torque.md").write_text(TORQUE, encoding="utf-8")
    docs = stack.settings.sources[0]
    stack.settings.sources = [docs, folder_source("manuals", manuals)]
    assert (await refresher.run("docs")).added == 1  # type: ignore[union-attr]
    assert (await refresher.run("manuals")).added == 1  # type: ignore[union-attr]

    # "manuals" is removed and "docs" moved to a folder that is not there (yet): docs fails, and as long
    # as it has not completed a run in its new folder, no run revokes anything of the old configuration.
    stack.settings.sources = [folder_source("docs", tmp_path / "unmounted"), folder_source("extra", extra)]
    run = await refresher.run("docs")
    assert run is not None and not run.ok and "no such file or folder" in (run.error or "")
    caplog.set_level(logging.WARNING, logger="kbbot.refresh")
    run = await refresher.run("extra")
    assert run is not None and run.ok and (run.added, run.orphaned) == (1, 0)
    assert len(stack.runtime.store.records()) == 3
    assert any("2 documents of sources no longer configured" in r.getMessage()
               and r.getMessage().endswith("are kept until docs completed a run") for r in caplog.records)

    shutil.copytree(Path(docs.path or ""), tmp_path / "unmounted")
    run = await refresher.run("docs")
    assert run is not None and run.ok and (run.added, run.orphaned) == (1, 2), run
    assert sorted(Path(d).parent.name for d in stack.runtime.store.records()) == ["extra", "unmounted"]


async def test_the_file_run_log_keeps_the_completed_roots(tmp_path: Path):
    log = FileRunLog(tmp_path / "refresh.json")
    assert await log.completed_roots() == {}
    await log.save_completed_roots(["urls:a", "/kb"], "2026-05-01T03:00:00Z")
    await log.save_completed_roots(["urls:b"], "2026-05-01T04:00:00Z")
    await log.forget_roots(["urls:a", "urls:never"])
    assert await FileRunLog(tmp_path / "refresh.json").completed_roots() == {
        "/kb": "2026-05-01T03:00:00Z", "urls:b": "2026-05-01T04:00:00Z"}
