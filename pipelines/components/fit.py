"""Fits the prompt's context into ``context_chars`` characters, in priority order.

Retrieved chunks come first (best first, never cut mid-chunk: a chunk that does not fit is
left out whole; chunks of one document become one source, so a document has one ``[n]``), then
thread history (newest turns first, shown in chronological order), then structured facts. An empty
block says so in words, so the model never mistakes a missing block for a formatting accident.
"""

from __future__ import annotations

from typing import Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage

from pipelines.components.shared import FactLines, Passage
from pipelines.text import LANGUAGE_NAMES, detect_language, neutralize_tags

NO_SOURCES = "(no knowledge-base passages were retrieved)"
NO_HISTORY = "(this is the first message of the conversation)"
NO_FACTS = "(no structured facts apply)"


def format_source(number: int, doc: Document) -> str:
    meta = doc.meta or {}
    title = meta.get("title") or meta.get("source") or "untitled"
    header = meta.get("header")
    label = f"{title} — {header}" if header and header != title else title
    label = neutralize_tags(label).replace('"', "'")
    return f'<source id="{number}" title="{label}">\n{neutralize_tags((doc.content or "").strip())}\n</source>'


def format_turn(message: ChatMessage) -> str:
    role = "User" if message.role.value == "user" else "kbbot"
    return f"{role}: {neutralize_tags((message.text or '').strip())}"


def by_document(documents: list[Document]) -> list[list[Document]]:
    """Chunks grouped by document, groups in order of their best chunk, chunks in document order."""
    groups: dict[str, list[Document]] = {}
    for doc in documents:
        groups.setdefault(str((doc.meta or {}).get("doc_id") or doc.id), []).append(doc)
    return [sorted(g, key=lambda d: (d.meta or {}).get("position", 0)) for g in groups.values()]


def merged(chunks: list[Document], lead: Document) -> Document:
    """One source of a document's chunks, with the meta of ``lead``, its best-ranked chunk."""
    if len(chunks) == 1:
        return lead
    content = "\n".join((c.content or "").strip() for c in chunks)
    return Passage(content=content, meta=dict(lead.meta or {}), score=lead.score)


@component
class PromptFit:
    """Chooses what goes into the prompt; outputs the blocks for ``ChatPromptBuilder``.

    ``sources`` are the chunks given to the model, in the order of their ``[n]`` numbers.
    """

    def __init__(self, context_chars: int = 12000):
        if context_chars <= 0:
            raise ValueError("context_chars must be positive")
        self.context_chars = context_chars

    @component.output_types(
        sources=list[Document], sources_block=str, history_block=str, facts_block=str,
        question=str, language=str, language_name=str, preferences_block=str,
    )
    def run(
        self,
        question: str,
        documents: list[Document],
        history: list[ChatMessage] | None = None,
        facts: FactLines | list[str] | None = None,
        preferences: str = "",
    ) -> dict[str, Any]:
        """``preferences``: how this user wants answers written (a few lines, outside ``context_chars``)."""
        remaining = self.context_chars
        sources: list[Document] = []
        source_parts: list[str] = []
        # Ranks by identity: ``documents.index`` compares Documents by their whole ``to_dict()``.
        rank = {id(d): i for i, d in enumerate(documents)}
        for chunks in by_document(documents):
            # The whole document's chunks if they fit, else its best chunk alone.
            lead = min(chunks, key=lambda d: rank[id(d)])
            for doc in (merged(chunks, lead), lead):
                part = format_source(len(sources) + 1, doc)
                if len(part) + 1 <= remaining:
                    remaining -= len(part) + 1
                    sources.append(doc)
                    source_parts.append(part)
                    break

        turns: list[str] = []
        for message in reversed(history or []):
            part = format_turn(message)
            if len(part) + 1 > remaining:
                break
            remaining -= len(part) + 1
            turns.append(part)
        turns.reverse()

        fact_parts: list[str] = []
        for fact in facts or []:
            fact = neutralize_tags(fact)
            if len(fact) + 3 > remaining:
                break
            remaining -= len(fact) + 3
            fact_parts.append(f"- {fact}")

        language = detect_language(question)
        return {
            "sources": sources,
            "sources_block": "\n".join(source_parts) or NO_SOURCES,
            "history_block": "\n".join(turns) or NO_HISTORY,
            "facts_block": "\n".join(fact_parts) or NO_FACTS,
            "question": neutralize_tags(question),
            "language": language,
            "language_name": LANGUAGE_NAMES[language],
            "preferences_block": neutralize_tags(preferences.strip()),
        }

    @component.output_types(
        sources=list[Document], sources_block=str, history_block=str, facts_block=str,
        question=str, language=str, language_name=str, preferences_block=str,
    )
    async def run_async(
        self,
        question: str,
        documents: list[Document],
        history: list[ChatMessage] | None = None,
        facts: FactLines | list[str] | None = None,
        preferences: str = "",
    ) -> dict[str, Any]:
        """``run`` on the event loop (string work under a millisecond: less than a thread hop)."""
        return self.run(question, documents, history, facts, preferences)
