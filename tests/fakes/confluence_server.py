"""A local Confluence that speaks the REST API (``/rest/api``) Cloud and Data Center share.

What ``pipelines.sources.confluence`` uses, served the way Confluence serves it:

- ``GET /rest/api/content/search?cql=...&expand=...&limit=...&start=...``: CQL clauses joined by
  ``and``: ``space = KEY``, ``space in ("A", "B")``, ``type = page|attachment``, ``label = x``;
  results in pages of ``limit`` with ``_links.next`` (relative to ``_links.base``) until the end;
  ``expand=version`` adds ``version.number`` and ``version.by`` (who made that version), ``history``
  ``history.createdBy`` (the page's author), ``space`` the space key, ``container`` an attachment's page;
- ``GET /rest/api/content/{id}?expand=body.storage,version``: a page with its storage-format body;
  404 for a deleted page, 403 for a restricted one (restricted pages are also left out of searches);
- ``GET /download/attachments/{page}/{file}``: an attachment's bytes;
- ``GET /rest/api/content/{id}/restriction/byOperation/read``: the page's read restrictions (users
  with ``accountId`` and ``email``, groups with ``name``); ``expand=ancestors`` on a search or a page
  gives its ancestors root first (``parent`` of ``add_page``);
- ``GET /rest/api/space/{key}?expand=permissions``: the space's permissions (``set_space_readers``;
  unset: the ``confluence-users`` group may read), read on the space among others; none for a space
  in ``hidden_permissions`` (as Data Center answers, or Cloud to an API user without the right);
- ``GET /rest/api/group/{name}/member``: a group's members (``groups``), paginated;
- every request needs the credentials (Bearer token, or Basic e-mail:token on Cloud), else 401;
- ``throttle(n, retry_after)`` answers the next ``n`` requests with 429 and ``Retry-After``.

``cloud=True`` serves under ``/wiki`` as Cloud does. ``log`` records (path, status, time) per request.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web

from tests.fakes.local_server import LocalServer


@dataclass
class FakeAttachment:
    id: str
    title: str
    data: bytes
    version: int = 1


@dataclass
class FakePage:
    id: str
    space: str
    title: str
    body: str  # storage format (XHTML)
    version: int = 1
    labels: list[str] = field(default_factory=list)
    restricted: bool = False
    attachments: list[FakeAttachment] = field(default_factory=list)
    #: Where a request for the page's body is redirected (302), if anywhere.
    redirect: str | None = None
    #: Who created the page, and who made its current version (display names; Cloud also gives accountId).
    author: str = "Ada Author"
    editor: str = ""
    #: The parent page's id (its restrictions are inherited).
    parent: str | None = None
    #: Read restrictions: e-mail addresses and group names (both empty: not restricted).
    read_users: list[str] = field(default_factory=list)
    read_groups: list[str] = field(default_factory=list)


def _user(name: str) -> dict[str, Any]:
    return {"type": "known", "displayName": name, "accountId": "acc-" + name.lower().replace(" ", "-")}


_CLAUSE = re.compile(r'^\s*(space|type|label)\s*(=|in)\s*(.+?)\s*$', re.I)


def _values(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("("):
        text = text[1:-1]
    return [v.strip().strip('"').strip("'") for v in text.split(",") if v.strip()]


def parse_cql(cql: str) -> list[tuple[str, list[str]]]:
    """The subset of CQL the fake understands: ``field = v`` / ``field in (a, b)`` joined by ``and``."""
    clauses = []
    for raw in re.split(r"\s+and\s+", cql.strip(), flags=re.I):
        raw = raw.strip()
        while raw.startswith("(") and not raw.startswith("(\"") and raw.count("(") > raw.count(")"):
            raw = raw[1:]
        while raw.endswith(")") and raw.count(")") > raw.count("("):
            raw = raw[:-1]
        match = _CLAUSE.match(raw)
        if not match:
            raise ValueError(f"unsupported CQL clause: {raw!r}")
        clauses.append((match.group(1).lower(), _values(match.group(3))))
    return clauses


class FakeConfluence(LocalServer):
    def __init__(self, *, cloud: bool = True, token: str = "conf-token", user: str | None = None,
                 max_limit: int = 200):
        super().__init__()
        #: The largest page of results served, whatever ``limit`` asks (Confluence caps it too).
        self.max_limit = max_limit
        self.path = "/wiki" if cloud else ""
        self.token = token
        self.user = user
        self.pages: dict[str, FakePage] = {}
        #: Draft pages created through ``POST /rest/api/content`` (not listed by searches until published).
        self.drafts: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[str, int, float]] = []
        self._throttle: list[str] = []  # Retry-After values of the next requests to refuse
        #: Group name -> members' e-mail addresses.
        self.groups: dict[str, list[str]] = {}
        #: Space key -> (e-mail addresses, group names, anonymous) with read permission on it.
        self.space_readers: dict[str, tuple[list[str], list[str], bool]] = {}
        #: Space keys whose permissions the API user is not shown.
        self.hidden_permissions: set[str] = set()
        self._next_id = 1000

    # --- content ---------------------------------------------------------------------------------
    def new_id(self) -> str:
        self._next_id += 1
        return str(self._next_id)

    def add_page(self, space: str, title: str, body: str, **options: Any) -> FakePage:
        page = FakePage(self.new_id(), space, title, body, **options)
        self.pages[page.id] = page
        return page

    def edit(self, page: FakePage, body: str) -> None:
        page.body = body
        page.version += 1

    def attach(self, page: FakePage, title: str, data: bytes) -> FakeAttachment:
        attachment = FakeAttachment(self.new_id(), title, data)
        page.attachments.append(attachment)
        return attachment

    def restrict(self, page: FakePage, users: list[str] | None = None, groups: list[str] | None = None) -> None:
        """Sets the page's read restrictions (as an admin does; the version does not change)."""
        page.read_users, page.read_groups = list(users or []), list(groups or [])

    def set_space_readers(self, key: str, users: list[str] | None = None, groups: list[str] | None = None,
                          anonymous: bool = False) -> None:
        self.space_readers[key] = (list(users or []), list(groups or []), anonymous)

    def ancestors(self, page: FakePage) -> list[FakePage]:
        chain: list[FakePage] = []
        parent = self.pages.get(page.parent) if page.parent else None
        while parent is not None:
            chain.insert(0, parent)
            parent = self.pages.get(parent.parent) if parent.parent else None
        return chain

    @staticmethod
    def user_json(email: str) -> dict[str, Any]:
        return {"type": "known", "accountId": "acc-" + email.split("@")[0], "accountType": "atlassian",
                "email": email, "publicName": email.split("@")[0], "displayName": email.split("@")[0]}

    def throttle(self, n: int, retry_after: str = "1") -> None:
        self._throttle += [retry_after] * n

    def requests_to(self, fragment: str) -> list[tuple[str, int, float]]:
        return [entry for entry in self.log if fragment in entry[0]]

    def web_link(self, page: FakePage) -> str:
        return f"{self.base_url}/spaces/{page.space}/pages/{page.id}"

    # --- wire ------------------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        p = self.path
        app.router.add_get(p + "/rest/api/content/search", self._search)
        app.router.add_post(p + "/rest/api/content", self._create)
        app.router.add_get(p + "/rest/api/content/{id}", self._content)
        app.router.add_get(p + "/rest/api/content/{id}/restriction/byOperation/read", self._read_restriction)
        app.router.add_get(p + "/rest/api/space/{key}", self._space)
        app.router.add_get(p + "/rest/api/group/{name}/member", self._group_members)
        app.router.add_get(p + "/download/attachments/{page}/{file}", self._download)

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if self.user:
            expected = base64.b64encode(f"{self.user}:{self.token}".encode()).decode()
            return header == f"Basic {expected}"
        return header == f"Bearer {self.token}"

    def _gate(self, request: web.Request) -> web.Response | None:
        if self._throttle:
            retry_after = self._throttle.pop(0)
            self.log.append((request.path_qs, 429, time.monotonic()))
            return web.json_response({"message": "Rate limit exceeded"}, status=429,
                                     headers={"Retry-After": retry_after})
        if not self._authorized(request):
            self.log.append((request.path_qs, 401, time.monotonic()))
            return web.json_response({"message": "Unauthorized"}, status=401)
        return None

    def _answer(self, request: web.Request, status: int, **kwargs: Any) -> web.Response:
        self.log.append((request.path_qs, status, time.monotonic()))
        if "body" in kwargs:
            return web.Response(status=status, **kwargs)
        return web.json_response(kwargs.get("data", {}), status=status)

    def _page_json(self, page: FakePage, expand: set[str]) -> dict[str, Any]:
        data: dict[str, Any] = {"id": page.id, "type": "page", "status": "current", "title": page.title,
                                "_links": {"webui": f"/spaces/{page.space}/pages/{page.id}"}}
        if "version" in expand:
            data["version"] = {"number": page.version, "by": _user(page.editor or page.author)}
        if "history" in expand:
            data["history"] = {"latest": True, "createdBy": _user(page.author)}
        if "space" in expand:
            data["space"] = {"key": page.space}
        if "body.storage" in expand:
            data["body"] = {"storage": {"value": page.body, "representation": "storage"}}
        if "ancestors" in expand:
            data["ancestors"] = [{"id": a.id, "type": "page", "status": "current", "title": a.title}
                                 for a in self.ancestors(page)]
        return data

    def _page_of(self, request: web.Request) -> FakePage | web.Response:
        """The page ``{id}`` names, or the refusal its request gets (no token, no such page, restricted)."""
        refused = self._gate(request)
        if refused is not None:
            return refused
        page = self.pages.get(request.match_info["id"])
        if page is None:
            return self._answer(request, 404, data={"message": "No content found"})
        if page.restricted:
            return self._answer(request, 403, data={"message": "Not permitted"})
        return page

    def _listing(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {"results": results, "start": 0, "limit": 200, "size": len(results)}

    async def _read_restriction(self, request: web.Request) -> web.Response:
        page = self._page_of(request)
        if isinstance(page, web.Response):
            return page
        return self._answer(request, 200, data={
            "operation": "read",
            "restrictions": {"user": self._listing([self.user_json(u) for u in page.read_users]),
                             "group": self._listing([{"type": "group", "name": g, "id": f"g-{g}"}
                                                     for g in page.read_groups])},
            "_expandable": {"content": f"/rest/api/content/{page.id}"},
            "_links": {"base": self.base_url, "context": self.path}})

    async def _space(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        key = request.match_info["key"]
        if not any(p.space == key for p in self.pages.values()) and key not in self.space_readers:
            return self._answer(request, 404, data={"message": "No space with key : " + key})
        data: dict[str, Any] = {"id": abs(hash(key)) % 100000, "key": key, "name": key, "type": "global"}
        if "permissions" in request.query.get("expand", "").split(",") and key not in self.hidden_permissions:
            users, groups, anonymous = self.space_readers.get(key, ([], ["confluence-users"], False))
            read = {"operation": "read", "targetType": "space"}
            permissions: list[dict[str, Any]] = [
                {"id": 1, "operation": {"operation": "create", "targetType": "page"},
                 "subjects": {"group": self._listing([{"type": "group", "name": "confluence-administrators"}])},
                 "anonymousAccess": False, "unlicensedAccess": False}]
            if users:
                permissions.append({"id": 2, "operation": read, "anonymousAccess": False, "unlicensedAccess": False,
                                    "subjects": {"user": self._listing([self.user_json(u) for u in users])}})
            if groups:
                permissions.append({"id": 3, "operation": read, "anonymousAccess": False, "unlicensedAccess": False,
                                    "subjects": {"group": self._listing([{"type": "group", "name": g}
                                                                         for g in groups])}})
            if anonymous:
                permissions.append({"id": 4, "operation": read, "anonymousAccess": True, "unlicensedAccess": False})
            data["permissions"] = permissions
        return self._answer(request, 200, data=data)

    async def _group_members(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        name = request.match_info["name"]
        if name not in self.groups:
            return self._answer(request, 404, data={"message": f"Group not found: {name}"})
        start, limit = int(request.query.get("start", "0")), min(int(request.query.get("limit", "200")),
                                                                 self.max_limit)
        people = [self.user_json(u) for u in self.groups[name]]
        window = people[start:start + limit]
        links: dict[str, Any] = {"base": self.base_url, "context": self.path}
        if start + limit < len(people):
            links["next"] = f"/rest/api/group/{quote(name)}/member?" + urlencode({"start": start + limit,
                                                                                  "limit": limit})
        return self._answer(request, 200, data={"results": window, "start": start, "limit": limit,
                                                "size": len(window), "_links": links})

    def _attachment_json(self, page: FakePage, att: FakeAttachment, expand: set[str]) -> dict[str, Any]:
        data: dict[str, Any] = {"id": att.id, "type": "attachment", "title": att.title, "_links": {
            "download": f"/download/attachments/{page.id}/{quote(att.title)}?version={att.version}&api=v2",
            "webui": f"/spaces/{page.space}/pages/{page.id}?preview=/{page.id}/{att.id}"}}
        if "version" in expand:
            data["version"] = {"number": att.version}
        if "container" in expand:
            data["container"] = {"id": page.id, "type": "page", "title": page.title}
        return data

    async def _create(self, request: web.Request) -> web.Response:
        """``POST /rest/api/content``: a page, here only as a draft (what kbbot creates)."""
        refused = self._gate(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            space, title = body["space"]["key"], body["title"]
            storage = body["body"]["storage"]
        except (ValueError, KeyError, TypeError):
            return self._answer(request, 400, data={"message": "a page needs a title, space.key and body.storage"})
        if body.get("type") != "page" or storage.get("representation") != "storage":
            return self._answer(request, 400, data={"message": "only pages in storage representation"})
        if body.get("status") != "draft":
            return self._answer(request, 400, data={"message": "this fake creates drafts only"})
        if space not in {page.space for page in self.pages.values()}:
            return self._answer(request, 404, data={"message": f"No space with key : {space}"})
        page_id = self.new_id()
        self.drafts[page_id] = {"id": page_id, "space": space, "title": title, "body": storage["value"],
                                "status": "draft"}
        return self._answer(request, 200, data={"id": page_id, "type": "page", "status": "draft", "title": title,
                                                "space": {"key": space},
                                                "_links": {"webui": f"/pages/resumedraft.action?draftId={page_id}"}})

    async def _search(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        query = request.query
        try:
            clauses = parse_cql(query.get("cql", ""))
        except ValueError as exc:
            return self._answer(request, 400, data={"message": str(exc)})
        expand = set(query.get("expand", "").split(","))
        start, limit = int(query.get("start", "0")), min(int(query.get("limit", "25")), self.max_limit)
        kinds = next((v for f, v in clauses if f == "type"), ["page"])
        results: list[dict[str, Any]] = []
        for page in self.pages.values():
            if page.restricted or not all(self._matches(page, f, v) for f, v in clauses if f != "type"):
                continue
            if "page" in kinds:
                results.append(self._page_json(page, expand))
            if "attachment" in kinds:
                results += [self._attachment_json(page, a, expand) for a in page.attachments]
        window = results[start:start + limit]
        links: dict[str, Any] = {"base": self.base_url, "context": self.path}
        if start + limit < len(results):
            following = {**query, "start": str(start + limit)}
            links["next"] = "/rest/api/content/search?" + urlencode(following)
        return self._answer(request, 200, data={"results": window, "start": start, "limit": limit,
                                                "size": len(window), "_links": links})

    @staticmethod
    def _matches(page: FakePage, name: str, values: list[str]) -> bool:
        if name == "space":
            return page.space in values
        if name == "label":
            return any(v in page.labels for v in values)
        return True

    async def _content(self, request: web.Request) -> web.Response:
        page = self._page_of(request)
        if isinstance(page, web.Response):
            return page
        if page.redirect:
            self.log.append((request.path_qs, 302, time.monotonic()))
            raise web.HTTPFound(page.redirect)
        expand = set(request.query.get("expand", "").split(","))
        return self._answer(request, 200, data=self._page_json(page, expand))

    async def _download(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        page = self.pages.get(request.match_info["page"])
        title = request.match_info["file"]
        att = next((a for a in page.attachments if a.title == title), None) if page and not page.restricted else None
        if att is None:
            return self._answer(request, 404, data={"message": "No attachment"})
        return self._answer(request, 200, body=att.data, content_type="application/octet-stream")
