"""Do the kept passages answer the question? Decided before anything is written, from what
retrieval already measured, with no model call.

A question the knowledge base does not answer still finds passages about its topic, so two things
must hold for it to be answered (docs/evaluation-abstention.md has each one's figures alone
and together, on Wikipedia questions, device manuals, Chinese and the sample knowledge base):

- the closest chunk is close in meaning: its cosine with the question (multilingual-e5-small);
- the best of the first ``COVER_OVER`` kept chunks holds what the question asks about: its share of
  the question's content (``cover``), the terms weighted by their inverse document frequency
  among everything retrieval found (so the product name every candidate shares weighs little, and
  "refrigerant", which none of them mentions, weighs most).

Either alone lets through what the other catches. Closeness in meaning separates Wikipedia
questions whose passage is about their topic but lacks the answer (clapnq: AUC 0.86, content 0.73);
content separates a product question about something the manuals never mention ("Which refrigerant
does the HL-M200 use?" is close in meaning to the HL-M200's data sheet: the sample knowledge base,
AUC 0.68 against 0.95). Both floors sit at the same low percentile of answerable development
questions (clapnq and emanual: ``CALIBRATION``), the one setting that moves them together being how
far below that percentile a question may fall (``answering.evidence_margin``): a property of the
embedding model and of the analysis, not of one knowledge base. A question about codes the embedding
model cannot read is the exception (``codes_held``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from haystack import Document, component

from pipelines.analysis import CJK_CHAR, ZH_FUNCTION, unigrams
from pipelines.components.retrievers import DenseCandidates
from pipelines.components.turn import current_ledger
from pipelines.grounding import facts

COVER_OVER = 3
# Words that carry a question's form, not what it asks about ("what does E-004 mean", "which grease
# does it use"): left out of the content a chunk must hold, as are Chinese terms holding a function
# character (``ZH_FUNCTION``).
QUESTION_FORM = frozenset({"mean", "use", "happen", "work", "need", "get", "make", "tell", "know", "explain"})


@dataclass(frozen=True)
class Signals:
    """A question's evidence: the best cosine of a chunk, and the content share the best kept chunk holds."""

    similarity: float
    cover: float


@dataclass(frozen=True)
class Calibration:
    """Where answerable development questions lie: ``low`` is the 5th percentile of each signal,
    ``typical`` its median (clapnq and emanual, 410 questions). A question's margin on a signal is
    (signal - low) / (typical - low): 0 at the percentile, 1 at the median."""

    low: Signals
    typical: Signals

    def margin(self, signals: Signals) -> float:
        """The weaker of the two margins: both must hold."""
        return min((signals.similarity - self.low.similarity) / (self.typical.similarity - self.low.similarity),
                   (signals.cover - self.low.cover) / (self.typical.cover - self.low.cover))

    def floors(self, margin: float) -> Signals:
        """The signal values a question needs to reach ``margin`` on both."""
        return Signals(self.low.similarity + margin * (self.typical.similarity - self.low.similarity),
                       self.low.cover + margin * (self.typical.cover - self.low.cover))


CALIBRATION = Calibration(low=Signals(similarity=0.850, cover=0.2885), typical=Signals(similarity=0.885, cover=0.8585))


def content_terms(question: str) -> set[str]:
    """The question's terms that say what it asks about (analysed as BM25 analyses it)."""
    # A unigram is all CJK or none of it: its first character tells.
    return {t for t in unigrams(question)
            if t not in QUESTION_FORM and not (CJK_CHAR.match(t) and any(ch in ZH_FUNCTION for ch in t))}


def signals(query: str, documents: Sequence[Document], candidates: Sequence[Document],
            dense: Sequence[Document] | None) -> Signals:
    """The signals of ``query`` over the kept ``documents`` (best first), among all the ``candidates``
    retrieval found and its vector candidates ``dense`` (raw cosines as scores; None for keyword-only
    retrieval, which has no cosine to judge by and counts as close)."""
    similarity = max((d.score or 0.0 for d in dense), default=0.0) if dense is not None else 1.0
    pool = list({d.id: d for d in (*candidates, *(dense or ()))}.values())
    return Signals(similarity, cover(query, documents[:COVER_OVER], pool))


def cover(query: str, chunks: Sequence[Document], pool: Sequence[Document]) -> float:
    """The largest share of the query's content terms, weighted by their inverse document frequency
    among ``pool``, that one of ``chunks`` holds."""
    wanted = content_terms(query) or set(unigrams(query))
    if not wanted or not chunks:
        return 0.0
    held = [terms_of(d) for d in pool] or [terms_of(d) for d in chunks]
    n = len(held)
    weight = {t: math.log((n - df + 0.5) / (df + 0.5) + 1) for t in wanted
              for df in [sum(t in terms for terms in held)]}
    total = sum(weight.values())
    return max(sum(w for t, w in weight.items() if t in terms_of(c)) / total for c in chunks) if total else 0.0


def codes_held(query: str, chunks: Sequence[Document]) -> bool:
    """Whether the question names codes or model numbers (``E-004``, ``K8-44``, ``6309-2Z``: tokens of
    letters and digits, not bare numbers or years) and one of ``chunks`` holds every one of them.

    The embedding model reads a code as a few characters, so a short question about one ("What does
    fault E-004 mean?") is far in meaning from the table row that answers it (cosine 0.82 on the
    sample knowledge base, under the similarity floor) although that row holds exactly what it asks
    about. Where a chunk holds the codes and nearly all of the rest of the question's content (cover
    at least its typical value), closeness in meaning counts as typical: content alone decides."""
    named = {f for f in facts(query) if any(ch.isalpha() for ch in f)}
    return bool(named) and any(named <= facts(c.content or "") for c in chunks)


# Words of a question's frame that say how it asks, not what about ("what are the steps to…", "is there
# a way…", "how do I fix…"), and number words: a candidate need not hold them.
QUESTION_FRAME = frozenset({
    "fix", "step", "way", "procedur", "again", "even", "identifi", "describ", "list", "name", "possibl", "abl",
    "want", "like", "pleas", "help", "issu", "problem", "question", "differ", "type", "kind", "someon", "someth",
    "anyon", "anyth", "thing", "come", "occur", "find", "show", "give", "instruct",
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"})
# Two intent words no candidate holds: one alone is often a question's own spelling or phrasing
# (clapnq and emanual answerable questions: "explian", "jurors"); two are a question about something
# else in the products' words ("pay my electricity bill through the HL-D50").
UNHELD_TO_DECLINE = 2


def _near_spelling(word: str, held: frozenset[str] | set[str]) -> bool:
    """Whether ``word`` is one typing slip (a letter added, dropped, changed, or two swapped) from a held
    term of five letters or more: a misspelt word asks for what the held one names."""
    if len(word) < 5:
        return False
    for term in held:
        if abs(len(term) - len(word)) > 1 or len(term) < 5 or term[0] != word[0] and term[1] != word[1]:
            continue
        if _one_slip(word, term):
            return True
    return False


def _one_slip(a: str, b: str) -> bool:
    if a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def unheld_intent(query: str, pool: Sequence[Document]) -> list[str]:
    """The question's English content words that no candidate holds, less its frame words and number
    words and what is one typing slip from a held term: what it asks about that retrieval found nowhere
    ("pay", "bill" in "Can I pay my electricity bill through the HL-D50 drive?"). Chinese is analysed into
    overlapping bigrams, many of which no text holds whatever it asks, so it is left to ``cover``."""
    # In the question's order (a set's order changes with each process's hash seed: traces would too);
    # ``content_terms``' test, for the English words it keeps: not a question form.
    words = [t for t in dict.fromkeys(unigrams(query))
             if t.isascii() and t.isalpha() and t not in QUESTION_FORM and t not in QUESTION_FRAME]
    if not words:
        return []
    held: set[str] = set().union(*(terms_of(d) for d in pool)) if pool else set()
    return [w for w in words if w not in held and not _near_spelling(w, held)]


_TERMS: dict[str, frozenset[str]] = {}
_TERMS_KEPT = 20000


def terms_of(chunk: Document) -> frozenset[str]:
    """A chunk's analysed terms, kept by its text (questions find the same chunks again and again).
    Keyed by the text, not the chunk id: an id is a source's position, and a page edited in place
    keeps its ids while its text changes."""
    text = chunk.content or ""
    found = _TERMS.get(text)
    if found is None:
        if len(_TERMS) >= _TERMS_KEPT:
            _TERMS.clear()
        found = _TERMS[text] = frozenset(unigrams(text))
    return found


@component
class EvidenceCheck:
    """``documents`` and ``query`` on when both signals reach their floors at ``margin`` (see
    ``Calibration``), else ``not_found`` (the margin). ``margin`` None passes everything (no decision:
    a model grades the passages instead); the signals are in the trace either way."""

    def __init__(self, margin: float | None = None, calibration: Calibration = CALIBRATION):
        self.margin = margin
        self.calibration = calibration

    @component.output_types(documents=list[Document], query=str, not_found=float)
    def run(self, query: str, documents: list[Document], candidates: list[Document] | None = None,
            dense_documents: DenseCandidates | None = None) -> dict[str, Any]:
        found = signals(query, documents, candidates or documents, dense_documents)
        similarity = found.similarity  # as measured, for the trace
        named = found.cover >= self.calibration.typical.cover and codes_held(query, documents[:COVER_OVER])
        if named:
            found = Signals(max(found.similarity, self.calibration.typical.similarity), found.cover)
        score = self.calibration.margin(found)
        pool = list({d.id: d for d in (*(candidates or documents), *(dense_documents or ()))}.values())
        unheld = unheld_intent(query, pool)
        answerable = self.margin is None or (score >= self.margin and len(unheld) < UNHELD_TO_DECLINE)
        current_ledger().note("answerable", score=round(score, 4), similarity=round(similarity, 4),
                    cover=round(found.cover, 4), codes_held=named, unheld=unheld, answerable=answerable)
        return {"documents": documents, "query": query} if answerable else {"not_found": score}

    @component.output_types(documents=list[Document], query=str, not_found=float)
    async def run_async(self, query: str, documents: list[Document], candidates: list[Document] | None = None,
                        dense_documents: DenseCandidates | None = None) -> dict[str, Any]:
        # Pure CPU well under a millisecond once the chunks' terms are known: on the event loop.
        return self.run(query, documents, candidates, dense_documents)
