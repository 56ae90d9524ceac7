"""Retrieval: quality and latency on the in-memory store and on Weaviate, our Weaviate retriever
against a bare weaviate-client hybrid query of the same collection, and latency at 50,000 chunks.

    uv run python -m bench.retrieval [--dataset ../shared/eval/clapnq] [--scale 50000] [--queries 100] [--json]

Quality (hit@1, hit@5, MRR@10) and latency (p50/p95, query embedding included) come from the
real retrieval pipeline (embed -> retrieve -> current -> rank) through ``pipelines.evaluation``.
The corpus is embedded once into the embedded store (cached under ``<data_dir>/eval/<name>``,
shared with ``kbbot eval``); Weaviate gets the same chunks and vectors, so both backends rank
identical data. Weaviate parts run when ``WEAVIATE_URL`` is set (``make services``).

Overhead: with the query vectors computed beforehand, the p50 of our ``WeaviateHybridRetriever``
(one hybrid query plus one near-vector query per language, sent together) against one bare
``collection.query.hybrid`` with the same alpha and fusion, in alternation, same collection.

At ``--scale`` chunks the corpus is repeated with varied ids (same texts and vectors), written
straight to the document stores; only latency is measured there (copies make hit rates moot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from haystack import Document
from haystack.document_stores.types import DuplicatePolicy

from bot.runtime import Runtime, make_ranker
from bot.settings import load_settings
from pipelines.evaluation import corpus_documents, evaluate, index_corpus, load_queries
from pipelines.indexing import build_indexing_pipeline
from pipelines.query import build_retrieval_pipeline
from pipelines.store import DocRecord, InMemoryKnowledgeStore, chunk_id, open_store

REPO = Path(__file__).resolve().parent.parent
MODES = ("bm25", "vector", "hybrid")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def embedded_corpus(settings: Any, dataset: Path) -> tuple[InMemoryKnowledgeStore, Runtime]:
    store = open_store("memory", directory=settings.data_dir / "eval" / dataset.name)
    runtime = Runtime(settings=settings, store=store)
    indexing = build_indexing_pipeline(store, runtime.document_embedder, chunk_chars=settings.indexing.chunk_chars,
                                       overlap_sentences=settings.indexing.chunk_overlap_sentences,
                                       from_documents=True)
    index_corpus(store, indexing, corpus_documents(dataset))
    return store, runtime


def copy_to_weaviate(memory: InMemoryKnowledgeStore, url: str, name: str) -> Any:
    """The same chunks and vectors in a Weaviate store of their own (reused when complete)."""
    from pipelines.weaviate_store import WeaviateKnowledgeStore

    chunks = memory.document_store.filter_documents()
    store = WeaviateKnowledgeStore(url, collection=name)
    if store.count_chunks() == len(chunks) and len(store.records()) == len(memory.records()):
        return store
    store.drop()
    store.close()
    store = WeaviateKnowledgeStore(url, collection=name)
    by_doc: dict[str, list[Document]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk.meta["doc_id"], []).append(chunk)
    for doc_id, record in memory.records().items():
        parts = sorted(by_doc.get(doc_id, []), key=lambda d: d.meta.get("position", 0))
        copies = [Document(content=d.content, meta={k: v for k, v in d.meta.items() if k not in ("version",)},
                           embedding=d.embedding) for d in parts]
        store.publish(DocRecord(doc_id=doc_id, version=0, content_hash=record.content_hash, title=record.title,
                                source=record.source, space=record.space, language=record.language), copies)
    store.commit()
    return store


def quality_rows(backend: str, store: Any, runtime: Runtime, settings: Any, queries: list[Any]) -> list[dict]:
    rows = []
    for mode in MODES:
        fresh = Runtime(settings=settings, store=store)  # components belong to one pipeline each
        pipe = build_retrieval_pipeline(store, fresh.text_embedder, mode=mode, candidates=30,
                                        fusion=settings.retrieval.fusion, ranker=make_ranker(settings))
        evaluate(pipe, queries[:3], mode=mode)  # warm-up
        result = evaluate(pipe, queries, mode=mode)
        rows.append({"backend": backend, "mode": mode, "hit@1": result["hit@1"], "hit@5": result["hit@5"],
                     "mrr@10": result["mrr@10"], "p50_ms": result["p50_ms"], "p95_ms": result["p95_ms"]})
    return rows


def query_vectors(runtime: Runtime, queries: list[Any]) -> list[list[float]]:
    return [runtime.text_embedder.run(text=q.text)["embedding"] for q in queries]


def overhead(store: Any, queries: list[Any], vectors: list[list[float]], rounds: int = 2) -> dict[str, Any]:
    """Ours vs a bare hybrid query, alternating, on precomputed vectors (no embedding in the timing)."""
    from pipelines.weaviate_store import _FUSIONS, DEFAULT_ALPHA, DEFAULT_FUSION, WeaviateHybridRetriever

    ours = WeaviateHybridRetriever(store, mode="hybrid", candidates=30)
    collection = store.collection
    bare_ms: list[float] = []
    ours_ms: list[float] = []
    for _ in range(rounds):
        for q, v in zip(queries, vectors):
            t = time.perf_counter()
            collection.query.hybrid(query=q.text, vector=v, alpha=DEFAULT_ALPHA, limit=30,
                                    fusion_type=_FUSIONS[DEFAULT_FUSION])
            bare_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            ours.run(query=q.text, query_embedding=v)
            ours_ms.append((time.perf_counter() - t) * 1000)
    return {"bare_p50_ms": round(pct(bare_ms, 50), 2), "bare_p95_ms": round(pct(bare_ms, 95), 2),
            "ours_p50_ms": round(pct(ours_ms, 50), 2), "ours_p95_ms": round(pct(ours_ms, 95), 2),
            "ours_over_bare_p50": round(pct(ours_ms, 50) / max(pct(bare_ms, 50), 1e-9), 3)}


def synthesised(chunks: list[Document], scale: int) -> list[Document]:
    copies: list[Document] = []
    n = 0
    while len(copies) < scale:
        for d in chunks:
            if len(copies) >= scale:
                break
            doc_id = f"{d.meta['doc_id']}~{n}"
            meta = {**d.meta, "doc_id": doc_id}
            copies.append(Document(id=chunk_id(doc_id, int(meta.get("version", 1)), int(meta.get("position", 0))),
                                   content=d.content, meta=meta, embedding=d.embedding))
        n += 1
    return copies


def latency_at_scale(memory: InMemoryKnowledgeStore, url: str | None, name: str, scale: int, queries: list[Any],
                     vectors: list[list[float]]) -> list[dict[str, Any]]:
    chunks = synthesised(memory.document_store.filter_documents(), scale)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        big = InMemoryKnowledgeStore(Path(tmp))
        big.document_store.write_documents(chunks, policy=DuplicatePolicy.OVERWRITE)
        retriever = big.retriever(mode="hybrid", candidates=30)
        ms = []
        for q, v in zip(queries, vectors):
            t = time.perf_counter()
            retriever.run(query=q.text, query_embedding=v)
            ms.append((time.perf_counter() - t) * 1000)
        rows.append({"backend": "memory", "chunks": len(chunks), "retriever": "ours (hybrid)",
                     "p50_ms": round(pct(ms, 50), 1), "p95_ms": round(pct(ms, 95), 1)})
    if url:
        from pipelines.weaviate_store import WeaviateKnowledgeStore

        store = WeaviateKnowledgeStore(url, collection=f"{name}Scaled")
        if store.count_chunks() != len(chunks):
            store.drop()
            store.close()
            store = WeaviateKnowledgeStore(url, collection=f"{name}Scaled")
            store.document_store.write_documents(chunks, policy=DuplicatePolicy.OVERWRITE)
        o = overhead(store, queries, vectors, rounds=1)
        rows.append({"backend": "weaviate", "chunks": store.count_chunks(), "retriever": "bare hybrid query",
                     "p50_ms": o["bare_p50_ms"], "p95_ms": o["bare_p95_ms"]})
        rows.append({"backend": "weaviate", "chunks": store.count_chunks(), "retriever": "ours (hybrid + dense)",
                     "p50_ms": o["ours_p50_ms"], "p95_ms": o["ours_p95_ms"]})
        store.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(REPO.parent / "shared" / "eval" / "clapnq"))
    parser.add_argument("--scale", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=100, help="queries used (the first N)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dataset = Path(args.dataset)
    if not (dataset / "corpus.jsonl").exists():
        print(f"bench.retrieval: no dataset at {dataset}; skipped", file=sys.stderr)
        return 0
    settings = load_settings(REPO / "config" / "kbbot.yaml")
    queries = load_queries(dataset)[: args.queries]
    memory, runtime = embedded_corpus(settings, dataset)
    url = os.environ.get("WEAVIATE_URL")
    name = f"Bench{dataset.name.capitalize()}"
    result: dict[str, Any] = {"dataset": dataset.name, "queries": len(queries), "chunks": memory.count_chunks()}
    rows = quality_rows("memory", memory, runtime, settings, queries)
    vectors = query_vectors(runtime, queries)
    if url:
        weaviate = copy_to_weaviate(memory, url, name)
        rows += quality_rows("weaviate", weaviate, runtime, settings, queries)
        result["overhead"] = overhead(weaviate, queries, vectors)
        weaviate.close()
    result["quality"] = rows
    # 30 queries are plenty for latency percentiles and keep the 50k run within a few minutes.
    result["scale"] = latency_at_scale(memory, url, name, args.scale, queries[:30], vectors[:30]) if args.scale else []
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    print(f"{dataset.name}: {result['chunks']} chunks, {len(queries)} queries (latency includes query embedding)")
    print(table(rows))
    if "overhead" in result:
        o = result["overhead"]
        print(f"\nour Weaviate retriever vs a bare hybrid query (vectors precomputed): p50 {o['ours_p50_ms']} vs "
              f"{o['bare_p50_ms']} ms (x{o['ours_over_bare_p50']}), p95 {o['ours_p95_ms']} vs {o['bare_p95_ms']} ms")
    if result["scale"]:
        print(f"\nat {args.scale} chunks (corpus repeated with varied ids; vectors precomputed):")
        print(table(result["scale"]))
    return 0


if __name__ == "__main__":
    main()
