"""Platform API calls counted in ``bot.metrics``: Slack's through an aiohttp ``TraceConfig``, Telegram's
through an aiogram request middleware (the core knows no platform SDK, so these live with the adapters)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
from aiogram.exceptions import TelegramNetworkError, TelegramRetryAfter, TelegramServerError

from bot.metrics import METRICS, Metrics


def slack_trace_config(metrics: Metrics | None = None) -> Any:
    """An ``aiohttp.TraceConfig`` counting Slack Web API calls by method (the URL's last segment) and
    status, for the ``aiohttp.ClientSession`` the Slack client (and bolt's per-request clients) use.
    Every call, retried ones included, is counted once per HTTP request."""
    def target() -> Metrics:
        return metrics or METRICS

    config = aiohttp.TraceConfig()

    def method_of(url: Any) -> str:
        path = getattr(url, "path", str(url))
        return path.rstrip("/").rsplit("/", 1)[-1] or "?"

    async def on_end(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        target().observe_api_call("slack", method_of(params.url), params.response.status)

    async def on_error(session: Any, ctx: SimpleNamespace, params: Any) -> None:
        target().observe_api_call("slack", method_of(params.url), type(params.exception).__name__)

    config.on_request_end.append(on_end)
    config.on_request_exception.append(on_error)
    return config


class TelegramApiMetrics:
    """An aiogram request middleware (``bot.session.middleware(TelegramApiMetrics())``): every Bot API
    call by method, with flood control (429) and server errors."""

    def __init__(self, metrics: Metrics | None = None):
        self.metrics = metrics

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        metrics = self.metrics or METRICS
        name = getattr(method, "__api_method__", type(method).__name__)
        if name == "getUpdates":  # long polls are the connection, not calls answering anyone
            return await make_request(bot, method)
        try:
            result = await make_request(bot, method)
        except TelegramRetryAfter:
            metrics.observe_api_call("telegram", name, 429)
            raise
        except TelegramServerError:
            metrics.observe_api_call("telegram", name, 500)
            raise
        except TelegramNetworkError:
            metrics.observe_api_call("telegram", name, "network")
            raise
        except Exception:
            metrics.observe_api_call("telegram", name, 400)  # refused (bad request, forbidden): still a call
            raise
        metrics.observe_api_call("telegram", name, 200)
        return result

