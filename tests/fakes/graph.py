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

SharePoint and OneDrive (``add_site``, ``add_drive``, ``add_file``; edits, moves, deletions and sharing
changes each advance the drive's change log)::

    site = graph.add_site("contoso.sharepoint.com", "sites/handbook", permissions=[site_group("Handbook Members")])
    docs = graph.add_drive("Documents", site=site)
    manual = graph.add_file(docs, "Manuals/pump.md", b"# Pump ...", permissions=[user_permission("a@contoso.com")])
    graph.edit(manual, b"..."); graph.share(manual, [...]); graph.move(manual, "Archive"); graph.delete(manual)
    graph.expire_delta_tokens(docs)                          # the next delta with a token answers 410

Site pages (``add_page``, ``edit_page``; ``page.deleted``, ``page.corrupt``, ``pages_forbidden``):
``GET /v1.0/sites/{id}/pages/microsoft.graph.sitePage`` (paged; with ``$expand=canvasLayout`` it fails
whole when one page is corrupt, as Graph does) and ``/sites/{id}/pages/{page}/microsoft.graph.sitePage``
(``$expand=canvasLayout``: text web parts' ``innerHtml`` in horizontal sections and the vertical one).

Served: ``GET /v1.0/sites/{host}:/{path}``, ``/sites/{id}/drives``, ``/users/{upn}/drive``,
``/drives/{id}/root/delta`` (and ``/sites/{id}/drive/root/delta``; ``delta_page_size`` items a page, an
``@odata.deltaLink`` with a token on the last; deleted items with the ``deleted`` facet and no name),
``/drives/{id}/root:/{path}``, ``/drives/{d}/items/{i}/children`` (paged as other collections; a move
changes only the moved item, so delta names a moved folder and none of its files, as Graph does),
``/drives/{d}/items/{i}/permissions`` (effective: the item's own, else its
folders', else the site's), ``/drives/{d}/items/{i}/content`` (302 to ``/download/...`` on
``download_root``: by default this server under the name ``localhost``, where the token is not needed;
``downloads`` records whether one came with it anyway). With ``tls=True`` the login service (OpenID
configuration and token endpoint) is also served over HTTPS (``login_url``, certificate ``ca_file``), as
MSAL insists; it accepts the client secret or a certificate's signed assertion (``add_certificate``), and
``expire_secret()`` makes it answer as Entra does for an expired secret (AADSTS7000222).
"""

from __future__ import annotations

import datetime
import itertools
import ssl
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jwt
from aiohttp import web

from tests.fakes.local_server import LocalServer

__all__ = ["GRAPH_SCOPE", "FakeDrive", "FakeGraph", "FakeItem", "FakePage", "GraphCall", "group_permission", "link_permission",
           "site_group", "site_user_permission", "user_permission"]

JSON = dict[str, Any]
GRAPH_SCOPE = "https://graph.microsoft.com/.default"
Handler = Callable[[web.Request], Awaitable[tuple[int, JSON] | web.StreamResponse]]
_ids = itertools.count(1)


# --- permissions as Graph shows them ------------------------------------------------------------------
def _permission(roles: tuple[str, ...], **fields: Any) -> JSON:
    return {"id": f"perm{next(_ids)}", "roles": list(roles), **fields}


def user_permission(email: str, *, name: str = "", roles: tuple[str, ...] = ("read",)) -> JSON:
    return _permission(roles, grantedToV2={"user": {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, email)),
                                                    "displayName": name or email.split("@")[0],
                                                    **({"email": email} if email else {})}})


def group_permission(object_id: str, *, name: str = "Group", roles: tuple[str, ...] = ("read",)) -> JSON:
    return _permission(roles, grantedToV2={"group": {"id": object_id, "displayName": name}})


def site_group(name: str, *, roles: tuple[str, ...] = ("read",)) -> JSON:
    return _permission(roles, grantedToV2={"siteGroup": {"id": str(next(_ids)), "displayName": name,
                                                         "loginName": name}})


def site_user_permission(login_name: str, *, name: str = "", roles: tuple[str, ...] = ("read",)) -> JSON:
    return _permission(roles, grantedToV2={"siteUser": {"id": str(next(_ids)), "displayName": name or login_name,
                                                        "loginName": login_name}})


def link_permission(scope: str, *, recipients: tuple[str, ...] = (), link_type: str = "view") -> JSON:
    """A sharing link: ``anonymous`` (anyone), ``organization`` or ``users`` (sent to ``recipients``)."""
    return _permission(("read",), link={"scope": scope, "type": link_type,
                                        "webUrl": f"https://contoso.sharepoint.com/:w:/s/x/{uuid.uuid4().hex[:12]}"},
                       grantedToIdentitiesV2=[{"user": {"email": r, "displayName": r.split("@")[0]}}
                                              for r in recipients])


@dataclass
class FakeItem:
    id: str
    name: str
    parent: str | None  # the parent folder's id (None: the drive's root)
    drive: FakeDrive
    folder: bool = False
    content: bytes = b""
    version: int = 1  # of the content (cTag)
    meta_version: int = 1  # of the item (eTag): content, name, place, sharing
    permissions: list[JSON] | None = None  # its own (unique) permissions; None: inherited
    deleted: bool = False
    seq: int = 0  # the drive's change number of its last change
    author: str = "Ada Author"
    size: int | None = None  # what Graph says its size is (None: its content's)

    @property
    def web_url(self) -> str:
        names: list[str] = []
        item: FakeItem | None = self
        while item is not None and item.id != self.drive.root.id:
            names.append(item.name)
            item = self.drive.items.get(item.parent or "")
        return self.drive.web_url + "/" + "/".join(quote(n) for n in reversed(names))

    def as_graph(self) -> JSON:
        if self.deleted:  # SharePoint and OneDrive for Business omit the name of a deleted item
            return {"id": self.id, "deleted": {"state": "deleted"},
                    "parentReference": {"driveId": self.drive.id, "id": self.parent}}
        body: JSON = {"id": self.id, "name": self.name, "eTag": f'"{{{self.id}}},{self.meta_version}"',
                      "cTag": f'"c:{{{self.id}}},{self.version}"', "webUrl": self.web_url,
                      "size": len(self.content) if self.size is None else self.size,
                      "createdBy": {"user": {"displayName": self.author}},
                      "lastModifiedDateTime": "2026-12-01T10:00:00Z",
                      "parentReference": {"driveId": self.drive.id, "driveType": "documentLibrary",
                                          **({"id": self.parent} if self.parent else {})}}
        if self is self.drive.root:
            body["root"] = {}
            body["name"] = "root"
        if self.folder:
            body["folder"] = {"childCount": sum(1 for i in self.drive.items.values()
                                                if i.parent == self.id and not i.deleted)}
        else:
            body["file"] = {"mimeType": "application/octet-stream"}
        return body


@dataclass
class FakeDrive:
    id: str
    name: str
    web_url: str
    site: JSON | None  # None: a user's OneDrive
    items: dict[str, FakeItem] = field(default_factory=dict)
    seq: int = 0
    #: Delta tokens of an earlier epoch answer 410 (Graph forgot them).
    epoch: int = 0
    root: FakeItem = field(init=False)

    def __post_init__(self) -> None:
        self.root = FakeItem(f"root{next(_ids)}", "root", None, self, folder=True)
        self.items[self.root.id] = self.root

    def touch(self, item: FakeItem) -> None:
        self.seq += 1
        item.seq = self.seq
        item.meta_version += 1

    def path_of(self, path: str) -> FakeItem | None:
        item = self.root
        for name in [n for n in path.strip("/").split("/") if n]:
            found = next((i for i in self.items.values() if i.parent == item.id and i.name.lower() == name.lower()
                          and not i.deleted), None)
            if found is None:
                return None
            item = found
        return item

    def effective_permissions(self, item: FakeItem) -> list[JSON]:
        current: FakeItem | None = item
        while current is not None:
            if current.permissions is not None:
                return current.permissions
            current = self.items.get(current.parent or "")
        return list((self.site or {}).get("permissions") or [])

    def ordered(self) -> list[FakeItem]:
        """Every live item, parents before children (as a full enumeration gives them)."""
        order: list[FakeItem] = []

        def walk(parent: FakeItem) -> None:
            order.append(parent)
            for child in sorted((i for i in self.items.values() if i.parent == parent.id and not i.deleted),
                                key=lambda i: i.name):
                walk(child)

        walk(self.root)
        return order


@dataclass
class FakePage:
    """A modern SharePoint page (``sitePage``) as Graph v1.0 shows it."""

    id: str
    title: str
    site_url: str
    text: list[str]
    vertical: list[str]
    others: list[JSON]
    version: int = 1
    deleted: bool = False
    corrupt: bool = False  # its canvasLayout cannot be read (Graph fails the list's $expand for all)

    @property
    def name(self) -> str:
        return self.title.replace(" ", "-") + ".aspx"

    @property
    def web_url(self) -> str:
        return f"{self.site_url}/SitePages/{quote(self.name)}"

    def as_graph(self, *, expand: bool) -> JSON:
        body: JSON = {"@odata.type": "#microsoft.graph.sitePage", "id": self.id, "name": self.name,
                      "title": self.title, "webUrl": self.web_url, "pageLayout": "article",
                      "promotionKind": "page", "eTag": f'"{{{self.id.upper()}}},{self.version}"',
                      "lastModifiedDateTime": f"2026-12-01T10:{self.version % 60:02d}:00Z",
                      "createdBy": {"user": {"displayName": "Ada Author"}}}
        if expand:
            def text_part(html: str) -> JSON:
                return {"@odata.type": "#microsoft.graph.textWebPart", "id": str(uuid.uuid4()), "innerHtml": html}

            body["canvasLayout"] = {
                "horizontalSections": [{"layout": "oneColumn", "id": str(n + 1), "emphasis": "none", "columns": [
                    {"id": "1", "width": 12, "webparts": [text_part(html)] + (self.others if n == 0 else [])}]}
                    for n, html in enumerate(self.text)],
                **({"verticalSection": {"emphasis": "none", "webparts": [text_part(h) for h in self.vertical]}}
                   if self.vertical else {})}
        return body


def tls_files() -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (made once per process)."""
    global _TLS
    if _TLS is None:
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kbbot fake login")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                               critical=False)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        folder = Path(tempfile.mkdtemp(prefix="kbbot-fake-tls-"))
        (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                                           serialization.NoEncryption()))
        _TLS = (folder / "cert.pem", folder / "key.pem")
    return _TLS


_TLS: tuple[Path, Path] | None = None


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
                 tenant_id: str = "0d1e2f30-0000-4000-8000-0000000fe4a7", token_lifetime_s: int = 3599,
                 tls: bool = False) -> None:
        super().__init__()
        self.tls = tls
        self._tls_root: str | None = None
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
        #: SharePoint and OneDrive.
        self.sites: dict[str, JSON] = {}
        self.drives: dict[str, FakeDrive] = {}
        self.user_drives: dict[str, str] = {}  # upn -> drive id
        self.delta_page_size = 200
        #: Where ``/content`` sends a download (None: ``http://localhost:<port>``).
        self.download_root: str | None = None
        #: Each download: (path, whether it carried an Authorization header).
        self.downloads: list[tuple[str, bool]] = []
        #: Thumbprint (hex, upper case) -> the certificate's public key (PEM), for client assertions.
        self.certificates: dict[str, bytes] = {}
        self.secret_expired = False
        self.token_requests = 0
        #: The site pages listing answers 403 (an app whose consent does not reach pages).
        self.pages_forbidden = False
        self.route("GET", "/v1.0/sites/{rest:.*}", self._sites)
        self.route("GET", "/v1.0/users/{upn}/drive", self._user_drive)
        self.route("GET", "/v1.0/drives/{drive}/root/delta", self._drive_delta)
        self.route("GET", "/v1.0/drives/{drive}/root:/{path:.*}", self._item_by_path)
        self.route("GET", "/v1.0/drives/{drive}/items/{item}/permissions", self._permissions)
        self.route("GET", "/v1.0/drives/{drive}/items/{item}/children", self._children)
        self.route("GET", "/v1.0/drives/{drive}/items/{item}/content", self._content)

    # --- where the app points ---------------------------------------------------------------------------
    @property
    def graph_url(self) -> str:
        """Stands for ``https://graph.microsoft.com``."""
        return self.root_url

    @property
    def login_url(self) -> str:
        """Stands for ``https://login.microsoftonline.com`` (over HTTPS with ``tls``)."""
        return self._tls_root or self.root_url

    @property
    def ca_file(self) -> str:
        """The certificate the HTTPS login service presents (for ``REQUESTS_CA_BUNDLE``: MSAL uses requests)."""
        return str(tls_files()[0])

    async def start(self) -> str:
        url = await super().start()
        if self.tls and self._tls_root is None:
            assert self._runner is not None
            cert, key = tls_files()
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp names no bound port
            self._tls_root = f"https://127.0.0.1:{port}"
        return url

    async def stop(self) -> None:
        self._tls_root = None
        await super().stop()

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
        app.router.add_get("/{tenant}/v2.0/.well-known/openid-configuration", self._openid_configuration)
        app.router.add_get("/download/{drive}/{item}", self._download)
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
                result = await handler(request)
                if isinstance(result, web.StreamResponse):
                    call.status = result.status
                    return result
                status, body = result
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
        self.token_requests += 1
        if form.get("client_id") != self.app_id:
            return error(400, "unauthorized_client", "AADSTS700016: Application not found in the directory.")
        if "client_assertion" in form:
            if not self._assertion_ok(form["client_assertion"], request):
                return error(401, "invalid_client", "AADSTS700027: The certificate with identifier used to sign "
                                                    "the client assertion is not registered on application.")
        elif self.secret_expired and form.get("client_secret") == self.app_secret:
            return error(401, "invalid_client", f"AADSTS7000222: The provided client secret keys for app "
                                                f"'{self.app_id}' are expired. Visit the Azure portal to create new "
                                                "keys for your app.")
        elif form.get("client_secret") != self.app_secret:
            return error(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        if form.get("scope") != GRAPH_SCOPE:
            return error(400, "invalid_scope", "AADSTS1002012: The provided value for scope is not valid.")
        return web.json_response({"token_type": "Bearer", "expires_in": self.token_lifetime_s,
                                  "ext_expires_in": self.token_lifetime_s, "access_token": self.access_token()})

    # --- the login service for MSAL -----------------------------------------------------------------------
    def expire_secret(self, expired: bool = True) -> None:
        self.secret_expired = expired

    def add_certificate(self, public_key_pem: bytes, thumbprint: str) -> None:
        self.certificates[thumbprint.replace(":", "").upper()] = public_key_pem

    def _assertion_ok(self, assertion: str, request: web.Request) -> bool:
        for key in self.certificates.values():
            try:
                claims = jwt.decode(assertion, key, algorithms=["RS256", "PS256"],
                                    audience=f"{request.scheme}://{request.host}{request.path}")
            except jwt.PyJWTError:
                continue
            return claims.get("iss") == claims.get("sub") == self.app_id
        return False

    async def _openid_configuration(self, request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        if tenant != self.tenant_id:
            return web.json_response({"error": "invalid_tenant", "error_description": "AADSTS90002: Tenant not found."},
                                     status=400)
        root = f"{request.scheme}://{request.host}/{tenant}"
        return web.json_response({"authorization_endpoint": f"{root}/oauth2/v2.0/authorize",
                                  "token_endpoint": f"{root}/oauth2/v2.0/token", "issuer": f"{root}/v2.0",
                                  "token_endpoint_auth_methods_supported": ["client_secret_post",
                                                                             "private_key_jwt"]})

    # --- SharePoint and OneDrive ----------------------------------------------------------------------------
    def add_site(self, hostname: str, path: str, *, name: str = "", permissions: list[JSON] | None = None) -> JSON:
        """A site; ``permissions``: what its libraries' items inherit (its groups)."""
        site_id = f"{hostname},{uuid.uuid4()},{uuid.uuid4()}"
        site = {"id": site_id, "name": name or path.rsplit("/", 1)[-1], "hostname": hostname,
                "path": path.strip("/"), "webUrl": f"https://{hostname}/{path.strip('/')}",
                "permissions": permissions or [], "drives": [], "pages": {}}
        self.sites[site_id] = site
        return site

    def add_drive(self, name: str, *, site: JSON | None = None, user: str | None = None) -> FakeDrive:
        """A document library of ``site``, or ``user``'s OneDrive (which only its owner may read)."""
        drive_id = "b!" + uuid.uuid4().hex
        if site is not None:
            drive = FakeDrive(drive_id, name, f"{site['webUrl']}/{quote(name)}", site)
            site["drives"].append(drive_id)
        else:
            assert user
            owner = user.split("@")[0].replace(".", "_")
            drive = FakeDrive(drive_id, name, f"https://contoso-my.sharepoint.com/personal/{owner}/Documents",
                              {"permissions": [user_permission(user, roles=("owner",))]})
            self.user_drives[user.lower()] = drive_id
        self.drives[drive_id] = drive
        return drive

    def add_folder(self, drive: FakeDrive, path: str, *, permissions: list[JSON] | None = None) -> FakeItem:
        parent = drive.root
        for name in [n for n in path.strip("/").split("/") if n]:
            found = drive.path_of(self._path(parent) + "/" + name)
            if found is None:
                found = FakeItem(f"item{next(_ids)}", name, parent.id, drive, folder=True)
                drive.items[found.id] = found
                drive.touch(found)
            parent = found
        if permissions is not None:
            parent.permissions = permissions
            drive.touch(parent)
        return parent

    def _path(self, item: FakeItem) -> str:
        names = []
        while item.parent is not None:
            names.append(item.name)
            item = item.drive.items[item.parent]
        return "/".join(reversed(names))

    def add_file(self, drive: FakeDrive, path: str, content: bytes, *, permissions: list[JSON] | None = None,
                 author: str = "Ada Author", size: int | None = None) -> FakeItem:
        folder, _, name = path.strip("/").rpartition("/")
        parent = self.add_folder(drive, folder) if folder else drive.root
        item = FakeItem(f"item{next(_ids)}", name, parent.id, drive, content=content, permissions=permissions,
                        author=author, size=size)
        drive.items[item.id] = item
        drive.touch(item)
        return item

    def edit(self, item: FakeItem, content: bytes) -> None:
        item.content = content
        item.version += 1
        item.drive.touch(item)

    def share(self, item: FakeItem, permissions: list[JSON] | None) -> None:
        """Its own permissions from now on (None: inherit again); a sharing change, its content unchanged."""
        item.permissions = permissions
        item.drive.touch(item)

    def rename(self, item: FakeItem, name: str) -> None:
        item.name = name
        item.drive.touch(item)

    def move(self, item: FakeItem, folder: str) -> None:
        item.parent = self.add_folder(item.drive, folder).id if folder else item.drive.root.id
        item.drive.touch(item)

    def delete(self, item: FakeItem) -> None:
        for child in [i for i in item.drive.items.values() if i.parent == item.id and not i.deleted]:
            self.delete(child)
        item.deleted = True
        item.drive.touch(item)

    def expire_delta_tokens(self, drive: FakeDrive) -> None:
        drive.epoch += 1

    def _drive(self, request: web.Request) -> FakeDrive:
        drive = self.drives.get(request.match_info["drive"])
        if drive is None:
            raise GraphRefusal(404, "itemNotFound", "The resource could not be found.")
        return drive

    def _item(self, request: web.Request) -> FakeItem:
        drive = self._drive(request)
        item = drive.items.get(request.match_info["item"])
        if item is None or item.deleted:
            raise GraphRefusal(404, "itemNotFound", "The resource could not be found.")
        return item

    @staticmethod
    def _site_json(site: JSON) -> JSON:
        return {k: site[k] for k in ("id", "name", "webUrl")} | {"displayName": site["name"]}

    @staticmethod
    def _drive_json(drive: FakeDrive) -> JSON:
        return {"id": drive.id, "name": drive.name, "webUrl": drive.web_url,
                "driveType": "documentLibrary" if drive.site and "id" in drive.site else "business"}

    async def _sites(self, request: web.Request) -> tuple[int, JSON]:
        rest = request.match_info["rest"]
        if ":/" in rest or ":" not in rest and "/" not in rest and "," not in rest:
            hostname, _, path = rest.partition(":/")
            path = path.rstrip(":").strip("/")
            for site in self.sites.values():
                if site["hostname"] == hostname and site["path"].lower() == path.lower():
                    return 200, self._site_json(site)
            raise GraphRefusal(404, "itemNotFound", "Requested site could not be found")
        site_id, _, tail = rest.partition("/")
        site = self.sites.get(site_id)
        if site is None:
            raise GraphRefusal(404, "itemNotFound", "Requested site could not be found")
        if tail == "pages/microsoft.graph.sitePage":
            return 200, self._pages(request, site)
        if tail.startswith("pages/") and tail.endswith("/microsoft.graph.sitePage"):
            return 200, self._page(request, site, tail.split("/")[1])
        if tail == "drives":
            return 200, self.page(request, [self._drive_json(self.drives[d]) for d in site["drives"]])
        if tail == "drive/root/delta" and site["drives"]:
            return 200, self._delta(request, self.drives[site["drives"][0]])
        if not tail:
            return 200, self._site_json(site)
        raise GraphRefusal(400, "BadRequest", f"Resource not found for the segment '{tail.split('/')[0]}'.")

    def _pages(self, request: web.Request, site: JSON) -> JSON:
        if self.pages_forbidden:
            raise GraphRefusal(403, "accessDenied", "Access denied")
        pages = [p for p in site["pages"].values() if not p.deleted]
        if "canvasLayout" in request.query.get("$expand", "") and any(p.corrupt for p in pages):
            # As Graph answers when one page of the site cannot be expanded (hence kbbot's page-by-page reads).
            raise GraphRefusal(400, "generalException", "Error when getting the canvas layout of a page.")
        body = self.page(request, [p.as_graph(expand=False) for p in pages])
        body["@odata.context"] = f"{self.graph_url}/v1.0/$metadata#sites('{site['id']}')/pages/microsoft.graph.sitePage"
        return body

    def _page(self, request: web.Request, site: JSON, page_id: str) -> JSON:
        page = site["pages"].get(page_id)
        if page is None or page.deleted:
            raise GraphRefusal(404, "itemNotFound", "The resource could not be found.")
        if page.corrupt and "canvasLayout" in request.query.get("$expand", ""):
            raise GraphRefusal(500, "generalException", "General exception while processing")
        return page.as_graph(expand="canvasLayout" in request.query.get("$expand", ""))

    def add_page(self, site: JSON, title: str, text: list[str], *, vertical: list[str] = (),
                 others: list[JSON] = ()) -> FakePage:
        """A modern page of ``site``: ``text`` the innerHtml of its text web parts (one column each section),
        ``vertical`` those of its vertical section, ``others`` other web parts (as Graph shows them)."""
        page = FakePage(str(uuid.uuid4()), title, site["webUrl"], list(text), list(vertical), list(others))
        site["pages"][page.id] = page
        return page

    def edit_page(self, page: FakePage, text: list[str]) -> None:
        page.text = list(text)
        page.version += 1


    async def _user_drive(self, request: web.Request) -> tuple[int, JSON]:
        drive_id = self.user_drives.get(request.match_info["upn"].lower())
        if drive_id is None:
            raise GraphRefusal(404, "ResourceNotFound", "User not found")
        return 200, self._drive_json(self.drives[drive_id])

    async def _drive_delta(self, request: web.Request) -> tuple[int, JSON]:
        return 200, self._delta(request, self._drive(request))

    def _delta(self, request: web.Request, drive: FakeDrive) -> JSON:
        token = request.query.get("token")
        snapshot = int(request.query.get("snapshot") or drive.seq)
        skip = int(request.query.get("$skiptoken") or 0)
        if token is not None:
            epoch, _, since = token.partition(".")
            if epoch != str(drive.epoch) or not since.isdigit():
                fresh = f"{self.graph_url}{request.path}"
                raise GraphRefusal(410, "resyncChangesApplyDifferences",
                                   "Resync required. Replace any local items with the server's version (including "
                                   "deletes) if you're sure that the service was up to date with your local changes "
                                   "when you last sync'd. Upload any local changes that the server doesn't know about.",
                                   {"Location": fresh})
            changed = sorted((i for i in drive.items.values() if int(since) < i.seq <= snapshot), key=lambda i: i.seq)
        else:
            changed = drive.ordered()
        shown = changed[skip:skip + self.delta_page_size]
        body: JSON = {"@odata.context": f"{self.graph_url}/v1.0/$metadata#Collection(driveItem)",
                      "value": [i.as_graph() for i in shown]}
        if skip + self.delta_page_size < len(changed):
            query = {**({"token": token} if token is not None else {}), "snapshot": snapshot,
                     "$skiptoken": skip + self.delta_page_size}
            body["@odata.nextLink"] = f"{self.next_link_root or self.graph_url}{request.path}?{urlencode(query)}"
        else:
            body["@odata.deltaLink"] = f"{self.graph_url}{request.path}?token={drive.epoch}.{snapshot}"
        return body

    async def _item_by_path(self, request: web.Request) -> tuple[int, JSON]:
        drive = self._drive(request)
        item = drive.path_of(request.match_info["path"].rstrip(":"))
        if item is None:
            raise GraphRefusal(404, "itemNotFound", "The resource could not be found.")
        return 200, item.as_graph()

    async def _permissions(self, request: web.Request) -> tuple[int, JSON]:
        item = self._item(request)
        return 200, self.page(request, item.drive.effective_permissions(item))

    async def _children(self, request: web.Request) -> tuple[int, JSON]:
        item = self._item(request)
        if not item.folder:
            raise GraphRefusal(400, "invalidRequest", "The item is not a folder.")
        children = sorted((i for i in item.drive.items.values() if i.parent == item.id and not i.deleted),
                          key=lambda i: i.name)
        return 200, self.page(request, [i.as_graph() for i in children])

    async def _content(self, request: web.Request) -> web.StreamResponse:
        item = self._item(request)
        if item.folder:
            raise GraphRefusal(400, "invalidRequest", "Cannot download a folder.")
        root = self.download_root or self.root_url.replace("127.0.0.1", "localhost")
        location = f"{root}/download/{item.drive.id}/{item.id}?tempauth={uuid.uuid4().hex}"
        return web.Response(status=302, headers={"Location": location})

    async def _download(self, request: web.Request) -> web.Response:
        self.downloads.append((request.path, "Authorization" in request.headers))
        drive = self.drives.get(request.match_info["drive"])
        item = drive.items.get(request.match_info["item"]) if drive else None
        if item is None or item.deleted or not request.query.get("tempauth"):
            return web.Response(status=404, text="not found")
        return web.Response(body=item.content, content_type="application/octet-stream")
