"""``kbbot serve``: one asyncio process, one HTTP server, every configured adapter.

The refresh scheduler (``bot.scheduler``) runs every configured source on its schedule in the same
event loop (the refreshes themselves in a worker thread). The web server listens on ``KBBOT_PORT``
(default 3000) and serves ``/healthz`` plus the routes the adapters mount (Slack's Events API at ``/slack/events``; Telegram's webhook later). Adapters that
hold their own connection (Slack Socket Mode, Telegram polling) are started next to it. An adapter
is anything with ``name``, ``mount(web_app)``, ``start()``, ``stop(timeout_s)`` and ``health()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from adapters.slack import SlackAdapter
from adapters.telegram import TelegramAdapter
from bot.feedback import JsonlFeedback, RedisFeedback
from bot.refresh import Refresher
from bot.scheduler import KnowledgeAdmin, RefreshScheduler

log = logging.getLogger("kbbot.server")

DEFAULT_PORT = 3000


class Adapter(Protocol):
    name: str

    def mount(self, web_app: web.Application) -> None:
        """Add this adapter's HTTP routes (none for connection-based modes)."""

    async def start(self) -> None: ...

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking events and wait up to ``timeout_s`` for the turns in progress."""

    def health(self) -> dict[str, Any]: ...


def feedback_store(runtime: Any) -> Any:
    """Feedback next to the other shared state: Redis when the runtime has it, else a file in the data dir."""
    redis = runtime.redis
    if redis is not None:
        return RedisFeedback(redis, prefix=runtime.settings.redis_prefix)
    return JsonlFeedback(runtime.settings.data_dir / "feedback.jsonl")


def build_adapters(runtime: Any, admin: Any = None) -> list[Adapter]:
    """The configured adapters, on a started runtime (its history and idempotency stores); ``admin``
    (``bot.scheduler.KnowledgeAdmin``) answers their admin commands."""
    adapters: list[Adapter] = []
    slack = runtime.settings.slack
    if slack.enabled:
        slack.validate()
        adapters.append(SlackAdapter(runtime.answerer, slack, idempotency=runtime.idempotency,
                                     feedback=feedback_store(runtime), history=runtime.history, admin=admin))
    telegram = runtime.settings.telegram
    if telegram.enabled:
        telegram.validate()
        adapters.append(TelegramAdapter(runtime.answerer, telegram, idempotency=runtime.idempotency,
                                        feedback=feedback_store(runtime), history=runtime.history, admin=admin))
    return adapters


def build_web_app(adapters: list[Adapter], runtime: Any = None) -> web.Application:
    app = web.Application()

    async def healthz(request: web.Request) -> web.Response:
        body: dict[str, Any] = {"status": "ok", "adapters": {a.name: a.health() for a in adapters}}
        if runtime is not None:
            body["knowledge_version"] = runtime.store.knowledge_version
        return web.json_response(body)

    app.router.add_get("/healthz", healthz)
    for adapter in adapters:
        adapter.mount(app)
    return app


def port_from(env: Mapping[str, str]) -> int:
    raw = env.get("KBBOT_PORT") or str(DEFAULT_PORT)
    try:
        return int(raw)
    except ValueError:
        from bot.settings import SettingsError

        raise SettingsError(f"KBBOT_PORT must be a port number, got {raw!r}") from None


async def serve(runtime: Any, *, env: Mapping[str, str] | None = None, host: str = "0.0.0.0",
                port: int | None = None, stop: asyncio.Event | None = None, drain_s: float = 30.0,
                schedule: bool = True) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM); then finish the turns in progress.

    With ``schedule`` (and sources configured), the refresh scheduler runs in the same event loop.
    """
    env = os.environ if env is None else env
    port = port_from(env) if port is None else port
    stop = stop or asyncio.Event()
    await runtime.start()
    refresher = Refresher(runtime.settings, runtime.store, runtime.indexer, redis=runtime.redis)
    scheduler = RefreshScheduler(refresher) if schedule and runtime.settings.sources else None
    adapters = build_adapters(runtime, admin=KnowledgeAdmin(refresher, scheduler))
    if not adapters:
        log.warning("no chat platform is configured (set SLACK_BOT_TOKEN or TELEGRAM_BOT_TOKEN); serving /healthz only")
    runner = web.AppRunner(build_web_app(adapters, runtime), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("kbbot serving on %s:%d (%s)", host, port, ", ".join(a.name for a in adapters) or "no adapters")
        for adapter in adapters:
            await adapter.start()
        if scheduler is not None:
            await scheduler.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: finishing the turns in progress (up to %.0f s)", drain_s)
    finally:
        if scheduler is not None:
            await scheduler.stop(drain_s)
        for adapter in adapters:
            try:
                await adapter.stop(drain_s)
            except Exception:
                log.exception("stopping %s failed", adapter.name)
        await runner.cleanup()
        await runtime.close()


def run_serve(runtime: Any, *, port: int | None = None) -> int:
    """The ``kbbot serve`` command body."""
    asyncio.run(serve(runtime, port=port))
    return 0
