"""The in-memory store's hybrid retriever, the current-version filter, and which retriever a store gets.

``InMemoryHybridRetriever`` asks the in-memory store for BM25 (on the analysed terms of
``pipelines.analysis``) and for vectors once per language, and fuses them (``pipelines.fusion``).
``retriever_for`` picks the retriever of a store: stores do not build retrievers, so neither store
module imports a retriever. ``CurrentKnowledge`` drops chunks of versions no longer current.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from haystack import Document, component
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever

from pipelines.components.embedders import QueryVector
from pipelines.filters import and_filters, language_filter
from pipelines.fusion import (
    DEFAULT_ALPHA,
    FUSIONS,
    LANGUAGES,
    MODES,
    DenseCandidates,
    as_list,
    check_alpha,
    check_choice,
    fuse,
    merged_dense,
    retrieved,
)
from pipelines.store import InMemoryKnowledgeStore, KnowledgeStore

__all__ = ["DEFAULT_ALPHA", "CurrentKnowledge", "DenseCandidates", "InMemoryHybridRetriever", "retriever_for"]


def retriever_for(store: KnowledgeStore, *, mode: str, candidates: int, fusion: str | None = None,
                  alpha: float | str | None = None) -> Any:
    """The retriever of ``store``: a Haystack component (query, query_embedding, filters, top_k) ->
    documents, dense_documents. ``fusion`` and ``alpha`` None: the store's own (Weaviate's settings)
    or the defaults."""
    if isinstance(store, InMemoryKnowledgeStore):
        return InMemoryHybridRetriever(store, mode=mode, candidates=candidates, fusion=fusion or "relative_score",
                                       alpha=DEFAULT_ALPHA if alpha is None else alpha)
    from pipelines.weaviate_store.retriever import WeaviateHybridRetriever  # here: the client is heavy to import

    return WeaviateHybridRetriever.of(store, mode=mode, candidates=candidates, fusion=fusion, alpha=alpha)


@component
class InMemoryHybridRetriever:
    """BM25 and per-language vector retrieval over the in-memory store, fused.

    ``documents`` are in final order; ``dense_documents`` are the vector candidates with their
    raw cosine as ``score``.
    """

    def __init__(self, store: KnowledgeStore, mode: str = "hybrid", candidates: int = 30,
                 fusion: str = "relative_score", alpha: float | str = DEFAULT_ALPHA):
        check_choice("retrieval mode", mode, MODES)
        check_choice("fusion", fusion, FUSIONS)
        self.mode = mode
        self.fusion = fusion
        self.alpha = check_alpha(alpha)
        self.candidates = candidates
        self.store = store
        self.dense = InMemoryEmbeddingRetriever(document_store=store.document_store, top_k=candidates)
        self._languages: tuple[int, list[str]] | None = None

    def languages(self) -> list[str]:
        """Languages that have chunks, re-checked when the knowledge version moves: asking for a
        language with no chunks is wasted work (and Haystack warns about it on every query)."""
        version = self.store.knowledge_version
        if self._languages is None or self._languages[0] != version:
            present = [lang for lang in LANGUAGES
                       if self.store.document_store.count_documents_by_filter(language_filter(lang))]
            self._languages = (version, present)
        return self._languages[1]

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    def run(self, query: str, query_embedding: list[float] | QueryVector | None = None,
            filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        k = top_k or self.candidates
        query_embedding = as_list(query_embedding)
        keyword: list[Document] = []
        dense = DenseCandidates()
        if self.mode in ("hybrid", "bm25") and query.strip():
            keyword = self.store.keyword_search(query, filters=filters, top_k=k)
        if self.mode in ("hybrid", "vector"):
            if query_embedding is None:
                raise ValueError(f"{self.mode} retrieval needs a query embedding")
            per_language = {
                lang: self.dense.run(query_embedding=query_embedding, filters=and_filters(filters, language_filter(lang)),
                                     top_k=k)["documents"]
                for lang in self.languages()
            }
            dense = merged_dense(per_language)
        return retrieved(fuse(keyword, list(dense), self.fusion, self.alpha)[:k], dense)


@component
class CurrentKnowledge:
    """Drops chunks whose document version is no longer the current one (or was revoked)."""

    def __init__(self, store: KnowledgeStore):
        self.store = store

    def _current(self, documents: Iterable[Document]) -> list[Document]:
        records = self.store.records()
        return [
            d for d in documents
            if (rec := records.get(d.meta.get("doc_id"))) is not None and rec.version == d.meta.get("version")
        ]

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    def run(self, documents: list[Document], dense_documents: DenseCandidates | None = None) -> dict[str, Any]:
        return {"documents": self._current(documents),
                "dense_documents": DenseCandidates(self._current(dense_documents or ()))}
