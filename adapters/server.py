"""``kbbot serve``: one asyncio process, one HTTP server, every configured adapter.

The refresh scheduler (``bot.scheduler``) runs every configured source on its schedule in the same
event loop (the refreshes themselves in a worker thread). The web server listens on ``KBBOT_PORT``
(default 3000) and serves ``/healthz``, ``/metrics`` and the routes the adapters mount (Slack's
Events API at ``/slack/events``, Telegram's webhook). Adapters that hold their own connection (Slack
Socket Mode, Telegram polling) are started next to it. An adapter is anything with ``name``,
``mount(web_app)``, ``start()``, ``stop(timeout_s)`` and ``health()``.

- ``/healthz``: Redis (PING), Weaviate (the knowledge version read), the refresh scheduler and each
  adapter, each ``up`` / ``down`` / ``off``; HTTP 503 when any is down, else 200.
- ``/metrics``: Prometheus text format (``bot.metrics``). Platform API calls are counted where every
  adapter's requests pass: an aiohttp ``TraceConfig`` on the Slack client's session (bolt's
  per-request clients share it) and an aiogram request middleware on the Telegram bot's session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Protocol

import aiohttp
from aiogram.exceptions import TelegramNetworkError, TelegramServerError
from aiohttp import web

from adapters.api.platform import HttpApi
from adapters.api_metrics import TelegramApiMetrics, slack_trace_config
from adapters.insights import mount_admin, start_digest, start_follow_ups
from adapters.knowledge_loop import ReviewerMessages
from adapters.slack.directory import SlackDirectory
from adapters.slack.platform import SlackAdapter
from adapters.slack.reply import make_rates as make_slack_rates
from adapters.telegram.platform import TelegramAdapter
from adapters.telegram.reply import make_rates as make_telegram_rates
from adapters.web_guard import GuardedRunner, max_body_bytes, middlewares
from bot.conversation import Conversations
from bot.errors import SettingsError
from bot.health import check_redis, check_store
from bot.knowledge_loop.golden import golden_results
from bot.metrics import CONTENT_TYPE, METRICS, Metrics
from bot.pending import RecoveryLoop
from bot.scheduler import KnowledgeAdmin
from bot.server_settings import ServerSettings
from bot.settings_base import reveal

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


class TelegramServerErrorRetry:
    """An aiogram request middleware: a Bot API call answered 5xx (or lost on the network) is tried
    again, up to ``retries`` times after ``backoff_s``, 2 x ``backoff_s``, ...; Slack's client does the
    same with its ``AsyncServerErrorRetryHandler``. A 5xx means Telegram did not finish the call, so
    the final answer is sent again rather than lost; 429s are left to the stream writer's Retry-After."""

    def __init__(self, retries: int = 2, backoff_s: float = 0.5):
        self.retries = retries
        self.backoff_s = backoff_s

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
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


def instrument(adapter: Any) -> aiohttp.ClientSession | None:
    """Count the adapter's platform API calls (and 429s) in ``bot.metrics``; retry Telegram's 5xx.
    Returns the HTTP session it opened for the adapter (the caller closes it), if any."""
    if isinstance(adapter, SlackAdapter) and adapter.client.session is None:
        # Bolt copies this session into its per-request clients, so every call is counted once.
        adapter.client.session = aiohttp.ClientSession(trace_configs=[slack_trace_config()])
        return adapter.client.session
    if isinstance(adapter, TelegramAdapter):
        adapter.bot.session.middleware(TelegramServerErrorRetry())  # outermost: each attempt is counted
        adapter.bot.session.middleware(TelegramApiMetrics())
    return None


def build_adapters(runtime: Any, admin: KnowledgeAdmin | None = None,
                   conversations: Conversations | None = None) -> list[Adapter]:
    """The configured adapters on one conversation service, on a started runtime; ``admin``
    answers their admin commands."""
    conversations = conversations or runtime.conversations(admin=admin)
    adapters: list[Adapter] = []
    # With Redis every replica draws from the same rate buckets: the platforms limit the app, not a process.
    redis, prefix = runtime.redis, runtime.settings.redis_prefix
    slack = runtime.settings.slack
    if slack.enabled:
        slack.check_serving()
        adapter = SlackAdapter(conversations, slack, rates=make_slack_rates(slack, redis, prefix))
        permissions = runtime.settings.permissions
        runtime.audiences.register("slack", SlackDirectory(adapter.client, cache_s=permissions.cache_s,
                                                           groups=permissions.slack_groups))
        adapters.append(adapter)
    telegram = runtime.settings.telegram
    if telegram.enabled:
        telegram.check_serving()
        adapters.append(TelegramAdapter(conversations, telegram, rates=make_telegram_rates(telegram, redis, prefix)))
    if runtime.settings.api.enabled:
        adapters.append(HttpApi(conversations, runtime.settings.api))
    for adapter in adapters:  # chat platforms answer the turns taken over from a replica that died
        if isinstance(adapter, (SlackAdapter, TelegramAdapter)):
            conversations.serve(adapter.delivery)
    return adapters


def _check_scheduler(scheduler: Any) -> dict[str, Any]:
    """The scheduler as ``/healthz`` (which answers anyone) shows it: whether each source's last run
    went well and when, never why not (a refresh error names internal hosts; ``kbbot status`` and the
    admin page show it)."""
    if scheduler is None:
        return {"status": "off", "detail": "no sources scheduled"}
    running = bool(scheduler.scheduler.running)
    body: dict[str, Any] = {"status": "up" if running else "down"}
    body["next_runs"] = {name: (when.isoformat(timespec="seconds") if when else None)
                         for name, when in scheduler.next_runs().items()}
    body["last_runs"] = {record.source: {"ok": record.ok, "started_at": record.started_at}
                         for record in scheduler.runs}
    return body


def _check_adapter(adapter: Any) -> dict[str, Any]:
    try:
        body = dict(adapter.health())
    except Exception as exc:  # noqa: BLE001
        return {"status": "down", "error": type(exc).__name__}
    body.setdefault("status", "up")
    return body


async def health_report(adapters: list[Adapter], runtime: Any = None, scheduler: Any = None,
                        timeout_s: float = 2.0, *, detail: bool = False) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body): 503 when Redis, Weaviate, the scheduler or an adapter is down; ``detail``
    (an admin asked) adds the last golden set replay, failures and all."""
    checks: dict[str, Any] = {}
    body: dict[str, Any] = {}
    if runtime is not None:
        # /healthz answers anyone: it says up or down, never where a service is or how it is reached.
        (checks["weaviate"], version), checks["redis"] = await asyncio.gather(
            check_store(runtime.settings, runtime.store, lambda store: store.knowledge_version, timeout_s=timeout_s,
                        public=True),
            check_redis(runtime.settings, runtime.redis, timeout_s=timeout_s, public=True))
        checks["scheduler"] = _check_scheduler(scheduler)
        if version is not None:
            body["knowledge_version"] = version
    adapter_checks = {a.name: _check_adapter(a) for a in adapters}
    down = sorted([name for name, c in checks.items() if c["status"] == "down"]
                  + [f"adapter:{name}" for name, c in adapter_checks.items() if c["status"] == "down"])
    body = {"status": "down" if down else "ok", **({"down": down} if down else {}), "checks": checks,
            "adapters": adapter_checks, **body}
    if detail and runtime is not None:
        body["detail"] = {"golden": await _last_golden(runtime)}
    return (503 if down else 200), body


async def _last_golden(runtime: Any) -> dict[str, Any] | None:
    s = runtime.settings
    try:
        last = await golden_results(runtime.redis, s.redis_prefix, s.data_dir).last()
    except Exception as exc:  # noqa: BLE001 - the health report says what it can
        return {"error": type(exc).__name__}
    return asdict(last) if last is not None else None


def _detail_refusal(request: web.Request, runtime: Any) -> web.Response | None:
    """None when ``?detail`` comes with the admin token (``Authorization: Bearer KBBOT_ADMIN_TOKEN``)."""
    token = reveal(runtime.settings.insights.admin_token) if runtime is not None else ""
    if not token:
        return web.json_response({"error": "the detail needs KBBOT_ADMIN_TOKEN to be set on the server"},
                                 status=404)
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return web.json_response({"error": "the detail is for admins: send Authorization: Bearer <KBBOT_ADMIN_TOKEN>"},
                                 status=401)
    return None


def build_web_app(adapters: list[Adapter], runtime: Any = None, scheduler: Any = None,
                  metrics: Metrics | None = None) -> web.Application:
    """The one web app: ``/healthz``, ``/metrics`` and the adapters' routes, behind the server's
    guards (``adapters.web_guard``; ``server:`` settings of ``runtime``, else the defaults)."""
    settings = runtime.settings if runtime is not None else None
    app = web.Application(middlewares=middlewares(settings.server if settings else ServerSettings()),
                          client_max_size=max_body_bytes(settings.api.max_body_kb if settings else None))

    async def healthz(request: web.Request) -> web.Response:
        detail = "detail" in request.query
        if detail and (refusal := _detail_refusal(request, runtime)) is not None:
            return refusal
        status, body = await health_report(adapters, runtime, scheduler, detail=detail)
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
    # Before it listens: the first question after a (re)start would pay the model clients, the store's
    # first query and the embedding model's first inference.
    await runtime.warm_up()
    knowledge = runtime.knowledge_admin(schedule=schedule)
    scheduler = knowledge.scheduler
    conversations = runtime.conversations(admin=knowledge)
    adapters = build_adapters(runtime, conversations=conversations)
    # After a refresh changed documents (bot/knowledge_loop): the gaps it closed answered where they were
    # asked, approved answers re-checked, the golden set replayed.
    start_follow_ups(runtime, knowledge, adapters)
    knowledge.refresher.after_change.append(
        runtime.knowledge_loop(ReviewerMessages(adapters, runtime.settings)).after_refresh)
    # Each replica also answers the turns of replicas that died holding them (bot/pending.py).
    recovery = RecoveryLoop(conversations.recover, runtime.settings.recovery.interval_s)
    sessions = [session for adapter in adapters if (session := instrument(adapter)) is not None]
    if not adapters:
        log.warning("no way in is configured (set SLACK_BOT_TOKEN, TELEGRAM_BOT_TOKEN or KBBOT_API_TOKEN); "
                    "serving /healthz only")
    web_app = build_web_app(adapters, runtime, scheduler)
    admin_site = mount_admin(web_app, runtime, knowledge)
    runner = GuardedRunner(web_app, runtime.settings.server, access_log=None)
    await runner.setup()
    digest = None
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else port
        log.info("kbbot serving on %s:%d (%s)", host, port, ", ".join(a.name for a in adapters) or "no adapters")
        if on_listening is not None:
            on_listening(port)
        for adapter in adapters:
            await adapter.start()
        if scheduler is not None:
            await scheduler.start()
        recovery.start()
        digest = start_digest(runtime, adapters)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: finishing the turns in progress (up to %.0f s)", drain_s)
    finally:
        await recovery.stop()
        await conversations.recovering.drain(drain_s)
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
        for session in sessions:
            await session.close()
        await runner.cleanup()
        await runtime.close()


def run_serve(runtime: Any, *, port: int | None = None) -> int:
    """The ``kbbot serve`` command body."""
    asyncio.run(serve(runtime, port=port))
    return 0
