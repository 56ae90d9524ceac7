"""What one refresh changed, as the after-refresh hooks receive it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipelines.indexing import IndexReport


@dataclass(frozen=True)
class KnowledgeChanges:
    """The sources (paths or URLs, as citations name them) a refresh added, changed or removed."""

    source: str = ""  # the configured source that ran
    added: frozenset[str] = field(default_factory=frozenset)
    changed: frozenset[str] = field(default_factory=frozenset)
    removed: frozenset[str] = field(default_factory=frozenset)
    knowledge_version: int = 0

    @classmethod
    def of_report(cls, report: IndexReport, source: str = "") -> KnowledgeChanges:
        return cls(source, frozenset(report.added), frozenset(report.changed),
                   frozenset(report.removed) | frozenset(report.orphaned), report.knowledge_version)

    @property
    def any(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def touches(self, citations: Iterable[dict[str, Any]]) -> bool:
        """Whether a document among ``citations`` (``Citation.to_dict()``) changed or went away."""
        gone = self.changed | self.removed
        return any(str(c.get("source") or "") in gone for c in citations)
