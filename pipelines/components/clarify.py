"""Product models: ask which one is meant when the answer depends on it, and keep to the one named."""

from __future__ import annotations

from typing import Any

from haystack import Document, component

from pipelines.text import terms
from pipelines.topics import Topics


@component
class ModelClarifier:
    """``documents`` and ``query`` through, or ``clarify``: the candidate model names.

    A question that names no model is ambiguous when the best relevant chunk comes from a document
    about one model (its title names exactly one) and another relevant chunk comes from a document
    about a different model: the answer would depend on which is meant, so kbbot asks instead of
    guessing or mixing the two. The candidates are those models, then the catalogue's other models
    of the same kinds (a Chinese spec sheet the English question did not retrieve still fits).
    Documents about several models at once (a maintenance schedule for all motors) never trigger it,
    and neither does a request that shares no content word with the model-specific chunks (a poem
    about spring is about no product, however its retrieval came out).

    A question that names models keeps to them: chunks of documents about another single model are
    dropped and those about a named model come first; if nothing is left, ``not_found``.
    """

    def __init__(self, topics: Topics | None = None, enabled: bool = True):
        self.topics = topics or Topics()
        self.enabled = enabled

    def _subject(self, doc: Document) -> str | None:
        named = self.topics.products_in(str((doc.meta or {}).get("title") or ""))
        return named[0].name if len(named) == 1 else None

    def _focus(self, named: set[str], documents: list[Document]) -> list[Document]:
        subjects = [self._subject(d) for d in documents]
        on = [d for d, s in zip(documents, subjects) if s in named]
        general = [d for d, s in zip(documents, subjects) if s is None]
        return on + general

    def _about(self, question: str, documents: list[Document]) -> bool:
        """The question shares a content word (or Chinese two-character word) with a chunk about one model."""
        words = {t for t in terms(question) if len(t) > 1}
        return any(words & set(terms(d.content or "")) for d in documents if self._subject(d))

    def _candidates(self, documents: list[Document]) -> list[str]:
        found = list(dict.fromkeys(s for d in documents if (s := self._subject(d))))
        kinds = {p.kind for p in self.topics.products if p.name in found and p.kind}
        return found + [p.name for p in self.topics.products if p.kind in kinds and p.name not in found]

    @component.output_types(documents=list[Document], query=str, clarify=list[str], not_found=float)
    def run(self, query: str, documents: list[Document], question: str = "") -> dict[str, Any]:
        if not documents:
            return {"documents": documents, "query": query}
        named = {p.name for p in self.topics.products_in(f"{question} {query}")}
        if named:
            focused = self._focus(named, documents)
            return {"documents": focused, "query": query} if focused else {"not_found": 0.0}
        if not self.enabled or self._subject(documents[0]) is None or not self._about(question or query, documents):
            return {"documents": documents, "query": query}
        candidates = self._candidates(documents)
        if len(candidates) < 2 or len({self._subject(d) for d in documents} - {None}) < 2:
            return {"documents": documents, "query": query}
        return {"clarify": candidates}

    @component.output_types(documents=list[Document], query=str, clarify=list[str], not_found=float)
    async def run_async(self, query: str, documents: list[Document], question: str = "") -> dict[str, Any]:
        """``run`` on the event loop (pure CPU, well under a millisecond: less than a thread hop)."""
        return self.run(query, documents, question)
