"""``SharePointSource``: the files of SharePoint document libraries (or of a user's OneDrive), read with
Graph's delta query: the first run enumerates each drive in full, the next ones read only what changed
since the ``@odata.deltaLink`` the run before kept (``updated_states``).

What a run does, per drive:

- **delta**: ``GET /drives/{d}/root/delta`` (or the kept delta link), page after page to a new delta link.
  An item may come several times: the last one counts. A kept link Graph no longer accepts (410) is
  dropped and the drive enumerated in full once, with a line in the run's failures saying so;
- **scope**: only files under the configured folder, by the ids of their parent folders (delta gives no
  paths): the folders seen are kept between runs, so a folder moved out of scope takes its files with it;
  a folder moved into it (delta names the folder, not its files) has its children listed
  (``/items/{id}/children``, folder by folder, paged), so its files are indexed in the same run;
- **what changed**: a file delta names is asked for its permissions (``/items/{id}/permissions``); its
  content is downloaded (``/content``, see ``client``) only when its ``cTag`` (the content's version) is
  not the one indexed, so a sharing change moves its readers in place, without conversion or embedding;
- **what did not**: a file delta does not name keeps its version and readers, costing no call; a file
  whose last try failed (download, conversion) is tried again;
- **gone**: a ``deleted`` item, one moved out of the folder, renamed to a type kbbot does not index, or
  (after a full enumeration) not listed at all, is not yielded, so the indexer revokes it.

A drive that cannot be read (403, throttled past the limit) keeps every document of it as it is and is
named in the run's failures; when no drive can be read, or no token can be had, the run fails with the
reason and nothing is revoked. With ``page_readers`` (``sharepoint.pages``), the site's pages are listed
and read too, after the drives (``pages``). ``permissions_only``: no delta (its link is kept for the next full run),
the permissions of every indexed file read again (its folder's or site's may have changed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote, urlsplit

from pipelines.records import INDEX_FORMAT, content_hash
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import NamedRootSource, SourceItem
from pipelines.sources.sharepoint.client import (
    DeltaExpired,
    GraphClient,
    GraphError,
    ItemGone,
    Refused,
    TokenRefused,
)
from pipelines.sources.sharepoint.pages import PageWork, SitePages
from pipelines.sources.sharepoint.permissions import SharePointReaders
from pipelines.store import DocRecord

log = logging.getLogger("pipelines.sources.sharepoint")

#: Folder depth walked up to decide whether an item is under the configured folder.
MAX_DEPTH = 200


def _pack(**values: str) -> list[str]:
    return [f"{k}={v}" for k, v in values.items() if v]


def _unpack(packed: list[str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in packed if "=" in p)


@dataclass
class Drive:
    """One drive (document library, or a user's OneDrive) as configured and resolved."""

    id: str
    name: str
    web_url: str
    site_url: str  # names the site groups (``group:<site url>::<name>``)
    scope_id: str = ""  # the configured folder's item id; "" until the drive's root is seen


@dataclass
class Known:
    """What a run keeps of one file for the next (a ``FetchState`` under the document's id)."""

    drive_id: str
    item_id: str
    name: str
    web_url: str
    parent: str
    ctag: str = ""  # the content version of the bytes indexed ("" when none was)
    content_hash: str | None = None
    size: int = 0
    held: str = ""
    author: str = ""

    @property
    def tag(self) -> str:
        return f"{self.ctag}:{INDEX_FORMAT}" if self.ctag else ""

    def state(self) -> FetchState:
        return FetchState(etag=self.tag or None, content_hash=self.content_hash, final_url=self.web_url,
                          urls=_pack(drive=self.drive_id, item=self.item_id, name=self.name, parent=self.parent,
                                     size=str(self.size), held=self.held, author=self.author))

    @classmethod
    def of(cls, state: FetchState) -> Known | None:
        info = _unpack(state.urls)
        if not info.get("drive") or not info.get("item"):
            return None
        tag = state.etag or ""
        ctag = tag.rsplit(":", 1)[0] if tag.endswith(f":{INDEX_FORMAT}") else ""
        return cls(info["drive"], info["item"], info.get("name", ""), state.final_url or "", info.get("parent", ""),
                   ctag, state.content_hash if ctag else None, int(info.get("size") or 0), info.get("held", ""),
                   info.get("author", ""))

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix.lower()


@dataclass
class Work:
    """One document this run yields: fetched (``fetch``) or kept as it is."""

    doc_id: str
    known: Known
    drive: Drive
    fetch: bool
    record: DocRecord | None = None


@dataclass
class DriveRun:
    """What the listing of one drive left for the scan."""

    drive: Drive
    work: list[Work] = field(default_factory=list)
    note: str = ""  # a line for the run's failures (a resync, a drive that could not be read)
    unreadable: bool = False


class _SharePointScan:
    def __init__(self, source: SharePointSource, work: list[Work | PageWork], notes: list[SourceItem],
                 current: dict[str, DocRecord], space: str):
        self.source = source
        self.work = work
        self.notes = notes
        self.current = current
        self.space = space

    @property
    def total(self) -> int:
        return len(self.work) + len(self.notes)

    def __iter__(self) -> Iterator[SourceItem]:
        yield from self.notes
        window = max(1, self.source.concurrency)
        pending: list[Work | PageWork] = []
        for work in self.work:
            if not work.fetch:
                yield self.source.kept(work)
                continue
            pending.append(work)
            if len(pending) == window:
                yield from self._fetch_all(pending)
                pending = []
        yield from self._fetch_all(pending)

    def _fetch_all(self, works: list[Work | PageWork]) -> list[SourceItem]:
        if not works:
            return []
        src = self.source

        async def all_of() -> list[SourceItem]:
            return list(await asyncio.gather(*(src.fetch(w, self.space) for w in works)))

        return src.run(all_of())


class SharePointSource(NamedRootSource):
    """The files of some drives of one SharePoint site (or one user's OneDrive); ``root``
    (``sharepoint:<name>``) scopes revocation to it. See the module docstring."""

    KIND = "sharepoint"

    def __init__(self, name: str, client: GraphClient | None, *, site: str | None = None, user: str | None = None,
                 drives: list[str] | None = None, folder: str = "", readers: SharePointReaders | None = None,
                 states: dict[str, FetchState] | None = None, suffixes: frozenset[str] = frozenset(),
                 max_file_bytes: int | None = None, max_documents: int = 10000, concurrency: int = 4,
                 missing: str | None = None, page_readers: list[str] | None = None):
        if bool(site) == bool(user):
            raise ValueError("a SharePoint source needs a site or a user (one of them)")
        self.name = name
        self.client = client
        self.site = site
        self.user = user
        self.drive_names = list(drives or [])
        self.folder = folder.strip("/")
        self.readers = readers or SharePointReaders()
        self.states = dict(states or {})
        self.suffixes = suffixes
        self.max_file_bytes = max_file_bytes
        self.max_documents = max_documents
        self.concurrency = concurrency
        self.missing = missing
        #: Who reads the site's pages (``[]``: no one named, held back); None: pages are not read.
        self.page_readers = None if user else page_readers
        self.updated_states: dict[str, FetchState] = {}
        self.permissions_only = False
        self._complete = True
        self._runner: asyncio.Runner | None = None
        self._site: tuple[str, str] | None = None  # the site's Graph id and web URL, once known

    # --- the contract ---------------------------------------------------------------------------------
    @property
    def listed_completely(self) -> bool:
        return self._complete

    def close(self) -> None:
        if self._runner is not None:
            if self.client is not None:
                self._runner.run(self.client.close())
            self._runner.close()
            self._runner = None

    def run(self, coroutine: Any) -> Any:
        """Runs ``coroutine`` on this source's own event loop (a refresh reads a source in a worker thread)."""
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coroutine)

    def doc_id(self, drive_id: str, item_id: str) -> str:
        return f"{self.root}:{drive_id}:{item_id}"

    @property
    def fingerprint(self) -> str:
        """The settings the kept states were made under: others (another site, folder) start afresh."""
        graph = self.client.graph_url if self.client else ""
        return f"{self.site or 'user:' + (self.user or '')}|{','.join(self.drive_names)}|{self.folder}|{graph}"

    def scan(self, current: dict[str, DocRecord], space: str) -> _SharePointScan:
        """Lists every drive (raises ``GraphError`` when none can be read, or no token can be had)."""
        if self.client is None:
            raise GraphError(self.missing or "no Graph client")
        started = time.perf_counter()
        mine = {k: r for k, r in current.items() if r.root == self.root}
        work: list[Work | PageWork]
        if self.permissions_only:
            work = [*self._indexed(mine), *(self._pages().known(mine) if self.page_readers is not None else [])]
            notes: list[SourceItem] = []
        else:
            work, notes = self.run(self._list(mine, space))
        log.info("sharepoint source=%s: %d files to yield (%d to read) in %.1f s (%d requests, %d throttled)",
                 self.name, len(work), sum(w.fetch for w in work), time.perf_counter() - started,
                 self.client.requests, self.client.retry.throttled)
        return _SharePointScan(self, work, notes, current, space)

    # --- listing --------------------------------------------------------------------------------------
    def _indexed(self, mine: dict[str, DocRecord]) -> list[Work]:
        """A permissions-only run: every indexed file, to be asked who may read it now."""
        work = []
        for doc_id, record in mine.items():
            state = self.states.get(doc_id)
            known = Known.of(state) if state else None
            if known is None:  # indexed, but its state is lost: the next full run reads it again
                continue
            drive = Drive(known.drive_id, "", "", self._site_url(known.drive_id))
            work.append(Work(doc_id, known, drive, fetch=True, record=record))
        return work

    def _pages(self) -> SitePages:
        assert self.client is not None and self.page_readers is not None
        return SitePages(self.client, self.root, self.page_readers, self.states, self.updated_states)

    def _site_url(self, drive_id: str) -> str:
        state = self.states.get(f"delta:{drive_id}")
        return _unpack(state.urls).get("site", "") if state else ""

    async def _drives(self) -> list[Drive]:
        """The configured drives: kept from the last run when its settings were these, else asked of Graph."""
        client = self.client
        assert client is not None
        kept = self.states.get("drives")
        if kept is not None and kept.etag == self.fingerprint:
            drives = []
            for drive_id in kept.urls:
                info = _unpack((self.states.get(f"delta:{drive_id}") or FetchState()).urls)
                if not info:
                    break
                drives.append(Drive(drive_id, info.get("name", ""), info.get("web", ""), info.get("site", ""),
                                    info.get("scope", "")))
            else:
                if drives:
                    return drives
        if self.user:
            drive = await client.json(f"v1.0/users/{quote(self.user, safe='@')}/drive")
            web = str(drive.get("webUrl") or "")
            found = [Drive(str(drive["id"]), str(drive.get("name") or "OneDrive"), web, web.rsplit("/", 1)[0])]
        else:
            found = await self._site_drives()
        if self.folder:
            for drive in found:
                try:
                    item = await client.json(f"v1.0/drives/{drive.id}/root:/{quote(self.folder)}")
                except ItemGone:
                    raise GraphError(f"no folder {self.folder!r} in the library {drive.name!r}") from None
                drive.scope_id = str(item["id"])
        return found

    async def _site_drives(self) -> list[Drive]:
        client = self.client
        assert client is not None
        site = await self._lookup_site()
        site_url = str(site.get("webUrl") or self.site)
        libraries = [d for d in await client.values(f"v1.0/sites/{site['id']}/drives")
                     if d.get("driveType", "documentLibrary") == "documentLibrary"]
        if not self.drive_names:
            return [Drive(str(d["id"]), str(d.get("name") or ""), str(d.get("webUrl") or ""), site_url)
                    for d in libraries]
        by_name = {str(d.get("name") or "").lower(): d for d in libraries}
        missing = [n for n in self.drive_names if n.lower() not in by_name]
        if missing:
            raise GraphError(f"the site {site_url} has no library named {', '.join(map(repr, missing))} (it has: "
                             f"{', '.join(sorted(str(d.get('name')) for d in libraries)) or 'none'})")
        return [Drive(str(d["id"]), str(d.get("name") or ""), str(d.get("webUrl") or ""), site_url)
                for d in (by_name[n.lower()] for n in self.drive_names)]

    async def _delta(self, link: str) -> tuple[dict[str, dict[str, Any]], str]:
        """Every item a delta enumeration gives (the last of repeats), and the new delta link."""
        assert self.client is not None
        items: dict[str, dict[str, Any]] = {}
        last: dict[str, Any] = {}
        async for page in self.client.pages(link):
            for item in page.get("value") or []:
                if isinstance(item, dict) and item.get("id"):
                    items.pop(str(item["id"]), None)
                    items[str(item["id"])] = item
            last = page
        delta_link = last.get("@odata.deltaLink")
        if not delta_link:
            raise GraphError("the delta query ended without an @odata.deltaLink")
        return items, str(delta_link)

    async def _lookup_site(self) -> dict[str, Any]:
        client = self.client
        assert client is not None and self.site
        parts = urlsplit(self.site)
        path = parts.path.strip("/")
        try:
            site = await client.json(f"v1.0/sites/{parts.hostname}:/{quote(path)}" if path
                                     else f"v1.0/sites/{parts.hostname}")
        except ItemGone:
            raise GraphError(f"no SharePoint site at {self.site}") from None
        self._site = (str(site["id"]), str(site.get("webUrl") or self.site))
        return site

    async def _site_ref(self) -> tuple[str, str]:
        """The site's Graph id and web URL: kept from the last run under these settings, else asked."""
        kept = self.states.get("site")
        if self._site is None and kept is not None and kept.etag == self.fingerprint and kept.urls:
            self._site = (kept.urls[0], kept.final_url or "")
        if self._site is None:
            await self._lookup_site()
        assert self._site is not None
        self.updated_states["site"] = FetchState(etag=self.fingerprint, final_url=self._site[1], urls=[self._site[0]])
        return self._site

    async def _list_pages(self, mine: dict[str, DocRecord], space: str) -> tuple[list[PageWork], str]:
        """The site's pages (see ``pages``); when they cannot be listed, those indexed stand, with a line why."""
        pages = self._pages()
        try:
            site_id, site_url = await self._site_ref()
            return await pages.listed(site_id, site_url, mine, space), ""
        except TokenRefused:
            raise
        except GraphError as exc:
            self._complete = False
            return pages.known(mine), (f"the site's pages could not be listed, those indexed keep their version "
                                       f"(does the app have Sites.Read.All, or Sites.Selected on this site?): {exc}")

    async def _list(self, mine: dict[str, DocRecord], space: str) -> tuple[list[Work | PageWork], list[SourceItem]]:
        drives = await self._drives()
        fresh = (self.states.get("drives") or FetchState()).etag != self.fingerprint
        runs: list[DriveRun] = []
        for drive in drives:
            try:
                runs.append(await self._list_drive(drive, mine, fresh))
            except TokenRefused:
                raise
            except GraphError as exc:
                runs.append(self._unreadable(drive, mine, str(exc)))
        if runs and all(r.unreadable for r in runs):  # nothing read: the run fails, nothing is revoked
            raise GraphError("; ".join(r.note for r in runs))
        self.updated_states["drives"] = FetchState(etag=self.fingerprint, urls=[d.id for d in drives])
        works: list[Work | PageWork] = [w for r in runs for w in r.work]
        notes = [SourceItem(doc_id=f"{self.root}:{r.drive.id}:drive", source=r.drive.web_url or r.drive.name,
                            root=self.root, error=r.note) for r in runs if r.note]
        if self.page_readers is not None:
            pages, note = await self._list_pages(mine, space)
            works += pages
            if note:
                notes.append(SourceItem(doc_id=f"{self.root}:pages", source=f"{self.site} (site pages)",
                                        root=self.root, error=note))
        if len(works) > self.max_documents:
            raise GraphError(f"{len(works)} files and pages listed; more than the {self.max_documents} a source "
                             "may have (refresh.max_urls)")
        return works, notes

    def _unreadable(self, drive: Drive, mine: dict[str, DocRecord], reason: str) -> DriveRun:
        """A drive that could not be listed: its documents stay as they are."""
        self._complete = False
        run = DriveRun(drive, unreadable=True, note=f"the library {drive.name or drive.id} could not be read, its documents keep "
                                   f"their version: {reason}")
        for key in (f"delta:{drive.id}", f"tree:{drive.id}"):
            if key in self.states:
                self.updated_states[key] = self.states[key]
        for doc_id, state in self.states.items():
            known = Known.of(state) if doc_id.startswith(self.root + ":") else None
            if known is not None and known.drive_id == drive.id:
                if doc_id in mine:
                    run.work.append(Work(doc_id, known, drive, fetch=False, record=mine[doc_id]))
                else:
                    self.updated_states[doc_id] = state
        return run

    async def _list_drive(self, drive: Drive, mine: dict[str, DocRecord], fresh: bool) -> DriveRun:
        run = DriveRun(drive)
        kept = None if fresh else self.states.get(f"delta:{drive.id}")
        start = f"v1.0/drives/{drive.id}/root/delta"
        full = kept is None or not kept.etag
        try:
            items, delta_link = await self._delta(start if full else str(kept.etag))
        except DeltaExpired as exc:
            log.warning("sharepoint source=%s: %s; library %s read in full again", self.name, exc, drive.name)
            run.note = (f"the delta token of library {drive.name or drive.id} was no longer accepted ({exc}); it was "
                        "read in full once again")
            full = True
            items, delta_link = await self._delta(start)
        tree: dict[str, str] = {}
        if not full:
            tree = dict(p.split(">", 1) for p in (self.states.get(f"tree:{drive.id}") or FetchState()).urls
                        if ">" in p)
        before = dict(tree)
        for item_id, item in items.items():
            if "root" in item:
                drive.scope_id = drive.scope_id or item_id
                tree.pop(item_id, None)
            elif "folder" in item or ("deleted" in item and item_id in tree):
                if "deleted" in item:
                    tree.pop(item_id, None)
                else:
                    tree[item_id] = str((item.get("parentReference") or {}).get("id") or "")

        def in_scope(parent: str, folders: dict[str, str] = tree) -> bool:
            for _ in range(MAX_DEPTH):
                if parent == drive.scope_id:
                    return True
                if parent not in folders:
                    return False
                parent = folders[parent]
            return False

        if not full:
            # Delta names a moved folder, not what is in it: a folder that came into the scope has its
            # files listed now, so that they are indexed (with their permissions) in this run.
            arrived = [i for i, item in items.items() if "folder" in item and "deleted" not in item
                       and "root" not in item and in_scope(i) and not (i in before and in_scope(i, before))]
            for folder_id in arrived:
                await self._children(drive, folder_id, items, tree)

        mentioned: set[str] = set()
        for item_id, item in items.items():
            if "file" not in item or "deleted" in item:
                continue
            known = self._known(drive, item)
            if known.suffix not in self.suffixes or not in_scope(known.parent):
                continue
            doc_id = self.doc_id(drive.id, item_id)
            mentioned.add(doc_id)
            run.work.append(Work(doc_id, known, drive, fetch=True, record=mine.get(doc_id)))
        if not full:  # what delta did not name stands, unless it was deleted or its folder left the scope
            named = mentioned | {self.doc_id(drive.id, i) for i in items}
            for doc_id, state in self.states.items():
                known = Known.of(state) if doc_id.startswith(self.root + ":") else None
                if known is None or known.drive_id != drive.id or doc_id in named:
                    continue
                if not in_scope(known.parent):
                    continue
                record = mine.get(doc_id)
                run.work.append(Work(doc_id, known, drive, fetch=record is None or not known.ctag, record=record))
        self.updated_states[f"delta:{drive.id}"] = FetchState(
            etag=delta_link, urls=_pack(name=drive.name, web=drive.web_url, site=drive.site_url, scope=drive.scope_id))
        self.updated_states[f"tree:{drive.id}"] = FetchState(urls=[f"{k}>{v}" for k, v in tree.items()])
        return run

    async def _children(self, drive: Drive, folder_id: str, items: dict[str, dict[str, Any]],
                        tree: dict[str, str]) -> None:
        """Everything under the folder ``folder_id``, into ``items`` (what delta named stands) and ``tree``.
        Graph's delta starts only at a drive's root in SharePoint and OneDrive for Business, so the folder's
        children are listed, folder by folder."""
        assert self.client is not None
        todo, seen = [folder_id], {folder_id}
        while todo:
            parent = todo.pop()
            async for page in self.client.pages(f"v1.0/drives/{drive.id}/items/{parent}/children"):
                for child in page.get("value") or []:
                    if not isinstance(child, dict) or not child.get("id"):
                        continue
                    child_id = str(child["id"])
                    child.setdefault("parentReference", {}).setdefault("id", parent)
                    items.setdefault(child_id, child)
                    if "folder" in child and child_id not in seen and len(seen) < self.max_documents:
                        tree[child_id] = parent
                        seen.add(child_id)
                        todo.append(child_id)

    @staticmethod
    def _known(drive: Drive, item: dict[str, Any]) -> Known:
        author = ((item.get("createdBy") or {}).get("user") or {}).get("displayName") or ""
        return Known(drive.id, str(item["id"]), str(item.get("name") or ""), str(item.get("webUrl") or ""),
                     str((item.get("parentReference") or {}).get("id") or ""), ctag=str(item.get("cTag") or ""),
                     size=int(item.get("size") or 0), author=str(author))

    # --- items ----------------------------------------------------------------------------------------
    def _item(self, work: Work) -> SourceItem:
        known = work.known
        meta = {"title": PurePosixPath(known.name).stem or known.name}
        if known.author:
            meta["author"] = known.author
        return SourceItem(doc_id=work.doc_id, source=known.web_url, root=self.root, suffix=known.suffix,
                          name=PurePosixPath(known.name).stem, meta=meta)

    def kept(self, work: Work | PageWork) -> SourceItem:
        """A document delta did not name: its version and its readers stand."""
        if isinstance(work, PageWork):
            return self._pages().kept(work)
        item = self._item(work)
        item.not_modified = True
        assert work.record is not None
        item.readers, item.held = list(work.record.readers), work.known.held
        state = self.states.get(work.doc_id)
        if state is not None:
            self.updated_states[work.doc_id] = state
        return item

    def _unchanged(self, work: Work, space: str) -> bool:
        old = self.states.get(work.doc_id)
        before = Known.of(old) if old else None
        record = work.record
        return (before is not None and record is not None and bool(before.ctag) and before.ctag == work.known.ctag
                and before.content_hash == record.content_hash and record.space == space
                and record.root == self.root)

    def _keep_state(self, work: Work, held: str | None = None) -> None:
        """The document's state as the last run left it (its version stands), or, for one never indexed,
        what is known now (so it is tried again next run)."""
        old = self.states.get(work.doc_id)
        before = Known.of(old) if old else None
        kept = before or Known(**{**work.known.__dict__, "ctag": "", "content_hash": None})
        if held is not None:
            kept.held = held
        kept.parent, kept.name, kept.web_url = work.known.parent, work.known.name, work.known.web_url
        self.updated_states[work.doc_id] = kept.state()

    async def fetch(self, work: Work | PageWork, space: str) -> SourceItem:
        """Who may read ``work``'s file, and its bytes when they changed (a page: its HTML)."""
        client = self.client
        assert client is not None
        if isinstance(work, PageWork):
            site_id, _ = await self._site_ref()
            return await self._pages().fetch(site_id, work)
        item = self._item(work)
        known = work.known
        try:
            permissions = await client.values(f"v1.0/drives/{known.drive_id}/items/{known.item_id}/permissions")
        except ItemGone as exc:
            item.gone, item.error = True, str(exc)
            return item
        except GraphError as exc:
            item.error = f"permissions not read: {exc}"
            self._keep_state(work)
            return item
        readers, held = self.readers.of(permissions, work.drive.site_url)
        item.readers, item.held = readers, held
        if self.permissions_only:
            item.not_modified = True
            self._keep_state(work, held)
            return item
        if self._unchanged(work, space):
            item.not_modified = True
            self._keep_state(work, held)
            return item
        if self.max_file_bytes is not None and known.size > self.max_file_bytes:
            mib = 1024 * 1024  # as indexing.max_file_mb counts
            item.error = (f"too large: {known.size / mib:.1f} MB, over the {self.max_file_bytes / mib:g} MB "
                          "limit (indexing.max_file_mb); not downloaded")
            self._keep_state(work, held)
            return item
        try:
            data = await client.download(known.drive_id, known.item_id, limit=self.max_file_bytes)
        except ItemGone as exc:
            item.gone, item.error = True, str(exc)
            return item
        except Refused as exc:  # like a URL source's refused page: an earlier version is revoked
            item.gone, item.error = True, str(exc)
            self._keep_state(work, held)
            return item
        except GraphError as exc:
            item.error = str(exc)
            self._keep_state(work, held)
            return item
        item.data = data
        self.updated_states[work.doc_id] = Known(**{**known.__dict__, "content_hash": content_hash(data),
                                                    "held": held}).state()
        return item
