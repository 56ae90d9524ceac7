"""The rest of a kept document, for the extractive answer.

The ranker keeps at most ``max_chunks_per_doc`` chunks of one document, and the chunk that matches a
question best is often the one that repeats its words: the document's title and opening. "电机过热
怎么办？" keeps the overheating guide's introduction, which names the guide's causes and measures,
while the measures are in chunks of their own further down. A model given the opening can say no
more than it holds, and neither can the extractive answer, which shows source sentences only. So the
extractive answer is given the first kept documents' other chunks that retrieval already found
(candidates of the same turn: no new search), and chooses among their sentences by what the
question asks (``pipelines.focus``); they join their document's source (``PromptFit`` merges a
document's chunks into one ``[n]``), so the citations stay what they were.
"""

from __future__ import annotations

from typing import Any

from haystack import Document, component

from pipelines.focus import question_focus

# The documents the answer draws on first, and how many more chunks of each it may read: its own
# sentence choice weighs at most ``MAX_SENTENCES_PER_SOURCE`` of a source, so a few are enough.
DOCUMENTS = 2
MORE_CHUNKS = 8


def _doc_id(doc: Document) -> str:
    return str((doc.meta or {}).get("doc_id") or doc.id)


@component
class DocumentRest:
    """``documents`` followed by up to ``more_chunks`` other chunks of each of the first ``documents``
    kept documents, taken from ``candidates`` in their order (best first), when the question's form
    asks for something (measures, steps, an interval, a cause, a meaning: ``question_focus``). A
    question without one ("What is the warranty period of the HL-M200?") keeps the kept chunks: the
    rest of a data sheet that names the product would only crowd its answer out."""

    def __init__(self, documents: int = DOCUMENTS, more_chunks: int = MORE_CHUNKS):
        self.documents = documents
        self.more_chunks = more_chunks

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document], candidates: list[Document] | None = None,
            query: str = "") -> dict[str, Any]:
        if question_focus(query) is None:
            return {"documents": documents}
        leading = list(dict.fromkeys(_doc_id(d) for d in documents))[: self.documents]
        have = {d.id for d in documents}
        added: dict[str, int] = {}
        more: list[Document] = []
        for candidate in candidates or []:
            key = _doc_id(candidate)
            if key in leading and candidate.id not in have and added.get(key, 0) < self.more_chunks:
                added[key] = added.get(key, 0) + 1
                have.add(candidate.id)
                more.append(candidate)
        # After the kept chunks: where the context is short, ``PromptFit`` keeps a document's best
        # chunk alone rather than its merged whole.
        return {"documents": [*documents, *more]}

    @component.output_types(documents=list[Document])
    async def run_async(self, documents: list[Document], candidates: list[Document] | None = None,
                        query: str = "") -> dict[str, Any]:
        return self.run(documents, candidates, query)
