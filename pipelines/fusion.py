"""Hybrid fusion, shared by every store's retriever: how a keyword list and a vector list become one.

Relative score fusion by default: each list's scores scaled to 0..1 over its candidates, then
weighted, ``alpha`` for the vectors (Weaviate's ``relativeScore`` hybrid, so both stores rank alike;
distribution-based and reciprocal rank fusion were measured against it in docs/evaluation.md). ``alpha``
"auto" (the default) sets that weight per question from how clearly the vectors separate their
best candidates (``adaptive_alpha``). The multilingual e5 model scores any same-language passage
above the right passage in the other language, so the vector side is asked once per language
(``LANGUAGES``): the ranker can then give each language its best candidates even when the other
language fills the top of the list (see ``components/ranker.py``). ``retrieved`` is what every
store's retriever returns: the fused list and the vector candidates (``DenseCandidates``).

The in-memory retriever (``pipelines.components.retrievers``) fuses here; the Weaviate one
(``pipelines.weaviate_store.retriever``) lets Weaviate fuse and uses the rest.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document
from haystack.components.joiners import DocumentJoiner

from pipelines.components.embedders import QueryVector
from pipelines.components.shared import SharedSequence, passages

LANGUAGES = ("zh", "en")
MODES = ("hybrid", "bm25", "vector")
FUSIONS = {"relative_score": None, "dbsf": "distribution_based_rank_fusion", "rrf": "reciprocal_rank_fusion"}
# The vector list's weight in relative score fusion: a number from 0 (keywords only) to 1 (vectors
# only), or "auto": per question, by ``adaptive_alpha`` (emanual, clapnq, cmrc2018: docs/evaluation.md).
AUTO_ALPHA = "auto"
DEFAULT_ALPHA: float | str = AUTO_ALPHA
# adaptive_alpha: weight = SLOPE x (best cosine - fifth best cosine), kept within RANGE. Chosen on
# the development halves of the three evaluation sets (docs/evaluation.md, "What each idea measured").
ADAPTIVE_SLOPE = 18.0
ADAPTIVE_OVER = 5
ADAPTIVE_RANGE = (0.2, 0.8)


def as_list(vector: list[float] | QueryVector | None) -> list[float] | None:
    """A query vector as the stores' clients take it (see ``QueryVector`` for why it may be an array)."""
    return vector.tolist() if isinstance(vector, np.ndarray) else vector


def check_choice(name: str, value: str, allowed: Any) -> None:
    """A clear ``ValueError`` for an option outside ``allowed`` (shared by every store's retriever)."""
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r} (expected one of {', '.join(allowed)})")


def check_alpha(alpha: float | str) -> float | str:
    """``alpha`` as given when it is "auto" or a number from 0 to 1; a clear ``ValueError`` otherwise."""
    if alpha == AUTO_ALPHA:
        return alpha
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"alpha is {alpha!r}; expected \"auto\" or a number from 0 (keywords only) to 1 (vectors only)")
    return value


def adaptive_alpha(similarities: Iterable[float]) -> float:
    """The vector list's weight for one question: ``ADAPTIVE_SLOPE`` times the cosine gap between
    the best vector candidate and the ``ADAPTIVE_OVER``-th, kept within ``ADAPTIVE_RANGE``.

    Why: relative score fusion scales each list to 0..1 over its candidates, so a vector list whose
    best five lie within 0.02 of each other (a small embedder that cannot tell sibling sections
    apart: a phone's and a TV's "Picture size") would weigh as much as a clear keyword match. Its
    gap is what it knows: manual questions have a median gap of 0.025 over ten candidates and
    are won by keywords, encyclopaedic ones 0.076 and are won by vectors. Measured on the
    development halves (hit@1): emanual 0.617 -> 0.720, clapnq 0.940 -> 0.940 against a fixed 0.55.
    """
    best = heapq.nlargest(ADAPTIVE_OVER, similarities)
    low, high = ADAPTIVE_RANGE
    if len(best) < 2:
        return (low + high) / 2  # nothing to compare: neither list is favoured
    return min(high, max(low, ADAPTIVE_SLOPE * (best[0] - best[-1])))


def resolve_alpha(alpha: float | str, dense: list[Document]) -> float:
    """The weight for this question: ``adaptive_alpha`` of the vector list's raw cosines when
    ``alpha`` is "auto", else ``alpha``."""
    if alpha == AUTO_ALPHA:
        return adaptive_alpha(d.score or 0.0 for d in dense)
    return float(alpha)


def relative_score_fusion(keyword: list[Document], dense: list[Document], alpha: float) -> list[Document]:
    """Each list min-max scaled over its own candidates, then ``alpha`` * vector + (1 - alpha) * keyword
    (a chunk missing from a list gets 0 from it); best first, the fused score as ``score``."""
    fused: dict[str, float] = {}
    by_id: dict[str, Document] = {}
    for docs, weight in ((keyword, 1.0 - alpha), (dense, alpha)):
        if not docs:
            continue
        scores = [d.score or 0.0 for d in docs]
        low, high = min(scores), max(scores)
        spread = high - low
        for doc, score in zip(docs, scores):
            by_id.setdefault(doc.id, doc)
            fused[doc.id] = fused.get(doc.id, 0.0) + weight * ((score - low) / spread if spread > 0 else 1.0)
    order = sorted(fused, key=lambda i: -fused[i])
    return [replace(by_id[i], score=fused[i]) for i in order]


def fuse(keyword: list[Document], dense: list[Document], fusion: str = "relative_score",
         alpha: float | str = DEFAULT_ALPHA) -> list[Document]:
    """Fuses the keyword and vector lists; the fused score replaces the list scores.

    ``relative_score`` keeps how far apart the scores are and weighs the lists by ``alpha`` (a
    number, or "auto": see ``resolve_alpha``; ``dense`` holds raw cosines);
    ``dbsf`` (Haystack's distribution-based score fusion) scales each list by its own spread,
    equal weights; ``rrf`` uses ranks only.
    """
    if not keyword or not dense:
        return keyword or dense
    if fusion == "relative_score":
        return relative_score_fusion(keyword, dense, resolve_alpha(alpha, dense))
    return DocumentJoiner(join_mode=FUSIONS[fusion]).run(documents=[keyword, dense])["documents"]


def retrieved(documents: Iterable[Document], dense: Iterable[Document]) -> dict[str, Any]:
    """A retriever's outputs: ``documents`` in final order and the vector side's candidates, all
    Passages (see ``Passage``); what every store's retriever returns."""
    return {"documents": passages(documents), "dense_documents": DenseCandidates(passages(dense))}


class DenseCandidates(SharedSequence[Document]):
    """The vector side's candidates of one search, raw cosine as ``score``, best first: what the
    ranker (each language's best, each chunk's similarity) and the grader (the best similarity) read.
    Shared between components rather than copied (see ``SharedSequence``): ~60 candidates over three
    hand-overs were ~9 ms of a turn's CPU."""

    __slots__ = ()


def merged_dense(per_language: dict[str, list[Document]]) -> DenseCandidates:
    """One vector list from the per-language lists, by raw cosine (kept in ``meta.similarity``)."""
    merged = [replace(d, meta={**d.meta, "similarity": d.score}) for docs in per_language.values() for d in docs]
    merged.sort(key=lambda d: -(d.score or 0.0))
    return DenseCandidates(merged)


