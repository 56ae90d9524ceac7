"""Haystack filters the retrievers and the answerer build: a conversation's knowledge spaces, who may
read a chunk (``readers``), one language, and several combined; and ``compile_filter``, which the
embedded store matches them with (list-valued fields included, as Weaviate's ``ContainsAny`` does)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from haystack import Document
from haystack.utils.filters import document_matches_filter

from pipelines.records import PUBLIC as PUBLIC

READERS_FIELD = "meta.readers"


def space_filter(spaces: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The Haystack filter that keeps retrieval inside the spaces a conversation may see. No spaces is
    an error, never "no filter": a configuration mistake must not open every space."""
    if isinstance(spaces, str) or not spaces or not all(isinstance(s, str) and s for s in spaces):
        raise ValueError(f"knowledge spaces must be a non-empty list of names, got {spaces!r}")
    return {"field": "meta.space", "operator": "in", "value": list(spaces)}


def readers_filter(everyone: Collection[str], each: Iterable[Collection[str]] = ()) -> dict[str, Any]:
    """Chunks an audience may read: those whose ``readers`` hold one of ``everyone`` (principals that
    admit the whole audience: ``public``, the channel), or else one principal of every set of ``each``
    (one set per member of the audience: that member's own principals).

    ``in`` on the list-valued ``readers`` is "contains any": Weaviate's ``ContainsAny`` on a ``text[]``
    property, ``compile_filter`` in the embedded store. A chunk with no readers matches nothing.
    """
    if isinstance(everyone, str) or not everyone:
        raise ValueError(f"an audience needs at least one principal, got {everyone!r}")
    anyone = {"field": READERS_FIELD, "operator": "in", "value": sorted(everyone)}
    members: list[dict[str, Any]] = []
    seen: set[frozenset[str]] = set()
    for principals in each:
        key = frozenset(principals)
        if key in seen:
            continue
        seen.add(key)
        if not key:  # a member who may read nothing but what everyone may: the whole audience is limited to that
            return anyone
        members.append({"field": READERS_FIELD, "operator": "in", "value": sorted(key)})
    if not members:
        return anyone
    together = members[0] if len(members) == 1 else {"operator": "AND", "conditions": members}
    return {"operator": "OR", "conditions": [anyone, together]}


def and_filters(*filters: dict[str, Any] | None) -> dict[str, Any] | None:
    present = [f for f in filters if f]
    if not present:
        return None
    return present[0] if len(present) == 1 else {"operator": "AND", "conditions": present}


def language_filter(language: str) -> dict[str, Any]:
    return {"field": "meta.language", "operator": "==", "value": language}


Predicate = Callable[[Document], bool]


def compile_filter(filters: dict[str, Any] | None) -> Predicate:
    """A Haystack filter as a predicate, with the value sets built once per query, not once per chunk.

    ``in`` on a list-valued field is true when the lists share a value (as Weaviate converts ``in`` to
    ``ContainsAny``); Haystack's own matcher compares the whole list and would never match. Other
    operators are Haystack's (``document_matches_filter``).
    """
    if not filters:
        return lambda _document: True
    if "field" not in filters:
        parts = [compile_filter(c) for c in filters.get("conditions") or []]
        operator = filters.get("operator")
        if operator == "AND":
            return lambda d: all(p(d) for p in parts)
        if operator == "OR":
            return lambda d: any(p(d) for p in parts)
        if operator == "NOT":
            return lambda d: not all(p(d) for p in parts)
        raise ValueError(f"unknown logical operator {operator!r} in filter {filters!r}")
    field, operator, value = filters["field"], filters.get("operator"), filters.get("value")
    if operator == "in" and field.startswith("meta.") and field.count(".") == 1 and isinstance(value, list):
        key = field[5:]
        wanted = frozenset(v for v in value if isinstance(v, str | int | float | bool))

        def contains(document: Document) -> bool:
            found = (document.meta or {}).get(key)
            if isinstance(found, list):
                return not wanted.isdisjoint(found)
            try:
                return found in wanted
            except TypeError:  # an unhashable value: Haystack's own comparison
                return document_matches_filter(filters, document)
        return contains
    return lambda d: document_matches_filter(filters, d)
