"""Asks which product model is meant when the answer depends on it and several fit."""

from __future__ import annotations

from typing import Any

from haystack import Document, component

from pipelines.topics import Topics


@component
class ModelClarifier:
    """``documents`` and ``query`` through, or ``clarify``: the candidate model names.

    A question that names no model is ambiguous when the best relevant chunk comes from a document
    about one model (its title names exactly one) and another of the top ``window`` relevant chunks
    comes from a document about a different model: the answer would depend on which is meant, so
    kbbot asks instead of guessing or mixing the two. Documents about several models at once (a
    maintenance schedule for all motors) never trigger it.
    """

    def __init__(self, topics: Topics | None = None, window: int = 4, enabled: bool = True):
        self.topics = topics or Topics()
        self.window = window
        self.enabled = enabled

    def _subject(self, doc: Document) -> str | None:
        named = self.topics.products_in(str((doc.meta or {}).get("title") or ""))
        return named[0].name if len(named) == 1 else None

    @component.output_types(documents=list[Document], query=str, clarify=list[str])
    def run(self, query: str, documents: list[Document], question: str = "") -> dict[str, Any]:
        if not self.enabled or not documents or self.topics.products_in(f"{question} {query}"):
            return {"documents": documents, "query": query}
        if self._subject(documents[0]) is None:
            return {"documents": documents, "query": query}
        candidates = list(dict.fromkeys(s for d in documents[: self.window] if (s := self._subject(d))))
        if len(candidates) < 2:
            return {"documents": documents, "query": query}
        return {"clarify": candidates}
