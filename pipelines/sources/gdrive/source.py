"""``DriveSource``: the files of one Drive folder tree (a shared drive's, or one shared with the service
account), crawled once, then followed through the changes feed (see the package's docstring)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pipelines.components.converter import SUPPORTED_SUFFIXES
from pipelines.records import INDEX_FORMAT, NOBODY, content_hash
from pipelines.sources.fetcher import FetchState
from pipelines.sources.gdrive.client import ApiError, CredentialsRefused, DriveClient, DriveError, Gone, RateLimited
from pipelines.sources.gdrive.permissions import DrivePermissions, ReadersUnknown
from pipelines.sources.kind import NamedRootSource, SourceItem
from pipelines.store import DocRecord

log = logging.getLogger("pipelines.sources.gdrive")

FOLDER = "application/vnd.google-apps.folder"
#: Google's own formats, exported to the Office format kbbot converts (the sheets of a spreadsheet all
#: come along in xlsx; Drive's csv export has only the first).
EXPORTS = {
    "application/vnd.google-apps.document":
        (".docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    "application/vnd.google-apps.spreadsheet":
        (".xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
    "application/vnd.google-apps.presentation":
        (".pptx", "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
}
FILE_FIELDS = "id,name,mimeType,parents,trashed,webViewLink,md5Checksum,modifiedTime,size"
LIST_FIELDS = f"nextPageToken,files({FILE_FIELDS})"
CHANGE_FIELDS = f"nextPageToken,newStartPageToken,changes(fileId,removed,changeType,file({FILE_FIELDS}))"
PAGE_SIZE = 1000

#: Keys of the run's states besides the files' doc ids (``FetchState``: a file keeps its content tag in
#: ``etag``, its parents in ``urls`` and its link in ``final_url``; a folder its parents in ``urls``).
TOKEN_KEY = "page-token"
FOLDER_KEY = "folder:"
HELD_KEY = "held:"


@dataclass
class DriveFile:
    """One file as Drive listed it."""

    id: str
    name: str
    mime: str
    parents: tuple[str, ...]
    link: str
    #: What changes when its content does: the checksum of a stored file, the modification time of a
    #: Google Docs file (not ``version``, which a sharing change moves too).
    tag: str
    size: int | None = None
    trashed: bool = False

    @classmethod
    def of(cls, raw: dict[str, Any]) -> DriveFile:
        size = raw.get("size")
        return cls(str(raw["id"]), str(raw.get("name") or ""), str(raw.get("mimeType") or ""),
                   tuple(str(p) for p in raw.get("parents") or []),
                   str(raw.get("webViewLink") or f"https://drive.google.com/file/d/{raw['id']}/view"),
                   f"{raw.get('md5Checksum') or raw.get('modifiedTime') or ''}:{INDEX_FORMAT}",
                   int(size) if str(size or "").isdigit() else None, bool(raw.get("trashed")))

    @property
    def folder(self) -> bool:
        return self.mime == FOLDER

    @property
    def suffix(self) -> str:
        if self.mime in EXPORTS:
            return EXPORTS[self.mime][0]
        return "" if self.mime.startswith("application/vnd.google-apps.") else PurePosixPath(self.name).suffix.lower()

    @property
    def title(self) -> str:
        return self.name if self.mime in EXPORTS else (PurePosixPath(self.name).stem or self.name)


@dataclass
class Step:
    """One item of a run: ``read`` a file, ``keep`` an unchanged one, ``readers`` only, or a ``notice``."""

    action: str
    doc_id: str
    file: DriveFile | None = None
    text: str = ""


class DeadToken(DriveError):
    """Drive no longer accepts the saved page token."""


class DriveSource(NamedRootSource):
    """The files under ``folder`` (in shared drive ``drive``, if set); ``root`` (``gdrive:<name>``)
    scopes revocation to it."""

    KIND = "gdrive"

    def __init__(self, name: str, client: DriveClient | None, *, folder: str, drive: str | None = None,
                 states: dict[str, FetchState] | None = None, extensions: Collection[str] = (),
                 max_file_mb: float | None = None, max_documents: int = 10000, anyone_public: bool = False,
                 missing: str | None = None):
        self.name = name
        self.client = client
        self.folder = folder
        self.drive = drive
        self.states = dict(states or {})
        self.updated_states: dict[str, FetchState] = {}
        self.extensions = frozenset(extensions or SUPPORTED_SUFFIXES)
        self.max_file_mb = max_file_mb
        self.max_documents = max_documents
        self.permissions = DrivePermissions(client, anyone_public) if client else None
        #: Why there is no client (no key set): the run fails with it, nothing is revoked.
        self.missing = missing
        #: Set by a permissions-only refresh: no content is read, no change followed.
        self.permissions_only = False

    @property
    def folder_link(self) -> str:
        return f"https://drive.google.com/drive/folders/{self.folder}"

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def doc_id(self, file_id: str) -> str:
        return f"{self.root}:file:{file_id}"

    def file_id(self, doc_id: str) -> str:
        return doc_id.rsplit(":", 1)[-1]

    def indexed(self, file: DriveFile) -> bool:
        """A document kbbot converts (not a folder, a form, a shortcut, a type not indexed)."""
        return bool(file.suffix) and file.suffix in self.extensions and not file.trashed

    # --- Drive calls ---------------------------------------------------------------------------------
    @property
    def _drive_params(self) -> dict[str, str]:
        params = {"supportsAllDrives": "true"}
        if self.drive:
            params.update(driveId=self.drive, includeItemsFromAllDrives="true")
        return params

    def _start_token(self) -> str:
        assert self.client is not None
        params = {"supportsAllDrives": "true", **({"driveId": self.drive} if self.drive else {})}
        token = self.client.json("changes/startPageToken", params).get("startPageToken")
        if not token:
            raise DriveError("changes.getStartPageToken gave no token")
        return str(token)

    def _crawl(self, folders: list[str], tree: dict[str, tuple[str, ...]]) -> list[DriveFile]:
        """The files under ``folders`` (their subfolders are added to ``tree``: id -> parents)."""
        assert self.client is not None
        files: list[DriveFile] = []
        queue, seen = list(folders), set(folders)
        params = {**self._drive_params, "pageSize": PAGE_SIZE, "fields": LIST_FIELDS}
        if self.drive:
            params["corpora"] = "drive"
        while queue:
            folder = queue.pop(0)
            quoted = folder.replace("\\", "\\\\").replace("'", "\\'")
            for raw in self.client.pages("files", {**params, "q": f"'{quoted}' in parents and trashed = false"},
                                         "files"):
                found = DriveFile.of(raw)
                if found.folder:
                    tree[found.id] = found.parents
                    if found.id not in seen:
                        seen.add(found.id)
                        queue.append(found.id)
                elif self.indexed(found):
                    files.append(found)
                    if len(files) > self.max_documents:
                        raise DriveError(f"more than the {self.max_documents} files a source may have "
                                         "(refresh.max_urls)")
        return files

    def _changes(self, token: str) -> tuple[list[dict[str, Any]], str]:
        """Every change since ``token``, and the token to start from next time."""
        assert self.client is not None
        params: dict[str, Any] = {**self._drive_params, "pageToken": token, "pageSize": PAGE_SIZE,
                                  "includeRemoved": "true", "fields": CHANGE_FIELDS}
        if not self.drive:
            params["includeItemsFromAllDrives"] = "true"
        changes: list[dict[str, Any]] = []
        while True:
            try:
                data = self.client.json("changes", params)
            except (Gone, ApiError) as exc:
                status = getattr(exc, "status", 404)
                if status in (400, 404, 410):
                    raise DeadToken(str(exc)) from exc
                raise
            changes += data.get("changes") or []
            if data.get("newStartPageToken"):
                return changes, str(data["newStartPageToken"])
            if not data.get("nextPageToken"):
                raise DriveError("changes.list ended without a newStartPageToken")
            params["pageToken"] = data["nextPageToken"]

    # --- plans -------------------------------------------------------------------------------------
    def _full(self, tree: dict[str, tuple[str, ...]]) -> tuple[list[Step], str]:
        token = self._start_token()  # before the crawl: what changes during it is in the next run's feed
        files = self._crawl([self.folder], tree)
        return [Step("read", self.doc_id(f.id), f) for f in files], token

    def _known(self, current: dict[str, DocRecord]) -> dict[str, FetchState] | None:
        """The files the last runs kept, or None when they cannot be trusted (a document of this source
        in the store without one): the run then crawls."""
        known = {k: s for k, s in self.states.items() if k.startswith(f"{self.root}:file:")}
        mine = [d for d, r in current.items() if r.root == self.root]
        return None if any(d not in known for d in mine) else known

    def _incremental(self, token: str, known: dict[str, FetchState], tree: dict[str, tuple[str, ...]]
                     ) -> tuple[list[Step], str]:
        changes, new_token = self._changes(token)
        tree.update({k.removeprefix(FOLDER_KEY): tuple(s.urls) for k, s in self.states.items()
                     if k.startswith(FOLDER_KEY)})
        before = set(tree)
        changed: dict[str, DriveFile | None] = {}  # file id -> as it is now (None: removed or trashed)
        for change in changes:
            if change.get("changeType", "file") != "file" or not change.get("fileId"):
                continue
            raw = change.get("file")
            found = None if change.get("removed") or not raw else DriveFile.of(raw)
            if found is not None and found.trashed:
                found = None
            changed[str(change["fileId"])] = found
        if self.folder in changed and changed[self.folder] is None:
            raise DriveError(f"the folder {self.folder} itself is trashed, deleted or no longer shared with the "
                             "service account; nothing was revoked (remove the source to revoke its documents)")
        for file_id, found in changed.items():
            if found is None:
                tree.pop(file_id, None)
            elif found.folder:
                tree[file_id] = found.parents
        in_tree = self._reachable(tree)
        for folder in set(tree) - in_tree:
            del tree[folder]
        steps: list[Step] = []
        # A folder moved (or restored) into the tree brings files the feed does not list: read them all.
        arrived = sorted(f for f in in_tree if f not in before and f != self.folder)
        if arrived:
            for found in self._crawl(arrived, tree):
                changed.setdefault(found.id, found)
            in_tree = self._reachable(tree)  # with the subfolders the crawl found
        for found in changed.values():
            if found is not None and not found.folder and self.indexed(found) \
                    and any(p in in_tree for p in found.parents):
                steps.append(Step("read", self.doc_id(found.id), found))
        for doc_id, state in known.items():
            file_id = self.file_id(doc_id)
            if file_id in changed or not any(p in in_tree for p in state.urls):
                continue  # changed (read above, or gone), or its folder left the tree: revoked by absence
            steps.append(Step("keep" if state.etag else "reread", doc_id))
        return steps, new_token

    def _reachable(self, tree: dict[str, tuple[str, ...]]) -> set[str]:
        inside = {self.folder}
        grew = True
        while grew:
            grew = False
            for folder, parents in tree.items():
                if folder not in inside and any(p in inside for p in parents):
                    inside.add(folder)
                    grew = True
        return inside

    def scan(self, current: dict[str, DocRecord], space: str) -> DriveScan:
        """Plans the run: a crawl (first run, or states that cannot be trusted), the changes since the
        saved page token, or (permissions only) the files indexed. Raises ``DriveError`` when that fails."""
        if self.client is None:
            raise DriveError(self.missing or "no Google Drive client")
        started = time.perf_counter()
        tree: dict[str, tuple[str, ...]] = {}
        notices: list[Step] = []
        token: str | None = None
        if self.permissions_only:
            steps = [Step("readers", d) for d, r in current.items() if r.root == self.root]
        else:
            saved = self.states.get(TOKEN_KEY)
            known = self._known(current)
            steps = []
            if saved and saved.etag and known is not None:
                try:
                    steps, token = self._incremental(saved.etag, known, tree)
                except DeadToken as exc:
                    log.warning("gdrive source=%s: the saved page token is refused (%s): reading the whole "
                                "folder again", self.name, exc)
                    notices.append(Step("notice", f"{self.root}:notice:resync", text=(
                        f"Drive no longer accepts the saved changes page token ({exc}): the whole folder was read "
                        "again (a full resync, once) and a new token taken")))
                    tree.clear()
            if token is None:
                steps, token = self._full(tree)
        log.info("gdrive source=%s: %d files to go through, planned in %.1f s (%d Drive calls, %d rate-limited)",
                 self.name, len(steps), time.perf_counter() - started, self.client.requests, self.client.retry.throttled)
        return DriveScan(self, notices + steps, current, space, token, tree)


class DriveScan:
    def __init__(self, source: DriveSource, steps: list[Step], current: dict[str, DocRecord], space: str,
                 token: str | None, tree: dict[str, tuple[str, ...]]):
        self.source = source
        self.steps = steps
        self.current = current
        self.space = space
        self.token = token
        self.tree = tree

    @property
    def total(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[SourceItem]:
        src = self.source
        for step in self.steps:
            yield self._item(step)
        if src.permissions_only:
            src.updated_states.update(src.states)
            return
        # Only once every item is handled: a run that stops part way reads the same changes again.
        src.updated_states.update({FOLDER_KEY + f: FetchState(urls=list(p)) for f, p in self.tree.items()})
        if self.token:
            src.updated_states[TOKEN_KEY] = FetchState(etag=self.token)

    def _source_of(self, doc_id: str) -> str:
        record = self.current.get(doc_id)
        state = self.source.states.get(doc_id)
        return (record.source if record else None) or (state.final_url if state else None) or doc_id

    def _item(self, step: Step) -> SourceItem:
        src = self.source
        if step.action == "notice":
            return SourceItem(doc_id=step.doc_id, source=src.folder_link, root=src.root, error=step.text)
        if step.action in ("keep", "readers"):
            record = self.current.get(step.doc_id)
            if record is None or (step.action == "keep" and not self._trusted(step.doc_id, record)):
                step = Step("reread", step.doc_id)
            elif step.action == "keep":
                return self._kept(step.doc_id, record)
            else:
                return self._readers_only(step.doc_id, record)
        if step.action == "reread":  # a file whose last read failed, or that the store lost
            try:
                assert src.client is not None
                raw = src.client.json(f"files/{src.file_id(step.doc_id)}",
                                      {"supportsAllDrives": "true", "fields": FILE_FIELDS})
            except (CredentialsRefused, RateLimited):
                raise
            except Gone as exc:
                return SourceItem(doc_id=step.doc_id, source=self._source_of(step.doc_id), root=src.root,
                                  gone=True, error=str(exc))
            except DriveError as exc:
                return self._failed(step.doc_id, self._source_of(step.doc_id), str(exc))
            step = Step("read", step.doc_id, DriveFile.of(raw))
            if not src.indexed(step.file) or not any(p in self.tree or p == src.folder for p in step.file.parents):
                return SourceItem(doc_id=step.doc_id, source=step.file.link, root=src.root, gone=True)
        assert step.file is not None
        return self._read(step.doc_id, step.file)

    def _trusted(self, doc_id: str, record: DocRecord) -> bool:
        state = self.source.states.get(doc_id)
        return (state is not None and state.content_hash == record.content_hash and record.space == self.space
                and record.root == self.source.root)

    def _held(self, file_id: str) -> str:
        state = self.source.states.get(HELD_KEY + file_id)
        return (state.etag if state else None) or ""

    def _kept(self, doc_id: str, record: DocRecord) -> SourceItem:
        """Unchanged since the last run: its readers as recorded, nothing asked of Drive."""
        src = self.source
        file_id = src.file_id(doc_id)
        src.updated_states[doc_id] = src.states[doc_id]
        readers = None if record.readers == [NOBODY] else list(record.readers)
        held = self._held(file_id) if readers is None else ""
        if held:
            src.updated_states[HELD_KEY + file_id] = FetchState(etag=held)
        return SourceItem(doc_id=doc_id, source=record.source, root=src.root, not_modified=True, readers=readers,
                          held=held)

    def _readers_only(self, doc_id: str, record: DocRecord) -> SourceItem:
        item = SourceItem(doc_id=doc_id, source=record.source, root=self.source.root, not_modified=True)
        self._set_readers(item, self.source.file_id(doc_id))
        return item

    def _set_readers(self, item: SourceItem, file_id: str) -> None:
        """``item.readers`` from Drive; on failure ``gone`` or ``error`` set (the caller returns it)."""
        assert self.source.permissions is not None
        try:
            item.readers = self.source.permissions.readers(file_id)
        except ReadersUnknown as exc:  # indexed all the same, for nobody
            item.readers, item.held = None, str(exc)
            self.source.updated_states[HELD_KEY + file_id] = FetchState(etag=str(exc))
        except (CredentialsRefused, RateLimited):
            raise
        except Gone as exc:
            item.gone, item.error = True, str(exc)
        except DriveError as exc:  # the document keeps its version and readers
            item.error = f"permissions not read: {exc}"

    def _failed(self, doc_id: str, source: str, reason: str, file: DriveFile | None = None) -> SourceItem:
        """Not read this run: the indexed version stands, and the next run tries again."""
        previous = self.source.states.get(doc_id)
        self.source.updated_states[doc_id] = FetchState(
            urls=list(file.parents) if file else list(previous.urls if previous else []),
            final_url=file.link if file else (previous.final_url if previous else None))
        return SourceItem(doc_id=doc_id, source=source, root=self.source.root, error=reason)

    def _read(self, doc_id: str, file: DriveFile) -> SourceItem:
        src = self.source
        item = SourceItem(doc_id=doc_id, source=file.link, root=src.root, suffix=file.suffix, name=file.title,
                          meta={"title": file.title})
        self._set_readers(item, file.id)
        if item.gone:
            return item
        if item.error:
            return self._failed(doc_id, file.link, item.error, file)
        record = self.current.get(doc_id)
        state = src.states.get(doc_id)
        if state is not None and record is not None and state.etag == file.tag and self._trusted(doc_id, record):
            item.not_modified = True  # a sharing change: the readers are written in place, nothing embedded
            src.updated_states[doc_id] = FetchState(etag=file.tag, content_hash=state.content_hash,
                                                    urls=list(file.parents), final_url=file.link)
            return item
        if file.size and src.max_file_mb and file.size > src.max_file_mb * 1e6:
            return self._failed(doc_id, file.link, f"file too large ({file.size / 1e6:.1f} MB > "
                                f"{src.max_file_mb:g} MB limit); not downloaded", file)
        try:
            item.data = self._content(file)
        except (CredentialsRefused, RateLimited):
            raise
        except Gone as exc:
            item.gone, item.error = True, str(exc)
            return item
        except DriveError as exc:
            return self._failed(doc_id, file.link, str(exc), file)
        src.updated_states[doc_id] = FetchState(etag=file.tag, content_hash=content_hash(item.data),
                                                urls=list(file.parents), final_url=file.link)
        return item

    def _content(self, file: DriveFile) -> bytes:
        client = self.source.client
        assert client is not None
        if file.mime not in EXPORTS:
            return client.get(f"files/{file.id}", {"alt": "media", "supportsAllDrives": "true"})
        try:
            return client.get(f"files/{file.id}/export", {"mimeType": EXPORTS[file.mime][1]})
        except ApiError as exc:
            if exc.reason == "exportSizeLimitExceeded":
                raise DriveError(f"too large for Drive to export as {file.suffix} (exportSizeLimitExceeded: "
                                 "Drive exports at most 10 MB); not indexed") from exc
            if exc.reason == "cannotExportFile":
                raise DriveError("Drive will not export it (cannotExportFile: its owner may have disabled "
                                 "download and copy for viewers); not indexed") from exc
            raise
