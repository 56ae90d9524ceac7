"""The answerer used when no language model is configured: the best sentences, cited.

It never paraphrases: every line is a sentence from a numbered source with its ``[n]``, and
the answer opens by saying plainly that no language model wrote it.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage, ComponentInfo, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback

from pipelines.text import breadcrumb, detect_language, split_sentences, terms

HEADINGS = {
    "en": "No language model is configured, so here are the most relevant passages from the knowledge base:",
    "zh": "未配置语言模型，以下是知识库中最相关的原文段落：",
}
_MARKUP = re.compile(r"^(#{1,6}\s+|[-*+]\s+|\d+[.)、]\s*)")
_TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")


def _clean(sentence: str) -> str:
    return _MARKUP.sub("", sentence).strip()


def answer_sentences(doc: Document) -> list[str]:
    """Sentences that can stand as an answer: not headings, table header rows or questions."""
    meta = doc.meta or {}
    path = [p for p in (meta.get("header") or "").split(" > ") if p]
    headings = set(path) | {meta.get("title") or "", breadcrumb(meta.get("title"), path)}
    raw = split_sentences(doc.content or "")
    out = []
    for i, sentence in enumerate(raw):
        is_table_header = i + 1 < len(raw) and bool(_TABLE_RULE.match(raw[i + 1])) and "|" in raw[i + 1]
        cleaned = _clean(sentence)
        if (_TABLE_RULE.match(sentence) or is_table_header or not cleaned or cleaned in headings
                or cleaned.endswith(("?", "？"))):
            continue
        out.append(sentence)
    return out


def select_sentences(question: str, sources: list[Document], max_sentences: int = 4,
                     max_sources: int = 3) -> list[tuple[int, str]]:
    """(source number, sentence) pairs: the sentences sharing the most weighted terms with the question."""
    q_terms = set(terms(question))
    candidates: list[tuple[float, int, int, str]] = []
    df: Counter[str] = Counter()
    per_source: list[list[str]] = []
    for doc in sources[:max_sources]:
        sentences = answer_sentences(doc)
        per_source.append(sentences)
        for s in sentences:
            df.update(set(terms(s)))
    n = sum(len(s) for s in per_source) or 1
    for number, sentences in enumerate(per_source, start=1):
        for order, sentence in enumerate(sentences):
            overlap = q_terms & set(terms(sentence))
            score = sum(math.log(1 + n / (1 + df[t])) for t in overlap)
            # Earlier sources rank higher: retrieval already judged them more relevant.
            candidates.append((score / (1 + 0.15 * (number - 1)), number, order, sentence))
    picked = [c for c in sorted(candidates, key=lambda c: -c[0]) if c[0] > 0][:max_sentences]
    if not picked and per_source and per_source[0]:
        # Nothing shared lexically (e.g. a Chinese question over English text): the top chunk leads.
        picked = [(0.0, 1, i, s) for i, s in enumerate(per_source[0][:2])]
    picked.sort(key=lambda c: (c[1], c[2]))
    return [(number, _clean(sentence)) for _, number, _, sentence in picked]


def compose(question: str, sources: list[Document]) -> str:
    language = detect_language(question)
    lines = [HEADINGS[language], ""]
    for number, sentence in select_sentences(question, sources):
        lines.append(f"- {sentence} [{number}]")
    return "\n".join(lines).strip()


@component
class ExtractiveAnswerer:
    """Answers with cited source sentences; streams them line by line like a model would."""

    def __init__(self, streaming_callback: StreamingCallbackT | None = None):
        self.streaming_callback = streaming_callback

    def _chunks(self, text: str) -> list[StreamingChunk]:
        info = ComponentInfo.from_component(self)
        pieces = re.findall(r"[^\n]*\n?", text)
        pieces = [p for p in pieces if p]
        return [
            StreamingChunk(content=p, index=0, start=i == 0, component_info=info,
                           finish_reason="stop" if i == len(pieces) - 1 else None)
            for i, p in enumerate(pieces)
        ]

    @component.output_types(replies=list[ChatMessage])
    def run(self, question: str, sources: list[Document],
            streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        text = compose(question, sources)
        if callback:
            for chunk in self._chunks(text):
                callback(chunk)
        return {"replies": [ChatMessage.from_assistant(text, meta={"model": "extractive"})]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, question: str, sources: list[Document],
                        streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        text = compose(question, sources)
        if callback:
            for chunk in self._chunks(text):
                result = callback(chunk)
                if asyncio.iscoroutine(result):
                    await result
        return {"replies": [ChatMessage.from_assistant(text, meta={"model": "extractive"})]}
