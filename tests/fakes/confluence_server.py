"""A local Confluence that speaks the REST API (``/rest/api``) Cloud and Data Center share.

What ``pipelines.confluence`` uses, served the way Confluence serves it:

- ``GET /rest/api/content/search?cql=...&expand=...&limit=...&start=...``: CQL clauses joined by
  ``and``: ``space = KEY``, ``space in ("A", "B")``, ``type = page|attachment``, ``label = x``;
  results in pages of ``limit`` with ``_links.next`` (relative to ``_links.base``) until the end;
  ``expand=version`` adds ``version.number``, ``space`` the space key, ``container`` an attachment's page;
- ``GET /rest/api/content/{id}?expand=body.storage,version``: a page with its storage-format body;
  404 for a deleted page, 403 for a restricted one (restricted pages are also left out of searches);
- ``GET /download/attachments/{page}/{file}``: an attachment's bytes;
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
            data["version"] = {"number": page.version}
        if "space" in expand:
            data["space"] = {"key": page.space}
        if "body.storage" in expand:
            data["body"] = {"storage": {"value": page.body, "representation": "storage"}}
        return data

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
        refused = self._gate(request)
        if refused is not None:
            return refused
        page = self.pages.get(request.match_info["id"])
        if page is None:
            return self._answer(request, 404, data={"message": "No content found"})
        if page.restricted:
            return self._answer(request, 403, data={"message": "Not permitted"})
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
