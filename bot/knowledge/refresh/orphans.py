"""Revoking the documents of sources that are no longer configured, without losing an answer on the way."""

from __future__ import annotations

import logging
from collections.abc import Callable

from bot.settings import SourceSettings
from pipelines.sources import SOURCE_KINDS
from pipelines.sources.kind import named_root
from pipelines.store import DocRecord

log = logging.getLogger("kbbot.refresh")


class Orphans:
    """Which documents of sources that are no longer configured one run of ``own`` revokes.

    A document is an orphan when its root is no configured source's (``SourceKind.roots``): a named
    root (``urls:<name>``, ``confluence:<name>``) of a source renamed or removed, or a folder that a
    configured source once completed a run with (the completed-roots registry of the ``RunLog``) and none has now. A folder
    indexed ad hoc (``kbbot index PATH``) never was a configured source's root and is left alone.

    Safety, so that no answer goes missing on the way:

    - nothing is revoked until every configured source has completed a run with its current roots
      and a full listing (this run counts once it is through its items): a renamed source has then
      published its documents under its new name first. Until then the orphans are kept, with a warning;
    - a document that a configured source still lists is not an orphan, even if that source could not
      read it (it keeps its version until it is read): what this run listed and what the other sources
      claim (``claims``: ``SourceKind.claims``, e.g. the other URL sources' pages, configured or from their
      sitemaps' last listings, and the files in the other folders).
    """

    def __init__(self, own: SourceSettings, sources: list[SourceSettings], completed: dict[str, str],
                 claims: Callable[[list[str]], set[str]]):
        self.own = own
        self.sources = sources
        self.completed = set(completed)
        self.configured = {root for src in sources for root in src.kind.roots(src)}
        self.claims = claims
        self.named = tuple(named_root(kind.name, "") for kind in SOURCE_KINDS.values() if kind.named_roots)
        #: Roots of the orphans a run kept (None until it checked): the registry forgets the others.
        self.kept_roots: set[str] | None = None

    def is_orphan_root(self, root: str | None) -> bool:
        return (root is not None and root not in self.configured
                and (root.startswith(self.named) or root in self.completed))

    def waiting_for(self, own_complete: bool) -> list[str]:
        """The configured sources that have not completed a run with their current roots."""
        done = self.completed | (set(self.own.kind.roots(self.own)) if own_complete else set())
        return [src.name for src in self.sources if not set(src.kind.roots(src)) <= done]

    def select(self, records: dict[str, DocRecord], seen: set[str], *, own_complete: bool) -> list[str]:
        """The doc ids to revoke now (``Indexer.refresh``'s ``orphans``); never raises: a surprise revokes nothing."""
        try:
            return self._select(records, seen, own_complete)
        except Exception:  # noqa: BLE001 - keeping documents is the safe way to fail
            log.exception("refresh source=%s: checking for documents of sources no longer configured failed; "
                          "none revoked", self.own.name)
            return []

    def _select(self, records: dict[str, DocRecord], seen: set[str], own_complete: bool) -> list[str]:
        candidates = {doc_id: r for doc_id, r in records.items() if self.is_orphan_root(r.root)}
        if not candidates:
            self.kept_roots = set()
            return []
        waiting = self.waiting_for(own_complete)
        if waiting:
            self.kept_roots = {r.root for r in candidates.values() if r.root}
            log.warning("refresh source=%s: %d documents of sources no longer configured (%s) are kept until %s "
                        "completed a run", self.own.name, len(candidates), ", ".join(sorted(self.kept_roots)),
                        ", ".join(waiting))
            return []
        claimed = (seen | self.claims(list(candidates))) & set(candidates)
        chosen = [doc_id for doc_id in candidates if doc_id not in claimed]
        self.kept_roots = {candidates[d].root for d in claimed if candidates[d].root}  # type: ignore[misc]
        by_root: dict[str, list[str]] = {}
        for doc_id in chosen:
            by_root.setdefault(candidates[doc_id].root or "", []).append(candidates[doc_id].source)
        for root, docs in sorted(by_root.items()):
            log.info("refresh source=%s: revoking %d documents of %s, which is no configured source's (e.g. %s)",
                     self.own.name, len(docs), root, docs[0])
        if claimed:
            log.info("refresh source=%s: %d documents of sources no longer configured are kept: a configured "
                     "source still lists them", self.own.name, len(claimed))
        return chosen

    def forgettable(self) -> list[str]:
        """Registry roots no configured source has and no document is kept under any more."""
        if self.kept_roots is None:
            return []
        return sorted(r for r in self.completed if r not in self.configured and r not in self.kept_roots)

