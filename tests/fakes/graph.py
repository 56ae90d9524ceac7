"""A local Microsoft Graph, as an app with client credentials meets it: the login service's token endpoint
(``/{tenant}/oauth2/v2.0/token``, scope ``https://graph.microsoft.com/.default``) and ``/v1.0``.

It is a directory of objects (``objects``: id -> the object as Graph returns it, ``@odata.type`` included)
and a registry of routes (``route(method, path, handler)``, before ``start``), so that a source reading
SharePoint or OneDrive adds its sites, drives and items to the same fake. Built in:
``GET /v1.0/users/{id}/transitiveMemberOf/microsoft.graph.group`` (nested groups, paged). Every ``/v1.0``
call needs a token it issued, is recorded in ``calls``, and may be refused on demand::

    async with FakeGraph(tenant_id=..., app_id=..., app_secret=...) as graph:
        finance = graph.add_group("Finance", members=[alice_object_id])
        graph.add_group("Finance EMEA", members=[finance])      # nested: alice is in both
        graph.throttle(times=2, retry_after=1)                  # 429 + Retry-After on the next two calls
        graph.forbid()                                          # 403 Authorization_RequestDenied (no consent)
        graph.max_page_size = 2                                 # pages of two at most, linked by @odata.nextLink

Collections are paged as Graph pages them: ``$top`` (at most ``max_page_size``) per page, the next page's
full URL in ``@odata.nextLink`` (``next_link_root`` may point it elsewhere, as a test of who follows it).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aiohttp import web

from tests.fakes.local_server import LocalServer

__all__ = ["GRAPH_SCOPE", "FakeGraph", "GraphCall"]

JSON = dict[str, Any]
GRAPH_SCOPE = "https://graph.microsoft.com/.default"
Handler = Callable[[web.Request], Awaitable[tuple[int, JSON]]]


@dataclass
class GraphCall:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    at: float
    status: int = 0


class GraphRefusal(Exception):
    """Raised by a handler: Graph's error body ``{"error": {"code", "message"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class FakeGraph(LocalServer):
    """``graph_url`` and ``login_url`` are where the app is pointed (both this server)."""

    def __init__(self, *, app_id: str = "7e1b0b52-0000-4000-8000-00000000b07a", app_secret: str = "fake-secret",
                 tenant_id: str = "0d1e2f30-0000-4000-8000-0000000fe4a7", token_lifetime_s: int = 3599) -> None:
        super().__init__()
        self.app_id, self.app_secret, self.tenant_id = app_id, app_secret, tenant_id
        self.token_lifetime_s = token_lifetime_s
        self.objects: dict[str, JSON] = {}
        #: Member id (user or group) -> the groups it is a direct member of.
        self.member_of: dict[str, set[str]] = {}
        self.calls: list[GraphCall] = []
        #: Graph's default page of directory objects is 100 (without ``$top``), its largest 999.
        self.default_page_size = 100
        self.max_page_size = 999
        #: Where ``@odata.nextLink`` points (None: this server).
        self.next_link_root: str | None = None
        self._routes: list[tuple[str, str, Handler]] = []
        self._tokens: dict[str, float] = {}
        self._refusals: deque[GraphRefusal] = deque()
        self._forbidden = False
        self.route("GET", "/v1.0/users/{id}/transitiveMemberOf/microsoft.graph.group", self._transitive_groups)

    # --- where the app points ---------------------------------------------------------------------------
    @property
    def graph_url(self) -> str:
        """Stands for ``https://graph.microsoft.com``."""
        return self.root_url

    @property
    def login_url(self) -> str:
        """Stands for ``https://login.microsoftonline.com``."""
        return self.root_url

    # --- the directory ------------------------------------------------------------------------------------
    def add_user(self, object_id: str | None = None, **properties: Any) -> str:
        object_id = object_id or str(uuid.uuid4())
        self.objects[object_id] = {"@odata.type": "#microsoft.graph.user", "id": object_id, **properties}
        return object_id

    def add_group(self, name: str, *, members: list[str] | None = None, object_id: str | None = None) -> str:
        """A security group; ``members``: user or group ids (a group in a group nests)."""
        object_id = object_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"group:{name}"))
        self.objects[object_id] = {"@odata.type": "#microsoft.graph.group", "id": object_id, "displayName": name,
                                   "securityEnabled": True, "mailEnabled": False}
        for member in members or []:
            self.add_member(object_id, member)
        return object_id

    def add_member(self, group: str, member: str) -> None:
        self.member_of.setdefault(member, set()).add(group)

    def remove_member(self, group: str, member: str) -> None:
        self.member_of.get(member, set()).discard(group)

    def transitive_groups(self, member: str) -> list[str]:
        found: list[str] = []
        todo = sorted(self.member_of.get(member, ()))
        while todo:
            group = todo.pop(0)
            if group not in found:
                found.append(group)
                todo += sorted(self.member_of.get(group, ()))
        return found

    # --- misbehaviour -------------------------------------------------------------------------------------
    def throttle(self, *, times: int = 1, retry_after: float | None = 1.0, status: int = 429) -> None:
        """The next ``times`` calls get ``status`` (429 or 503) with ``Retry-After`` (None: without)."""
        headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
        code = "TooManyRequests" if status == 429 else "ServiceUnavailable"
        self._refusals.extend(GraphRefusal(status, code, "Too many requests", headers) for _ in range(times))

    def forbid(self, forbidden: bool = True) -> None:
        """Every call gets 403, as when the app's permission has no admin consent."""
        self._forbidden = forbidden

    def calls_to(self, suffix: str) -> list[GraphCall]:
        return [c for c in self.calls if c.path.endswith(suffix)]

    # --- tokens -------------------------------------------------------------------------------------------
    def access_token(self) -> str:
        token = f"graph-{uuid.uuid4().hex}"
        self._tokens[token] = time.time() + self.token_lifetime_s
        return token

    def expire_tokens(self) -> None:
        self._tokens.clear()

    # --- routes -------------------------------------------------------------------------------------------
    def route(self, method: str, path: str, handler: Handler) -> None:
        """``handler(request)`` -> (status, JSON) for ``path`` (aiohttp's ``{name}`` patterns); raise
        ``GraphRefusal`` for an error. Register before ``start``."""
        self._routes.append((method, path, handler))

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token_endpoint)
        for method, path, handler in self._routes:
            app.router.add_route(method, path, self._api(handler))

    def page(self, request: web.Request, items: list[JSON]) -> JSON:
        """One page of ``items`` as Graph pages a collection (``$top``, ``$skiptoken``), ``$select`` applied."""
        query = dict(request.query)
        size = min(int(query.get("$top") or self.default_page_size), self.max_page_size)
        start = int(query.pop("$skiptoken", "0") or 0)
        select = [f for f in (query.get("$select") or "").split(",") if f]
        shown = [{k: v for k, v in item.items() if not select or k in select or k == "@odata.type"}
                 for item in items[start:start + size]]
        body: JSON = {"@odata.context": f"{self.graph_url}/v1.0/$metadata#directoryObjects", "value": shown}
        if "$count" in query:
            body["@odata.count"] = len(items)
        if start + size < len(items):
            root = self.next_link_root or self.graph_url
            body["@odata.nextLink"] = f"{root}{request.path}?{urlencode({**query, '$skiptoken': start + size})}"
        return body

    def _api(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            call = GraphCall(request.method, request.path, dict(request.query), dict(request.headers), time.monotonic())
            self.calls.append(call)
            headers: dict[str, str] = {}
            try:
                scheme, _, token = request.headers.get("Authorization", "").partition(" ")
                if scheme != "Bearer" or self._tokens.get(token, 0) < time.time():
                    raise GraphRefusal(401, "InvalidAuthenticationToken", "Access token is empty or expired.")
                if self._refusals:
                    raise self._refusals.popleft()
                if self._forbidden:
                    raise GraphRefusal(403, "Authorization_RequestDenied",
                                       "Insufficient privileges to complete the operation.")
                status, body = await handler(request)
            except GraphRefusal as refusal:
                status, headers = refusal.status, refusal.headers
                body = {"error": {"code": refusal.code, "message": refusal.message,
                                  "innerError": {"request-id": str(uuid.uuid4())}}}
            call.status = status
            return web.json_response(body, status=status, headers=headers)
        return handle

    async def _transitive_groups(self, request: web.Request) -> tuple[int, JSON]:
        user = request.match_info["id"]
        if self.objects.get(user, {}).get("@odata.type") != "#microsoft.graph.user":
            raise GraphRefusal(404, "Request_ResourceNotFound",
                               f"Resource '{user}' does not exist or one of its queried reference-property "
                               "objects are not present.")
        if request.headers.get("ConsistencyLevel") != "eventual" or "$count" not in request.query:
            # An OData cast on a directory relationship is an advanced query.
            raise GraphRefusal(400, "Request_UnsupportedQuery", "Unsupported Query.")
        return 200, self.page(request, [self.objects[g] for g in self.transitive_groups(user)])

    async def _token_endpoint(self, request: web.Request) -> web.Response:
        form = dict(parse_qsl(await request.text()))

        def error(status: int, code: str, description: str) -> web.Response:
            return web.json_response({"error": code, "error_description": description}, status=status)

        if form.get("grant_type") != "client_credentials":
            return error(400, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type.")
        if request.match_info["tenant"] != self.tenant_id:
            return error(400, "invalid_request", "AADSTS90002: Tenant not found.")
        if form.get("client_id") != self.app_id:
            return error(400, "unauthorized_client", "AADSTS700016: Application not found in the directory.")
        if form.get("client_secret") != self.app_secret:
            return error(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        if form.get("scope") != GRAPH_SCOPE:
            return error(400, "invalid_scope", "AADSTS1002012: The provided value for scope is not valid.")
        return web.json_response({"token_type": "Bearer", "expires_in": self.token_lifetime_s,
                                  "ext_expires_in": self.token_lifetime_s, "access_token": self.access_token()})
