"""``ConfluenceSource``: the pages (and attachments) of some spaces or of a CQL query, listed once per
run, read only where their version changed (see the package's docstring)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pipelines.components.converter import SUPPORTED_SUFFIXES
from pipelines.records import INDEX_FORMAT, PUBLIC, content_hash
from pipelines.sources.confluence.client import PAGE_SIZE, ConfluenceClient, ConfluenceError, Gone
from pipelines.sources.confluence.permissions import ConfluencePermissions, ReadersUnknown
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import NamedRootSource, SourceItem
from pipelines.store import DocRecord

log = logging.getLogger("pipelines.sources.confluence")


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


class ConfluenceSource(NamedRootSource):
    """The pages (and attachments) of ``spaces`` or of ``cql`` on one Confluence site; ``root``
    (``confluence:<name>``) scopes revocation to it."""

    KIND = "confluence"

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
        #: Read restrictions and space permissions per document (None: every document is public to its space).
        self.permissions = (ConfluencePermissions(client, everyone_groups, everyone_readers, hidden_spaces)
                            if permissions and client else None)
        #: Set by a permissions-only refresh: no body is read, only who may read each document.
        self.permissions_only = False

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
                 self.name, len(entries), time.perf_counter() - started, self.client.requests, self.client.retry.throttled)
        return _ConfluenceScan(self, entries, current, space)
