"""Permissions that a source's settings give (``acl:``: a path or URL prefix -> principals), for
sources that carry none of their own (folders, web pages); and the principals' one spelling.

A principal is ``public`` (everyone who may search the knowledge space), ``user:<e-mail>``,
``group:<name>`` or ``channel:<platform channel id>``; a bare e-mail address means ``user:`` it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from pipelines.indexing import SourceItem
from pipelines.records import PUBLIC, DocRecord

KINDS = ("user:", "group:", "channel:")


def principal(text: str) -> str:
    """``text`` as a principal (trimmed, lower case); ``ValueError`` says what a principal looks like."""
    value = str(text).strip().lower()
    if value == PUBLIC:
        return value
    if not value.startswith(KINDS) and "@" in value and ":" not in value:
        value = "user:" + value
    if not value.startswith(KINDS) or not value.split(":", 1)[1].strip():
        raise ValueError(f"{text!r} is not a principal: use public, user:<e-mail>, group:<name> or "
                         "channel:<channel id> (a bare e-mail address is a user)")
    return value


def readers_for(acl: Mapping[str, list[str]], key: str) -> list[str] | None:
    """The principals of the longest prefix of ``acl`` that ``key`` (a path relative to its folder, or
    a URL) starts with; None when none does (public to its space). A folder prefix matches whole
    names only: ``hr`` covers ``hr/pay.md``, not ``hrm.md``."""
    covering = [prefix for prefix in acl if _covers(prefix, key)]
    best = max(covering, key=len) if covering else None
    return sorted({principal(p) for p in acl[best]}) if best is not None else None


def _covers(prefix: str, key: str) -> bool:
    bare = prefix.rstrip("/")
    if "://" in bare:  # a URL prefix: as written
        return key.startswith(bare)
    return key == bare or key.startswith(bare + "/") or not bare


def folder_key(path: str, root: str | None) -> str:
    """A file's key in a folder source's ``acl``: its path relative to the folder (its name without one)."""
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return PurePosixPath(path).name


@dataclass
class AclOnlyScan:
    items: list[SourceItem]

    @property
    def total(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[SourceItem]:
        return iter(self.items)


class AclOnlySource:
    """A permissions-only refresh of a source whose permissions are its settings' ``acl``: each
    document it has in the store, with the readers the settings give it now, nothing read or fetched."""

    def __init__(self, roots: list[str], readers: Callable[[DocRecord], list[str] | None]):
        self._roots = roots
        self._readers = readers
        self.permissions_only = True

    @property
    def roots(self) -> list[str]:
        return list(self._roots)

    def scan(self, current: dict[str, DocRecord], space: str) -> AclOnlyScan:
        return AclOnlyScan([SourceItem(doc_id=r.doc_id, source=r.source, root=r.root, not_modified=True,
                                       readers=self._readers(r))
                            for r in current.values() if r.root in self._roots])
