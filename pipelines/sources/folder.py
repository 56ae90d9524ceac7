"""Local folders as a source: every supported file under a folder (``FolderSource``), filtered by
include/exclude globs, with who may read each file from the entry's ``acl:``; and where "Add to the
knowledge base" puts an expert's reply in such a folder (``FolderCapture``).

Captured replies are written to ``expert-answers/<platform>-<channel>/`` of the folder: the place they
were said in. Their readers are that place (``channel:<id>``, as for a turn answered there), whatever the
``acl:`` says, so what was said in a private channel is never public once indexed. Files directly under
``expert-answers/`` (captured before places were kept) are read as the ``acl:`` says.

Kind ``path`` (``FOLDER``): ``path`` (relative to the settings file's folder), ``include``, ``exclude``,
``acl``. Its root is the folder itself.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pipelines.acl import Acl, folder_key, readers_for
from pipelines.components.converter import SUPPORTED_SUFFIXES
from pipelines.records import PUBLIC
from pipelines.sections import Texts
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import AclOnlySource, Captured, ConfiguredSource, Scan, SourceContext, SourceEntry, SourceItem
from pipelines.store import DocRecord

log = logging.getLogger(__name__)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over ``/``-separated relative paths: ``*`` and ``?`` stay within a folder, ``**``
    spans folders (``**/`` also matches none), a glob without ``/`` matches file names at any depth."""
    pattern = pattern.strip().removeprefix("./")
    if "/" not in pattern.rstrip("/"):
        pattern = "**/" + pattern
    if pattern.endswith("/"):
        pattern += "**"
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def discover(paths: Iterable[str | os.PathLike[str]], suffixes: Iterable[str] = SUPPORTED_SUFFIXES, *,
             include: Iterable[str] = (), exclude: Iterable[str] = (),
             outside: list[tuple[Path, Path]] | None = None) -> list[Path]:
    """Supported files under ``paths`` (files given directly are kept whatever their type).

    In folders, hidden files and folders are skipped, and ``include`` / ``exclude`` globs (relative to
    the folder, see ``glob_regex``) select files: included when no include glob is given or one
    matches, unless an exclude glob matches. A symbolic link (to a file, or a folder on the way) that
    leads out of the folder is not followed: whoever can write to a knowledge folder must not be able to
    publish any file the bot's user can read. Such links are added to ``outside`` as (link, target).
    A link inside the folder is followed only when its target would be found too (not hidden, not
    excluded, included): else a link would publish what the settings keep out.
    """
    wanted = {s.lower() for s in suffixes}
    includes = [glob_regex(g) for g in include]
    excludes = [glob_regex(g) for g in exclude]

    def selected(rel: Path) -> bool:
        posix = rel.as_posix()
        return (rel.suffix.lower() in wanted and not any(p.startswith(".") for p in rel.parts)
                and (not includes or any(g.match(posix) for g in includes))
                and not any(g.match(posix) for g in excludes))

    found: list[Path] = []
    listed: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {raw}")
        if path.is_file():
            found.append(path.resolve())
            continue
        folder = path.resolve()
        for child in sorted(path.rglob("*")):
            if not child.is_file() or not selected(child.relative_to(path)):
                continue
            target = child.resolve()
            if not target.is_relative_to(folder):
                log.warning("%s links to %s, outside the folder %s: not followed", child, target, folder)
                if outside is not None:
                    outside.append((child.absolute(), target))
                continue
            if not selected(target.relative_to(folder)):
                log.info("%s links to %s, which the folder's settings leave out: not followed", child, target)
                continue
            if target not in listed:  # two links to one file: one document
                listed.add(target)
                found.append(target)
    return found


def display_source(path: Path) -> str:
    """The path as people see it: relative to the working directory when inside it."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def read_capped(path: Path, max_bytes: int | None) -> bytes:
    """The file's bytes; ``ValueError`` (the reason) when it holds more than ``max_bytes``, checked
    before reading and while reading (a file may grow meanwhile), so a huge file is never read whole."""
    with path.open("rb") as handle:
        if max_bytes is None:
            return handle.read()
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(max_bytes + 1) if size <= max_bytes else b""
        if size > max_bytes or len(data) > max_bytes:
            raise ValueError(f"file too large ({max(size, len(data)) / 1e6:.1f} MB > {max_bytes / 1e6:.0f} MB limit)")
        return data


@dataclass
class _FileScan:
    files: list[tuple[Path, str | None]]
    max_bytes: int | None = None
    outside: list[tuple[Path, Path, str | None]] = field(default_factory=list)  # (link, target, root)
    revoke: list[Path] = field(default_factory=list)  # outside targets published earlier
    #: (path, root) -> who may read the file; see ``pipelines.acl``.
    readers: Callable[[str, str | None], list[str]] = field(default=lambda path, root: [PUBLIC])

    @property
    def total(self) -> int:
        return len(self.files) + len(self.outside) + len(self.revoke)

    def __iter__(self) -> Iterator[SourceItem]:
        for link, target, root in self.outside:
            yield SourceItem(doc_id=link.as_posix(), source=display_source(link), root=root,
                             error=f"a symbolic link to {target}, outside the source's folder: not followed")
        for target in self.revoke:
            yield SourceItem(doc_id=target.as_posix(), source=display_source(target), root=None, gone=True,
                             error="outside the source's folder (published through a symbolic link): revoked")
        for path, root in self.files:
            item = SourceItem(doc_id=path.as_posix(), source=display_source(path), root=root, suffix=path.suffix,
                              name=path.stem, readers=self.readers(path.as_posix(), root))
            try:
                item.data = read_capped(path, self.max_bytes)
            except OSError as exc:
                item.error = f"cannot read the file ({exc.strerror or exc})"
            except ValueError as exc:
                item.error = str(exc)
            yield item


class FolderSource(ConfiguredSource):
    """Local folders (and single files): every supported file, filtered by include/exclude globs.

    A folder is the root of the files found in it, so a file deleted from it is revoked by the next
    refresh; a file given directly has no root and is only ever replaced. A folder that does not
    exist is an error (``FileNotFoundError``), never "everything was deleted".

    ``readers(path, root)``: who may read a file (a source's ``acl:``, ``pipelines.acl``); without it,
    everyone of the space: the operator who indexes files by hand (``kbbot index``) publishes them.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]], *, suffixes: Iterable[str] = SUPPORTED_SUFFIXES,
                 include: Iterable[str] = (), exclude: Iterable[str] = (), max_file_mb: float | None = None,
                 readers: Callable[[str, str | None], list[str]] | None = None):
        self.paths = list(paths)
        self.readers = readers or (lambda path, root: [PUBLIC])
        self.suffixes = set(suffixes)
        self.include = list(include)
        self.exclude = list(exclude)
        # The converter's limit, applied already when reading (its unit: MiB).
        self.max_bytes = None if max_file_mb is None else int(max_file_mb * 1024 * 1024)

    @property
    def roots(self) -> list[str]:
        return [Path(p).resolve().as_posix() for p in self.paths if Path(p).is_dir()]

    def scan(self, current: dict[str, DocRecord], space: str) -> Scan:
        roots = self.roots

        def root_of(path: Path) -> str | None:
            return next((r for r in roots if path.as_posix().startswith(r + "/")), None)

        outside: list[tuple[Path, Path]] = []
        found = discover(self.paths, self.suffixes, include=self.include, exclude=self.exclude, outside=outside)
        # A target an earlier version published through the link (under its own path, with no root):
        # revoked now, since no refresh of the folder would ever revoke it otherwise.
        leaked = [target for _, target in outside
                  if (record := current.get(target.as_posix())) is not None and record.root is None]
        return _FileScan([(path, root_of(path)) for path in found], self.max_bytes,
                         [(link, target, root_of(link)) for link, target in outside], leaked, self.readers)


# --- expert replies captured into a folder --------------------------------------------------------

CAPTURED = "expert-answers"


def place_folder(platform: str, channel: str) -> str:
    """The folder (relative to the source's) of replies said in ``channel`` of ``platform``."""
    return f"{CAPTURED}/{re.sub(r'[^A-Za-z0-9_]', '_', platform)}-{re.sub(r'[^A-Za-z0-9_-]', '_', channel)}"


def place_readers(key: str) -> list[str] | None:
    """The readers of a file at ``key`` (its path relative to the folder) when it is a captured reply of a
    place; None for every other file."""
    parts = PurePosixPath(key).parts
    if len(parts) < 3 or parts[0] != CAPTURED:
        return None
    _, dash, channel = parts[1].partition("-")
    return [f"channel:{channel.lower()}"] if dash and channel else None


def folder_readers(acl: Mapping[str, list[str]], key: str) -> list[str]:
    """Who may read a folder source's file (``key``: its path relative to the folder): a captured reply
    is read by the place it was said in, the rest as ``acl`` says."""
    return place_readers(key) or readers_for(acl, key)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _slug(text: str) -> str:
    words = re.sub(r"[^\w]+", "-", text.casefold(), flags=re.UNICODE).strip("-")
    return words[:60].strip("-") or "answer"


def markdown_of(reply: Captured) -> str:
    """The document a captured reply becomes: the question as its title, the reply, and where it came from."""
    return (f"# {_one_line(reply.question)}\n\n{reply.text.strip()}\n\n---\n\n"
            f"Answered by {_one_line(reply.author)} on {reply.date} "
            f"in {reply.link or reply.thread_key}. Added to the knowledge base by {_one_line(reply.reviewer)}.\n")


class FolderCapture:
    """A Markdown file per captured reply in ``folder``, under the place it was said in."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def write(self, reply: Captured) -> str:
        folder = self.folder / place_folder(reply.platform, reply.channel)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{reply.date}-{_slug(reply.question)}-{reply.id[:8]}.md"
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".capture-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(markdown_of(reply))
            os.replace(tmp, target)  # a refresh never reads half a file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(target)


# --- the kind ---------------------------------------------------------------------------------------

class FolderSettings(SourceEntry):
    #: A local folder (relative to the settings file's folder), or None for a URL source.
    path: str | None = None
    #: Globs relative to ``path``; without ``/`` a glob matches file names at any depth.
    include: Texts = []
    exclude: Texts = []
    #: Folders and URLs: who may read what (a path relative to ``path``, or a URL prefix -> principals:
    #: ``user:<e-mail>``, ``group:<name>``, ``channel:<id>``, ``public``); the longest prefix wins; a
    #: document no prefix covers is public to its space. Confluence records its own permissions.
    acl: Acl = {}


class FolderKind:
    name = "path"
    label = "path (a local folder)"
    settings = FolderSettings
    named_roots = False
    keeps_states = False

    def selected(self, entry: FolderSettings) -> bool:
        return bool(entry.path)

    def roots(self, entry: FolderSettings) -> list[str]:
        return [Path(str(entry.path)).resolve().as_posix()]

    def build(self, entry: FolderSettings, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> ConfiguredSource:
        if permissions_only:  # the settings' acl is all there is to read: nothing is listed
            return AclOnlySource(self.roots(entry),
                                 lambda record: folder_readers(entry.acl, folder_key(record.doc_id, record.root)))
        return FolderSource([str(entry.path)], suffixes=context.extensions, include=entry.include,
                            exclude=entry.exclude, max_file_mb=context.max_file_mb,
                            readers=lambda path, root: folder_readers(entry.acl, folder_key(path, root)))

    def claims(self, entry: FolderSettings, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]:
        root = self.roots(entry)[0]
        inside = [d for d in doc_ids if d.startswith(root + "/")]
        if not inside:
            return set()
        try:
            files = {p.as_posix() for p in discover([str(entry.path)], context.extensions, include=entry.include,
                                                    exclude=entry.exclude)}
        except OSError:  # a folder that cannot be listed may still hold them all
            files = set(inside)
        return {d for d in inside if d in files}

    def capture(self, entry: FolderSettings, context: SourceContext) -> FolderCapture:
        return FolderCapture(str(entry.path))


FOLDER = FolderKind()
