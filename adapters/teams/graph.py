"""The Entra ID groups of a Teams user, from Microsoft Graph (``teams.graph_groups``), as principals
``group:<group object id>``: the names SharePoint and OneDrive give Entra groups on documents.

One request per user and page: ``GET /v1.0/users/{object id}/transitiveMemberOf/microsoft.graph.group``
(nested groups included; the cast to groups is an advanced query: ``ConsistencyLevel: eventual`` and
``$count=true``), ``$select=id``, 999 a page, ``@odata.nextLink`` followed only on the Graph host (a link
elsewhere would carry the app's token away). The token is the app's, for
``https://graph.microsoft.com/.default`` (client credentials, ``BotTokens``); plain httpx, not the Graph
SDK (hundreds of megabytes for one call, see the notes).

Graph throttles per app and tenant: a 429 or 503 is waited out when its ``Retry-After`` fits in
``max_wait_s`` (all of a lookup's waits together), else every lookup stops until it has passed.
Whatever goes wrong raises ``GraphUnavailable`` with its cause; ``TeamsDirectory`` then gives the user
the principals known without Graph, never more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import httpx

from adapters.teams.auth import BotTokens, TokenError

log = logging.getLogger("kbbot.teams")

GRAPH_URL = "https://graph.microsoft.com"
GRAPH_SCOPE = "https://graph.microsoft.com/.default"
#: Graph's largest page of directory objects.
PAGE_SIZE = 999
#: Pages of one user's groups read at most (999 each).
MAX_PAGES = 50
#: A 429 or 503 without ``Retry-After``.
DEFAULT_RETRY_S = 2.0


class GraphUnavailable(Exception):
    """Graph did not say which groups a user is in; ``cause``: a short, stable name of why (one warning each)."""

    def __init__(self, cause: str, detail: str = ""):
        super().__init__(f"{cause}{': ' + detail if detail else ''}")
        self.cause = cause


class GraphGroups:
    """``of(object_id)``: the ids of the Entra groups the user is a transitive member of."""

    def __init__(self, tokens: BotTokens, *, graph_url: str = GRAPH_URL, max_wait_s: float = 10.0,
                 attempts: int = 3, concurrency: int = 8, timeout_s: float = 10.0,
                 client: httpx.AsyncClient | None = None, clock: Any = time.monotonic):
        self.tokens = tokens
        self.graph_url = graph_url.rstrip("/")
        self._host = urlsplit(self.graph_url)[:2]
        self.max_wait_s = max_wait_s
        self.attempts = attempts
        self._client = client
        self._own_client = client is None
        self.timeout_s = timeout_s
        self._clock = clock
        #: A channel's roster asks for many users at once: a few at a time, as Graph's throttling asks.
        self._slots = asyncio.Semaphore(concurrency)
        #: Throttled past the bound: no request before this time.
        self.paused_until = float("-inf")

    async def close(self) -> None:
        if self._own_client and self._client is not None:
            await self._client.aclose()
        self._client = None
        await self.tokens.close()

    async def of(self, object_id: str) -> frozenset[str]:
        url = (f"{self.graph_url}/v1.0/users/{quote(object_id, safe='')}/transitiveMemberOf/microsoft.graph.group"
               f"?$select=id&$top={PAGE_SIZE}&$count=true")
        groups: set[str] = set()
        async with self._slots:
            waited = 0.0
            for _ in range(MAX_PAGES):
                page, waited = await self._get(url, waited)
                if page is None:
                    return frozenset()  # Graph knows no such user: no groups
                groups.update(str(g["id"]).lower() for g in page.get("value") or []
                              if isinstance(g, dict) and g.get("id"))
                next_link = page.get("@odata.nextLink")
                if not next_link:
                    return frozenset(groups)
                if urlsplit(str(next_link))[:2] != self._host:
                    raise GraphUnavailable("a nextLink off the Graph host", urlsplit(str(next_link)).netloc[:64])
                url = str(next_link)
        raise GraphUnavailable("too many groups", f"more than {MAX_PAGES * PAGE_SIZE}")

    async def _get(self, url: str, waited: float) -> tuple[dict[str, Any] | None, float]:
        """One page (None: 404), retrying a 401 once and a 429/503 within ``max_wait_s``; ``waited``: the
        seconds this lookup has waited so far."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        renewed = False
        for attempt in range(1, self.attempts + 1):
            if self._clock() < self.paused_until:
                raise GraphUnavailable("throttled", f"paused for {self.paused_until - self._clock():.0f} s more")
            try:
                token = await self.tokens.get_app_token(GRAPH_SCOPE)
                response = await self._client.get(url, headers={
                    "Authorization": f"Bearer {token}", "ConsistencyLevel": "eventual", "Accept": "application/json"})
            except TokenError as exc:
                raise GraphUnavailable("no Graph token", str(exc)) from None
            except (httpx.HTTPError, aiohttp.ClientError, TimeoutError) as exc:
                raise GraphUnavailable("unreachable", type(exc).__name__) from None
            status = response.status_code
            if status == 200:
                try:
                    body = response.json()
                except ValueError:
                    raise GraphUnavailable("not JSON") from None
                if not isinstance(body, dict):
                    raise GraphUnavailable("not JSON")
                return body, waited
            if status == 404:
                return None, waited
            if status == 401 and not renewed:
                self.tokens.forget()
                renewed = True
                continue
            if status in (429, 503):
                delay = _retry_after(response)
                if attempt < self.attempts and waited + delay <= self.max_wait_s:
                    waited += delay
                    await asyncio.sleep(delay)
                    continue
                self.paused_until = max(self.paused_until, self._clock() + delay)
                raise GraphUnavailable("throttled", f"{status}, Retry-After {delay:.0f} s")
            code = _error_code(response)
            if status == 403:
                raise GraphUnavailable("403 forbidden", f"{code} (is User.Read.All or GroupMember.Read.All granted "
                                                        "with admin consent?)")
            raise GraphUnavailable(f"{status}", code)
        raise GraphUnavailable("refused", f"{self.attempts} attempts")


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", DEFAULT_RETRY_S)))
    except ValueError:
        return DEFAULT_RETRY_S


def _error_code(response: httpx.Response) -> str:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code") or "")[:64] if isinstance(error, dict) else ""
