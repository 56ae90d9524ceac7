"""Confluence as a source: the pages of some spaces (or of a CQL query) and their attachments.

``ConfluenceSource`` is a ``pipelines.indexing.Source``. It speaks the REST API that Confluence
Cloud (``https://<site>.atlassian.net/wiki``, e-mail + API token) and Data Center
(``https://confluence.example.com``, a personal access token as Bearer) share:

- one listing per run, ``GET /rest/api/content/search`` with CQL (``space in (...) and type = page``,
  or the configured CQL ``and type = page``), following ``_links.next`` page after page, with each
  page's version number; attachments likewise, one listing for the spaces the pages are in, kept
  when their page is listed and their file type is indexed;
- a page or attachment whose version is the one indexed last time (``FetchState``, kept by the
  caller between runs, trusted only while the store still holds what it produced) costs nothing
  more: no body, no download, no conversion, no embedding;
- a changed page's body (storage format) becomes Markdown with its headings (``markdownify``), so
  the splitter keeps the page's section structure; an attachment is converted like a file;
- what the listing no longer has (deleted, moved out of scope, restricted from the API user) is
  revoked by the indexer, since the listing is complete or the run fails; a page that answers 403 or
  404 between the listing and its download is gone too;
- every document's source is its web link (the page, or the attachment's download), so a citation
  links to it (a PDF attachment at the cited page);
- every connection, redirect hops included, passes ``pipelines.netguard`` as URL sources' do: the
  site's own host is allowed, any other must be a public address or in ``refresh.allow_hosts``; a
  page redirected elsewhere is refused with the reason (and revoked, like a page that is gone);
- 429 and 503 answers are retried after their ``Retry-After`` (seconds or an HTTP date), at most
  ``max_retries`` times and never waiting longer than ``max_retry_wait_s`` at once; beyond that
  the run fails with the reason and every document keeps its version.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.components.converter import SUPPORTED_SUFFIXES
from pipelines.indexing import INDEX_FORMAT, SourceItem, content_hash
from pipelines.netguard import guarded_transport, refusal
from pipelines.records import PUBLIC
from pipelines.sources import FetchState
from pipelines.store import DocRecord

log = logging.getLogger(__name__)

RETRY_STATUSES = (429, 503)
PAGE_SIZE = 100


class ConfluenceError(Exception):
    """The Confluence API could not be read; the message is the reason shown to the operator."""


class Gone(ConfluenceError):
    """A page or attachment no longer exists for us (deleted, or restricted from the API user)."""


class Refused(Gone):
    """A request was redirected to an address kbbot must not fetch from (``pipelines.netguard``): like a
    page that is gone, a version indexed earlier is revoked."""


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds to wait: a number of seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    return max(0.0, moment.timestamp() - now)


class ConfluenceClient:
    """GETs against one Confluence site with its credentials, rate-limit retries and size cap."""

    def __init__(self, base_url: str, token: str, *, user: str | None = None, timeout_s: float = 30,
                 connect_timeout_s: float = 10, max_bytes: int = 20_000_000, max_retries: int = 5,
                 max_retry_wait_s: float = 120, user_agent: str = "kbbot", allow_hosts: Collection[str] = (),
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep):
        self.base_url = base_url.rstrip("/")
        self.max_bytes = max_bytes
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
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
        self.origin = _origin(self.base_url)
        #: Requests sent and 429/503 answers waited out, for the run's log line.
        self.requests = 0
        self.throttled = 0

    def close(self) -> None:
        self.client.close()

    def url(self, link: str) -> str:
        """An API or web link (``_links.next``, ``webui``, ``download``) as an absolute URL of this site."""
        if link.startswith(("http://", "https://")):
            if _origin(link) != self.origin:
                raise ConfluenceError(f"the API pointed to another site ({_origin(link)}); not followed")
            return link
        return self.base_url + "/" + link.lstrip("/")

    def get(self, link: str, params: dict[str, Any] | None = None) -> bytes:
        """The body of a 200 answer (at most ``max_bytes``); else ``Gone`` or ``ConfluenceError``."""
        url = self.url(link)
        for attempt in range(self.max_retries + 1):
            self.requests += 1
            try:
                with self.client.stream("GET", url, params=params) as response:
                    if response.status_code in RETRY_STATUSES:
                        wait = retry_after_s(response.headers.get("Retry-After"))
                        wait = min(2.0 ** attempt, 30.0) if wait is None else wait
                        if attempt == self.max_retries or wait > self.max_retry_wait_s:
                            raise ConfluenceError(
                                f"HTTP {response.status_code} from {urlsplit(url).path}: rate limited; gave up after "
                                f"{attempt + 1} tries (Retry-After {wait:g} s, longest wait allowed "
                                f"{self.max_retry_wait_s:g} s)")
                        self.throttled += 1
                        log.info("confluence: HTTP %d, waiting %.1f s as Retry-After asks", response.status_code, wait)
                    else:
                        _check_status(response, url)
                        body = bytearray()
                        for chunk in response.iter_bytes():
                            body.extend(chunk)
                            if len(body) > self.max_bytes:
                                raise ConfluenceError(f"{urlsplit(url).path}: larger than the "
                                                      f"{self.max_bytes / 1e6:.1f} MB limit; not downloaded")
                        return bytes(body)
            except httpx.TimeoutException as exc:
                raise ConfluenceError(f"no answer from {self.origin} in time ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                refused = refusal(exc)
                if refused is not None:
                    raise Refused(f"{urlsplit(url).path}: {refused}") from exc
                raise ConfluenceError(f"cannot reach {self.origin} ({type(exc).__name__}: {exc})") from exc
            self.sleep(wait)
        raise AssertionError("unreachable")

    def create_draft(self, space: str, title: str, storage: str) -> dict[str, Any]:
        """A draft page (``status: draft``, seen by its author and admins until someone publishes it) in
        ``space`` with the storage-format ``storage`` body: ``POST /rest/api/content``. The created
        content's JSON (``id``, ``_links``); ``ConfluenceError`` when Confluence refuses. Not retried:
        a create that timed out may have created the page."""
        url = self.url("rest/api/content")
        body = {"type": "page", "status": "draft", "title": title, "space": {"key": space},
                "body": {"storage": {"value": storage, "representation": "storage"}}}
        self.requests += 1
        try:
            response = self.client.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise ConfluenceError(f"no answer from {self.origin} in time ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ConfluenceError(f"cannot reach {self.origin} ({type(exc).__name__}: {exc})") from exc
        if response.status_code not in (200, 201):
            detail = response.text[:200].strip()
            raise ConfluenceError(f"HTTP {response.status_code}: the draft page was not created"
                                  + (f" ({detail})" if detail else ""))
        data = response.json()
        if not isinstance(data, dict) or not data.get("id"):
            raise ConfluenceError("the draft page was not created (no id in the answer)")
        return data

    def json(self, link: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.get(link, params)
        path = urlsplit(self.url(link)).path
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ConfluenceError(f"{path}: not a JSON answer; is {self.base_url} the Confluence base URL "
                                  "(Cloud: https://<site>.atlassian.net/wiki)?") from exc
        if not isinstance(data, dict):
            raise ConfluenceError(f"{path}: unexpected answer ({type(data).__name__})")
        return data

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


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.netloc or '').lower()}"


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


def storage_to_markdown(title: str, storage: str) -> str:
    """A page's storage-format body as Markdown under ``# title``: headings, lists and tables kept,
    macro bodies kept as text, images and links reduced to their text."""
    from markdownify import markdownify  # with BeautifulSoup: Confluence sources only

    body = markdownify(storage or "", heading_style="ATX", strip=["img", "a"], bullets="-")
    # Confluence pages start at h1 inside the page; the title is the document's own heading.
    lines = [("#" + line) if line.startswith("#") else line for line in body.splitlines()]
    return f"# {title}\n\n" + "\n".join(lines).strip() + "\n"


@dataclass
class Entry:
    """One page or attachment as the listing showed it."""

    doc_id: str
    kind: str  # page | attachment
    content_id: str
    version: int
    title: str
    link: str  # the web link people follow (the page), for an attachment its download
    suffix: str = ".md"
    #: Who owns it (``bot/knowledge/loop/owners.py``): the page's author (an attachment: its page's), and its
    #: space key (also whose space permissions apply).
    author: str = ""
    space: str = ""
    #: The page's ancestors' content ids, root first (an attachment: its page's, and the page itself).
    ancestors: tuple[str, ...] = ()
    #: The page itself, or an attachment's page: whose read restrictions apply.
    page_id: str = ""

    @property
    def tag(self) -> str:
        """What ``FetchState.etag`` keeps: the version this index format made it from."""
        return f"v{self.version}:{INDEX_FORMAT}"


def _person(result: dict[str, Any]) -> str:
    """A listed page's author (its creator; else who made its current version): the display name."""
    for who in ((result.get("history") or {}).get("createdBy"), (result.get("version") or {}).get("by")):
        if isinstance(who, dict) and (name := who.get("displayName") or who.get("username") or who.get("accountId")):
            return str(name)
    return ""


def _cql_list(values: list[str]) -> str:
    return ", ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)


class _ConfluenceScan:
    def __init__(self, source: ConfluenceSource, entries: list[Entry], current: dict[str, DocRecord], space: str):
        self.source = source
        self.entries = entries
        self.current = current
        self.space = space

    @property
    def total(self) -> int:
        return len(self.entries)

    def _unchanged(self, entry: Entry) -> bool:
        state = self.source.states.get(entry.doc_id)
        record = self.current.get(entry.doc_id)
        return (state is not None and record is not None and state.etag == entry.tag
                and state.content_hash == record.content_hash and record.space == self.space
                and record.root == self.source.root)

    def _item(self, entry: Entry) -> SourceItem:
        src = self.source
        item = SourceItem(doc_id=entry.doc_id, source=entry.link, root=src.root, suffix=entry.suffix,
                          name=PurePosixPath(entry.title).stem if entry.kind == "attachment" else entry.title,
                          meta={k: v for k, v in (("author", entry.author), ("confluence_space", entry.space))
                                if v})
        if src.permissions is None:  # the operator turned permissions off: the source's space may read all
            item.readers = [PUBLIC]
        else:
            try:
                item.readers = src.permissions.readers(entry)
            except ReadersUnknown as exc:  # indexed all the same, for nobody: a mapping opens it without a fetch
                item.readers, item.held = None, str(exc)
            except Gone as exc:
                item.gone, item.error = True, str(exc)
                return item
            except ConfluenceError as exc:  # permissions unknown: the document keeps its version and readers
                item.error = f"permissions not read: {exc}"
                return item
        if src.permissions_only:
            item.not_modified = True
            if entry.doc_id in src.states:
                src.updated_states[entry.doc_id] = src.states[entry.doc_id]
            return item
        if self._unchanged(entry):
            item.not_modified = True
            src.updated_states[entry.doc_id] = src.states[entry.doc_id]
            return item
        try:
            if entry.kind == "page":
                page = src.client.json(f"rest/api/content/{entry.content_id}", {"expand": "body.storage,version"})
                storage = ((page.get("body") or {}).get("storage") or {}).get("value") or ""
                item.data = storage_to_markdown(page.get("title") or entry.title, storage).encode("utf-8")
            else:
                item.data = src.client.get(entry.link)
        except Gone as exc:
            item.gone = True
            item.error = str(exc)
            return item
        except ConfluenceError as exc:
            item.error = str(exc)
            return item
        src.updated_states[entry.doc_id] = FetchState(etag=entry.tag, content_hash=content_hash(item.data))
        return item

    def __iter__(self) -> Iterator[SourceItem]:
        for entry in self.entries:
            yield self._item(entry)


class ConfluenceSource:
    """The pages (and attachments) of ``spaces`` or of ``cql`` on one Confluence site; ``root``
    (``confluence:<name>``) scopes revocation to it."""

    def __init__(self, name: str, client: ConfluenceClient | None, *, spaces: list[str] | None = None,
                 cql: str | None = None, attachments: bool = True, states: dict[str, FetchState] | None = None,
                 max_documents: int = 10000, missing: str | None = None, permissions: bool = True,
                 everyone_groups: Collection[str] = ("confluence-users",),
                 everyone_readers: Collection[str] = ("confluence:everyone",),
                 hidden_spaces: Mapping[str, Collection[str]] | None = None):
        if bool(spaces) == bool(cql):
            raise ValueError("a Confluence source needs space keys or a CQL query (one of them)")
        self.name = name
        self.client = client
        self.spaces = list(spaces or [])
        self.cql = cql
        self.attachments = attachments
        self.states = dict(states or {})
        self.updated_states: dict[str, FetchState] = {}
        self.max_documents = max_documents
        #: Why there is no client (a token not set): the run fails with it, nothing is revoked.
        self.missing = missing
        self.listed_completely = True  # a listing is whole, or the scan raises
        #: Read restrictions and space permissions per document (None: every document is public to its space).
        self.permissions = (ConfluencePermissions(client, everyone_groups, everyone_readers, hidden_spaces)
                            if permissions and client else None)
        #: Set by a permissions-only refresh: no body is read, only who may read each document.
        self.permissions_only = False

    @property
    def root(self) -> str:
        return f"confluence:{self.name}"

    @property
    def roots(self) -> list[str]:
        return [self.root]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def page_cql(self) -> str:
        scope = f"space in ({_cql_list(self.spaces)})" if self.spaces else f"({self.cql})"
        return f"{scope} and type = page"

    def _doc_id(self, kind: str, content_id: str) -> str:
        return f"{self.root}:{kind}:{content_id}"

    def _list(self) -> list[Entry]:
        assert self.client is not None
        client = self.client
        entries: list[Entry] = []
        pages: dict[str, Entry] = {}
        space_keys: set[str] = set()
        for result in client.results("rest/api/content/search",
                                     {"cql": self.page_cql(), "expand": "version,space,history,ancestors",
                                      "limit": PAGE_SIZE}):
            content_id = str(result["id"])
            links = result.get("_links") or {}
            key = (result.get("space") or {}).get("key")
            entry = Entry(self._doc_id("page", content_id), "page", content_id,
                          int((result.get("version") or {}).get("number") or 0), str(result.get("title") or ""),
                          client.url(links.get("webui") or f"pages/viewpage.action?pageId={content_id}"),
                          author=_person(result), space=str(key or ""), page_id=content_id,
                          ancestors=tuple(str(a["id"]) for a in result.get("ancestors") or [] if a.get("id")))
            pages[content_id] = entry
            if key:
                space_keys.add(str(key))
        entries += pages.values()
        if self.attachments and pages and space_keys:
            cql = f"space in ({_cql_list(sorted(space_keys))}) and type = attachment"
            for result in client.results("rest/api/content/search",
                                         {"cql": cql, "expand": "version,container", "limit": PAGE_SIZE}):
                container = str((result.get("container") or {}).get("id") or "")
                title = str(result.get("title") or "")
                suffix = PurePosixPath(title).suffix.lower()
                links = result.get("_links") or {}
                if container not in pages or suffix not in SUPPORTED_SUFFIXES or not links.get("download"):
                    continue
                download = client.url(links["download"])
                page = pages[container]
                entries.append(Entry(self._doc_id("attachment", str(result["id"])), "attachment", str(result["id"]),
                                     int((result.get("version") or {}).get("number") or 0), title, download,
                                     suffix=suffix, author=page.author, space=page.space,
                                     page_id=page.content_id,
                                     ancestors=page.ancestors))
        if len(entries) > self.max_documents:
            raise ConfluenceError(f"{len(entries)} pages and attachments listed; more than the "
                                  f"{self.max_documents} a source may have (refresh.max_urls)")
        return entries

    def scan(self, current: dict[str, DocRecord], space: str) -> _ConfluenceScan:
        """Lists the source (raises ``ConfluenceError`` if the listing cannot be read whole)."""
        if self.client is None:
            raise ConfluenceError(self.missing or "no Confluence client")
        started = time.perf_counter()
        try:
            entries = self._list()
        except Gone as exc:  # the search itself is missing: not a page that went away
            raise ConfluenceError(f"{exc}; is {self.client.base_url} the Confluence base URL (Cloud: "
                                  "https://<site>.atlassian.net/wiki)?") from exc
        log.info("confluence source=%s: %d pages and attachments listed in %.1f s (%d requests, %d rate-limited)",
                 self.name, len(entries), time.perf_counter() - started, self.client.requests, self.client.throttled)
        return _ConfluenceScan(self, entries, current, space)



class ReadersUnknown(Exception):
    """Who may read a document cannot be established (its space's permissions are hidden from the API
    user and no setting maps them): it is indexed, readable by nobody; the message says why."""


@dataclass(frozen=True)
class Level:
    """Who passes one level of restriction (the space's read permission, or one page's read restriction)."""

    people: frozenset[str] = frozenset()  # user principals
    groups: frozenset[str] = frozenset()  # Confluence group names (members can be listed)
    #: Principals an operator mapped that name no Confluence user or group (``space:ops``): matched by
    #: name only, so they admit no one person in an intersection.
    others: frozenset[str] = frozenset()
    #: Every Confluence account passes (an everyone group): the level restricts no account further.
    everyone: bool = False


class ConfluencePermissions:
    """Who may read a page (or an attachment, as its page), read through the REST API once per run:

    - the page's and each ancestor's read restrictions
      (``GET rest/api/content/{id}/restriction/byOperation/read``): a reader must satisfy every one of
      them that restricts anything (Confluence inherits view restrictions down the tree);
    - the space's permissions (``GET rest/api/space/{key}?expand=permissions``, the ``read`` operation
      on the space): no restriction when anonymous access is granted; every Confluence account when one
      of ``everyone_groups`` has it; else a reader must hold it too. A space whose read permissions the
      API user is not shown (Data Center's REST API shows none; a Cloud user without the right sees
      none) takes its readers from ``hidden_spaces`` (space key or ``*`` -> principals), else its pages'
      readers are unknown (``ReadersUnknown``): held back, never public.

    One level: its users and groups are the readers; a level every Confluence account passes gives
    ``everyone_readers`` (an explicit principal such as ``confluence:everyone``, never ``public`` unless
    the operator says so). Several: their intersection (a level every account passes narrows nothing),
    the groups of one expanded to members (``GET rest/api/group/{name}/member``) where the other does not
    name them. Users become ``user:<e-mail>`` (``user:confluence:<account id or user name>`` when the
    API shows no e-mail), groups ``group:<name>``. An intersection no one passes: ``[]`` (nobody).
    """

    def __init__(self, client: ConfluenceClient, everyone_groups: Collection[str] = ("confluence-users",),
                 everyone_readers: Collection[str] = ("confluence:everyone",),
                 hidden_spaces: Mapping[str, Collection[str]] | None = None):
        self.client = client
        self.everyone = frozenset(g.lower() for g in everyone_groups)
        self.everyone_readers = sorted(everyone_readers)
        self.hidden_spaces = {k.upper(): list(v) for k, v in (hidden_spaces or {}).items()}
        self._restrictions: dict[str, Level | None] = {}
        self._spaces: dict[str, Level | None | ReadersUnknown] = {}
        self._members: dict[str, frozenset[str]] = {}

    @staticmethod
    def user_principal(user: dict[str, Any]) -> str | None:
        email = str(user.get("email") or "").strip().lower()
        if email:
            return f"user:{email}"
        ident = user.get("accountId") or user.get("username") or user.get("userKey")
        return f"user:confluence:{str(ident).lower()}" if ident else None

    def _level(self, users: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Level | None:
        people = frozenset(p for p in map(self.user_principal, users) if p)
        names = frozenset(str(g.get("name") or "").lower() for g in groups if g.get("name"))
        if names & self.everyone:
            return Level(everyone=True)
        return Level(people, names) if people or names else None

    def _mapped(self, principals: Collection[str]) -> Level | None:
        """A level from principals the operator gave a hidden space."""
        if PUBLIC in principals:
            return None
        if any(p in self.everyone_readers for p in principals):
            return Level(everyone=True)
        return Level(people=frozenset(p for p in principals if p.startswith("user:")),
                     groups=frozenset(p.removeprefix("group:") for p in principals if p.startswith("group:")),
                     others=frozenset(p for p in principals if not p.startswith(("user:", "group:"))))

    def restriction(self, content_id: str) -> Level | None:
        if content_id not in self._restrictions:
            data = self.client.json(f"rest/api/content/{content_id}/restriction/byOperation/read",
                                    {"expand": "restrictions.user,restrictions.group"})
            found = data.get("restrictions") or {}
            self._restrictions[content_id] = self._level(list(self._all(found.get("user"))),
                                                         list(self._all(found.get("group"))))
        return self._restrictions[content_id]

    def _all(self, listing: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
        """A restriction's or permission's users or groups, following ``_links.next`` if it has more."""
        while listing:
            yield from listing.get("results") or []
            following = (listing.get("_links") or {}).get("next")
            listing = self.client.json(following) if following else None

    def space(self, key: str) -> Level | None:
        """The space's read level; None: anyone may read (anonymous access). ``ReadersUnknown``: hidden."""
        if key not in self._spaces:
            self._spaces[key] = self._read_space(key)
        found = self._spaces[key]
        if isinstance(found, ReadersUnknown):
            raise found
        return found

    def _read_space(self, key: str) -> Level | None | ReadersUnknown:
        data = self.client.json(f"rest/api/space/{key}", {"expand": "permissions"})
        reads = [p for p in data.get("permissions") or []
                 if (p.get("operation") or {}).get("operation") == "read"
                 and (p.get("operation") or {}).get("targetType") == "space"]
        if not reads:
            mapped = self.hidden_spaces.get(key.upper(), self.hidden_spaces.get("*"))
            if mapped is not None:
                log.info("confluence: space %s shows no read permissions; its readers are %s "
                         "(confluence.hidden_space_readers)", key, ", ".join(mapped))
                return self._mapped(mapped)
            log.warning("confluence: no read permissions visible for space %s; its pages are held back (readable "
                        "by nobody) until confluence.hidden_space_readers names its readers", key)
            return ReadersUnknown(f"the read permissions of Confluence space {key} are not visible to the API user: "
                                  f"held back until confluence.hidden_space_readers names its readers (e.g. "
                                  f"{key}: [space:{key.lower()}], or [confluence:everyone] to let page restrictions "
                                  "decide)")
        if any(p.get("anonymousAccess") for p in reads):
            return None
        users: list[dict[str, Any]] = []
        groups: list[dict[str, Any]] = []
        for permission in reads:
            subjects = permission.get("subjects") or {}
            users += list(self._all(subjects.get("user")))
            groups += list(self._all(subjects.get("group")))
        # Read permission shown but naming no one: no one reads it (not "no restriction").
        return self._level(users, groups) or Level()

    def members(self, group: str) -> frozenset[str]:
        if group not in self._members:
            people = self.client.results(f"rest/api/group/{group}/member", {"limit": PAGE_SIZE})
            self._members[group] = frozenset(p for p in map(self.user_principal, people) if p)
        return self._members[group]

    def _admits(self, level: Level, user: str) -> bool:
        return user in level.people or any(user in self.members(g) for g in level.groups)

    def readers(self, entry: Entry) -> list[str]:
        """The principals who may read ``entry``; ``[]`` when no one passes every level.
        :raises ReadersUnknown: its space's permissions are hidden and not mapped (or it has no space)."""
        if not entry.space:
            raise ReadersUnknown("the Confluence listing gave no space for it: its space permissions are unknown")
        space = self.space(entry.space)
        found = [level for level in (space, *(self.restriction(c) for c in (*entry.ancestors, entry.page_id)))
                 if level is not None]
        if not found:
            return [PUBLIC]
        # A level every account passes narrows none of the others: all their users and groups are accounts.
        levels = [level for level in found if not level.everyone]
        if not levels:
            return list(self.everyone_readers)
        if len(levels) == 1:
            level = levels[0]
            return sorted(level.people | {f"group:{g}" for g in level.groups} | level.others)
        # A reader must pass every level: a group (or mapped principal) named by all of them passes as
        # such; anyone else is checked one by one (groups expanded to their members).
        common_groups = frozenset.intersection(*(level.groups for level in levels))
        common_others = frozenset.intersection(*(level.others for level in levels))
        candidates = set().union(*(level.people for level in levels))
        for level in levels:
            for group in level.groups - common_groups:
                candidates |= self.members(group)
        people = {u for u in candidates if all(self._admits(level, u) for level in levels)}
        return sorted(people | {f"group:{g}" for g in common_groups} | common_others)
