"""Answer-quality evaluation: whole turns of the answering pipeline, scored on what they say.

Each question of a dataset (``queries.jsonl``, and ``queries_unanswerable.jsonl`` when present)
runs through the real query pipeline with the configured generator. What is measured, per set
and overall:

- ``answered`` / ``abstained`` (not_found or off_topic) / ``clarified``: shares of the turns.
- ``citation_validity``: share of the ``[n]`` markers in answers that refer to a source the
  model was shown (target 1.0); ``uncited``: share of answers with no marker at all.
- ``cited_gold``: share of answers to answerable questions that cite a chunk of a gold passage.
- ``groundedness``: share of answer sentences supported by the chunks they cite. Deterministic:
  a sentence (markers removed; fewer than two content terms: not a claim, skipped; kbbot's own
  label lines skipped) cites the markers on it or the next marker on its line
  (``citations.sentence_citations``). It is supported when one cited chunk either contains at
  least ``LEXICAL_SUPPORT`` of the sentence's content terms (words; CJK characters and bigrams)
  or holds a sentence whose embedding cosine with it is at least ``SEMANTIC_SUPPORT`` (the
  embedder's passage vectors; 0.9 is where multilingual-e5-small separates paraphrases, ~0.98,
  from same-domain unrelated sentences, 0.81-0.85). A sentence citing nothing is unsupported.
  Limitation: e5-small scores translations only ~0.83-0.86, so a faithful English sentence drawn
  from a Chinese chunk counts as supported only through shared terms (numbers, codes, names).
- ``reference_f1`` / ``reference_recall``: token overlap with the closest of the dataset's
  ``answers`` (SQuAD-style: lower-cased words; characters for Chinese), over answered
  answerable questions; recall says whether the reference's content is in the answer at all
  (answers are longer than the short reference spans, which caps F1).
- ``language_match``: share of answers whose text is in the question's language.
- ``seconds_per_turn`` (mean) and ``p95_seconds``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from haystack import Document, Pipeline

from pipelines.citations import MARKER, attach_missing_markers, cited_numbers, normalize_markers, sentence_citations
from pipelines.components.extractive import HEADINGS
from pipelines.components.turn import TurnLedger
from pipelines.evaluation import EVIDENCE_SWEEP, Decided, decision_sweep, gold_ids, read_jsonl, step_value
from pipelines.query import turn_end
from pipelines.text import detect_language, split_sentences, terms

JUDGE_SWEEP = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
LEXICAL_SUPPORT = 0.6
SEMANTIC_SUPPORT = 0.9
ABSTAINED = ("not_found", "off_topic")
_LABELS = set(HEADINGS.values())
_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_]+", re.UNICODE)

Embed = Callable[[list[str]], np.ndarray]  # texts -> L2-normalised row vectors


@dataclass
class AnswerCase:
    id: str
    text: str
    gold_ids: list[str]
    answers: list[str]
    set: str  # "answerable" | "unanswerable"


@dataclass
class EvalTurn:
    """One turn as the eval saw it (``--turns`` writes these as JSON lines)."""

    id: str
    set: str
    question: str
    outcome: str
    text: str = ""
    seconds: float = 0.0
    shown: list[str] = field(default_factory=list)  # doc ids of the sources the model was shown, in [n] order
    cited: list[int] = field(default_factory=list)
    invalid_markers: int = 0
    markers_added: int = 0  # by attach_missing_markers, for sentences the model left uncited
    cited_gold: bool | None = None
    sentences: int = 0
    supported: int = 0
    reference_f1: float | None = None
    reference_recall: float | None = None
    language_match: bool | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    # The answerability decision (its score and whether the turn passed it; None: not reached) and
    # the model's own text before the sentence check, scored the same way ("what the model wrote").
    evidence: float | None = None
    evidence_passed: bool | None = None
    judge: float | None = None
    judge_passed: bool | None = None
    left_out: int = 0
    draft: str = ""
    draft_sentences: int = 0
    draft_supported: int = 0
    draft_cited_gold: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_cases(dataset: Path, limit: int | None = None) -> list[AnswerCase]:
    """``queries.jsonl`` (answerable) and, when present, ``queries_unanswerable.jsonl``; the first
    ``limit`` of each."""
    cases: list[AnswerCase] = []
    for name, kind in (("queries.jsonl", "answerable"), ("queries_unanswerable.jsonl", "unanswerable")):
        path = dataset / name
        if not path.exists():
            if kind == "answerable":
                raise FileNotFoundError(f"{path} not found")
            continue
        for row in read_jsonl(path)[:limit]:
            gold = gold_ids(dataset, row)
            cases.append(AnswerCase(str(row["id"]), row["text"], gold, list(row.get("answers") or []), kind))
    return cases


def answer_body(text: str) -> str:
    """The answer without kbbot's label lines and markers: what is compared with references."""
    lines = [ln for ln in text.splitlines() if ln.strip() not in _LABELS]
    return re.sub(r"\[\d{1,3}\]", "", "\n".join(lines)).strip()


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def overlap(answer: str, reference: str) -> tuple[float, float]:
    """(F1, recall) of the answer's tokens against the reference's (bags of tokens)."""
    a, r = tokens(answer), tokens(reference)
    if not a or not r:
        return 0.0, 0.0
    common = sum(min(a.count(t), r.count(t)) for t in set(r))
    if not common:
        return 0.0, 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall), recall


def supported(sentence: str, chunks: list[str], embed: Embed | None) -> bool:
    """Whether one of ``chunks`` supports ``sentence`` (the module docstring gives the method)."""
    s_terms = set(terms(sentence))
    if any(len(s_terms & set(terms(c))) / len(s_terms) >= LEXICAL_SUPPORT for c in chunks):
        return True
    if embed is None:
        return False
    candidates = [s for c in chunks for s in split_sentences(c)]
    if not candidates:
        return False
    vectors = embed([sentence, *candidates])
    return float(np.max(vectors[1:] @ vectors[0])) >= SEMANTIC_SUPPORT


def score_answer(record: EvalTurn, case: AnswerCase, sources: Sequence[Document], embed: Embed | None) -> None:
    """Fills the citation, grounding, reference and language fields of an answered turn, on the
    text kbbot shows (markers normalised, uncited sentences credited as the Answerer does)."""
    text = attach_missing_markers(normalize_markers(record.text), [d.content or "" for d in sources])
    record.markers_added = len(MARKER.findall(text)) - len(MARKER.findall(normalize_markers(record.text)))
    record.text = text
    numbers = [int(n) for n in re.findall(r"\[(\d{1,3})\]", text)]
    record.cited = cited_numbers(text)
    record.invalid_markers = sum(1 for n in numbers if not 1 <= n <= len(sources))
    cited_ids = {str((sources[n - 1].meta or {}).get("doc_id")) for n in record.cited if 1 <= n <= len(sources)}
    if case.gold_ids:
        record.cited_gold = bool(cited_ids & set(case.gold_ids))
    for sentence, cites in sentence_citations(text):
        if sentence in _LABELS or len(set(terms(sentence))) < 2:
            continue
        record.sentences += 1
        chunks = [sources[n - 1].content or "" for n in cites if 1 <= n <= len(sources)]
        record.supported += bool(chunks) and supported(sentence, chunks, embed)
    body = answer_body(text)
    if case.answers:
        record.reference_f1, record.reference_recall = max(overlap(body, ref) for ref in case.answers)
    record.language_match = detect_language(body) == detect_language(case.text)


def run_case(pipeline: Pipeline, case: AnswerCase, ledger: Callable[[], TurnLedger], embed: Embed | None) -> EvalTurn:
    """One whole turn of ``pipeline`` (``build_query_pipeline``) on ``case``, scored."""
    turn = ledger()
    started = time.perf_counter()
    try:
        with turn.running():
            result = pipeline.run({"question": case.text})
    except Exception as exc:  # noqa: BLE001 - a failed turn is a result of the eval, not its end
        return EvalTurn(case.id, case.set, case.text, "error", seconds=time.perf_counter() - started,
                          steps=list(turn.steps), error=f"{type(exc).__name__}: {exc}"[:300])
    seconds = time.perf_counter() - started
    end = turn_end(result)
    outcome, sources, replies = end.outcome, end.sources, end.replies
    text = (replies[0].text or "").strip() if replies else ""
    record = EvalTurn(case.id, case.set, case.text, outcome, text=text, seconds=round(seconds, 2),
                        shown=[str((d.meta or {}).get("doc_id")) for d in sources], steps=list(turn.steps))
    _decisions(record)
    if outcome == "answered":
        score_answer(record, case, sources, embed)
    draft = end.draft.strip()
    if draft:
        written = EvalTurn(case.id, case.set, case.text, "answered", text=draft)
        score_answer(written, case, sources, embed)
        record.draft, record.draft_sentences, record.draft_supported = draft, written.sentences, written.supported
        record.draft_cited_gold = written.cited_gold
    return record


def _decisions(record: EvalTurn) -> None:
    steps = record.steps
    record.evidence, record.evidence_passed = step_value(steps, "answerable", "score"), \
        step_value(steps, "answerable", "answerable")
    record.judge, record.judge_passed = step_value(steps, "judge", "p_yes"), step_value(steps, "judge", "answerable")
    record.left_out = int(step_value(steps, "check", "left_out") or 0)


def _share(values: list[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def summarize(records: list[EvalTurn]) -> dict[str, Any]:
    """The metrics of the module docstring over ``records``."""
    answered = [r for r in records if r.outcome == "answered"]
    markers = sum(len(re.findall(r"\[\d{1,3}\]", normalize_markers(r.text))) for r in answered)
    invalid = sum(r.invalid_markers for r in answered)
    sentences = sum(r.sentences for r in answered)
    seconds = sorted(r.seconds for r in records)
    drafted = [r for r in records if r.draft]
    draft_sentences = sum(r.draft_sentences for r in drafted)
    return {
        "n": len(records),
        "answered": _share([r.outcome == "answered" for r in records]),
        "abstained": _share([r.outcome in ABSTAINED for r in records]),
        "clarified": _share([r.outcome == "clarify" for r in records]),
        "errors": sum(r.outcome == "error" for r in records),
        "citation_validity": round((markers - invalid) / markers, 4) if markers else None,
        "uncited": _share([not r.cited for r in answered]),
        "cited_gold": _share([r.cited_gold for r in answered if r.cited_gold is not None]),
        "groundedness": round(sum(r.supported for r in answered) / sentences, 4) if sentences else None,
        "reference_f1": _mean([r.reference_f1 for r in answered if r.reference_f1 is not None]),
        "reference_recall": _mean([r.reference_recall for r in answered if r.reference_recall is not None]),
        "language_match": _share([r.language_match for r in answered if r.language_match is not None]),
        "left_out": sum(r.left_out for r in answered),
        # What the model wrote, before the sentence check: its answers' grounding and gold citations.
        "drafted": len(drafted),
        "draft_groundedness": round(sum(r.draft_supported for r in drafted) / draft_sentences, 4)
        if draft_sentences else None,
        "draft_cited_gold": _share([r.draft_cited_gold for r in drafted if r.draft_cited_gold is not None]),
        "seconds_per_turn": _mean([r.seconds for r in records]),
        "p95_seconds": seconds[min(len(seconds) - 1, round(0.95 * (len(seconds) - 1)))] if seconds else None,
    }


def evaluate_answers(pipeline: Pipeline, cases: list[AnswerCase], *, ledger: Callable[[], TurnLedger],
                     embed: Embed | None = None, on_turn: Callable[[EvalTurn], Any] | None = None) -> dict[str, Any]:
    """Runs every case; metrics per set (answerable, unanswerable) and overall."""
    records = []
    for case in cases:
        record = run_case(pipeline, case, ledger, embed)
        records.append(record)
        if on_turn is not None:
            on_turn(record)
    sets = {name: summarize([r for r in records if r.set == name]) for name in ("answerable", "unanswerable")
            if any(r.set == name for r in records)}
    return {"sets": sets, "overall": summarize(records), "decisions": decisions(records)}


def decisions(records: list[EvalTurn]) -> dict[str, Any]:
    """The answerability decision over these turns: precision and recall of declining (recall: the
    unanswerable questions declined; precision: of all declined, the share that were unanswerable;
    with no unanswerable questions, only the answerable ones kept), and sweeps of its thresholds
    (``decision_sweep``): the knowledge base's signals, and the model's yes/no where it ran."""
    def turn(r: EvalTurn, score: float | None, passed: bool | None) -> Decided:
        return r.outcome, score, bool(passed)

    answerable = [r for r in records if r.set == "answerable"]
    unanswerable = [r for r in records if r.set == "unanswerable"]
    declined_u = sum(r.outcome in ABSTAINED for r in unanswerable)
    declined = declined_u + sum(r.outcome in ABSTAINED for r in answerable)
    out: dict[str, Any] = {
        "recall": round(declined_u / len(unanswerable), 4) if unanswerable else None,
        "precision": round(declined_u / declined, 4) if unanswerable and declined else None,
        "kept": _share([r.outcome not in ABSTAINED for r in answerable]),
        "evidence_sweep": decision_sweep([turn(r, r.evidence, r.evidence_passed) for r in answerable],
                                         [turn(r, r.evidence, r.evidence_passed) for r in unanswerable],
                                         EVIDENCE_SWEEP),
    }
    if any(r.judge is not None for r in records):
        out["judge_sweep"] = decision_sweep([turn(r, r.judge, r.judge_passed) for r in answerable],
                                            [turn(r, r.judge, r.judge_passed) for r in unanswerable], JUDGE_SWEEP)
    return out
