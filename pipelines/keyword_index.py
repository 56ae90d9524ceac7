"""BM25 over the in-memory store's chunks, on the terms of ``pipelines.analysis``.

Haystack's in-memory BM25 tokenizes with one regular expression and cannot stem, so the embedded
store scores with ``bm25s`` (sparse matrices, numpy only) on the analysed ``search_text`` of each
chunk: the same terms, ``k1`` and ``b`` as the Weaviate collection. The index is rebuilt when
the store's contents change; each chunk's terms are kept by chunk id (a chunk id names one
immutable version of one chunk), so a rebuild after a refresh analyses only the new chunks.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import bm25s
import numpy as np
from haystack import Document

from pipelines.analysis import BM25_B, BM25_K1, analyze, chunk_search_text
from pipelines.filters import compile_filter

# bm25s logs every index build at DEBUG through a handler of its own; a rebuild is routine here.
logging.getLogger("bm25s").setLevel(logging.WARNING)


class KeywordIndex:
    """A BM25 index of a document store's chunks, rebuilt lazily when ``generation`` moves."""

    def __init__(self, k1: float = BM25_K1, b: float = BM25_B):
        self.k1 = k1
        self.b = b
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._documents: list[Document] = []
        self._bm25: bm25s.BM25 | None = None
        self._terms: dict[str, list[str]] = {}
        # Which chunks a filter admits, per filter (a conversation's spaces): matching every chunk
        # against a filter on every question would cost more than the BM25 scoring itself.
        self._masks: dict[str, np.ndarray] = {}

    def _rebuild(self, documents: list[Document]) -> None:
        terms = {d.id: self._terms.get(d.id) or chunk_search_text(d).split() for d in documents}
        self._terms = terms
        self._documents = documents
        self._masks = {}
        self._bm25 = None
        if documents:
            bm25 = bm25s.BM25(k1=self.k1, b=self.b)
            bm25.index([terms[d.id] for d in documents], show_progress=False)
            self._bm25 = bm25

    def _mask(self, filters: dict[str, Any]) -> np.ndarray:
        key = json.dumps(filters, sort_keys=True, default=str)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= 64:
                self._masks.clear()
            match = compile_filter(filters)  # "in" on readers (a list) is "contains any", as in Weaviate
            mask = np.fromiter((match(d) for d in self._documents), dtype=bool,
                               count=len(self._documents))
            self._masks[key] = mask
        return mask

    def search(self, documents: Any, generation: int, query: str, *, filters: dict[str, Any] | None = None,
               top_k: int = 30) -> list[Document]:
        """The ``top_k`` best chunks for ``query`` with their BM25 score, best first.

        ``documents`` is called (no argument) for every chunk when the index must be rebuilt.
        """
        with self._lock:
            if generation != self._generation:
                self._rebuild(documents())
                self._generation = generation
            bm25, docs = self._bm25, self._documents
            mask = self._mask(filters) if filters else None
        if bm25 is None:
            return []
        terms = [t for t in analyze(query) if t in bm25.vocab_dict]
        if not terms:
            return []
        scores = bm25.get_scores(terms)
        if mask is not None:
            scores = scores * mask
        best = np.argsort(-scores, kind="stable")[:top_k]
        # No embedding: nothing after retrieval reads a chunk's vector, and Haystack deep-copies every
        # component's inputs, so 30 candidates' 384 floats each were most of a turn's CPU (bench.turn).
        return [Document(id=docs[i].id, content=docs[i].content, meta=docs[i].meta, score=float(scores[i]))
                for i in best if scores[i] > 0]
