"""``Refresher``: one run of a source at a time, under the refresh lock, in a worker thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bot.knowledge.refresh.orphans import Orphans
from bot.knowledge.refresh.runs import RunLog, RunRecord, log_run, run_log
from bot.knowledge.refresh.schedule import is_due, permissions_run_name, schedule_zone, utcnow
from bot.settings import Settings, SourceSettings
from bot.state import MemoryLock, RenewingLock
from bot.state.redis import RedisLock
from pipelines.errors import ServiceUnavailable, one_line
from pipelines.indexing import Indexer, IndexReport, Progress, RefreshAborted
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import ConfiguredSource, Source, SourceError
from pipelines.store import DocRecord, KnowledgeStore

log = logging.getLogger("kbbot.refresh")

LOCK_NAME = "refresh"


class RefreshBusy(RuntimeError):
    """Another refresh held the lock for longer than this run was willing to wait."""


class UnknownSource(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class RefreshChanges:
    """What one run of a source changed, as the hooks after it see it (``Refresher.after_change``).

    Documents are named by their ``source`` (the path or URL a citation of them carries)."""

    source: str
    space: str
    trigger: str
    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    knowledge_version: int = 0  # the version the run published (0: unknown)

    @property
    def new_or_changed(self) -> frozenset[str]:
        return frozenset(self.added) | frozenset(self.changed)

    @property
    def any(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def touches(self, citations: Iterable[dict[str, Any]]) -> bool:
        """Whether a document among ``citations`` (``Citation.to_dict()``) changed or went away."""
        gone = frozenset(self.changed) | frozenset(self.removed)
        return any(str(c.get("source") or "") in gone for c in citations)


#: A hook run after a refresh that changed documents (re-answering gaps, re-checking approved answers).
AfterChange = Callable[[RefreshChanges], Awaitable[Any]]


class Refresher:
    """Runs sources (configured ones by name, or an ad-hoc ``Source``) under the refresh lock."""

    def __init__(self, settings: Settings, store: KnowledgeStore, indexer: Indexer, *, redis: Any = None,
                 runs: RunLog | None = None, lock_factory: Callable[[float], RenewingLock] | None = None):
        self.settings = settings
        self.store = store
        self.indexer = indexer
        self.redis = redis
        self.runs = runs if runs is not None else run_log(settings, redis)
        self._lock_factory = lock_factory
        self.stopping = False  # set on shutdown: a run stops before its next document
        #: Run, in order, after each run that added, changed or removed documents, once the refresh lock is
        #: released (their work, such as answering again, must not hold up the next source's refresh). One
        #: replica runs a given refresh, so each hook runs once per change across replicas.
        self.after_change: list[AfterChange] = []

    @property
    def sources(self) -> dict[str, SourceSettings]:
        return {s.name: s for s in self.settings.sources}

    def source(self, name: str) -> SourceSettings:
        try:
            return self.sources[name]
        except KeyError:
            known = ", ".join(self.sources) or "none configured"
            raise UnknownSource(f"no source named {name!r} (sources: {known})") from None

    def lock(self, wait_s: float = 0.0) -> RenewingLock:
        r = self.settings.refresh
        if self._lock_factory is not None:
            return self._lock_factory(wait_s)
        if self.redis is not None:
            return RedisLock(self.redis, LOCK_NAME, ttl_s=r.lock_ttl_s, prefix=self.settings.redis_prefix,
                             wait_s=wait_s, poll_s=0.5)
        return MemoryLock(LOCK_NAME, ttl_s=r.lock_ttl_s, wait_s=wait_s)

    async def last_run(self, name: str) -> RunRecord | None:
        return await self.runs.last_run(name)

    async def permissions_read(self, name: str) -> datetime | None:
        """When the permissions of source ``name`` were last read: by its last run of either kind."""
        runs = [await self.runs.last_run(name), await self.runs.last_run(permissions_run_name(name))]
        return max((r.started for r in runs if r is not None), default=None)

    def build_source(self, src: SourceSettings, states: dict[str, FetchState] | None = None, *,
                     permissions_only: bool = False) -> ConfiguredSource:
        return src.kind.build(src, self.settings.source_context, states or {}, permissions_only=permissions_only)

    async def orphans(self, src: SourceSettings) -> Orphans | None:
        """What a run of ``src`` needs to reconcile the configuration; None (reconcile nothing) when the
        run log cannot be read."""
        others = [other for other in self.settings.sources if other.name != src.name]
        try:
            completed = await self.runs.completed_roots()
            # What the others' last runs listed (a URL source's sitemaps) may still claim a document.
            states = {other.name: await self.runs.fetch_states(other.name) for other in others
                      if other.kind.keeps_states}
        except Exception as exc:  # noqa: BLE001 - keeping documents is the safe way to fail
            log.warning("refresh source=%s: cannot read the run log (%s); documents of sources no longer "
                        "configured are not checked this run", src.name, one_line(exc))
            return None
        context = self.settings.source_context

        def claims(doc_ids: list[str]) -> set[str]:
            return set().union(*(other.kind.claims(other, doc_ids, states.get(other.name, {}), context)
                                 for other in others))

        return Orphans(src, list(self.settings.sources), completed, claims)

    async def _acquire(self, wait_s: float, on_wait: Callable[[], None] | None) -> RenewingLock:
        lock = self.lock(wait_s)
        if await lock.acquire():
            return lock
        if on_wait is not None:
            on_wait()
        if wait_s > 0 and await lock.acquire(blocking=True, timeout=wait_s):
            return lock
        raise RefreshBusy(f"another refresh is running (waited {wait_s:g} s for it)")

    async def run(self, name: str, *, trigger: str = "manual", only_if_due: bool = False,
                  wait_s: float | None = None, progress: Progress | None = None,
                  on_wait: Callable[[], None] | None = None, permissions_only: bool = False) -> RunRecord | None:
        """Refresh source ``name`` now; None when ``only_if_due`` and it was not due (anymore).

        :raises UnknownSource: no such source. :raises RefreshBusy: the lock stayed taken for ``wait_s``.
        """
        src = self.source(name)
        wait_s = self.settings.refresh.lock_wait_s if wait_s is None else wait_s
        lock = await self._acquire(wait_s, on_wait)
        try:
            if only_if_due:
                if permissions_only:
                    last_started = await self.permissions_read(name)
                else:
                    last = await self.runs.last_run(name)
                    last_started = last.started if last else None
                if not is_due(src, last_started, schedule_zone(self.settings), permissions=permissions_only):
                    log.info("refresh source=%s trigger=%s%s skipped: already run at %s (another replica?)",
                             name, trigger, " permissions-only" if permissions_only else "",
                             last_started.isoformat(timespec="seconds") if last_started else "?")
                    return None
            record, changes = await self._run_locked(src, trigger, lock, progress, permissions_only)
        finally:
            if lock.held:
                await lock.release()
        if changes is not None:
            await self._changed(changes)
        return record

    async def _changed(self, changes: RefreshChanges) -> None:
        for hook in self.after_change:
            try:
                await hook(changes)
            except Exception:  # noqa: BLE001 - the refresh is done; one hook's failure stops no other
                log.exception("refresh source=%s: a hook after the refresh failed (%s)", changes.source,
                              getattr(hook, "__qualname__", hook))

    async def _run_locked(self, src: SourceSettings, trigger: str, lock: RenewingLock,
                          progress: Progress | None, permissions_only: bool = False,
                          ) -> tuple[RunRecord, RefreshChanges | None]:
        kind = src.kind
        states = await self.runs.fetch_states(src.name) if kind.keeps_states else {}
        source = self.build_source(src, states, permissions_only=permissions_only)
        orphans = await self.orphans(src)
        started = utcnow()
        report = IndexReport()
        error: str | None = None

        def select_orphans(records: dict[str, DocRecord], seen: set[str]) -> list[str]:
            assert orphans is not None
            return orphans.select(records, seen, own_complete=source.listed_completely)

        def work() -> None:
            try:
                self.indexer.refresh(source, space=src.space, progress=progress, report=report,
                                     should_stop=lambda: lock.lost or self.stopping,
                                     orphans=select_orphans if orphans is not None and not permissions_only else None,
                                     permissions_only=permissions_only)
            finally:
                source.close()

        try:
            await asyncio.to_thread(work)
        except (FileNotFoundError, ServiceUnavailable, RefreshAborted, SourceError) as exc:
            error = one_line(exc)
        except Exception as exc:  # noqa: BLE001 - recorded; the next run retries
            log.exception("refresh of %s failed", src.name)
            error = f"{type(exc).__name__}: {one_line(exc)}"
        finished = error is None
        if error is None:
            error = source.run_error()
        duration = (utcnow() - started).total_seconds()
        record = RunRecord.of(src.name, trigger, started, duration, report, error, disallowed=len(source.disallowed))
        if permissions_only:
            # Not the source's last run: its content was not refreshed, so its schedule and validators stand.
            # Recorded under a name of its own, which its own schedule reads (``permissions_interval``).
            # No hook runs: no document's text changed (the caches' knowledge version did).
            record = replace(record, source=permissions_run_name(src.name))
            try:
                await self.runs.save_run(record)
            except Exception:  # noqa: BLE001 - the permissions are refreshed; only their record is missing
                log.exception("could not record the permissions refresh of %s", src.name)
            log_run(record)
            return record, None
        try:
            await self.runs.save_run(record)
            if kind.keeps_states:
                # A finished run keeps the validators of what it saw; a broken one also keeps the old ones.
                kept = dict(source.updated_states) if error is None else {**states, **source.updated_states}
                await self.runs.save_fetch_states(src.name, kept)
            if error is None and source.listed_completely:
                await self.runs.save_completed_roots(kind.roots(src), record.started_at)
            if finished and orphans is not None and orphans.forgettable():
                await self.runs.forget_roots(orphans.forgettable())
        except Exception:  # noqa: BLE001 - the knowledge is refreshed; only its record is missing
            log.exception("could not record the refresh of %s", src.name)
        log_run(record)
        changes = None
        removed = (*report.removed, *report.orphaned)  # an orphan's chunks are gone as a removed document's
        if report.added or report.changed or removed:  # also a run that failed part way
            changes = RefreshChanges(src.name, src.space, trigger, tuple(report.added), tuple(report.changed),
                                     removed, report.knowledge_version or 0)
        return record, changes

    async def run_source(self, source: Source, *, space: str, progress: Progress | None = None,
                         wait_s: float | None = None, on_wait: Callable[[], None] | None = None) -> IndexReport:
        """An ad-hoc source (``kbbot index PATH``) under the same lock; errors propagate."""
        wait_s = self.settings.refresh.lock_wait_s if wait_s is None else wait_s
        lock = await self._acquire(wait_s, on_wait)
        try:
            return await asyncio.to_thread(self.indexer.refresh, source, space=space, progress=progress,
                                           should_stop=lambda: lock.lost)
        finally:
            await lock.release()

