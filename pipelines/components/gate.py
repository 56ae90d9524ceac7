"""Routes a turn to generation only when retrieval found something relevant."""

from __future__ import annotations

from typing import Any

from haystack import Document, component


def best_similarity(documents: list[Document]) -> float | None:
    scores = [d.score for d in documents if d.score is not None]
    return max(scores) if scores else None


@component
class RelevanceGate:
    """``documents`` out when the best dense similarity reaches ``min_similarity``, else ``not_found``.

    The dense candidates (cosine to the question) decide, not the fused order: RRF scores
    say which chunk is best, not whether any is good enough. ``not_found`` carries the best
    similarity seen, for the trace.
    """

    def __init__(self, min_similarity: float = 0.8):
        self.min_similarity = min_similarity

    @component.output_types(documents=list[Document], not_found=float)
    def run(self, documents: list[Document], dense_documents: list[Document] | None = None) -> dict[str, Any]:
        if dense_documents is None:  # keyword-only retrieval: nothing to judge relevance by
            return {"documents": documents} if documents else {"not_found": 0.0}
        best = best_similarity(dense_documents)
        if not documents or best is None or best < self.min_similarity:
            return {"not_found": best if best is not None else 0.0}
        return {"documents": documents}
