"""The production configuration end to end: documents in Weaviate, threads in Redis, through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest
import redis

from adapters.cli import main
from tests.conftest import EXAMPLES, REPO

WEAVIATE_URL = os.environ.get("WEAVIATE_URL")
REDIS_URL = os.environ.get("REDIS_URL")
pytestmark = pytest.mark.skipif(not (WEAVIATE_URL and REDIS_URL),
                                reason="WEAVIATE_URL and REDIS_URL are not set (make test starts both)")


@pytest.fixture
def production(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A settings file of our own naming a fresh collection, and both services switched on."""
    config = tmp_path / "config"
    shutil.copytree(REPO / "config", config)
    collection = f"E2e{uuid.uuid4().hex[:10]}"
    text = (config / "kbbot.yaml").read_text(encoding="utf-8").replace("collection: KbChunk", f"collection: {collection}")
    (config / "kbbot.yaml").write_text(text, encoding="utf-8")
    monkeypatch.setenv("KBBOT_CONFIG", str(config / "kbbot.yaml"))
    monkeypatch.setenv("KBBOT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WEAVIATE_URL", WEAVIATE_URL)
    monkeypatch.setenv("REDIS_URL", REDIS_URL)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    yield collection
    from pipelines.weaviate_store import WeaviateKnowledgeStore

    store = WeaviateKnowledgeStore(WEAVIATE_URL, collection=collection)
    store.drop()
    store.close()


def ask(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ask", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_index_then_two_turns_of_a_thread(production, capsys):
    assert main(["index", str(EXAMPLES)]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("indexed 15 new, 0 changed, 0 unchanged, 0 removed, 0 failed")

    thread = f"t1-{uuid.uuid4().hex[:6]}"
    first = ask(capsys, "电机过热怎么办？", "--thread", thread)
    second = ask(capsys, "How often should the bearings be greased?", "--thread", thread)
    assert first["outcome"] == second["outcome"] == "answered"
    assert Path(first["citations"][0]["doc_id"]).name == "overheating-zh.md"
    assert "maintenance-schedule.md" in [Path(c["doc_id"]).name for c in second["citations"]]
    assert (first["trace"]["history_turns"], second["trace"]["history_turns"]) == (0, 1)
    assert redis.Redis.from_url(REDIS_URL).delete(f"kbbot:history:console:{thread}") == 1

    assert main(["index", str(EXAMPLES)]) == 0  # a second process sees the first one's manifest
    assert "0 new, 0 changed, 15 unchanged" in capsys.readouterr().out


def test_unreachable_weaviate_at_start_is_one_clear_line(production, capsys, monkeypatch):
    monkeypatch.setenv("WEAVIATE_URL", "http://127.0.0.1:9")
    assert main(["ask", "How long is the warranty?"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kbbot: cannot reach Weaviate at http://127.0.0.1:9")
    assert err.count("\n") == 1
