"""Permissions that a source's settings give (``acl:``: a path or URL prefix -> principals), for
sources that carry none of their own (folders, web pages); and the principals' one spelling.

A principal is ``public`` (everyone who may search the knowledge space), ``user:<e-mail>``,
``group:<name>``, ``channel:<platform channel id>``, or one the operator names for Confluence
(``space:<key>``: the readers of a space whose permissions kbbot cannot see; ``confluence:everyone``:
every Confluence account) or SharePoint (``sharepoint:organization``: whoever an organisation-wide sharing
link reaches) and grants in ``permissions.principals``; ``domain:<domain>`` (everyone of a
Google Workspace domain: an asker holds it through an e-mail address of that domain); a bare e-mail
address means ``user:`` it. ``nobody`` (a document held back) is none: no setting can grant it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import unquote, urlsplit

from pydantic import AfterValidator

from pipelines.records import PUBLIC

KINDS = ("user:", "group:", "channel:", "space:", "confluence:", "sharepoint:", "domain:")


def principal(text: str) -> str:
    """``text`` as a principal (trimmed, lower case); ``ValueError`` says what a principal looks like."""
    value = str(text).strip().lower()
    if value == PUBLIC:
        return value
    if not value.startswith(KINDS) and "@" in value and ":" not in value:
        value = "user:" + value
    if not value.startswith(KINDS) or not value.split(":", 1)[1].strip():
        raise ValueError(f"{text!r} is not a principal: use public, user:<e-mail>, group:<name>, "
                         "channel:<channel id>, space:<Confluence space key>, confluence:everyone, "
                         "sharepoint:organization or domain:<e-mail domain> (a bare e-mail address is a user)")
    return value


def _checked_acl(acl: dict[str, list[str]]) -> dict[str, list[str]]:
    checked = {}
    for prefix, principals in acl.items():
        if not str(prefix).strip():
            raise ValueError("has an empty prefix; use a path (hr/) or a URL prefix")
        if isinstance(principals, str) or not principals:
            raise ValueError(f"[{prefix!r}] must be a non-empty list of principals")
        try:
            checked[str(prefix).strip()] = [principal(p) for p in principals]
        except ValueError as exc:
            raise ValueError(f"[{prefix!r}]: {exc}") from None
    return checked


#: A source entry's ``acl:`` setting (folders, URLs): prefix -> principals, each spelt as ``principal`` does.
Acl = Annotated[dict[str, list[str]], AfterValidator(_checked_acl)]


def readers_for(acl: Mapping[str, list[str]], key: str) -> list[str]:
    """The principals of the most specific prefix of ``acl`` that ``key`` (a path relative to its
    folder, or a URL) falls under; ``[public]`` when none does: the operator's ``acl`` leaves the rest
    public to its space. A prefix matches whole names only: ``hr`` covers ``hr/pay.md``, not
    ``hrm.md``; a URL prefix is compared as ``url_key`` spells it."""
    covering = [prefix for prefix in acl if _covers(prefix, key)]
    if not covering:
        return [PUBLIC]
    best = max(covering, key=_specificity)
    return sorted({principal(p) for p in acl[best]})


def _covers(prefix: str, key: str) -> bool:
    if "://" in prefix:
        scheme, host, port, path, query = url_key(prefix)
        if "://" not in key:
            return False
        k_scheme, k_host, k_port, k_path, k_query = url_key(key)
        if (scheme, host, port) != (k_scheme, k_host, k_port):
            return False
        if query:  # a prefix naming a query: that page, queries starting with it
            return k_path == path and k_query.startswith(query)
        path = _without_trailing(path)
        return k_path[:len(path)] == path
    bare = prefix.rstrip("/")
    return key == bare or key.startswith(bare + "/") or not bare


def _without_trailing(segments: tuple[str, ...]) -> tuple[str, ...]:
    while segments and not segments[-1]:
        segments = segments[:-1]
    return segments


def _specificity(prefix: str) -> tuple[int, int]:
    if "://" in prefix:
        *_, path, query = url_key(prefix)
        return len(_without_trailing(path)), len(query)
    return len(prefix.rstrip("/")), 0


DEFAULT_PORTS = {"http": 80, "https": 443}


def url_key(url: str) -> tuple[str, str, int | None, tuple[str, ...], str]:
    """``url`` as ``acl`` prefixes are matched: scheme and host in lower case (no trailing dot), the
    port (none when it is the scheme's default), the path as segments with percent-encoding decoded
    and dot segments (also encoded ones, ``%2e%2e``) resolved, and the query. Spellings a server
    takes for one page compare equal, so a listed or redirected URL cannot step around a prefix."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port == DEFAULT_PORTS.get(scheme):
        port = None
    segments: list[str] = []
    for raw in parts.path.split("/")[1:]:
        segment = unquote(raw)
        if segment == "..":
            if segments:
                segments.pop()
        elif segment != ".":
            segments.append(segment)
    return scheme, host, port, tuple(segments), parts.query


def folder_key(path: str, root: str | None) -> str:
    """A file's key in a folder source's ``acl``: its path relative to the folder (its name without one)."""
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return PurePosixPath(path).name
