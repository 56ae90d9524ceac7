"""Section- and sentence-aware chunking for Chinese and English Markdown.

Haystack's splitters either split on spaces (a Chinese paragraph stays one piece) or need
nltk models we cannot download; ``MarkdownHeaderSplitter`` knows sections but not CJK
sentences. This splitter cuts at Markdown sections first, keeps paragraphs, list items and
table rows whole, breaks over-long paragraphs at 。！？ / .!? sentence ends, repeats a table's
header row in every chunk of the table, and starts each chunk with its breadcrumb (document
title > section) so a chunk read alone still says what it is about; BM25 gains most from it,
since questions name the product or topic that titles carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from haystack import Document, component

from pipelines.components.converter import MARKDOWN_FORMATS, Failure
from pipelines.text import breadcrumb, detect_language, split_sentences

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


@dataclass
class Section:
    path: list[str]
    lines: list[str] = field(default_factory=list)


def parse_sections(text: str, markdown: bool) -> list[Section]:
    """Sections of a Markdown text by ATX headings (ignoring ``#`` inside code fences)."""
    sections = [Section(path=[])]
    if not markdown:
        sections[0].lines = text.splitlines()
        return sections
    stack: list[tuple[int, str]] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match:
            level, title = len(match.group(1)), match.group(2).strip()
            stack = [(lvl, t) for lvl, t in stack if lvl < level] + [(level, title)]
            sections.append(Section(path=[t for _, t in stack]))
        else:
            sections[-1].lines.append(line)
    return [s for s in sections if any(line.strip() for line in s.lines)]


def blocks_of(lines: list[str]) -> list[list[str]]:
    """Paragraphs (split at blank lines) and tables (runs of ``|`` rows) as blocks of lines."""
    blocks: list[list[str]] = []
    current: list[str] = []
    current_is_table = False
    for line in lines:
        is_table = bool(_TABLE_ROW.match(line))
        if not line.strip() or (current and is_table != current_is_table):
            if current:
                blocks.append(current)
            current = [] if not line.strip() else [line]
            current_is_table = is_table
            continue
        if not current:
            current_is_table = is_table
        current.append(line)
    if current:
        blocks.append(current)
    return blocks


def units_of(block: list[str], max_chars: int) -> list[tuple[str, bool]]:
    """Pieces of a block that fit ``max_chars``: (text, joins_previous_paragraph)."""
    text = "\n".join(block)
    if len(text) <= max_chars:
        return [(text, False)]
    if _TABLE_ROW.match(block[0]):
        header = block[:2] if len(block) > 1 and _TABLE_RULE.match(block[1]) else block[:1]
        rows = block[len(header) :]
        units, group = [], list(header)
        for row in rows:
            if len("\n".join(group + [row])) > max_chars and len(group) > len(header):
                units.append(("\n".join(group), bool(units)))
                group = list(header)
            group.append(row)
        units.append(("\n".join(group), bool(units)))
        return units
    pieces: list[tuple[str, bool]] = []
    for i, sentence in enumerate(split_sentences(text)):
        # A single sentence longer than the limit is cut at the limit; nothing else is.
        for start in range(0, len(sentence), max_chars):
            pieces.append((sentence[start : start + max_chars], i > 0 or start > 0))
    return pieces


def _joiner(a: str, b: str) -> str:
    """Sentences of one Chinese paragraph join without a space; others with one."""
    if a.endswith(("。", "！", "？", "；")) or detect_language(b[:20]) == "zh" and detect_language(a[-20:]) == "zh":
        return ""
    return " "


@component
class SectionSplitter:
    """Splits documents into chunks of at most about ``chunk_chars`` characters.

    Outputs chunks with ``header`` (the section path), ``language`` (of the chunk) and the
    parent document's meta; positions are assigned when the chunks are published.
    """

    def __init__(self, chunk_chars: int = 700, overlap_sentences: int = 1, max_chunks: int | None = None):
        if chunk_chars < 100:
            raise ValueError("chunk_chars must be at least 100")
        self.chunk_chars = chunk_chars
        self.overlap_sentences = overlap_sentences
        self.max_chunks = max_chunks

    @component.output_types(documents=list[Document], failures=list[Failure])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        """``failures``: the documents (by ``meta.doc_id``, all their parts) with more than ``max_chunks``
        chunks, left out whole: each chunk costs an embedding, and one file must not hold a refresh."""
        chunks: dict[str, list[Document]] = {}
        for doc in documents:
            chunks.setdefault(str((doc.meta or {}).get("doc_id", id(doc))), []).extend(self.split(doc))
        failures = [Failure(str(parts[0].meta.get("source") or key),
                            f"refused: it makes {len(parts):,} chunks, over the {self.max_chunks:,} limit "
                            "(indexing.max_document_chunks)")
                    for key, parts in chunks.items() if self.max_chunks is not None and len(parts) > self.max_chunks]
        kept = [c for parts in chunks.values() if self.max_chunks is None or len(parts) <= self.max_chunks for c in parts]
        return {"documents": kept, "failures": failures}

    def split(self, doc: Document) -> list[Document]:
        text = doc.content or ""
        markdown = (doc.meta or {}).get("format") in MARKDOWN_FORMATS
        title = (doc.meta or {}).get("title") or ""
        out: list[Document] = []
        for section in parse_sections(text, markdown):
            header = " > ".join(section.path)
            crumb = breadcrumb(title, section.path)
            prefix = f"{crumb}\n" if crumb else ""
            budget = max(self.chunk_chars - len(prefix), 50)
            for body in self._pack(section.lines, budget):
                # A plain-text document's first line is its title: do not say it twice.
                content = body if crumb and body.startswith(crumb) else prefix + body
                meta = {**(doc.meta or {}), "header": header, "language": detect_language(content)}
                out.append(Document(content=content, meta=meta))
        return out

    def _pack(self, lines: list[str], budget: int) -> list[str]:
        chunks: list[str] = []
        current: list[tuple[str, bool]] = []

        def length(items: list[tuple[str, bool]]) -> int:
            return sum(len(t) + 2 for t, _ in items)

        def render(items: list[tuple[str, bool]]) -> str:
            out = ""
            for text, joins in items:
                if not out:
                    out = text
                elif joins:
                    out += _joiner(out, text) + text
                else:
                    out += "\n\n" + text
            return out

        for block in blocks_of(lines):
            for unit in units_of(block, budget):
                if current and length(current) + len(unit[0]) > budget:
                    chunks.append(render(current))
                    # Overlap only inside a paragraph that continues into the next chunk.
                    carry = current[-self.overlap_sentences :] if unit[1] and self.overlap_sentences else []
                    current = [(t, j) for t, j in carry if length(carry) + len(unit[0]) <= budget]
                    if current:
                        current[0] = (current[0][0], False)
                current.append(unit)
        if current:
            chunks.append(render(current))
        return [c for c in chunks if c.strip()]
