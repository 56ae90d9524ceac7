"""The contract of a kind of source: what a refresh reads (``SourceItem``, ``Scan``, ``Source``) and what
one kind (``SourceKind``: folder, URLs, Confluence, ...) gives the rest of kbbot.

A kind is one module or package under ``pipelines/sources/`` with one line in ``SOURCE_KINDS``
(``pipelines/sources/__init__.py``). It brings:

- ``name``: the key of a ``sources:`` entry that selects it (``path``, ``urls``, ``confluence``);
  ``label`` names it in the settings' complaint when an entry has none or several;
- ``settings``: the pydantic model of its keys in a ``sources:`` entry (a subclass of ``SourceEntry``);
  ``bot.settings.SourceSettings`` is made of every kind's model, so an entry's YAML keys are the kinds'
  keys, one entry of one kind (``selected``);
- ``roots(entry)``: the roots its documents are indexed under, which scope revocation: a document of a
  root that a run no longer lists is revoked. ``named_roots``: the roots are ``<kind>:<source name>``
  (``named_root``), so a document under such a root that no configured source has is an orphan at
  once; otherwise (folders) only once a configured source has completed a run with that root;
- ``build(entry, context, states, permissions_only=...)``: the ``ConfiguredSource`` one run reads
  (``permissions_only``: a source that reads only who may read each indexed document);
  ``keeps_states``: the run's ``updated_states`` (ETags, page versions) are kept and given back to
  the next run's build;
- ``claims(entry, doc_ids, states, context)``: which of ``doc_ids`` (documents of sources no longer
  configured) this configured source still lists, so they are not orphans;
- ``capture(entry, context)``: where "Add to the knowledge base" writes an expert's reply (a
  ``Capture``), or None when kbbot cannot write to this kind.

A kind reads no settings of its own beyond its entry: ``SourceContext`` carries the limits of the
settings file that every kind shares (file types, download bounds, allowed hosts). An error that makes
a whole source unreadable (a listing that fails, a token not set) is a ``SourceError``: the run fails
with its message and every document keeps its version.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from pipelines.records import NOBODY
from pipelines.sections import Section
from pipelines.sources.fetcher import FetchState
from pipelines.store import DocRecord


@dataclass
class SourceItem:
    """One document as a source sees it during a refresh.

    Exactly one of: ``data`` (its bytes), ``not_modified`` (the server answered 304: the current
    version stands), ``error`` (it could not be read: the current version stands, the reason is
    reported), ``gone`` (the source says it no longer exists: it is revoked).
    """

    doc_id: str
    source: str  # as people see it: a path relative to the working directory, or the URL
    root: str | None  # the source root it belongs to; documents of a refreshed root not seen are revoked
    suffix: str = ""  # picks the converter: .md .txt .html .pdf
    data: bytes | None = None
    not_modified: bool = False
    error: str | None = None
    gone: bool = False
    name: str = ""  # a file name for the title fallback
    #: More of the document's meta, kept on each chunk (a Confluence page's ``author``, ``confluence_space``).
    meta: dict[str, str] = field(default_factory=dict)
    #: Who may read it at the source (principals, ``pipelines.filters``; ``public``: everyone of the
    #: space). A source states them for every item with content: None (not established) and ``[]`` (no
    #: one passes every restriction) both mean nobody (``NOBODY``), never public; ``held`` says why.
    readers: list[str] | None = None
    held: str = ""

    @property
    def principals(self) -> list[str]:
        return sorted(set(self.readers)) if self.readers else [NOBODY]

    @property
    def held_back(self) -> str | None:
        """Why nobody may read it (the refresh and ``kbbot status`` count it under this reason); None: someone may."""
        if self.principals != [NOBODY]:
            return None
        if self.held:
            return self.held
        return ("its source did not establish who may read it" if self.readers is None
                else "no one passes every read restriction at its source")


class Scan(Protocol):
    """What one refresh of a source yields: ``total`` items (for progress), then the items."""

    total: int

    def __iter__(self) -> Iterator[SourceItem]: ...


class Source(Protocol):
    """Anything a refresh can read: its roots (the revocation scope) and a scan of its items."""

    @property
    def roots(self) -> list[str]: ...

    def scan(self, current: dict[str, DocRecord], space: str) -> Scan:
        """The items; ``current`` (the store's records) lets a source skip downloads (conditional requests)."""
        ...


class ConfiguredSource:
    """A ``Source`` as a kind builds it for one run of a configured source: besides its items, what the
    run's record needs of it. The defaults are a source's that lists everything it has, keeps no
    validators and holds no connection."""

    #: Validators of what this run read (ETag, page version), kept for the next run (``SourceKind.keeps_states``).
    updated_states: Mapping[str, FetchState] = MappingProxyType({})
    #: Documents its rules (robots.txt) kept this run from reading: counted in the run's record.
    disallowed: Collection[str] = ()

    @property
    def listed_completely(self) -> bool:
        """Whether this run knows every document the source lists: only then may the documents of
        sources no longer configured be revoked, and its roots count as completed."""
        return True

    def run_error(self) -> str | None:
        """Why the run fails although every item was handled (a host whose robots.txt could not be had);
        None: it does not."""
        return None

    def close(self) -> None:
        """Releases its connections once the run is over (done or not)."""


class SourceError(Exception):
    """A source cannot be read as a whole (its listing failed, its token is not set); the message is the
    reason shown to the operator. The run fails with it and every document keeps its version."""


class SourceEntry(Section):
    """The base of a kind's settings model: one entry of ``sources:`` (its other keys are the kinds' and
    ``bot.settings.SourceSettings``', which checks the name)."""

    name: str = ""


@dataclass(frozen=True)
class SourceContext:
    """The settings every kind's build shares (``indexing`` and ``refresh`` of the settings file)."""

    #: File types indexed (``indexing.extensions``) and the largest file converted (MiB).
    extensions: tuple[str, ...] = ()
    max_file_mb: float | None = None
    #: Downloads: seconds per URL in all and to connect, bytes per body, the User-Agent.
    fetch_timeout_s: float = 30
    connect_timeout_s: float = 10
    max_bytes: int = 20_000_000
    user_agent: str = "kbbot"
    #: Hosts allowed although they resolve to a private address (``refresh.allow_hosts``).
    allow_hosts: tuple[str, ...] = ()
    #: URLs fetched at once, most documents and sitemaps one source may list.
    concurrency: int = 4
    max_urls: int = 10000
    max_sitemaps: int = 100


@dataclass(frozen=True)
class Captured:
    """An expert's reply a reviewer added to the knowledge base (``bot.knowledge.loop.expert``)."""

    id: str
    question: str
    text: str
    author: str  # the name shown
    date: str  # YYYY-MM-DD, when it was said
    link: str  # the thread's link ("" when it has none)
    thread_key: str
    reviewer: str
    platform: str  # where it was said: its readers, once indexed, are that place's
    channel: str


class Capture(Protocol):
    """Writes a captured reply into a source (blocking: run it in a thread); returns where it went."""

    def write(self, reply: Captured) -> str: ...


class SourceKind(Protocol):
    """One kind of source; see the module docstring."""

    name: str
    label: str
    settings: type[SourceEntry]
    named_roots: bool
    keeps_states: bool

    def selected(self, entry: Any) -> bool:
        """Whether the ``sources:`` entry is of this kind (its key is set)."""
        ...

    def roots(self, entry: Any) -> list[str]: ...

    def build(self, entry: Any, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> ConfiguredSource: ...

    def claims(self, entry: Any, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]: ...

    def capture(self, entry: Any, context: SourceContext) -> Capture | None: ...


def named_root(kind: str, source: str) -> str:
    """The root of the documents of source ``source`` of a kind with named roots: ``urls:docs``."""
    return f"{kind}:{source}"


class NamedRootSource(ConfiguredSource):
    """A ``ConfiguredSource`` whose documents all sit under one root, ``named_root(KIND, name)``
    (Confluence, SharePoint, Google Drive)."""

    KIND: ClassVar[str]
    name: str

    @property
    def root(self) -> str:
        return named_root(self.KIND, self.name)

    @property
    def roots(self) -> list[str]:
        return [self.root]


@dataclass
class AclOnlyScan:
    items: list[SourceItem]

    @property
    def total(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[SourceItem]:
        return iter(self.items)


class AclOnlySource(ConfiguredSource):
    """A permissions-only refresh of a source whose permissions are its settings' ``acl``: each
    document it has in the store, with the readers the settings give it now, nothing read or fetched.
    ``readers`` answers None for a document whose key it does not know (held back: ``unknown``)."""

    def __init__(self, roots: list[str], readers: Callable[[DocRecord], list[str] | None], unknown: str = ""):
        self._roots = roots
        self._readers = readers
        self._unknown = unknown
        self.permissions_only = True

    @property
    def roots(self) -> list[str]:
        return list(self._roots)

    def scan(self, current: dict[str, DocRecord], space: str) -> AclOnlyScan:
        return AclOnlyScan([SourceItem(doc_id=r.doc_id, source=r.source, root=r.root, not_modified=True,
                                       readers=self._readers(r), held=self._unknown)
                            for r in current.values() if r.root in self._roots])
