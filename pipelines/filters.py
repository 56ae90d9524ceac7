"""Haystack filters the retrievers and the answerer build: a conversation's knowledge spaces, one
language, and several combined."""

from __future__ import annotations

from typing import Any


def space_filter(spaces: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The Haystack filter that keeps retrieval inside the spaces a conversation may see. No spaces is
    an error, never "no filter": a configuration mistake must not open every space."""
    if isinstance(spaces, str) or not spaces or not all(isinstance(s, str) and s for s in spaces):
        raise ValueError(f"knowledge spaces must be a non-empty list of names, got {spaces!r}")
    return {"field": "meta.space", "operator": "in", "value": list(spaces)}


def and_filters(*filters: dict[str, Any] | None) -> dict[str, Any] | None:
    present = [f for f in filters if f]
    if not present:
        return None
    return present[0] if len(present) == 1 else {"operator": "AND", "conditions": present}


def language_filter(language: str) -> dict[str, Any]:
    return {"field": "meta.language", "operator": "==", "value": language}
