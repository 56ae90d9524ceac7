"""Structured facts: table rows kept as entity–attribute–value triples.

At indexing, ``table_facts`` reads each Markdown table of a document (the splitter repeats a
table's header row in every chunk, so chunks are enough). At query time ``FactLookup`` finds the
facts about entities the question names (model numbers, fault codes, row names) for the prompt's
facts block, which ``PromptFit`` fills after documents and history.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from haystack import Document, component

from pipelines.components.shared import FactLines
from pipelines.filters import compile_filter
from pipelines.store import DocRecord, KnowledgeStore
from pipelines.text import identifiers, terms

_ROW = re.compile(r"^\s*\|(.*)\|\s*$")
_RULE = re.compile(r"^[\s:|-]+$")
# A first column headed like this holds attribute names (a specification table), not entities.
_ATTRIBUTE_HEADERS = {"parameter", "parameters", "item", "items", "property", "properties", "characteristic",
                      "specification", "参数", "项目", "技术参数", "名称", "性能"}
MAX_CELL_CHARS = 300


def _cells(line: str) -> list[str] | None:
    match = _ROW.match(line)
    if not match or _RULE.match(match.group(1)):
        return None
    return [c.strip() for c in match.group(1).split("|")]


def _tables(text: str) -> Iterable[list[list[str]]]:
    table: list[list[str]] = []
    for line in (text or "").splitlines():
        if _ROW.match(line):
            cells = _cells(line)
            if cells is not None:
                table.append(cells)
            continue
        if table:
            yield table
        table = []
    if table:
        yield table


_CODE = re.compile(r"^[A-Za-z]{0,4}[-.]?\d[\w.-]*$")


def _is_attribute_header(cell: str) -> bool:
    words = {w.lower() for w in re.split(r"[\s/]+", cell) if w}
    return bool(words & _ATTRIBUTE_HEADERS) or cell.strip().lower() in _ATTRIBUTE_HEADERS


def _names_entities(rows: list[list[str]]) -> bool:
    """The first column holds codes (P02.01, E-004): each row is an entity, whatever the header says."""
    firsts = [r[0] for r in rows if r and r[0]]
    return bool(firsts) and sum(bool(_CODE.match(f)) for f in firsts) >= 0.8 * len(firsts)


def table_facts(text: str, subject: str) -> list[list[str]]:
    """(entity, attribute, value) for every cell of every table in ``text``.

    - A first column headed "Parameter" (参数, Item…) names attributes: with two columns the entity
      is ``subject`` (the document's model); with more, each column is a variant of it
      (``HL-M200 7.5 kW``).
    - Otherwise the first column names the entity (``E-007``) and the header names the attributes.
    """
    facts: list[list[str]] = []
    for table in _tables(text):
        header, rows = table[0], table[1:]
        if len(header) < 2:
            continue
        by_attribute = _is_attribute_header(header[0]) and not _names_entities(rows)
        for row in rows:
            if len(row) != len(header) or not row[0]:
                continue
            for j in range(1, len(header)):
                value = row[j]
                if not value or value in ("-", "—"):
                    continue
                if by_attribute:
                    entity = subject if len(header) == 2 else f"{subject} {header[j]}".strip()
                    attribute = row[0]
                else:
                    entity, attribute = row[0], header[j]
                facts.append([entity[:MAX_CELL_CHARS], attribute[:MAX_CELL_CHARS], value[:MAX_CELL_CHARS]])
    return facts


def document_subject(title: str) -> str:
    """What a document is about, for facts without an entity column: its first model number, else its title."""
    found = identifiers(title)
    return found[0] if found else title


def unique_facts(facts: Iterable[list[str]]) -> list[list[str]]:
    return [list(f) for f in dict.fromkeys(tuple(f) for f in facts)]


def format_fact(fact: list[str], title: str) -> str:
    entity, attribute, value = fact
    return f"{entity} | {attribute} | {value} (from: {title})"


@component
class FactLookup:
    """``facts``: lines ``entity | attribute | value (from: title)`` about entities the query names,
    best-matching attributes first, at most ``max_facts``; only from documents in ``spaces``."""

    def __init__(self, store: KnowledgeStore, max_facts: int = 40):
        self.store = store
        self.max_facts = max_facts
        self._index: tuple[int, list[tuple[DocRecord, list[str], set[str], set[str]]]] | None = None

    def _facts(self) -> list[tuple[DocRecord, list[str], set[str], set[str]]]:
        """Each fact with its record, the keys that name its entity and its content terms, built
        once per knowledge version."""
        version = self.store.knowledge_version
        if self._index is None or self._index[0] != version:
            entries = []
            for record in self.store.records().values():
                for fact in record.facts:
                    keys = {k.lower() for k in identifiers(fact[0])} | {fact[0].lower()}
                    entries.append((record, fact, keys, set(terms(" ".join(fact)))))
            self._index = (version, entries)
        return self._index[1]

    @component.output_types(facts=FactLines)
    def run(self, query: str, spaces: list[str] | None = None, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        """``filters``: the retrieval filter of the turn (spaces and readers), matched against each
        document's record as against its chunks, so a fact never comes from a document the audience
        may not read."""
        admits = compile_filter(filters)
        text = query.lower()
        named = {k.lower() for k in identifiers(query)}
        query_terms = set(terms(query))
        scored = []
        for record, fact, keys, fact_terms in self._facts():
            if spaces and record.space not in spaces:
                continue
            if filters and not admits(Document(content="", meta={"space": record.space, "readers": record.readers,
                                                                  "doc_id": record.doc_id,
                                                                  "language": record.language})):
                continue
            if not (keys & named or any(len(k) >= 4 and k in text for k in keys)):
                continue
            overlap = len(query_terms & fact_terms)
            scored.append((-overlap, len(scored), format_fact(fact, record.title)))
        scored.sort()
        return {"facts": FactLines(line for _, _, line in scored[: self.max_facts])}
