"""Slack's HTTP edges: its Events API requests checked where the SDK would stumble on a stranger's, and its
Web API calls counted in ``bot.metrics``.

The events route answers anyone before a signature is proven. slack_sdk's ``SignatureVerifier`` does
``int(X-Slack-Request-Timestamp)``: a timestamp that is no number ended in a 500 with a traceback. Here
such a request is a 401 and one log line, like any other wrong signature.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from bot.metrics import METRICS, Metrics

log = logging.getLogger("kbbot.webhooks")


def slack_signature_problem(headers: Mapping[str, str]) -> str | None:
    """Why a request's ``X-Slack-Request-Timestamp`` / ``X-Slack-Signature`` cannot be checked (a
    timestamp that is no number, a signature that is no ASCII), else None (Bolt checks the rest)."""
    timestamp = headers.get("X-Slack-Request-Timestamp")
    if timestamp is not None and not (timestamp.isascii() and timestamp.isdigit()):
        return "X-Slack-Request-Timestamp is not a number"
    signature = headers.get("X-Slack-Signature")
    if signature is not None and not signature.isascii():
        return "X-Slack-Signature is not ASCII"
    return None


def slack_refusal(request: web.Request, problem: str) -> web.Response:
    log.warning("Slack: refused %s %s from %s: %s", request.method, request.path, request.remote, problem)
    return web.json_response({"error": "invalid request"}, status=401)


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
