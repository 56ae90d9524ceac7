"""Retrieval evaluation on question-answering sets (format: ../shared/eval/README.md).

The corpus is indexed through the real indexing pipeline (split, embed, publish) into a store
of its own, and each query runs the real retrieval pipeline; chunks are collapsed to their
passage before scoring, since a passage split in two must not count twice.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haystack import Document, Pipeline

from pipelines.components.end import TurnEnd
from pipelines.components.turn import TurnLedger
from pipelines.query import retrieval_inputs, turn_end
from pipelines.records import PUBLIC, content_hash
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


def corpus_folder(dataset: Path) -> Path | None:
    """The folder of files a dataset's questions are about, when its ``corpus.folder`` names one (relative
    to the dataset: ``examples/kb-eval`` holds ``../kb``) instead of a ``corpus.jsonl``."""
    pointer = dataset / "corpus.folder"
    if not pointer.exists():
        return None
    folder = (dataset / pointer.read_text(encoding="utf-8").strip()).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"{pointer} names {folder}, which is not a folder")
    return folder


def gold_ids(dataset: Path, row: dict[str, Any]) -> list[str]:
    """A question's gold passages as the store names them: a folder corpus's files by their absolute
    path (the document id a folder source gives them)."""
    folder = corpus_folder(dataset)
    gold = [str(g) for g in row.get("gold_ids", [])]
    return [str(folder / g) for g in gold] if folder is not None else gold


def load_queries(dataset: Path, name: str = "queries.jsonl") -> list[EvalQuery]:
    path = dataset / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    return [EvalQuery(str(r["id"]), r["text"], gold_ids(dataset, r)) for r in read_jsonl(path)]


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
            "space": "default", "readers": [PUBLIC],  # an evaluation set has no permissions: all may read it
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


def first_rank(ids: list[str], gold: set[str]) -> int | None:
    return next((i for i, doc_id in enumerate(ids, start=1) if doc_id in gold), None)


def miss_cause(query: EvalQuery, top: str | None, retrieved: list[str], ranked: list[str],
               titles: dict[str, str]) -> str | None:
    """Why the best gold passage is not first, from what the titles' ``a > b > c`` paths say:
    ``hit`` (it is first), ``not_retrieved`` (no candidate of the retriever), ``cut_by_ranker``
    (among as many first candidates as were ranked, but dropped by the ranker), ``duplicate`` (the first passage has the gold's very title),
    ``parent_first`` / ``child_first`` (the first is the gold's ancestor / descendant section),
    ``sibling_first`` (same parent section), ``other_section``."""
    gold = set(query.gold_ids)
    if ranked and ranked[0] in gold:
        return "hit"
    if not gold & set(retrieved):
        return "not_retrieved"
    if not gold & set(ranked) and gold & set(retrieved[: len(ranked)]):
        return "cut_by_ranker"
    if top is None:
        return "not_retrieved"
    first = titles.get(top, "")
    causes = set()
    for gid in gold:
        path = titles.get(gid, "")
        if path == first:
            causes.add("duplicate")
        elif path.startswith(first + " > "):
            causes.add("parent_first")
        elif first.startswith(path + " > "):
            causes.add("child_first")
        elif " > " in path and path.rsplit(" > ", 1)[0] == first.rsplit(" > ", 1)[0]:
            causes.add("sibling_first")
    for cause in ("duplicate", "parent_first", "child_first", "sibling_first"):
        if cause in causes:
            return cause
    return "other_section"


def evaluate(pipeline: Pipeline, queries: list[EvalQuery], *, mode: str, k: int = 10,
             titles: dict[str, str] | None = None, per_query: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """hit@1, hit@5, MRR@k and latency percentiles of the retrieval pipeline over ``queries``.

    With ``per_query`` (a list to fill), one record per question: the rank of its best gold
    passage among sections (chunks collapsed to their passage) and among chunks, before and
    after the ranker, and ``miss_cause`` (needs ``titles``, passage id -> title path).
    """
    hits1 = hits5 = 0
    rr = 0.0
    latencies: list[float] = []
    for q in queries:
        data = retrieval_inputs(q.text, mode=mode)
        data["rank"]["top_k"] = k * 2  # chunks; collapsed to k passages below
        started = time.perf_counter()
        result = pipeline.run(data, include_outputs_from={"current"} if per_query is not None else None)
        latencies.append((time.perf_counter() - started) * 1000)
        chunks = result["rank"]["documents"]
        ranking = ranked_passages(chunks)[:k]
        gold = set(q.gold_ids)
        rank = first_rank(ranking, gold)
        if rank:
            hits1 += rank == 1
            hits5 += rank <= 5
            rr += 1 / rank
        if per_query is not None:
            candidates = ranked_passages(result.get("current", {}).get("documents") or [])
            per_query.append({
                "id": q.id, "text": q.text, "gold_ids": q.gold_ids, "mode": mode,
                "section_rank": rank, "chunk_rank": first_rank([str(d.meta.get("doc_id")) for d in chunks], gold),
                "candidate_rank": first_rank(candidates, gold), "top": ranking[:3],
                "cause": miss_cause(q, ranking[0] if ranking else None, candidates, ranking, titles or {}),
            })
    n = len(queries) or 1
    return {
        "mode": mode, "n": len(queries),
        "hit@1": round(hits1 / n, 4), "hit@5": round(hits5 / n, 4), f"mrr@{k}": round(rr / n, 4),
        "p50_ms": round(percentile(latencies, 50), 1), "p95_ms": round(percentile(latencies, 95), 1),
    }


_MARKER = re.compile(r"\[(\d{1,3})\]")
ABSTAINED = ("not_found", "off_topic")


def cited_passages(end: TurnEnd) -> set[str]:
    text = (end.replies[0].text or "") if end.replies else ""
    numbers = {int(n) for n in _MARKER.findall(text)}
    return {str(end.sources[n - 1].meta.get("doc_id")) for n in numbers if 1 <= n <= len(end.sources)}


EVIDENCE_SWEEP = (-0.6, -0.5, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2)


def step_value(steps: list[dict[str, Any]], step: str, key: str) -> float | None:
    """``key`` of the last ``step`` the turn noted (its trace), if any."""
    for noted in reversed(steps):
        if noted.get("step") == step and key in noted:
            return noted[key]
    return None


Decided = tuple[str, float | None, bool]  # outcome, the decision's score (None: not reached), passed it


def decided(outcome: str, steps: list[dict[str, Any]], step: str = "answerable", key: str = "score",
            verdict: str = "answerable") -> Decided:
    """A turn as ``decision_sweep`` reads it, from its trace."""
    passed = step_value(steps, step, verdict)
    return outcome, step_value(steps, step, key), bool(passed)


def decision_sweep(answerable: list[Decided], unanswerable: list[Decided],
                   thresholds: tuple[float, ...]) -> list[dict[str, Any]]:
    """What the answerability decision would do at each threshold, from each turn's outcome, score
    and whether it passed at the threshold it ran with: a turn that ended before the decision keeps
    its outcome; one that passed and was declined later (the sentence check, the judge) stays
    declined; otherwise the score decides. ``abstained``: unanswerable questions declined (the
    decision's recall); ``answered``: answerable ones kept; ``precision``: of all declined, the share
    that were unanswerable. A turn declined by the decision is counted as answered below its score,
    though a later step might still have declined it: the sweep can overstate ``answered`` there."""
    def declines(turn: Decided, t: float) -> bool:
        outcome, score, passed = turn
        if score is None:
            return outcome in ABSTAINED
        return score < t or (passed and outcome in ABSTAINED)

    rows = []
    for t in thresholds:
        kept = sum(not declines(turn, t) for turn in answerable)
        declined = sum(declines(turn, t) for turn in unanswerable)
        wrongly = len(answerable) - kept
        rows.append({"threshold": t, "abstained": round(declined / (len(unanswerable) or 1), 4),
                     "answered": round(kept / (len(answerable) or 1), 4),
                     "precision": round(declined / (declined + wrongly), 4) if declined + wrongly else None})
    return rows


def evaluate_abstention(pipeline: Pipeline, answerable: list[EvalQuery], unanswerable: list[EvalQuery], *,
                        ledger: Callable[[], TurnLedger], sweep: tuple[float, ...] = (0.78, 0.79, 0.80, 0.81, 0.82, 0.83, 0.84, 0.85, 0.86),
                        evidence_sweep: tuple[float, ...] = EVIDENCE_SWEEP) -> dict[str, Any]:
    """Runs the whole answering pipeline on both sets.

    ``abstained``: share of unanswerable questions that end not_found or off_topic (the higher the
    better); ``answered`` / ``answered_cited_gold``: share of answerable questions that get an
    answer / an answer citing a gold passage (the recall that abstention costs); ``precision``: of
    the questions that did not get an answer, the share that were unanswerable. ``sweep``: the same
    two shares if the not-found threshold were each of the given values, from the best dense
    similarity of each question's first retrieval (how the thresholds were chosen);
    ``evidence_sweep``: the same for the answerability decision's threshold (``decision_sweep``).
    ``ledger`` makes a fresh per-turn ``TurnLedger``.
    """
    def run(q: EvalQuery) -> tuple[str, set[str], float, Decided]:
        with ledger().running() as turn:
            result = pipeline.run({"question": q.text}, include_outputs_from={"current"})
        dense = result.get("current", {}).get("dense_documents") or []
        best = max((d.score for d in dense if d.score is not None), default=0.0)
        end = turn_end(result)
        return end.outcome, cited_passages(end), best, decided(end.outcome, turn.steps)

    answered = cited_gold = abstained = 0
    best_answerable, best_unanswerable = [], []
    decided_answerable: list[Decided] = []
    decided_unanswerable: list[Decided] = []
    outcomes: dict[str, int] = {}
    for q in answerable:
        outcome, cited, best, turn = run(q)
        outcomes[f"answerable:{outcome}"] = outcomes.get(f"answerable:{outcome}", 0) + 1
        answered += outcome == "answered"
        cited_gold += outcome == "answered" and bool(cited & set(q.gold_ids))
        best_answerable.append(best)
        decided_answerable.append(turn)
    for q in unanswerable:
        outcome, _, best, turn = run(q)
        outcomes[f"unanswerable:{outcome}"] = outcomes.get(f"unanswerable:{outcome}", 0) + 1
        abstained += outcome in ABSTAINED
        best_unanswerable.append(best)
        decided_unanswerable.append(turn)
    n_a, n_u = len(answerable) or 1, len(unanswerable) or 1
    declined = abstained + (len(answerable) - answered)
    return {
        "answerable": len(answerable), "unanswerable": len(unanswerable),
        "abstained": round(abstained / n_u, 4), "answered": round(answered / n_a, 4),
        "answered_cited_gold": round(cited_gold / n_a, 4),
        "precision": round(abstained / declined, 4) if declined else None, "outcomes": outcomes,
        "sweep": [{"min_similarity": t, "abstained": round(sum(b < t for b in best_unanswerable) / n_u, 4),
                   "answered": round(sum(b >= t for b in best_answerable) / n_a, 4)} for t in sweep],
        "evidence_sweep": decision_sweep(decided_answerable, decided_unanswerable, evidence_sweep),
    }
