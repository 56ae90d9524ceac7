"""Reading a hybrid query's scores apart: the dense candidates and the per-question re-weighing.

Weaviate's relative-score fusion explains each result's score per side (BM25 and vector). From those
explanations one hybrid query gives both the fused list and the vector candidates with their raw
cosines (no near-vector query needed), and, with ``alpha`` "auto", is fused again with the weight
``adaptive_alpha`` picks for this question (sent once with ``PROBE_ALPHA``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from haystack import Document

from pipelines.fusion import adaptive_alpha
from pipelines.weaviate_store.integration import to_document


def dense_of(objects: list[Any]) -> list[Document]:
    docs = []
    for obj in objects:
        similarity = 1.0 - float(obj.metadata.distance)
        doc = to_document(obj, score=similarity)
        doc.meta["similarity"] = similarity  # a fresh dict, made by to_document
        docs.append(doc)
    return docs


def merge_dense(per_language: list[list[Document]]) -> list[Document]:
    merged = [d for docs in per_language for d in docs]
    merged.sort(key=lambda d: -(d.score or 0.0))
    return merged


# How Weaviate (1.35, relative-score fusion) explains a hybrid result, one part per side it was
# found by: the "original score" is the BM25 score or the cosine similarity (1 - the distance a
# near-vector query returns); the "normalized score" is that score min-max scaled over the side's
# results, times the side's weight (alpha for the vector side).
_EXPLAINED = re.compile(r"\(Result Set (keyword|vector)[^)]*\) Document ([0-9a-fA-F-]{36}): original score "
                        r"([-+0-9.eE]+), normalized score: ([-+0-9.eE]+)")
# alpha "auto": the hybrid query goes out with equal weights and its results are re-weighed per
# question from their explanations (one round trip, as with a fixed alpha).
PROBE_ALPHA = 0.5


def explained_scores(obj: Any) -> dict[str, tuple[float, float]]:
    """A hybrid result's explanation: side ("keyword", "vector") -> (original score, normalized
    score), for the sides that found it; empty when the explanation is missing or has another form."""
    uuid = str(obj.uuid).lower()
    return {side: (float(original), float(normalized)) for side, found, original, normalized
            in _EXPLAINED.findall(getattr(obj.metadata, "explain_score", None) or "") if found.lower() == uuid}


def reweighed_scores(explained: list[dict[str, tuple[float, float]]], cosines: Iterable[float]) -> list[float]:
    """Each result's score fused again with this question's ``adaptive_alpha`` (of ``cosines``),
    from the scaled scores its explanation gives for a query sent with ``PROBE_ALPHA``."""
    alpha = adaptive_alpha(cosines)
    return [alpha * (sides["vector"][1] / PROBE_ALPHA if "vector" in sides else 0.0)
            + (1.0 - alpha) * (sides["keyword"][1] / (1.0 - PROBE_ALPHA) if "keyword" in sides else 0.0)
            for sides in explained]


def reweighed(objects: list[Any], dense: list[Document]) -> list[Document] | None:
    """The results of a hybrid query sent with ``PROBE_ALPHA``, fused again with this question's
    ``adaptive_alpha`` of ``dense``'s raw cosines, best first; None when one of them does not
    explain its scores."""
    explained = [explained_scores(obj) for obj in objects]
    if not all(explained):
        return None
    scores = reweighed_scores(explained, (d.score or 0.0 for d in dense))
    documents = [to_document(obj, score=score) for obj, score in zip(objects, scores)]
    return sorted(documents, key=lambda d: -(d.score or 0.0))


def hybrid_with_dense(objects: list[Any], reweigh: bool = False) -> tuple[list[Document], list[Document]] | None:
    """The hybrid results (re-weighed for this question when ``reweigh``, as ``reweighed`` does)
    and, from their explanations, the dense candidates (cosine as ``score`` and
    ``meta.similarity``, best first); None when no result explains its vector side. Each
    explanation is read once and each result made a Document once."""
    explained = [explained_scores(obj) for obj in objects]
    if objects and not any("vector" in sides for sides in explained):
        return None
    scores = [obj.metadata.score for obj in objects]
    reweigh = reweigh and all(explained)
    if reweigh:
        scores = reweighed_scores(explained, (sides["vector"][0] for sides in explained if "vector" in sides))
    documents: list[Document] = []
    dense: list[Document] = []
    for obj, sides, score in zip(objects, explained, scores):
        doc = to_document(obj, score=score)
        documents.append(doc)
        if "vector" in sides:  # built directly: dataclasses.replace took twice as long
            similarity = sides["vector"][0]
            dense.append(Document(id=doc.id, content=doc.content, meta={**doc.meta, "similarity": similarity},
                                  score=similarity, embedding=doc.embedding))
    dense.sort(key=lambda d: -(d.score or 0.0))
    if reweigh:
        documents.sort(key=lambda d: -(d.score or 0.0))
    return documents, dense
