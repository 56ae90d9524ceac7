"""What the permission filter costs retrieval: ``python -m bench.retrieval --permissions``.

Side by side in one run, on each store (the embedded one, and Weaviate when ``WEAVIATE_URL`` is
set): our hybrid retriever over ``chunks`` chunks with the filter a turn sends without permissions
(its knowledge spaces) against the same query with the audience's filter added: ``readers`` holding
any of ``principals`` principals (``public`` and the audience's own; ``pipelines.filters.readers_filter``).
Queries alternate between the two, and which goes first alternates too.

The chunks are synthetic, made the same way every run (seeded): texts of 40 words drawn from 2,000,
384-dimensional unit vectors, 70 % public, the rest readable by 1-3 principals. What is compared is
one filter against another on the same data, so the texts' meaning does not matter; the vectors are
random, so the vector side's work is the HNSW search's worst case, not its best.

Two corpora: ``named`` 5,000 (restrictions name principals from the whole pool of 5,000, so most of
the audience's 1,000 are named by some document: the worst case, ~700 sent) and ``named`` 200
(restrictions name 200 principals, as restrictions by a few groups do: ~40 sent). A turn sends only
the principals some document names (``bot.permissions.Audience.filter``, ``KnownPrincipals``), and a
store's cost grows with the values sent.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from haystack import Document
from haystack.document_stores.types import DuplicatePolicy

from bot.permissions import Audience
from pipelines.analysis import chunk_search_text
from pipelines.components.retrievers import retriever_for
from pipelines.filters import PUBLIC, and_filters, space_filter
from pipelines.records import chunk_id
from pipelines.store import InMemoryKnowledgeStore

DIMENSIONS = 384
VOCABULARY = 2000
PRINCIPAL_POOL = 5000
PUBLIC_SHARE = 0.7


def _principal(i: int) -> str:
    return f"group:g{i}" if i % 10 == 0 else f"user:u{i}@example.com"


def synthetic_chunks(n: int, seed: int = 30, named: int = PRINCIPAL_POOL) -> list[Document]:
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed).standard_normal((n, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = []
    for i in range(n):
        doc_id = f"bench:perm:{i // 4}"
        readers = [PUBLIC] if rng.random() < PUBLIC_SHARE else sorted(
            {_principal(rng.randrange(named)) for _ in range(rng.randint(1, 3))})
        text = " ".join(f"w{rng.randrange(VOCABULARY)}" for _ in range(40))
        meta = {"doc_id": doc_id, "version": 1, "position": i % 4, "title": doc_id, "source": doc_id,
                "space": "default", "language": "en", "readers": readers}
        chunks.append(Document(id=chunk_id(doc_id, 1, i % 4), content=text, meta=meta, embedding=vectors[i].tolist()))
    return chunks


def queries(n: int, seed: int = 31) -> list[tuple[str, list[float]]]:
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed).standard_normal((n, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [(" ".join(f"w{rng.randrange(VOCABULARY)}" for _ in range(6)), vectors[i].tolist()) for i in range(n)]


def audience_filter(principals: int, known: frozenset[str] | None = None) -> dict[str, Any]:
    """The spaces and a private audience of ``principals`` principals (``public`` among them), built as
    a turn builds it (``Audience.filter``): without the principals no document names, given ``known``."""
    own = [_principal(i) for i in range(0, PRINCIPAL_POOL, max(1, PRINCIPAL_POOL // (principals - 1)))][: principals - 1]
    audience = Audience(private=True, everyone=frozenset({PUBLIC, *own}), asker=frozenset(own))
    return and_filters(space_filter(["default"]), audience.filter(known))


def memory_store(chunks: list[Document], directory: Path) -> InMemoryKnowledgeStore:
    store = InMemoryKnowledgeStore(directory)
    store.document_store.write_documents(chunks, policy=DuplicatePolicy.OVERWRITE)
    store._generation += 1  # written straight to the document store: the keyword index is rebuilt
    return store


def weaviate_store(url: str, chunks: list[Document], name: str = "BenchPermissions") -> Any:
    """The chunks in a collection of their own (reused when it holds as many)."""
    from pipelines.weaviate_store import WeaviateKnowledgeStore

    store = WeaviateKnowledgeStore(url, collection=name, allow_outdated=True)
    if store.outdated is None and store.count_chunks() == len(chunks):
        return store
    store.drop()
    store.close()
    store = WeaviateKnowledgeStore(url, collection=name)
    copies = [Document(id=c.id, content=c.content, meta={**c.meta, "search_text": chunk_search_text(c)},
                       embedding=c.embedding) for c in chunks]
    for start in range(0, len(copies), 500):
        store.document_store.write_documents(copies[start : start + 500], policy=DuplicatePolicy.OVERWRITE)
    return store


def side_by_side(store: Any, asked: list[tuple[str, list[float]]], with_filter: dict[str, Any],
                 without: dict[str, Any], rounds: int = 2) -> dict[str, Any]:
    retriever = retriever_for(store, mode="hybrid", candidates=30)
    for text, vector in asked[:3]:  # warm both (keyword masks, connections)
        retriever.run(query=text, query_embedding=vector, filters=without)
        retriever.run(query=text, query_embedding=vector, filters=with_filter)
    plain_ms: list[float] = []
    filtered_ms: list[float] = []
    kept: list[int] = []
    for r in range(rounds):
        for i, (text, vector) in enumerate(asked):
            order = [(without, plain_ms), (with_filter, filtered_ms)]
            if (i + r) % 2:
                order.reverse()
            for filters, out in order:
                started = time.perf_counter()
                found = retriever.run(query=text, query_embedding=vector, filters=filters)["documents"]
                out.append((time.perf_counter() - started) * 1000)
                if filters is with_filter:
                    kept.append(len(found))
    paired = [f / p for f, p in zip(filtered_ms, plain_ms, strict=True) if p > 0]
    p50 = statistics.median
    return {"without_p50_ms": round(p50(plain_ms), 2), "with_p50_ms": round(p50(filtered_ms), 2),
            "ratio_p50": round(p50(filtered_ms) / p50(plain_ms), 3), "paired_ratio_median": round(p50(paired), 3),
            "with_p95_ms": round(float(np.percentile(filtered_ms, 95)), 2),
            "without_p95_ms": round(float(np.percentile(plain_ms, 95)), 2),
            "samples": len(plain_ms), "results_min": min(kept) if kept else 0}


def run(url: str | None, *, chunks: int = 10_000, principals: int = 1000, n_queries: int = 50,
        named: tuple[int, ...] = (PRINCIPAL_POOL, 200)) -> list[dict[str, Any]]:
    rows = []
    for pool in named:
        rows += run_one(url, chunks=chunks, principals=principals, n_queries=n_queries, named=pool)
    return rows


def run_one(url: str | None, *, chunks: int, principals: int, n_queries: int, named: int) -> list[dict[str, Any]]:
    data = synthetic_chunks(chunks, named=named)
    asked = queries(n_queries)
    # The principals the documents name, as KnownPrincipals reads them from the store's records.
    known = frozenset(p for c in data for p in c.meta["readers"])
    with_filter, without = audience_filter(principals, known), space_filter(["default"])
    sent = sum(len(c["value"]) for c in with_filter["conditions"][1:])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        memory = memory_store(data, Path(scratch))
        rows.append({"backend": "memory", "chunks": memory.count_chunks(), "principals": principals, "named": named,
                     "sent": sent,
                     **side_by_side(memory, asked, with_filter, without)})
    if url:
        weaviate = weaviate_store(url, data, f"BenchPermissions{named}")
        try:
            rows.append({"backend": "weaviate", "chunks": weaviate.count_chunks(), "principals": principals,
                         "named": named, "sent": sent,
                         **side_by_side(weaviate, asked, with_filter, without)})
        finally:
            weaviate.close()
    return rows
