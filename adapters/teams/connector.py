"""kbbot's calls to the Bot Connector, through the Teams SDK's ``ApiClient`` (``microsoft-teams-api``).

One SDK client per service URL (each activity names the connector its conversation lives on), all on
one httpx pool and the app's token (``adapters.teams.auth.BotTokens``). The SDK retries nothing: here a
401 drops the token held and the call is made once more (a token revoked or expired early), and a 429
becomes ``bot.delivery.reply.RetryAfter`` (Teams documents no ``Retry-After`` for bot APIs: without one
the wait is ``DEFAULT_RETRY_S``), which the caller's rate budget holds for everyone.

The SDK's two side effects are neutralised here (see docs/teams.md): ``ApiClient`` is given the OAuth
URL, so it reads no ``OAUTH_URL`` from the environment, and the httpx logger's level, which its
``Client`` resets, is put back.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from microsoft_teams.api import ApiClient, ApiClientSettings
from microsoft_teams.api.auth.cloud_environment import PUBLIC
from microsoft_teams.common import Client, ClientOptions

from adapters.teams.auth import BotTokens
from bot.delivery.reply import RetryAfter

log = logging.getLogger("kbbot.teams")

T = TypeVar("T")
#: The wait after a 429 without ``Retry-After`` (Microsoft asks for a backoff; streams: 1.5-2 s apart).
DEFAULT_RETRY_S = 2.0

# The 403 messages of Teams' streaming protocol ("Stream bot messages").
STREAM_NOT_ALLOWED = "content stream is not allowed"
STREAM_CANCELLED = "cancelled by user"
STREAM_TIMED_OUT = "exceeded streaming time"
STREAM_COMPLETED = "already completed"


def error_of(exc: httpx.HTTPStatusError) -> tuple[int, str, str]:
    """(status, error code, message) of a connector error (its JSON body, when it has one)."""
    try:
        body = exc.response.json()
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    return exc.response.status_code, str(error.get("code") or ""), str(error.get("message") or "")


def retry_after_of(response: httpx.Response, default: float = DEFAULT_RETRY_S) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", default)))
    except ValueError:
        return default


class Connector:
    """The Bot Connector, per service URL, with the app's token (see the module)."""

    def __init__(self, tokens: BotTokens, *, timeout_s: float = 10.0):
        self.tokens = tokens
        httpx_logger = logging.getLogger("httpx")
        level = httpx_logger.level
        self._http = Client(ClientOptions(timeout=timeout_s))
        httpx_logger.setLevel(level)  # the SDK's Client sets it to its own logger's level
        self._clients: dict[str, ApiClient] = {}

    def api(self, service_url: str) -> ApiClient:
        key = service_url.rstrip("/")
        client = self._clients.get(key)
        if client is None:
            with warnings.catch_warnings():  # its own deprecated BotClient, built by every ApiClient
                warnings.simplefilter("ignore", DeprecationWarning)
                client = ApiClient(key, self._http, ApiClientSettings(oauth_url=PUBLIC.token_service_url),
                                   cloud=PUBLIC, token_provider=self.tokens)
            self._clients[key] = client
        return client

    async def call(self, service_url: str, what: str, call: Callable[[ApiClient], Awaitable[T]]) -> T:
        """``call`` on the client of ``service_url``: a 401 fetches a new token and tries once more, a 429
        raises ``RetryAfter``; other refusals raise ``httpx.HTTPStatusError``."""
        api = self.api(service_url)
        for attempt in range(2):
            try:
                return await call(api)
            except httpx.HTTPStatusError as exc:
                status = exc.response.status_code
                if status == 401 and attempt == 0:
                    log.info("Teams: %s refused the app's token; fetching a new one", what)
                    self.tokens.forget()
                    continue
                if status == 429:
                    raise RetryAfter(retry_after_of(exc.response), f"{what} throttled") from exc
                raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        http: Any = getattr(self._http, "http", None)
        if http is not None:
            await http.aclose()
        await self.tokens.close()
