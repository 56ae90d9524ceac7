"""``kbbot serve``: one asyncio process, one HTTP server, every configured platform; ``serve --workers N``
runs N of them behind one port (``adapters.workers``).

The refresh scheduler (``bot.knowledge.scheduler``) runs every configured source on its schedule in the same
event loop (the refreshes themselves in a worker thread). The platforms are the registry's
(``adapters.platforms``: each a ``bot.platform.Platform``); the web server listens on ``KBBOT_PORT``
(default 3000) and serves ``/healthz``, ``/metrics`` and the routes the platforms mount (Slack's
Events API at ``/slack/events``, Telegram's webhook, the HTTP API). Platforms that hold their own
connection (Slack Socket Mode, Telegram polling) are started next to it.

- ``/healthz``: Redis (PING), Weaviate (the knowledge version read), the refresh scheduler and each
  platform, each ``up`` / ``down`` / ``off``; HTTP 503 when any is down, else 200.
- ``/metrics``: Prometheus text format (``bot.metrics``). Each platform counts its own API calls where
  all of them pass (Slack: a ``TraceConfig`` on its client's session; Telegram: a request middleware).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from aiohttp import web

from adapters.insights import mount_admin, start_digest, start_follow_ups
from adapters.platforms import build_platforms
from adapters.web_guard import GuardedRunner, max_body_bytes, middlewares
from adapters.workers import Worker
from bot.delivery.pending import RecoveryLoop
from bot.errors import SettingsError
from bot.knowledge.loop.golden import golden_results
from bot.metrics import CONTENT_TYPE, METRICS, Metrics
from bot.platform import Platform, ReviewerMessages
from bot.settings.base import reveal
from bot.settings.server import ServerSettings
from bot.state.health import check_redis, check_store

log = logging.getLogger("kbbot.server")

DEFAULT_PORT = 3000


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


async def health_report(adapters: Iterable[Platform], runtime: Any = None, scheduler: Any = None,
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


def build_web_app(adapters: Iterable[Platform], runtime: Any = None, scheduler: Any = None,
                  metrics: Metrics | None = None, worker: Worker | None = None) -> web.Application:
    """The one web app: ``/healthz``, ``/metrics`` and the adapters' routes, behind the server's
    guards (``adapters.web_guard``; ``server:`` settings of ``runtime``, else the defaults). ``/healthz``
    names the ``worker`` that answered when there are several."""
    settings = runtime.settings if runtime is not None else None
    app = web.Application(middlewares=middlewares(settings.server if settings else ServerSettings()),
                          client_max_size=max_body_bytes(settings.api.max_body_kb if settings else None))

    async def healthz(request: web.Request) -> web.Response:
        detail = "detail" in request.query
        if detail and (refusal := _detail_refusal(request, runtime)) is not None:
            return refusal
        status, body = await health_report(adapters, runtime, scheduler, detail=detail)
        if worker is not None and not worker.alone:
            body["worker"] = {"index": worker.index, "of": worker.count, "pid": os.getpid()}
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
    worker = Worker.from_env(env)
    schedule = schedule and worker.first  # once per host (adapters.workers)
    await runtime.start()
    # Before it listens: the first question after a (re)start would pay the model clients, the store's
    # first query and the embedding model's first inference.
    await runtime.warm_up()
    knowledge = runtime.knowledge_admin(schedule=schedule)
    scheduler = knowledge.scheduler
    conversations = runtime.conversations(admin=knowledge)
    adapters = list(build_platforms(runtime, conversations).values())
    # After a refresh changed documents (bot/knowledge/loop): the gaps it closed answered where they were
    # asked, approved answers re-checked, the golden set replayed.
    start_follow_ups(runtime, knowledge, adapters)
    knowledge.refresher.after_change.append(runtime.knowledge_loop(ReviewerMessages(adapters)).after_refresh)
    # Each replica also answers the turns of replicas that died holding them (bot/delivery/pending.py).
    recovery = RecoveryLoop(conversations.turns.recover, runtime.settings.recovery.interval_s)
    if not adapters:
        log.warning("no way in is configured (set SLACK_BOT_TOKEN, TELEGRAM_BOT_TOKEN or KBBOT_API_TOKEN); "
                    "serving /healthz only")
    web_app = build_web_app(adapters, runtime, scheduler, worker=worker)
    admin_site = mount_admin(web_app, runtime, knowledge)
    runner = GuardedRunner(web_app, runtime.settings.server, access_log=None)
    await runner.setup()
    digest = None
    try:
        site = web.TCPSite(runner, host, port, reuse_port=not worker.alone or None)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else port
        log.info("kbbot serving on %s:%d (%s)%s", host, port, ", ".join(a.name for a in adapters) or "no adapters",
                 "" if worker.alone else f", worker {worker.index} of {worker.count}")
        if on_listening is not None:
            on_listening(port)
        for adapter in adapters:
            await adapter.start()
        if scheduler is not None:
            await scheduler.start()
        recovery.start()
        digest = start_digest(runtime, adapters) if worker.first else None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: finishing the turns in progress (up to %.0f s)", drain_s)
    finally:
        await recovery.stop()
        await conversations.turns.recovering.drain(drain_s)
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
        await runner.cleanup()
        await runtime.close()


def run_serve(runtime: Any, *, port: int | None = None) -> int:
    """The ``kbbot serve`` command body."""
    asyncio.run(serve(runtime, port=port))
    return 0
