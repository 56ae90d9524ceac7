"""``kbbot serve``: one asyncio process, one HTTP server, every configured adapter.

The refresh scheduler (``bot.scheduler``) runs every configured source on its schedule in the same
event loop (the refreshes themselves in a worker thread). The web server listens on ``KBBOT_PORT``
(default 3000) and serves ``/healthz``, ``/metrics`` and the routes the adapters mount (Slack's
Events API at ``/slack/events``, Telegram's webhook). Adapters that hold their own connection (Slack
Socket Mode, Telegram polling) are started next to it. An adapter is anything with ``name``,
``mount(web_app)``, ``start()``, ``stop(timeout_s)`` and ``health()``.

- ``/healthz``: Redis (PING), Weaviate (``/v1/.well-known/ready``), the refresh scheduler and each
  adapter, each ``up`` / ``down`` / ``off``; HTTP 503 when any is down, else 200.
- ``/metrics``: Prometheus text format (``bot.metrics``). Platform API calls are counted where every
  adapter's requests pass: an aiohttp ``TraceConfig`` on the Slack client's session (bolt's
  per-request clients share it) and an aiogram request middleware on the Telegram bot's session.
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

from adapters.insights import mount_admin, start_digest
from adapters.slack import SlackAdapter
from adapters.telegram import TelegramAdapter
from bot.feedback import JsonlFeedback, RedisFeedback
from bot.insights.recorder import RecordingFeedback
from bot.metrics import CONTENT_TYPE, METRICS, Metrics, TelegramApiMetrics, slack_trace_config
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
        store: Any = RedisFeedback(redis, prefix=runtime.settings.redis_prefix)
    else:
        store = JsonlFeedback(runtime.settings.data_dir / "feedback.jsonl")
    turns = getattr(runtime, "turns", None)
    return RecordingFeedback(store, turns) if turns is not None else store


class TelegramServerErrorRetry:
    """An aiogram request middleware: a Bot API call answered 5xx (or lost on the network) is tried
    again, up to ``retries`` times after ``backoff_s``, 2 x ``backoff_s``, ...; Slack's client does the
    same with its ``AsyncServerErrorRetryHandler``. A 5xx means Telegram did not finish the call, so
    the final answer is sent again rather than lost; 429s are left to the stream writer's Retry-After."""

    def __init__(self, retries: int = 2, backoff_s: float = 0.5):
        self.retries = retries
        self.backoff_s = backoff_s

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        from aiogram.exceptions import TelegramNetworkError, TelegramServerError

        name = getattr(method, "__api_method__", type(method).__name__)
        attempt = 0
        while True:
            try:
                return await make_request(bot, method)
            except (TelegramServerError, TelegramNetworkError) as exc:
                if attempt >= self.retries or name == "getUpdates":
                    raise
                attempt += 1
                log.warning("Telegram %s failed (%s); retry %d of %d", name, type(exc).__name__, attempt,
                            self.retries)
                await asyncio.sleep(self.backoff_s * attempt)


def instrument(adapter: Any) -> None:
    """Count the adapter's platform API calls (and 429s) in ``bot.metrics``; retry Telegram's 5xx."""
    if isinstance(adapter, SlackAdapter):
        import aiohttp

        client = adapter.client
        if client.session is None:
            # Bolt copies this session into its per-request clients, so every call is counted once.
            client.session = aiohttp.ClientSession(trace_configs=[slack_trace_config()])
            adapter._kbbot_owned_session = client.session
    elif isinstance(adapter, TelegramAdapter):
        adapter.bot.session.middleware(TelegramServerErrorRetry())  # outermost: each attempt is counted
        adapter.bot.session.middleware(TelegramApiMetrics())


async def close_instrumentation(adapter: Any) -> None:
    session = getattr(adapter, "_kbbot_owned_session", None)
    if session is not None and not session.closed:
        await session.close()


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


async def _check_redis(runtime: Any, timeout_s: float) -> dict[str, Any]:
    # /healthz answers anyone: it says up or down, never where a service is or how it is reached.
    if not runtime.settings.redis_url:
        return {"status": "off", "detail": "state kept in this process (set REDIS_URL)"}
    status: dict[str, Any] = {}
    if runtime.redis is None:
        return {**status, "status": "down", "error": "not connected"}
    try:
        await asyncio.wait_for(runtime.redis.ping(), timeout_s)
        return {**status, "status": "up"}
    except asyncio.TimeoutError:
        return {**status, "status": "down", "error": f"no answer within {timeout_s:g} s"}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {**status, "status": "down", "error": type(exc).__name__}


async def _check_weaviate(runtime: Any, timeout_s: float) -> dict[str, Any]:
    import aiohttp

    if runtime.settings.store_kind != "weaviate":
        return {"status": "off", "detail": "embedded in-memory store (set WEAVIATE_URL)"}
    url = str(runtime.settings.store.weaviate_url).rstrip("/")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(f"{url}/v1/.well-known/ready") as response:
                if response.status == 200:
                    return {"status": "up"}
                return {"status": "down", "error": f"HTTP {response.status}"}
    except asyncio.TimeoutError:
        return {"status": "down", "error": f"no answer within {timeout_s:g} s"}
    except Exception as exc:  # noqa: BLE001
        return {"status": "down", "error": type(exc).__name__}


def _check_scheduler(scheduler: Any) -> dict[str, Any]:
    if scheduler is None:
        return {"status": "off", "detail": "no sources scheduled"}
    running = bool(scheduler.scheduler.running)
    body: dict[str, Any] = {"status": "up" if running else "down"}
    body["next_runs"] = {name: (when.isoformat(timespec="seconds") if when else None)
                         for name, when in scheduler.next_runs().items()}
    last: dict[str, Any] = {}
    for record in scheduler.runs:
        last[record.source] = {"ok": record.ok, "started_at": record.started_at, "error": record.error,
                               "failed": len(record.failed)}
    body["last_runs"] = last
    return body


def _check_adapter(adapter: Any) -> dict[str, Any]:
    try:
        body = dict(adapter.health())
    except Exception as exc:  # noqa: BLE001
        return {"status": "down", "error": type(exc).__name__}
    polling = getattr(adapter, "_polling", None)  # Telegram long polling that died stops all updates
    if polling is not None and polling.done():
        body.setdefault("status", "down")
        body.setdefault("error", "polling stopped")
    body.setdefault("status", "up")
    return body


async def health_report(adapters: list[Adapter], runtime: Any = None, scheduler: Any = None,
                        timeout_s: float = 2.0) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body): 503 when Redis, Weaviate, the scheduler or an adapter is down."""
    checks: dict[str, Any] = {}
    body: dict[str, Any] = {}
    if runtime is not None:
        checks["redis"], checks["weaviate"] = await asyncio.gather(_check_redis(runtime, timeout_s),
                                                                   _check_weaviate(runtime, timeout_s))
        checks["scheduler"] = _check_scheduler(scheduler)
        if checks["weaviate"]["status"] != "down":
            try:
                body["knowledge_version"] = await asyncio.wait_for(
                    asyncio.to_thread(lambda: runtime.store.knowledge_version), timeout_s)
            except Exception as exc:  # noqa: BLE001 - the store answered ready but not this
                checks["weaviate"] = {**checks["weaviate"], "status": "down", "error": type(exc).__name__}
    adapter_checks = {a.name: _check_adapter(a) for a in adapters}
    down = sorted([name for name, c in checks.items() if c["status"] == "down"]
                  + [f"adapter:{name}" for name, c in adapter_checks.items() if c["status"] == "down"])
    body = {"status": "down" if down else "ok", **({"down": down} if down else {}), "checks": checks,
            "adapters": adapter_checks, **body}
    return (503 if down else 200), body


def build_web_app(adapters: list[Adapter], runtime: Any = None, scheduler: Any = None,
                  metrics: Metrics | None = None) -> web.Application:
    app = web.Application()

    async def healthz(request: web.Request) -> web.Response:
        status, body = await health_report(adapters, runtime, scheduler)
        return web.json_response(body, status=status)

    async def metrics_endpoint(request: web.Request) -> web.Response:
        payload = (metrics or METRICS).exposition()
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_endpoint)
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
                schedule: bool = True, on_listening: Any = None) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM); then finish the turns in progress.

    With ``schedule`` (and sources configured), the refresh scheduler runs in the same event loop.
    ``on_listening(port)`` is called once the HTTP server listens (``port=0`` picks a free one).
    """
    env = os.environ if env is None else env
    port = port_from(env) if port is None else port
    stop = stop or asyncio.Event()
    await runtime.start()
    refresher = Refresher(runtime.settings, runtime.store, runtime.indexer, redis=runtime.redis)
    scheduler = RefreshScheduler(refresher) if schedule and runtime.settings.sources else None
    knowledge = KnowledgeAdmin(refresher, scheduler)
    adapters = build_adapters(runtime, admin=knowledge)
    for adapter in adapters:
        instrument(adapter)
    if not adapters:
        log.warning("no chat platform is configured (set SLACK_BOT_TOKEN or TELEGRAM_BOT_TOKEN); serving /healthz only")
    web_app = build_web_app(adapters, runtime, scheduler)
    admin_site = mount_admin(web_app, runtime, knowledge)
    runner = web.AppRunner(web_app, access_log=None)
    await runner.setup()
    digest = None
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        port = sockets[0].getsockname()[1] if sockets else port
        log.info("kbbot serving on %s:%d (%s)", host, port, ", ".join(a.name for a in adapters) or "no adapters")
        if on_listening is not None:
            on_listening(port)
        for adapter in adapters:
            await adapter.start()
        if scheduler is not None:
            await scheduler.start()
        digest = start_digest(runtime, adapters)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: finishing the turns in progress (up to %.0f s)", drain_s)
    finally:
        if digest is not None:
            digest.stop()
        if admin_site is not None:
            await admin_site.close(drain_s)
        if scheduler is not None:
            await scheduler.stop(drain_s)
        for adapter in adapters:
            try:
                await adapter.stop(drain_s)
            except Exception:
                log.exception("stopping %s failed", adapter.name)
            await close_instrumentation(adapter)
        await runner.cleanup()
        await runtime.close()


def run_serve(runtime: Any, *, port: int | None = None) -> int:
    """The ``kbbot serve`` command body."""
    asyncio.run(serve(runtime, port=port))
    return 0
