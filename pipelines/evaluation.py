"""Retrieval evaluation on question-answering sets (format: ../shared/eval/README.md).

The corpus is indexed through the real indexing pipeline (split, embed, publish) into a store
of its own, and each query runs the real retrieval pipeline; chunks are collapsed to their
passage before scoring, since a passage split in two must not count twice.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haystack import Document, Pipeline

from pipelines.indexing import content_hash
from pipelines.query import query_inputs
from pipelines.store import KnowledgeStore


@dataclass
class EvalQuery:
    id: str
    text: str
    gold_ids: list[str]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
    return rows


def load_queries(dataset: Path, name: str = "queries.jsonl") -> list[EvalQuery]:
    path = dataset / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    return [EvalQuery(str(r["id"]), r["text"], [str(g) for g in r.get("gold_ids", [])]) for r in read_jsonl(path)]


def corpus_documents(dataset: Path) -> list[Document]:
    path = dataset / "corpus.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (expected a corpus.jsonl of {{id, title, text}})")
    docs = []
    for row in read_jsonl(path):
        text = row["text"]
        docs.append(Document(content=text, meta={
            "doc_id": str(row["id"]), "title": row.get("title") or str(row["id"]), "source": f"{dataset.name}:{row['id']}",
            "content_hash": content_hash(f"{row.get('title')}\x00{text}".encode()), "format": "text",
            "space": "default",
        }))
    return docs


def index_corpus(store: KnowledgeStore, pipeline: Pipeline, docs: list[Document], progress: Any = None) -> int:
    """Publishes passages that are new or changed; returns how many were (re)indexed."""
    records = store.records()
    todo = [d for d in docs if (r := records.get(d.meta["doc_id"])) is None or r.content_hash != d.meta["content_hash"]]
    batches = [todo[i : i + 32] for i in range(0, len(todo), 32)]
    for batch in progress(batches, len(batches)) if progress else batches:
        pipeline.run({"clean": {"documents": batch}})
    store.commit()
    return len(todo)


def ranked_passages(documents: list[Document]) -> list[str]:
    seen: list[str] = []
    for d in documents:
        doc_id = d.meta.get("doc_id")
        if doc_id not in seen:
            seen.append(doc_id)
    return seen


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def evaluate(pipeline: Pipeline, queries: list[EvalQuery], *, mode: str, k: int = 10) -> dict[str, Any]:
    """hit@1, hit@5, MRR@k and latency percentiles of the retrieval pipeline over ``queries``."""
    hits1 = hits5 = 0
    rr = 0.0
    latencies: list[float] = []
    for q in queries:
        data = query_inputs(q.text, mode=mode, generate=False)
        data["rank"]["top_k"] = k * 2  # chunks; collapsed to k passages below
        started = time.perf_counter()
        result = pipeline.run(data)
        latencies.append((time.perf_counter() - started) * 1000)
        ranking = ranked_passages(result["rank"]["documents"])[:k]
        gold = set(q.gold_ids)
        rank = next((i for i, doc_id in enumerate(ranking, start=1) if doc_id in gold), None)
        if rank:
            hits1 += rank == 1
            hits5 += rank <= 5
            rr += 1 / rank
    n = len(queries) or 1
    return {
        "mode": mode, "n": len(queries),
        "hit@1": round(hits1 / n, 4), "hit@5": round(hits5 / n, 4), f"mrr@{k}": round(rr / n, 4),
        "p50_ms": round(percentile(latencies, 50), 1), "p95_ms": round(percentile(latencies, 95), 1),
    }
