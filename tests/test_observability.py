"""Operating kbbot: JSON logs with the turn id on every line of a turn, secrets never logged,
``/metrics`` in Prometheus text format, ``/healthz`` with 503 when a dependency is down."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from adapters.server import build_web_app, health_report
from bot.logs import JsonFormatter, SecretMasker, TextFormatter, make_handler, turn_id
from bot.metrics import METRICS, Metrics
from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from pipelines.weaviate_store import WeaviateUnavailable
from tests.conftest import make_settings
from tests.private_redis import PrivateRedis, private_redis  # noqa: F401 - fixture
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"


def inquiry(text: str = QUESTION, *, user: str = "u1", channel: str = "c1", platform: str = "test") -> Inquiry:
    return Inquiry(platform, "t", channel, f"{platform}:{channel}:{user}", user, text)


async def http_get(app: web.Application, path: str) -> tuple[int, Any, str]:
    """Serve ``app`` on an ephemeral port and GET ``path``: status, headers, body."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{runner.addresses[0][1]}{path}") as resp:
                return resp.status, resp.headers, await resp.text()
    finally:
        await runner.cleanup()


class Captured:
    """The root logger writing JSON into a string, as ``kbbot serve`` writes to stderr."""

    def __init__(self, level: int = logging.INFO, fmt: str = "json"):
        self.stream = io.StringIO()
        self.handler = make_handler(fmt, self.stream)
        self.level = level

    def __enter__(self) -> Captured:
        root = logging.getLogger()
        self.old_level = root.level
        root.addHandler(self.handler)
        root.setLevel(self.level)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self.old_level)

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def entries(self) -> list[dict]:
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]


# --- logs -----------------------------------------------------------------------------------------
async def test_every_log_line_of_a_turn_is_json_with_its_turn_id(kb_runtime):
    with Captured() as logs:
        first = await kb_runtime.answerer.answer(inquiry(), RecordingReply())
        second = await kb_runtime.answerer.answer(inquiry("电机过热怎么办？"), RecordingReply())
        logging.getLogger("kbbot.test").info("between turns")
    entries = logs.entries()  # every line parses as one JSON object
    ids = {first.trace.turn_id, second.trace.turn_id}
    turn_lines = [e for e in entries if e.get("turn_id")]
    assert {e["turn_id"] for e in turn_lines} == ids
    for tid in ids:
        closing = [e for e in turn_lines if e["turn_id"] == tid and e["logger"] == "kbbot.answering"]
        assert closing and tid in closing[-1]["message"]
    outside = [e for e in entries if e["message"] == "between turns"]
    assert outside and "turn_id" not in outside[0]
    assert all({"ts", "level", "logger", "message"} <= e.keys() for e in entries)
    assert turn_id.get() is None


def test_json_lines_keep_extras_and_tracebacks_and_text_lines_show_the_turn():
    record = logging.LogRecord("kbbot.refresh", logging.WARNING, __file__, 1, "refresh source=%s", ("docs",), None)
    record.refresh = {"source": "docs", "added": 2}
    record.turn_id = "abc123"
    entry = json.loads(JsonFormatter(SecretMasker({})).format(record))
    assert entry["message"] == "refresh source=docs" and entry["refresh"] == {"source": "docs", "added": 2}
    assert entry["turn_id"] == "abc123"
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter(SecretMasker({})).format(record))["exc"]
    assert "[abc123]" in TextFormatter(SecretMasker({})).format(record)


def test_the_masker_hides_secret_values_and_credential_shapes():
    env = {"SLACK_BOT_TOKEN": "xoxb-111-222-abcdefABCDEF", "ANTHROPIC_API_KEY": "plain-key-value-123",
           "REDIS_URL": "redis://:s3cr3t-pass@redis.internal:6379/0"}
    masker = SecretMasker(env)
    text = masker.mask("token xoxb-111-222-abcdefABCDEF key plain-key-value-123 pass s3cr3t-pass "
                       "url https://api.telegram.org/bot123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/getMe "
                       "other xoxp-999-888-zzz redis://user:hunter22@db:6379")
    for secret in ("xoxb-111-222-abcdefABCDEF", "plain-key-value-123", "s3cr3t-pass",
                   "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", "xoxp-999-888-zzz", "hunter22"):
        assert secret not in text
    assert "redis://user:***@db:6379" in text


# --- secrets never in logs: turns and serve start-up with every token set ---------------------------
SLACK_TOKEN = "xoxb-4242424242-4242424242424-SlAcKsEcReTtOkEnVaLuE"
SIGNING_SECRET = "d5f2e9c1b7a34e6f8a0b1c2d3e4f5a6b"
TELEGRAM_TOKEN = "7000000001:AAF-TeLeGrAmSeCrEtToKeNvAlUe_0123456"
ANTHROPIC_KEY = "sk-ant-api03-AnThRoPiCsEcReTkEyVaLuE-0123456789"
REDIS_PASSWORD = "r3dis-Pa55word-for-kbbot"


async def test_secrets_never_appear_in_logs(kb_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil

    from adapters.server import serve
    from tests.fakes.anthropic_server import FakeAnthropic
    from tests.fakes.slack_server import FakeSlack
    from tests.fakes.telegram_server import FakeTelegram, message_update
    from tests.model_router import AnswerView, ModelRouter

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    redis = PrivateRedis(tmp_path, password=REDIS_PASSWORD)
    redis.start()
    try:
        async with FakeAnthropic() as claude, FakeSlack(token=SLACK_TOKEN) as slack, \
                FakeTelegram(token=TELEGRAM_TOKEN) as telegram:
            AnswerView(claude, ModelRouter())
            env = {"SLACK_BOT_TOKEN": SLACK_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                   "SLACK_API_URL": slack.base_url, "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
                   "TELEGRAM_API_URL": telegram.base_url, "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
                   "ANTHROPIC_BASE_URL": claude.base_url, "REDIS_URL": redis.url}
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            settings = make_settings(kb_data_dir, **env)
            settings.sources = []
            settings.slack.stream_interval_s = settings.slack.edit_interval_s = 0.2
            settings.telegram.polling_timeout_s = 1
            runtime = build_runtime(settings)
            stop = asyncio.Event()
            ports: list[int] = []
            with Captured(level=logging.DEBUG) as logs:
                server = asyncio.create_task(serve(runtime, env={}, host="127.0.0.1", port=0, stop=stop, drain_s=10,
                                                   schedule=False, on_listening=ports.append))
                try:
                    for _ in range(200):
                        if ports or server.done():
                            break
                        await asyncio.sleep(0.05)
                    assert ports, server
                    telegram.push(message_update(QUESTION, chat_id=7001))
                    event = {"type": "app_mention", "user": "U0ALICE", "text": f"<@UKBBOT> {QUESTION}",
                             "ts": "1800000000.000100", "channel": "C0SUPPORT", "team": "T0KBBOT"}
                    body = json.dumps({"token": "legacy", "team_id": "T0KBBOT", "api_app_id": "AKBBOT",
                                       "type": "event_callback", "event_id": "Ev0001", "event_time": int(time.time()),
                                       "authorizations": [{"team_id": "T0KBBOT", "user_id": "UKBBOT", "is_bot": True}],
                                       "event": event})
                    ts = str(int(time.time()))
                    signature = SignatureVerifier(SIGNING_SECRET).generate_signature(timestamp=ts, body=body)
                    async with aiohttp.ClientSession() as session:
                        async with session.post(f"http://127.0.0.1:{ports[0]}/slack/events", data=body.encode(),
                                                headers={"Content-Type": "application/json",
                                                         "X-Slack-Request-Timestamp": ts,
                                                         "X-Slack-Signature": signature}) as resp:
                            assert resp.status == 200
                        for _ in range(300):
                            if telegram.chat(7001) and slack.thread("C0SUPPORT", "1800000000.000100") and \
                                    not any(m.streaming for m in slack.messages.values()):
                                break
                            await asyncio.sleep(0.1)
                        async with session.get(f"http://127.0.0.1:{ports[0]}/healthz") as health:
                            assert health.status == 200, await health.text()
                    logging.getLogger("kbbot.test").error("redis at %s", os.environ["REDIS_URL"])
                finally:
                    stop.set()
                    await asyncio.wait_for(server, 30)
    finally:
        redis.stop()
    assert telegram.chat(7001), "the Telegram turn was answered"
    assert slack.thread("C0SUPPORT", "1800000000.000100"), "the Slack turn was answered"
    captured = logs.text
    assert "kbbot serving on" in captured and '"turn_id"' in captured
    for secret in (SLACK_TOKEN, SIGNING_SECRET, TELEGRAM_TOKEN, TELEGRAM_TOKEN.split(":")[1], ANTHROPIC_KEY,
                   REDIS_PASSWORD):
        assert secret not in captured
    assert "redis://:***@127.0.0.1" in captured


# --- metrics ------------------------------------------------------------------------------------------
async def test_metrics_endpoint_reports_turns_stages_tokens_and_refreshes(claude):
    fake, runtime = claude
    before = METRICS.value("kbbot_turns_total", platform="metrics-test", outcome="answered")
    tokens_before = METRICS.value("kbbot_model_tokens_total", direction="output")
    answer = await runtime.answerer.answer(inquiry(platform="metrics-test"), RecordingReply())
    assert answer.outcome is Outcome.ANSWERED
    from bot.knowledge.refresh import RunRecord, log_run

    log_run(RunRecord(source="metrics-src", trigger="manual", started_at="2026-01-01T00:00:00Z", duration_s=1.5,
                      ok=True, added=3, changed=1, removed=2, failed=[{"source": "x.pdf", "reason": "corrupt"}],
                      orphaned=4, disallowed=5))
    METRICS.observe_api_call("slack", "chat.update", 429)
    status, headers, text = await http_get(build_web_app([], runtime), "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert METRICS.value("kbbot_turns_total", platform="metrics-test", outcome="answered") == before + 1
    assert METRICS.value("kbbot_model_tokens_total", direction="output") > tokens_before
    assert 'kbbot_turns_total{outcome="answered",platform="metrics-test"}' in text
    for stage in ("retrieve", "generate", "total"):
        assert f'kbbot_turn_seconds_bucket{{le="+Inf",stage="{stage}"}}' in text
    assert "kbbot_model_first_token_seconds_count" in text
    assert 'kbbot_refresh_documents_total{change="added",source="metrics-src"} 3.0' in text
    assert 'kbbot_refresh_documents_total{change="failed",source="metrics-src"} 1.0' in text
    assert 'kbbot_refresh_documents_total{change="orphaned",source="metrics-src"} 4.0' in text
    assert 'kbbot_refresh_documents_total{change="disallowed",source="metrics-src"} 5.0' in text
    assert 'kbbot_refresh_runs_total{source="metrics-src",status="ok"} 1.0' in text
    assert 'kbbot_platform_api_rate_limited_total{method="chat.update",platform="slack"}' in text


async def test_platform_api_calls_and_429s_are_counted_at_the_shared_http_layer():
    from adapters.slack.platform import SlackAdapter
    from adapters.slack.settings import SlackSettings
    from adapters.telegram.platform import TelegramAdapter
    from adapters.telegram.session import instrument
    from adapters.telegram.settings import TelegramSettings
    from tests.fakes.slack_server import FakeSlack
    from tests.fakes.telegram_server import FakeTelegram

    async with FakeSlack() as slack, FakeTelegram() as telegram:
        s_adapter = SlackAdapter(None, SlackSettings(bot_token=slack.token, signing_secret="x" * 32,
                                                     api_url=slack.base_url))
        t_adapter = TelegramAdapter(None, TelegramSettings(token=telegram.token, api_url=telegram.base_url))
        await s_adapter.start()  # its one HTTP session, traced
        instrument(t_adapter.bot)
        calls = METRICS.value("kbbot_platform_api_calls_total", platform="slack", method="chat.postMessage")
        limited = METRICS.value("kbbot_platform_api_rate_limited_total", platform="slack", method="chat.postMessage")
        slack.rate_limit("chat.postMessage", times=1, retry_after=0)
        await s_adapter.client.chat_postMessage(channel="C1", text="hello")  # 429, retried once, then ok
        assert METRICS.value("kbbot_platform_api_calls_total", platform="slack",
                             method="chat.postMessage") == calls + 2
        assert METRICS.value("kbbot_platform_api_rate_limited_total", platform="slack",
                             method="chat.postMessage") == limited + 1
        tg_calls = METRICS.value("kbbot_platform_api_calls_total", platform="telegram", method="sendMessage")
        tg_limited = METRICS.value("kbbot_platform_api_rate_limited_total", platform="telegram", method="sendMessage")
        telegram.rate_limit("sendMessage", times=1, retry_after=1)
        from aiogram.exceptions import TelegramRetryAfter

        with pytest.raises(TelegramRetryAfter):
            await t_adapter.bot.send_message(7001, "hello")
        await t_adapter.bot.send_message(7001, "hello")
        assert METRICS.value("kbbot_platform_api_calls_total", platform="telegram",
                             method="sendMessage") == tg_calls + 2
        assert METRICS.value("kbbot_platform_api_rate_limited_total", platform="telegram",
                             method="sendMessage") == tg_limited + 1
        await s_adapter.stop()
        await t_adapter.bot.session.close()


def test_a_private_registry_starts_empty():
    metrics = Metrics()
    assert metrics.value("kbbot_turns_total") == 0
    metrics.observe_turn("slack", "answered", SimpleNamespace(stages={"total": 12.0}, first_token_ms=5.0,
                                                              usage={"input_tokens": 10, "output_tokens": 4},
                                                              model_calls=2))
    assert metrics.value("kbbot_turns_total") == 1
    assert metrics.value("kbbot_model_tokens_total", direction="input") == 10
    assert b"kbbot_turn_seconds_bucket" in metrics.exposition()


# --- health -------------------------------------------------------------------------------------------
class _Adapter:
    name = "fake"

    def __init__(self, status: str | None = None):
        self.status = status

    def mount(self, app: web.Application) -> None:
        pass

    def health(self) -> dict:
        return {"mode": "test", **({"status": self.status} if self.status else {})}


class _Store:
    """Reads its knowledge version as a Weaviate store does, or fails as one that stopped answering."""

    def __init__(self, version: int | None):
        self.version = version

    @property
    def knowledge_version(self) -> int:
        if self.version is None:
            raise WeaviateUnavailable("cannot reach Weaviate at http://127.0.0.1:9: connection refused")
        return self.version


class _Scheduler:
    def __init__(self, running: bool):
        self.scheduler = SimpleNamespace(running=running)
        self.runs: list = []

    def next_runs(self) -> dict:
        return {}


@pytest.mark.skipif(not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")),
                    reason="REDIS_URL and WEAVIATE_URL are not set (make test starts them)")
async def test_healthz_checks_redis_weaviate_scheduler_and_adapters(tmp_path: Path, private_redis):  # noqa: F811
    from bot.state.redis import connect_redis

    settings = make_settings(tmp_path, REDIS_URL=private_redis.url, WEAVIATE_URL=os.environ["WEAVIATE_URL"])
    client = await connect_redis(private_redis.url)
    runtime = SimpleNamespace(settings=settings, redis=client, store=_Store(7))
    try:
        status, body = await health_report([_Adapter()], runtime, _Scheduler(True))
        assert status == 200, body
        assert body["status"] == "ok" and body["knowledge_version"] == 7
        assert {k: v["status"] for k, v in body["checks"].items()} == {"redis": "up", "weaviate": "up",
                                                                       "scheduler": "up"}
        assert body["adapters"]["fake"]["status"] == "up"

        private_redis.stop()
        runtime.store = _Store(None)  # Weaviate stopped answering
        status, body = await health_report([_Adapter("down")], runtime, _Scheduler(False), timeout_s=1)
        assert status == 503
        assert body["down"] == ["adapter:fake", "redis", "scheduler", "weaviate"]
        assert REDIS_PASSWORD not in json.dumps(body)

        # The HTTP endpoint answers the same.
        status, _, text = await http_get(build_web_app([_Adapter()], runtime, _Scheduler(True)), "/healthz")
        assert status == 503
        assert json.loads(text)["checks"]["redis"]["status"] == "down"
    finally:
        await client.aclose()


async def test_healthz_on_embedded_defaults_is_ok(kb_runtime):
    status, body = await health_report([], kb_runtime, None)
    assert status == 200
    assert body["checks"]["redis"]["status"] == "off" and body["checks"]["weaviate"]["status"] == "off"
    assert body["checks"]["scheduler"]["status"] == "off"
