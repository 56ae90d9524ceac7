"""``kbbot refresh``, ``kbbot status [--json]`` and ``kbbot index PATH`` end to end (settings file, real
Weaviate and Redis), ``kbbot serve`` running the scheduler, and the settings' checks of ``sources:``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from adapters.cli import main
from adapters.platforms import load_settings
from bot.settings import SettingsError
from tests.conftest import REPO
from tests.refresh_helpers import REDIS_URL, SERVICES_MISSING, WEAVIATE_URL, drop_prefix

needs_services = pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")

GREASE = "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 hours.\n"


def config_file(tmp_path: Path, **changes: object) -> Path:
    """The repository's settings with ``changes`` (top-level keys), its relative paths made absolute."""
    raw = yaml.safe_load((REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8"))
    for key in ("system_template", "user_template"):
        raw["prompt"][key] = str(REPO / "config" / raw["prompt"][key])
    if isinstance(raw.get("answering"), dict) and raw["answering"].get("topics"):
        raw["answering"]["topics"] = str(REPO / "config" / raw["answering"]["topics"])
    for source in raw.get("sources") or []:
        if source.get("path"):
            source["path"] = str((REPO / "config" / source["path"]).resolve())
    raw.update(changes)
    path = tmp_path / "kbbot.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    assert WEAVIATE_URL and REDIS_URL
    tag = uuid.uuid4().hex[:10]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "grease.txt").write_text(GREASE, encoding="utf-8")
    collection, prefix = f"Cli{tag}", f"kbbot-test-{tag}:"
    path = config_file(tmp_path, store={"kind": "auto", "weaviate_url": None, "collection": collection},
                       redis_prefix=prefix,
                       sources=[{"name": "docs", "space": "default", "path": str(docs), "interval": "6h"},
                                {"name": "nightly", "path": str(tmp_path / "nowhere"), "cron": "0 3 * * *"}])
    monkeypatch.setenv("KBBOT_CONFIG", str(path))
    monkeypatch.setenv("KBBOT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    yield {"docs": docs, "collection": collection, "prefix": prefix, "config": path}
    from pipelines.weaviate_store import WeaviateKnowledgeStore

    store = WeaviateKnowledgeStore(WEAVIATE_URL, collection=collection)
    store.drop()
    store.close()
    asyncio.run(drop_prefix(REDIS_URL, prefix))


@needs_services
def test_refresh_then_status_json_has_exactly_the_documented_shape(deployment, capsys: pytest.CaptureFixture[str]):
    assert main(["refresh"]) == 1, "the nightly source's folder is missing: that run fails"
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0].startswith("docs: refreshed in ") and "1 new, 0 changed, 0 removed, 0 unchanged, 0 failed" in lines[0]
    assert lines[1].startswith("nightly: refresh failed after ") and "no such file or folder" in lines[1]

    assert main(["refresh", "docs"]) == 0
    assert "0 new, 0 changed, 0 removed, 1 unchanged" in capsys.readouterr().out
    assert main(["refresh", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "kbbot: no source named 'nope' (sources: docs, nightly)"

    assert main(["status", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "exactly one JSON object"
    status = json.loads(out)
    assert set(status) == {"knowledge_version", "sources", "services", "golden", "golden_file"}
    assert status["golden"] is None and status["golden_file"] is None, "no golden file, never replayed"
    assert status["knowledge_version"] == 1
    docs, nightly = status["sources"]
    for source in (docs, nightly):
        assert set(source) == {"name", "documents", "chunks", "held", "held_reasons", "last_run", "next_run",
                               "last_permissions_run"}
        assert (source["held"], source["held_reasons"]) == (0, {}), "a folder without acl is public"
        assert source["last_permissions_run"] is None, "never read permissions alone"
    assert (docs["name"], docs["documents"], docs["chunks"]) == ("docs", 1, 1)
    run = docs["last_run"]
    assert set(run) >= {"started_at", "duration_s", "added", "changed", "removed", "failed"}
    assert (run["trigger"], run["ok"], run["unchanged"], run["failed"]) == ("manual", True, 1, [])
    assert docs["next_run"] > run["started_at"]
    assert (nightly["documents"], nightly["last_run"]["ok"]) == (0, False)
    assert "no such file or folder" in nightly["last_run"]["error"]
    assert nightly["next_run"].endswith("T03:00:00Z")
    assert status["services"]["weaviate"] == {"status": "up", "url": WEAVIATE_URL}
    assert status["services"]["redis"]["status"] == "up"

    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Knowledge version 1 · Weaviate up · Redis up\n• docs: 1 documents, 1 chunks; last run")


@needs_services
def test_status_reports_a_service_that_is_down_and_exits_3(deployment, monkeypatch, capsys):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9/0")
    assert main(["status", "--json"]) == 3
    status = json.loads(capsys.readouterr().out)
    assert status["services"]["redis"]["status"] == "down"
    assert "cannot reach Redis at redis://127.0.0.1:9/0" in status["services"]["redis"]["error"]
    assert status["services"]["weaviate"]["status"] == "up"
    assert [s["last_run"] for s in status["sources"]] == [None, None]


@needs_services
def test_index_path_is_a_refresh_of_that_path(deployment, tmp_path, capsys):
    adhoc = tmp_path / "adhoc"
    adhoc.mkdir()
    (adhoc / "note.md").write_text("# Torque\n\nTighten the HL-M200 terminal screws to 2.5 N·m.\n", encoding="utf-8")
    assert main(["index", str(adhoc)]) == 0
    assert "indexed 1 new, 0 changed, 0 unchanged, 0 removed, 0 failed; 1 chunks written" in capsys.readouterr().out
    (adhoc / "note.md").unlink()
    assert main(["index", str(adhoc)]) == 0
    assert "0 new, 0 changed, 0 unchanged, 1 removed" in capsys.readouterr().out
    assert main(["index", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


@needs_services
async def test_serve_runs_the_configured_sources_on_schedule(deployment):
    from adapters.server import serve
    from bot.knowledge.refresh import RedisRunLog
    from bot.runtime import build_runtime
    from bot.state.redis import connect_redis

    settings = load_settings()
    settings.sources = settings.sources[:1]
    runtime = build_runtime(settings)
    stop = asyncio.Event()
    server = asyncio.create_task(serve(runtime, env={}, host="127.0.0.1", port=0, stop=stop, drain_s=5))
    client = await connect_redis(REDIS_URL or "")
    try:
        runs = RedisRunLog(client, str(deployment["prefix"]))
        for _ in range(300):
            last = await runs.last_run("docs")
            if last is not None:
                break
            await asyncio.sleep(0.2)
        assert last is not None and last.trigger == "schedule" and last.added == 1
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
        await client.aclose()


@pytest.mark.parametrize(("sources", "message"), [
    ([{"name": "a", "path": "/tmp", "interval": "1h", "cron": "0 3 * * *"}],
     "sources[0] (a) needs exactly one schedule: interval (e.g. 30m, 6h) or cron (e.g. '0 3 * * *')"),
    ([{"name": "a", "path": "/tmp"}], "sources[0] (a) needs exactly one schedule"),
    ([{"name": "a", "path": "/tmp", "interval": "soon"}],
     "sources[0] (a).interval: 'soon' is not an interval like 90s, 30m, 6h, 1d or 1h30m"),
    ([{"name": "a", "path": "/tmp", "cron": "0 25 * * *"}], "sources[0] (a).cron '0 25 * * *' is not a crontab line"),
    ([{"name": "a", "interval": "1h"}],
     "sources[0] (a) needs exactly one of path (a local folder) or urls (pages and sitemaps)"),
    ([{"name": "a", "path": "/tmp", "urls": ["https://x.example/"], "interval": "1h"}], "needs exactly one of path"),
    ([{"name": "a", "urls": ["ftp://x.example/a"], "interval": "1h"}],
     "sources[0] (a).urls: 'ftp://x.example/a' is not an http:// or https:// URL"),
    ([{"name": "a b", "path": "/tmp", "interval": "1h"}], "sources[0] (a b).name must be 1-64 letters"),
    ([{"name": "a", "path": "/tmp/x", "interval": "1h"}, {"name": "a", "path": "/tmp/y", "interval": "1h"}],
     "sources[1] (a): two sources are named 'a'; names must be unique"),
    ([{"name": "a", "path": "/tmp/x", "interval": "1h"}, {"name": "b", "path": "/tmp/x/y", "interval": "1h"}],
     "sources[1] (b).path overlaps the folder of source 'a'"),
    ([{"name": "a", "path": "/tmp", "interval": "1h", "colour": "red"}], "unknown setting sources[0] (a).colour"),
    ([{"name": "a", "path": "/tmp", "interval": "1h", "include": "*.md", "exclude": [3]}],
     "sources[0] (a).exclude must be a list of non-empty strings"),
    ([{"name": "a", "urls": ["https://x.example/"], "interval": "1h", "respect_robots": "no"}],
     "sources[0] (a).respect_robots must be true or false, got 'no'"),
    ("examples/kb", "sources must be a list of sources, got str"),
])
def test_bad_sources_are_one_clear_settings_error(tmp_path: Path, sources: object, message: str):
    path = config_file(tmp_path, sources=sources)
    with pytest.raises(SettingsError) as error:
        load_settings(path, env={})
    assert message in str(error.value)


def test_the_old_default_sources_key_says_what_replaced_it(tmp_path: Path, capsys):
    path = config_file(tmp_path, default_sources=["examples/kb"])
    assert main(["--config", str(path), "status"]) == 2
    assert "default_sources was replaced by sources:" in capsys.readouterr().err


def test_the_shipped_settings_have_the_examples_source():
    settings = load_settings(REPO / "config" / "kbbot.yaml", env={})
    [source] = settings.sources
    assert (source.name, source.space, source.interval) == ("examples", "default", "1h")
    assert Path(source.path or "") == REPO / "examples" / "kb"
    assert settings.slack.admins == [] and settings.telegram.admins == []


def test_include_and_exclude_globs_select_files(tmp_path: Path):
    from pipelines.sources.folder import discover

    for rel in ("a.md", "b.txt", "guides/c.md", "guides/old/d.md", "drafts/e.md", ".hidden/f.md", "g.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x", encoding="utf-8")

    def names(**globs: list[str]) -> list[str]:
        return [p.relative_to(tmp_path).as_posix() for p in discover([tmp_path], **globs)]

    assert names() == ["a.md", "b.txt", "drafts/e.md", "guides/c.md", "guides/old/d.md"]
    assert names(include=["*.md"], exclude=["drafts/**", "guides/old/"]) == ["a.md", "guides/c.md"]
    assert names(include=["guides/*.md"]) == ["guides/c.md"]
    assert names(include=["guides/**/*.md"]) == ["guides/c.md", "guides/old/d.md"]


@needs_services
def test_refresh_permissions_only_applies_a_changed_acl_and_embeds_nothing(deployment, capsys):
    docs, config = deployment["docs"], deployment["config"]
    (docs / "hr").mkdir()
    (docs / "hr" / "pay.txt").write_text("Pay scale\nHL-M300 technicians are paid on scale T4.\n", encoding="utf-8")
    assert main(["refresh", "docs"]) == 0
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["sources"][0]["acl"] = {"hr/": ["group:HR", "boss@example.com"]}
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()

    assert main(["refresh", "docs", "--permissions-only"]) == 0
    out = capsys.readouterr().out
    assert "0 new, 0 changed, 0 removed" in out and "1 with new permissions" in out, out
    from pipelines.weaviate_store import WeaviateKnowledgeStore

    store = WeaviateKnowledgeStore(WEAVIATE_URL, collection=str(deployment["collection"]))
    try:
        readers = {Path(r.doc_id).name: r.readers for r in store.records().values()}
        chunks = store.document_store.filter_documents({"field": "meta.doc_id", "operator": "==",
                                                        "value": str((docs / "hr" / "pay.txt").resolve())})
    finally:
        store.close()
    assert readers == {"grease.txt": ["public"], "pay.txt": ["group:hr", "user:boss@example.com"]}
    assert chunks and all(sorted(c.meta["readers"]) == ["group:hr", "user:boss@example.com"] for c in chunks)
    # Recorded apart: the source's last (content) run stands, its permissions-only run is shown beside it.
    assert main(["status", "--json"]) == 0
    docs_status = json.loads(capsys.readouterr().out)["sources"][0]
    assert docs_status["last_run"]["permissions"] == 0 and docs_status["last_permissions_run"]["permissions"] == 1
