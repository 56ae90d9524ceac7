"""``ConfluenceClient``: the one way kbbot talks to a Confluence site (the source's listing, pages and
permissions; the knowledge loop's draft pages): its credentials, the network guard on every hop,
``Retry-After`` retries on 429/503, and a size cap per answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.netguard import guarded_transport
from pipelines.sources.http import RetryPolicy, json_object, origin, reaching, read_capped
from pipelines.sources.kind import SourceError

PAGE_SIZE = 100


class ConfluenceError(SourceError):
    """The Confluence API could not be read; the message is the reason shown to the operator."""


class Gone(ConfluenceError):
    """A page or attachment no longer exists for us (deleted, or restricted from the API user)."""


class Refused(Gone):
    """A request was redirected to an address kbbot must not fetch from (``pipelines.netguard``): like a
    page that is gone, a version indexed earlier is revoked."""


class ConfluenceClient:
    """GETs against one Confluence site with its credentials, rate-limit retries and size cap."""

    def __init__(self, base_url: str, token: str, *, user: str | None = None, timeout_s: float = 30,
                 connect_timeout_s: float = 10, max_bytes: int = 20_000_000, max_retries: int = 5,
                 max_retry_wait_s: float = 120, user_agent: str = "kbbot", allow_hosts: Collection[str] = (),
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep):
        self.base_url = base_url.rstrip("/")
        self.max_bytes = max_bytes
        self.retry = RetryPolicy("Confluence", max_retries=max_retries, max_wait_s=max_retry_wait_s,
                                 error=ConfluenceError)
        self.sleep = sleep
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        auth: httpx.Auth | None = None
        if user:  # Cloud: e-mail address and API token
            auth = httpx.BasicAuth(user, token)
        else:  # Data Center: a personal access token
            headers["Authorization"] = f"Bearer {token}"
        # Redirects are followed (Cloud sends attachment downloads to its media host), and every hop
        # connects through the same guard as URL sources: the site itself is the operator's choice,
        # anywhere else must be a public address or in refresh.allow_hosts.
        site = urlsplit(self.base_url).hostname or ""
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
                                   headers=headers, auth=auth, follow_redirects=True, max_redirects=5,
                                   transport=transport or guarded_transport([site, *allow_hosts]))
        self.origin = origin(self.base_url)
        #: Requests sent, for the run's log line.
        self.requests = 0

    def close(self) -> None:
        self.client.close()

    def url(self, link: str) -> str:
        """An API or web link (``_links.next``, ``webui``, ``download``) as an absolute URL of this site."""
        if link.startswith(("http://", "https://")):
            if origin(link) != self.origin:
                raise ConfluenceError(f"the API pointed to another site ({origin(link)}); not followed")
            return link
        return self.base_url + "/" + link.lstrip("/")

    def get(self, link: str, params: dict[str, Any] | None = None) -> bytes:
        """The body of a 200 answer (at most ``max_bytes``); else ``Gone`` or ``ConfluenceError``."""
        url = self.url(link)
        path = urlsplit(url).path
        waits: list[float] = []
        while True:
            self.requests += 1
            with reaching(url, ConfluenceError, Refused, path), self.client.stream("GET", url, params=params) as response:
                if not self.retry.applies(response.status_code):
                    _check_status(response, url)
                    return read_capped(response, self.max_bytes, path, ConfluenceError)
                wait = self.retry.wait_s(waits, response.status_code, response.headers.get("Retry-After"), path)
            self.sleep(wait)

    def create_draft(self, space: str, title: str, storage: str) -> dict[str, Any]:
        """A draft page (``status: draft``, seen by its author and admins until someone publishes it) in
        ``space`` with the storage-format ``storage`` body: ``POST /rest/api/content``. The created
        content's JSON (``id``, ``_links``); ``ConfluenceError`` when Confluence refuses. Not retried:
        a create that timed out may have created the page."""
        url = self.url("rest/api/content")
        body = {"type": "page", "status": "draft", "title": title, "space": {"key": space},
                "body": {"storage": {"value": storage, "representation": "storage"}}}
        self.requests += 1
        with reaching(url, ConfluenceError, ConfluenceError):
            response = self.client.post(url, json=body)
        if response.status_code not in (200, 201):
            detail = response.text[:200].strip()
            raise ConfluenceError(f"HTTP {response.status_code}: the draft page was not created"
                                  + (f" ({detail})" if detail else ""))
        data = response.json()
        if not isinstance(data, dict) or not data.get("id"):
            raise ConfluenceError("the draft page was not created (no id in the answer)")
        return data

    def json(self, link: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return json_object(self.get(link, params), urlsplit(self.url(link)).path, ConfluenceError,
                           f"is {self.base_url} the Confluence base URL (Cloud: https://<site>.atlassian.net/wiki)?")

    def results(self, link: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every result of a paginated listing, following ``_links.next`` (offsets on Data Center,
        cursors on Cloud) to the end."""
        data = self.json(link, params)
        while True:
            yield from data.get("results") or []
            following = (data.get("_links") or {}).get("next")
            if not following:
                return
            data = self.json(following)


def _check_status(response: httpx.Response, url: str) -> None:
    status = response.status_code
    if status == 200:
        return
    path = urlsplit(url).path
    if status in (403, 404):
        raise Gone(f"HTTP {status} for {path}: deleted, or not visible to the API user")
    if status == 401:
        raise ConfluenceError("HTTP 401: Confluence refused the credentials (check the token, and for Cloud the "
                              "user e-mail)")
    response.read()
    detail = response.text[:200].strip()
    raise ConfluenceError(f"HTTP {status} for {path}" + (f": {detail}" if detail else ""))
