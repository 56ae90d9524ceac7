"""What a stranger can do to ``kbbot serve``'s HTTP server before any authentication (issue 26,
findings 6, 9 and 11): read internal host names from ``/healthz``, turn malformed requests into 500s
with tracebacks, and hold connections open by sending requests slowly. The real ``serve()`` on a free
port, with Slack (Events API), Telegram (webhook) and the HTTP API against the fake platforms."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from adapters.server import serve
from bot.runtime import Runtime, build_runtime
from bot.settings import SourceSettings
from pipelines.sources.confluence import ConfluenceSettings
from tests.conftest import make_settings
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

API_TOKEN = "kbbot-test-token-0123456789"
SIGNING_SECRET = "d5f2e9c1b7a34e6f8a0b1c2d3e4f5a6b"
WEBHOOK_SECRET = "webhook-secret-0123456789"
DEEP = b"[" * 100_000 + b"]" * 100_000


@dataclass
class Served:
    url: str
    port: int
    runtime: Runtime


@contextlib.asynccontextmanager
async def served(kb_data_dir: Path, tmp_path: Path, *, sources: list[SourceSettings] | None = None,
                 host: str = "127.0.0.1", **server: Any) -> AsyncIterator[Served]:
    async with FakeSlack() as slack, FakeTelegram() as telegram:
        env = {"SLACK_BOT_TOKEN": slack.token, "SLACK_SIGNING_SECRET": SIGNING_SECRET, "SLACK_API_URL": slack.base_url,
               "TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_URL": telegram.base_url,
               "TELEGRAM_WEBHOOK_URL": "https://bot.example.com/telegram/webhook",
               "TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET, "KBBOT_API_TOKEN": API_TOKEN}
        settings = make_settings(kb_data_dir, **env)
        settings.sources = sources or []
        for name, value in server.items():
            setattr(settings.server, name, value)
        runtime = build_runtime(settings)
        runtime.settings.data_dir = tmp_path  # run records and history of this test's own
        stop, ports = asyncio.Event(), []
        task = asyncio.create_task(serve(runtime, env={}, host=host, port=0, stop=stop, drain_s=5,
                                         schedule=bool(sources), on_listening=ports.append))
        try:
            for _ in range(600):
                if ports or task.done():
                    break
                await asyncio.sleep(0.05)
            assert ports, task
            yield Served(f"http://{f'[{host}]' if ':' in host else host}:{ports[0]}", ports[0], runtime)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


# --- finding 6: /healthz ---------------------------------------------------------------------------------
async def test_healthz_says_a_refresh_failed_and_when_but_not_why(kb_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "conf-token")
    # Nothing listens on port 9: the run fails at once, its error naming the internal address.
    wiki = SourceSettings(name="intranet", interval="1h", confluence=ConfluenceSettings(
        url="http://127.0.0.1:9/confluence", spaces=["OPS"], token_env="KBBOT_TEST_CONFLUENCE_TOKEN"))
    async with served(kb_data_dir, tmp_path, sources=[wiki]) as site, httpx.AsyncClient() as http:
        for _ in range(300):
            health = (await http.get(f"{site.url}/healthz")).json()
            if health["checks"]["scheduler"].get("last_runs", {}).get("intranet"):
                break
            await asyncio.sleep(0.1)
        status = await site.runtime.knowledge_admin(schedule=False).status_text()
    run = health["checks"]["scheduler"]["last_runs"]["intranet"]
    assert set(run) == {"ok", "started_at"} and run["ok"] is False and run["started_at"]
    assert "127.0.0.1:9" not in json.dumps(health) and "cannot reach" not in json.dumps(health)
    assert "cannot reach http://127.0.0.1:9" in status, "the operator's status still says why"


# --- finding 9: malformed requests from anyone ------------------------------------------------------------
MALFORMED = [
    ("deep JSON, authenticated", "/v1/ask", {"Authorization": f"Bearer {API_TOKEN}"}, DEEP, 400),
    ("deep JSON to the webhook", "/telegram/webhook", {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET}, DEEP, 400),
    ("deep JSON, unsigned", "/slack/events", {}, DEEP, 400),
    ("non-ASCII secret token", "/telegram/webhook", {"X-Telegram-Bot-Api-Secret-Token": "sécret".encode()},
     b'{"update_id": 1}', 401),
    ("non-numeric timestamp", "/slack/events", {"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
     b'{"type": "event_callback"}', 401),
    ("non-ASCII signature", "/slack/events", {"X-Slack-Request-Timestamp": str(int(time.time())),
                                              "X-Slack-Signature": "v0=é".encode()}, b'{"type": "event_callback"}', 401),
    ("undecodable bearer token", "/v1/ask", {"Authorization": b"Bearer \xff\xfe"}, b'{"question": "x"}', 401),
    ("a body that is no UTF-8", "/slack/events", {}, b'{"type": "\xff\xfe"}', 400),
    ("an unknown charset", "/telegram/webhook", {"X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET,
                                                 "Content-Type": "application/json; charset=kbbot-7"},
     b'{"update_id": 1}', 400),
]


async def test_malformed_requests_get_a_clean_400_or_401_and_one_log_line(kb_data_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    async with served(kb_data_dir, tmp_path) as site, httpx.AsyncClient(timeout=30) as http:
        outcomes = {}
        for name, path, headers, body, expected in MALFORMED:
            caplog.clear()
            response = await http.post(site.url + path, content=body,
                                       headers={"Content-Type": "application/json", **headers})
            # asyncio's own lines name objects another test left to the garbage collector, not this request.
            lines = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "asyncio"]
            outcomes[name] = (response.status_code, [(r.levelname, r.getMessage()[:120]) for r in lines],
                              any(r.exc_info for r in lines))
            assert (response.status_code, len(lines), lines[0].levelno if lines else None, outcomes[name][2]) == \
                (expected, 1, logging.WARNING, False), (name, outcomes[name])
        healthy = await http.get(f"{site.url}/healthz")
        assert healthy.status_code == 200


# --- finding 11: slow and many connections ------------------------------------------------------------------
async def _connect(port: int, first_bytes: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first_bytes)
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, within_s: float) -> str:
    """The status line the server sent before closing, or "open" if it held the connection. (After
    a refused body aiohttp reads on for up to its lingering time, 10 s, before it closes.)"""
    try:
        data = await asyncio.wait_for(reader.read(), within_s)
    except TimeoutError:
        return "open"
    return data.split(b"\r\n", 1)[0].decode() or "closed"


HALF_HEADERS = b"POST /v1/ask HTTP/1.1\r\nHost: kbbot\r\nX-Slow: "


async def test_slow_requests_are_closed_and_one_address_holds_a_bounded_number(kb_data_dir, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kbbot.server")
    async with served(kb_data_dir, tmp_path, header_timeout_s=1, body_timeout_s=1, max_connections_per_client=4) \
            as site:
        slow = [await _connect(site.port, HALF_HEADERS) for _ in range(4)]
        extra = await _connect(site.port, HALF_HEADERS)
        assert await _answer(extra[0], 5) == "HTTP/1.1 429 Too Many Requests"
        answers = await asyncio.gather(*(_answer(reader, 10) for reader, _ in slow))
        assert answers == ["HTTP/1.1 408 Request Timeout"] * 4, "closed, not held"
        body = ("POST /telegram/webhook HTTP/1.1\r\nHost: kbbot\r\nContent-Type: application/json\r\n"
                f"X-Telegram-Bot-Api-Secret-Token: {WEBHOOK_SECRET}\r\nContent-Length: 1000\r\n\r\n"
                '{"update_id"').encode()
        reader, _ = await _connect(site.port, body)
        assert (await _answer(reader, 20)).startswith("HTTP/1.1 408")
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{site.url}/healthz")).status_code == 200, "the server still answers"
        for _, writer in [*slow, extra]:
            writer.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("refused a connection from 127.0.0.1" in m for m in messages) == 1
    assert sum("no request headers within 1 s" in m for m in messages) == 1, "one line for the four"
    assert sum("refused POST /telegram/webhook from 127.0.0.1: the body did not arrive within 1 s" in m
               for m in messages) == 1


async def test_a_trusted_proxys_connections_are_not_limited_per_address(kb_data_dir, tmp_path):
    async with served(kb_data_dir, tmp_path, max_connections_per_client=2, trusted_proxies=["127.0.0.1"]) as site:
        held = [await _connect(site.port, b"GET /healthz HTTP/1.1\r\nHost: kbbot\r\n\r\n") for _ in range(5)]
        statuses = [(await reader.readline()).decode().strip() for reader, _ in held]
        assert statuses == ["HTTP/1.1 200 OK"] * 5
        for _, writer in held:
            writer.close()
