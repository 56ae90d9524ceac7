"""`kbbot ask` over the sample knowledge base, on embedded defaults (no model configured)."""

import json
import os
import uuid
from pathlib import Path

import pytest
import redis

from adapters.cli import main


@pytest.fixture
def cli_env(kb_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KBBOT_DATA_DIR", str(kb_data_dir))
    for name in ("ANTHROPIC_API_KEY", "WEAVIATE_URL", "REDIS_URL", "KBBOT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return kb_data_dir


def ask(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ask", *args, "--json"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0, "--json prints exactly one JSON object"
    return json.loads(out)


def cited_files(result: dict) -> list[str]:
    return [Path(c["doc_id"]).name for c in result["citations"]]


def test_chinese_question_is_answered_from_the_overheating_guide(cli_env, capsys):
    result = ask(capsys, "电机过热怎么办？")
    assert result["outcome"] == "answered"
    assert cited_files(result)[0] == "overheating-zh.md"
    assert result["answer"].startswith("未配置语言模型")
    assert set(result["trace"]) == {"turn_id", "stages", "first_token_ms", "history_turns", "query", "steps",
                                    "model_calls", "regenerated", "left_out"}
    assert result["trace"]["query"] == "电机过热怎么办？" and result["trace"]["model_calls"] == 0
    assert {"embed", "retrieve", "rank", "generate"} <= set(result["trace"]["stages"])
    for c in result["citations"]:
        assert set(c) == {"index", "doc_id", "version", "position", "title", "source", "locator", "page"}
        assert f"[{c['index']}]" in result["answer"]


def test_english_question_is_answered_from_the_maintenance_schedule(cli_env, capsys):
    result = ask(capsys, "How often should the bearings be greased?")
    assert result["outcome"] == "answered"
    assert "maintenance-schedule.md" in cited_files(result)
    assert "4,000 operating hours" in result["answer"]


def test_unrelated_question_is_off_topic_without_citations_and_without_a_model(cli_env, capsys):
    result = ask(capsys, "What's the weather in Paris tomorrow?")
    assert result["outcome"] == "off_topic"  # by retrieval score: below answering.off_topic_similarity
    assert result["citations"] == [] and "generate" not in result["trace"]["stages"]
    assert "outside what I can help with" in result["answer"]


def test_a_question_that_depends_on_the_model_is_clarified_then_answered(cli_env, capsys):
    asked = ask(capsys, "What is the rated current at 400 V?", "--thread", "t-clarify")
    assert asked["outcome"] == "clarify" and asked["citations"] == []
    assert "HL-M200" in asked["answer"] and "Which one do you mean" in asked["answer"]
    resolved = ask(capsys, "HL-M200", "--thread", "t-clarify")
    # Without a model, the reply to a clarifying question is joined to the question it answers.
    assert resolved["trace"]["query"] == "What is the rated current at 400 V? HL-M200"
    assert resolved["outcome"] == "answered"
    assert cited_files(resolved)[0] == "hl-m200-specifications.md" and "14.4 A" in resolved["answer"]


def test_a_follow_up_is_searched_with_the_previous_question_without_a_model(cli_env, capsys):
    ask(capsys, "What does fault E-004 mean?", "--thread", "t-carry")
    second = ask(capsys, "How do I fix it?", "--thread", "t-carry")
    assert second["trace"]["query"] == "How do I fix it? What does fault E-004 mean?"
    assert second["outcome"] == "answered" and second["citations"]


def test_thread_history_persists_between_invocations(cli_env, capsys):
    first = ask(capsys, "What does fault E-004 mean?", "--thread", "t-e2e")
    second = ask(capsys, "And how do I fix it?", "--thread", "t-e2e")
    assert first["trace"]["history_turns"] == 0
    assert second["trace"]["history_turns"] == 1
    fresh = ask(capsys, "What does fault E-004 mean?")
    assert fresh["trace"]["history_turns"] == 0


def test_empty_question_gets_a_clear_message(cli_env, capsys):
    assert main(["ask", "   ", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["outcome"] == "error"
    assert "Please type a question" in result["answer"]


def test_bad_settings_are_one_clear_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "kbbot.yaml"
    bad.write_text("retrieval:\n  mode: psychic\n", encoding="utf-8")
    assert main(["--config", str(bad), "ask", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kbbot: retrieval.mode is 'psychic'; expected one of hybrid, bm25, vector"


REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test starts Redis)")


@needs_redis
def test_thread_history_lives_in_redis_when_configured(cli_env, capsys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", REDIS_URL)
    thread = f"t-redis-{uuid.uuid4().hex[:8]}"
    first = ask(capsys, "What does fault E-004 mean?", "--thread", thread)
    second = ask(capsys, "And how do I fix it?", "--thread", thread)
    assert (first["trace"]["history_turns"], second["trace"]["history_turns"]) == (0, 1)
    client = redis.Redis.from_url(REDIS_URL)
    key = f"kbbot:history:console:{thread}"
    assert client.llen(key) == 4 and 0 < client.ttl(key) <= 30 * 86400
    client.delete(key)


def test_unreachable_redis_at_start_is_one_clear_line(cli_env, capsys, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    assert main(["ask", "How long is the warranty?"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("kbbot: cannot reach Redis at redis://:***@127.0.0.1:1/0: ")
    assert err.count("\n") == 1 and "hunter2" not in err
