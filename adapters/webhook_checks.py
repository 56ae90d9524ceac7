"""Slack's and Telegram's webhook requests, checked where their SDKs would stumble on a stranger's.

Both routes answer anyone before a signature or secret is proven. slack_sdk's ``SignatureVerifier``
does ``int(X-Slack-Request-Timestamp)`` and aiogram compares ``X-Telegram-Bot-Api-Secret-Token``
with ``secrets.compare_digest`` on text, which raises on anything but ASCII: both ended in a 500 with
a traceback. Here such a request is a 401 and one log line, like any other wrong signature.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any

from aiogram import Bot
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web

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


class TelegramWebhook(SimpleRequestHandler):
    """aiogram's webhook handler, comparing the secret token as bytes and logging a refusal."""

    def verify_secret(self, telegram_secret_token: str, bot: Bot) -> bool:
        if not self.secret_token:
            return True
        # aiohttp keeps undecodable header bytes as surrogates: they encode back to what was sent.
        presented = telegram_secret_token.encode("utf-8", "surrogateescape")
        return hmac.compare_digest(presented, self.secret_token.encode())

    async def handle(self, request: web.Request) -> web.Response:
        bot = await self.resolve_bot(request)
        if not self.verify_secret(request.headers.get("X-Telegram-Bot-Api-Secret-Token", ""), bot):
            log.warning("Telegram webhook: refused %s %s from %s: wrong or missing secret token", request.method,
                        request.path, request.remote)
            return web.Response(body="Unauthorized", status=401)
        return await super().handle(request)

    __call__: Any = handle
