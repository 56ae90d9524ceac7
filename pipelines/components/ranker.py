"""Rankers that run without a model download.

No cross-encoder ships offline, so the default ranker works on what retrieval already knows:
it orders the fused candidates, attaches each chunk's dense similarity (the relevance gate
reads it), and caps chunks per document so one long manual cannot fill the whole context.
The embedder's same-language bias is corrected upstream, where vectors are retrieved per
language and calibrated (see ``pipelines.components.retrievers``). ``HttpReranker`` calls a text-embeddings-
inference style ``/rerank`` endpoint for deployments that run a real cross-encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx
from haystack import Document, component

from pipelines.components.retrievers import DenseCandidates


def cap_per_document(documents: list[Document], max_per_doc: int, top_k: int) -> list[Document]:
    """The best ``top_k`` chunks with at most ``max_per_doc`` from one document, order kept."""
    counts: dict[str, int] = {}
    kept: list[Document] = []
    for doc in documents:
        key = (doc.meta or {}).get("doc_id", doc.id)
        if counts.get(key, 0) >= max_per_doc:
            continue
        counts[key] = counts.get(key, 0) + 1
        kept.append(doc)
        if len(kept) >= top_k:
            break
    return kept


def reserve_languages(ranked: list[Document], dense: Sequence[Document] | None, per_language: int,
                      max_per_doc: int) -> list[Document]:
    """Make sure each language's best vector candidates are among ``ranked``.

    The multilingual embedder scores same-language near-misses above the right passage in the
    other language; giving each language ``per_language`` slots (the notes' language-balanced
    top-k) keeps a Chinese question's English answer, and vice versa, in front of the model.
    The reserved chunks replace the lowest-ranked chunks of the over-represented language.
    """
    if not dense or per_language <= 0:
        return ranked
    out = list(ranked)
    ids = {d.id for d in out}
    for language in sorted({(d.meta or {}).get("language") for d in dense} - {None}):
        have = sum(1 for d in out if d.meta.get("language") == language)
        wanted = [d for d in dense if d.meta.get("language") == language and d.id not in ids]
        for candidate in wanted[: max(0, per_language - have)]:
            per_doc = sum(1 for d in out if d.meta.get("doc_id") == candidate.meta.get("doc_id"))
            victims = [i for i, d in enumerate(out) if d.meta.get("language") != language]
            if per_doc >= max_per_doc or not victims:
                continue
            victim = victims[-1]
            if sum(1 for d in out if d.meta.get("language") == out[victim].meta.get("language")) <= per_language:
                continue
            ids.discard(out[victim].id)
            out[victim] = candidate
            ids.add(candidate.id)
    return out


def with_similarity(documents: list[Document], dense: Sequence[Document] | None) -> list[Document]:
    """Copies of ``documents`` with ``meta.similarity``: the chunk's cosine to the question."""
    by_id = {d.id: d.score for d in dense or []}
    return [replace(d, meta={**d.meta, "similarity": by_id.get(d.id, d.meta.get("similarity"))}) for d in documents]


@component
class DiversityRanker:
    """Keeps the fused order, caps chunks per document, reserves slots per language, and
    annotates dense similarity."""

    def __init__(self, top_k: int = 8, max_chunks_per_doc: int = 2, per_language: int = 2):
        self.top_k = top_k
        self.max_chunks_per_doc = max_chunks_per_doc
        self.per_language = per_language

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], dense_documents: DenseCandidates | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        """:param query: unused here, kept so rankers are interchangeable."""
        del query
        ranked = cap_per_document(documents, self.max_chunks_per_doc, top_k or self.top_k)
        ranked = reserve_languages(ranked, dense_documents, self.per_language, self.max_chunks_per_doc)
        return {"documents": with_similarity(ranked, dense_documents)}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], dense_documents: DenseCandidates | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        """``run`` on the event loop: a few list passes cost less than the hop to a worker thread
        that Haystack makes for a component without ``run_async``."""
        return self.run(query, documents, dense_documents, top_k)


@component
class HttpReranker:
    """Reorders candidates with a ``POST {url}/rerank`` cross-encoder (TEI's API shape)."""

    def __init__(self, url: str, top_k: int = 8, max_chunks_per_doc: int = 2, timeout_s: float = 10):
        self.url = url.rstrip("/")
        self.top_k = top_k
        self.max_chunks_per_doc = max_chunks_per_doc
        self.timeout_s = timeout_s

    def _body(self, query: str, documents: list[Document]) -> dict[str, Any]:
        return {"query": query, "texts": [d.content or "" for d in documents], "truncate": True}

    def _ranked(self, documents: list[Document], scores: list[dict[str, Any]], dense: Sequence[Document] | None,
                top_k: int | None) -> dict[str, Any]:
        order = sorted(scores, key=lambda s: -float(s["score"]))
        reordered = [replace(documents[int(s["index"])], score=float(s["score"])) for s in order]
        ranked = cap_per_document(reordered, self.max_chunks_per_doc, top_k or self.top_k)
        return {"documents": with_similarity(ranked, dense)}

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], dense_documents: DenseCandidates | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        if not documents:
            return {"documents": []}
        response = httpx.post(f"{self.url}/rerank", json=self._body(query, documents), timeout=self.timeout_s)
        response.raise_for_status()
        return self._ranked(documents, response.json(), dense_documents, top_k)

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], dense_documents: DenseCandidates | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        if not documents:
            return {"documents": []}
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            response = await client.post(f"{self.url}/rerank", json=self._body(query, documents))
        response.raise_for_status()
        return self._ranked(documents, response.json(), dense_documents, top_k)
