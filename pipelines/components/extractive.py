"""The answerer used when no language model is configured: the best sentences, cited.

It never paraphrases: every line is a sentence from a numbered source with its ``[n]``, and
the answer opens by saying plainly that no language model wrote it.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage, ComponentInfo, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT, select_streaming_callback

from pipelines.components.embedders import SentenceVectors
from pipelines.focus import about_the_document, gives, question_focus
from pipelines.text import breadcrumb, detect_language, identifiers, split_sentences, terms

HEADINGS = {
    "en": "No language model is configured, so here are the most relevant passages from the knowledge base:",
    "zh": "未配置语言模型，以下是知识库中最相关的原文段落：",
}
_MARKUP = re.compile(r"^(#{1,6}\s+|[-*+]\s+|\d+[.)、]\s*)")
_TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")
_SENTENCE_END = ("。", "！", "!", ".", "；")
# multilingual-e5-small scores a question against a sentence of the other language (zh <-> en)
# lower than against an equally relevant sentence of its own: measured on examples/kb, the
# Chinese overheating page's best sentence scored 0.874 for "My motor is overheating, what
# should I check?", below an English maintenance-table row (0.889).
CROSS_LANGUAGE_OFFSET = 0.03
LEXICAL_WEIGHT = 0.03  # shared rare terms (numbers, names) break near-ties of meaning
IDENTIFIER_BONUS = 0.1  # a fault code or model number the question names is an exact key
MAX_SENTENCES_PER_SOURCE = 8  # what is embedded per turn stays small (~20 sentences/s on 2 cores)
# What the question's form asks for (``pipelines.focus``): a sentence that gives it (a measure for
# "what should I do", an interval for "how often") is lifted by as much as the offsets above move a
# sentence (not fitted to a set: the size of the nudges this scoring already makes).
FOCUS_BONUS = 0.03

Similarity = Callable[[str, list[str]], list[float]]  # question, sentences -> cosine each


def _clean(sentence: str) -> str:
    return _MARKUP.sub("", sentence).strip().strip("*_").strip()


def _heading_lines(doc: Document) -> tuple[set[str], list[str]]:
    """Lines that only label the chunk: its title, section headings and the breadcrumb that opens
    it (``Title > Section > 2. Subsection``), and breadcrumb prefixes to recognise them by."""
    meta = doc.meta or {}
    title = str(meta.get("title") or "")
    path = [p for p in str(meta.get("header") or "").split(" > ") if p]
    crumb = breadcrumb(title, path)
    prefixes = [f"{p} > " for p in (title, *path[:1]) if p]
    # A title can be a path itself ("User manual > Settings > Time zone converter"): its parts head
    # the text too.
    return {*path, title, crumb, *(p.strip() for p in title.split(" > ") if p.strip())}, prefixes


def _is_sentence(line: str) -> bool:
    """A title can be the document's only sentence (a one-line .txt file): it ends like one."""
    return line.endswith(_SENTENCE_END) and len(terms(line)) >= 3


def answer_sentences(doc: Document) -> list[str]:
    """Sentences that can stand as an answer: not headings, breadcrumbs, table header rows or questions."""
    headings, prefixes = _heading_lines(doc)
    lines = [ln.strip() for ln in (doc.content or "").splitlines() if ln.strip()]
    out = []
    for i, line in enumerate(lines):
        cleaned = _clean(line)
        if not cleaned or line.startswith(tuple(prefixes)) or line.startswith("#"):
            continue
        if cleaned in headings and not _is_sentence(cleaned):
            continue
        is_table_header = i + 1 < len(lines) and bool(_TABLE_RULE.match(lines[i + 1])) and "|" in lines[i + 1]
        if _TABLE_RULE.match(line) or is_table_header:
            continue
        for sentence in split_sentences(line):
            cleaned = _clean(sentence)
            if cleaned and not cleaned.endswith(("?", "？")) and (cleaned not in headings or _is_sentence(cleaned)):
                out.append(sentence)
    return out


def opening_sentences(doc: Document) -> set[str]:
    """The sentences of a document's introduction, before its first section, when it has sections
    (its merged chunks' breadcrumbs or Markdown headings say so): they announce what the sections
    say, so they do not count as giving what a question asks for. A document of one section has
    no such opening."""
    _, prefixes = _heading_lines(doc)
    lines = [ln.strip() for ln in (doc.content or "").splitlines() if ln.strip()]
    if (doc.meta or {}).get("position", 0) != 0:
        return set()
    for i, line in enumerate(lines):
        if i and (line.startswith("#") or line.startswith(tuple(prefixes))):
            return {s for ln in lines[:i] for s in split_sentences(ln)}
    return set()


def _lexical(question: str, per_source: list[list[str]]) -> list[list[float]]:
    """Per sentence: the idf-weighted terms it shares with the question."""
    q_terms = set(terms(question))
    df: Counter[str] = Counter()
    for sentences in per_source:
        for s in sentences:
            df.update(set(terms(s)))
    n = sum(len(s) for s in per_source) or 1
    return [[sum(math.log(1 + n / (1 + df[t])) for t in q_terms & set(terms(s))) for s in sentences]
            for sentences in per_source]


Candidate = tuple[int, int, str, float]  # source number, order in the source, sentence, lexical score


def _distinguishing(codes: list[str], candidates: list[Candidate]) -> list[str]:
    """The question's codes that single out sentences: a fault code the question asks about is an exact
    key, but a product model that most sources name ("the warranty period of the HL-M200", over its
    data sheet, its manual and the warranty policy) is the topic they share, and a bonus for it would
    prefer any sentence naming the product to the one that answers."""
    by_source: dict[int, str] = {}
    for number, _, sentence, _ in candidates:
        by_source[number] = by_source.get(number, "") + "\n" + sentence.lower()
    texts = list(by_source.values())
    return [c for c in (c.lower() for c in codes) if 2 * sum(c in t for t in texts) <= len(texts)]


_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _holds_language(sentence: str, language: str) -> bool:
    """Whether ``sentence`` is, or has a part, in ``language``: a bilingual table row ("| E-004 | Drive
    overheat / 变频器过热 | …") holds both, and needs no lift for either."""
    return detect_language(sentence) == language or (language == "zh" and len(_CJK.findall(sentence)) >= 4)


def _by_meaning(question: str, candidates: list[Candidate], similarity: Similarity,
                openings: set[tuple[int, str]] = frozenset()) -> list[tuple[float, int, int, str]]:
    """Scores by cosine with the question (the other language's sentences lifted by
    ``CROSS_LANGUAGE_OFFSET``), plus a small share of the lexical score and ``IDENTIFIER_BONUS``
    for a code the question names. Only each source's ``MAX_SENTENCES_PER_SOURCE`` best by shared
    terms are embedded."""
    language = detect_language(question)
    asked = [c.lower() for c in identifiers(question)]
    codes = _distinguishing(identifiers(question), candidates)  # over every sentence: what the sources name
    focus = question_focus(question)
    # A sentence about its document ("本文说明……", "This guide describes…") names the topic and answers
    # nothing: shown only when its sources hold nothing else.
    candidates = [c for c in candidates if not about_the_document(c[2])] or candidates

    def answers_focus(number: int, sentence: str) -> bool:
        return gives(focus, sentence) and not about_the_document(sentence) and (number, sentence) not in openings

    def preference(c: Candidate) -> tuple[bool, bool, float]:
        # Shared terms pick what is embedded; first a sentence naming the code asked about (the table row
        # of "E-007 是什么意思？"), then one giving what the question asks for (a measure rarely repeats
        # the question's words).
        return (any(code in c[2].lower() for code in asked), answers_focus(c[0], c[2]), c[3])

    kept = [c for number in dict.fromkeys(c[0] for c in candidates)
            for c in sorted((c for c in candidates if c[0] == number), key=preference,
                            reverse=True)[:MAX_SENTENCES_PER_SOURCE]]
    cosines = similarity(question, [_clean(s) for _, _, s, _ in kept])
    top = max(lex for *_, lex in kept) or 1.0
    scored = []
    for (number, order, sentence, lex), cosine in zip(kept, cosines):
        score = cosine + LEXICAL_WEIGHT * lex / top
        score += CROSS_LANGUAGE_OFFSET if not _holds_language(sentence, language) else 0.0
        score += IDENTIFIER_BONUS if any(c in sentence.lower() for c in codes) else 0.0
        score += FOCUS_BONUS if answers_focus(number, sentence) else 0.0
        scored.append((score, number, order, sentence))
    return scored


def _considered(sources: list[Document], max_sources: int) -> list[tuple[int, Document]]:
    """(source number, source) of the first ``max_sources`` sources, plus the best-ranked source of
    each language they lack: the ranker gives the other language's best chunk a slot of its own
    at the end of the ranking (``components/ranker.py``), and an English question whose answer is
    on a Chinese page (the sample KB's overheating guide, ranked fifth) needs it considered;
    ``_by_meaning`` then weighs it against the rest."""
    considered = list(enumerate(sources[:max_sources], start=1))
    languages = {doc.meta.get("language") for _, doc in considered}
    for number, doc in enumerate(sources[max_sources:], start=max_sources + 1):
        language = doc.meta.get("language")
        if language and language not in languages:
            considered.append((number, doc))
            languages.add(language)
    return considered


def select_sentences(question: str, sources: list[Document], max_sentences: int = 4, max_sources: int = 4,
                     similarity: Similarity | None = None) -> list[tuple[int, str]]:
    """(source number, sentence) pairs, in source order: with ``similarity`` (the embedder) the
    sentences closest in meaning (``_by_meaning``); without it, those sharing the most weighted
    terms with the question, earlier sources first (retrieval judged them more relevant)."""
    considered = _considered(sources, max_sources)
    per_source = [answer_sentences(doc) for _, doc in considered]
    lexical = _lexical(question, per_source)
    candidates: list[Candidate] = [
        (number, order, sentence, lexical[i][order])
        for i, (number, _) in enumerate(considered) for order, sentence in enumerate(per_source[i])]
    if not candidates:
        return []
    if similarity is not None:
        openings = {(number, s) for (number, doc) in considered for s in opening_sentences(doc)}
        scored = _by_meaning(question, candidates, similarity, openings)
    else:
        scored = [(lex / (1 + 0.15 * (number - 1)), number, order, s) for number, order, s, lex in candidates if lex > 0]
        if not scored:
            # Nothing shared lexically (e.g. a Chinese question over English text): the top chunk leads.
            first = candidates[0][0]
            scored = [(0.0, number, order, s) for number, order, s, _ in candidates if number == first][:2]
    picked = sorted(scored, key=lambda c: -c[0])[:max_sentences]
    picked.sort(key=lambda c: (c[1], c[2]))
    return [(number, _clean(sentence)) for _, number, _, sentence in picked]


def embedding_similarity(text_embedder: Any, document_embedder: Any) -> Similarity:
    """``Similarity`` from the pipeline's embedders (question as a query, sentences as passages)."""
    vectors = SentenceVectors(text_embedder, document_embedder)

    def similarity(question: str, sentences: list[str]) -> list[float]:
        return (vectors.passages(sentences) @ vectors.query(question)).tolist()

    return similarity


def compose(question: str, sources: list[Document], similarity: Similarity | None = None) -> str:
    language = detect_language(question)
    lines = [HEADINGS[language], ""]
    for number, sentence in select_sentences(question, sources, similarity=similarity):
        lines.append(f"- {sentence} [{number}]")
    return "\n".join(lines).strip()


@component
class ExtractiveAnswerer:
    """Answers with cited source sentences; streams them line by line like a model would.

    ``similarity`` (see ``embedding_similarity``) picks sentences by meaning; without it, by
    shared words."""

    def __init__(self, streaming_callback: StreamingCallbackT | None = None, similarity: Similarity | None = None):
        self.streaming_callback = streaming_callback
        self.similarity = similarity

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
        text = compose(question, sources, self.similarity)
        if callback:
            for chunk in self._chunks(text):
                callback(chunk)
        return {"replies": [ChatMessage.from_assistant(text, meta={"model": "extractive"})]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, question: str, sources: list[Document],
                        streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        # Choosing by meaning embeds the question and up to a few sentences of each source (~0.3-0.8 s of
        # the model): in a thread, or every other turn on the event loop would wait that long.
        text = compose(question, sources) if self.similarity is None else \
            await asyncio.to_thread(compose, question, sources, self.similarity)
        if callback:
            for chunk in self._chunks(text):
                result = callback(chunk)
                if asyncio.iscoroutine(result):
                    await result
        return {"replies": [ChatMessage.from_assistant(text, meta={"model": "extractive"})]}
