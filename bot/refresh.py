"""Refreshing the configured sources: one run at a time, its record, and the knowledge status.

``Refresher.run(name)`` takes the refresh lock (``RedisLock`` across replicas when ``REDIS_URL`` is
set, else a lock of this process), optionally checks that the source is still due (another replica
may just have run it), then runs ``Indexer.refresh`` in a worker thread, so the event loop keeps
answering chat turns and renewing the lock while documents are embedded. The lock is renewed every
third of ``refresh.lock_ttl_s``; a replica that dies mid-run stops renewing and its lock expires,
and since every document is published atomically the previous knowledge stays fully served. A run
that finds its lock lost stops before its next document.

Each run leaves a ``RunRecord`` (the last one per source is kept, with counts per file format) and,
for URL sources, the validators of what it downloaded (for Confluence sources, the page versions). With Redis (keys after ``redis_prefix``):

====================================  ======  ==================================================
key                                   type    contents
====================================  ======  ==================================================
``{prefix}refresh:run:{source}``      string  the source's last ``RunRecord`` as JSON
``{prefix}refresh:fetch:{source}``    hash    url -> ``FetchState`` JSON (ETag, Last-Modified,
                                              content hash; a sitemap's listed pages); Confluence:
                                              doc id -> version and content hash
``{prefix}refresh:roots``             hash    root -> when a configured source last completed a
                                              run with it (``Orphans``)
``{prefix}lock:refresh``              string  the refresh lock (``bot.redis_state.RedisLock``)
====================================  ======  ==================================================

Without Redis they live in ``<data_dir>/refresh.json``.

Every run also reconciles the configuration: once its own documents are published, it revokes the
documents of sources that are no longer configured (renamed or removed; see ``Orphans`` for when it
waits instead). A URL source reads robots.txt unless ``respect_robots: false``; a host whose
robots.txt cannot be had fails the run with the reason (its pages keep their versions).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from bot.health import check_redis, check_store
from bot.metrics import METRICS
from bot.settings import Settings, SourceSettings
from bot.state import MemoryLock, RenewingLock
from pipelines.confluence import ConfluenceClient, ConfluenceError, ConfluenceSource
from pipelines.errors import ServiceUnavailable
from pipelines.indexing import (
    FolderSource,
    FormatCounts,
    Indexer,
    IndexReport,
    Progress,
    RefreshAborted,
    Source,
    discover,
)
from pipelines.sources import Fetcher, FetchState, Robots, UrlSource, is_sitemap, normalise_url
from pipelines.store import DocRecord, KnowledgeStore

log = logging.getLogger("kbbot.refresh")

LOCK_NAME = "refresh"
#: Clock skew between replicas tolerated when deciding whether a run is still due.
DUE_TOLERANCE_S = 30.0


class RefreshBusy(RuntimeError):
    """Another refresh held the lock for longer than this run was willing to wait."""


class UnknownSource(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z") if moment else None


def parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- run records ---------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One run of one source, as ``kbbot status`` shows it."""

    source: str
    trigger: str  # schedule | manual | admin | startup
    started_at: str
    duration_s: float
    ok: bool  # the run finished (documents may still have failed: see ``failed``)
    error: str | None = None  # why the run itself failed
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    failed: list[dict[str, str]] = field(default_factory=list)  # {"source", "reason"} per document
    knowledge_version: int | None = None
    orphaned: int = 0  # documents revoked because their source is no longer configured
    disallowed: int = 0  # pages robots.txt kept this run from fetching (revoked if they were indexed)
    #: Per file type: {"documents", "ocr_pages", "failed"} converted this run.
    formats: dict[str, dict[str, int]] = field(default_factory=dict)

    MAX_FAILURES = 200

    @property
    def started(self) -> datetime:
        moment = parse_iso(self.started_at)
        assert moment is not None
        return moment

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunRecord:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)

    @classmethod
    def of(cls, source: str, trigger: str, started: datetime, duration_s: float, report: IndexReport | None,
           error: str | None, *, disallowed: int = 0) -> RunRecord:
        record = cls(source=source, trigger=trigger, started_at=iso(started) or "", duration_s=round(duration_s, 3),
                     ok=error is None, error=error, disallowed=disallowed)
        if report is not None:
            record.added, record.changed = len(report.added), len(report.changed)
            record.removed, record.unchanged = len(report.removed), len(report.unchanged)
            record.orphaned = len(report.orphaned)
            record.failed = [{"source": f.source, "reason": f.reason} for f in report.failed[: cls.MAX_FAILURES]]
            record.knowledge_version = report.knowledge_version or None
            record.formats = {name: asdict(counts) for name, counts in sorted(report.formats.items())}
        return record

    def summary(self) -> str:
        """One line: what the run did, or why it failed."""
        counts = (f"{self.added} new, {self.changed} changed, {self.removed} removed, {self.unchanged} unchanged, "
                  f"{len(self.failed)} failed")
        if self.disallowed:
            counts += f", {self.disallowed} disallowed by robots.txt"
        if self.orphaned:
            counts += f", {self.orphaned} removed with a source no longer configured"
        if self.formats:
            counts += " (" + "; ".join(f"{name}: {FormatCounts(**c).summary()}" for name, c in self.formats.items()) + ")"
        head = f"{self.source}: " + (f"refreshed in {self.duration_s:.1f} s: {counts}" if self.ok
                                     else f"refresh failed after {self.duration_s:.1f} s ({self.error}); so far {counts}")
        if self.knowledge_version is not None:
            head += f"; knowledge version {self.knowledge_version}"
        return head


class RunLog(Protocol):
    async def last_run(self, source: str) -> RunRecord | None: ...

    async def save_run(self, record: RunRecord) -> None: ...

    async def fetch_states(self, source: str) -> dict[str, FetchState]: ...

    async def save_fetch_states(self, source: str, states: dict[str, FetchState]) -> None: ...

    async def completed_roots(self) -> dict[str, str]:
        """root -> when a configured source last completed a run with it (ISO time)."""
        ...

    async def save_completed_roots(self, roots: list[str], at: str) -> None: ...

    async def forget_roots(self, roots: list[str]) -> None: ...


class FileRunLog:
    """``<data_dir>/refresh.json``: ``{"runs": {source: record}, "fetch": {source: {url: state}},
    "roots": {root: time}}``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._mutex = threading.Lock()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"runs": {}, "fetch": {}, "roots": {}}
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s); starting a new refresh log", self.path, exc)
            return {"runs": {}, "fetch": {}, "roots": {}}
        data.setdefault("runs", {})
        data.setdefault("fetch", {})
        data.setdefault("roots", {})
        return data

    def _update(self, change: Callable[[dict[str, Any]], None]) -> None:
        with self._mutex:
            data = self._read()
            change(data)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, ensure_ascii=False, indent=1)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    async def last_run(self, source: str) -> RunRecord | None:
        raw = self._read()["runs"].get(source)
        return RunRecord.from_dict(raw) if raw else None

    async def save_run(self, record: RunRecord) -> None:
        self._update(lambda data: data["runs"].__setitem__(record.source, record.to_dict()))

    async def fetch_states(self, source: str) -> dict[str, FetchState]:
        raw = self._read()["fetch"].get(source) or {}
        return {url: FetchState.from_dict(state) for url, state in raw.items()}

    async def save_fetch_states(self, source: str, states: dict[str, FetchState]) -> None:
        self._update(lambda data: data["fetch"].__setitem__(source, {u: s.to_dict() for u, s in states.items()}))

    async def completed_roots(self) -> dict[str, str]:
        return dict(self._read()["roots"])

    async def save_completed_roots(self, roots: list[str], at: str) -> None:
        self._update(lambda data: data["roots"].update(dict.fromkeys(roots, at)))

    async def forget_roots(self, roots: list[str]) -> None:
        def forget(data: dict[str, Any]) -> None:
            for root in roots:
                data["roots"].pop(root, None)

        self._update(forget)


class RedisRunLog:
    """Run records and fetch states in Redis, shared by every replica (keys: see the module docstring)."""

    def __init__(self, client: Any, prefix: str = "kbbot:"):
        self.client = client
        self.prefix = prefix

    def run_key(self, source: str) -> str:
        return f"{self.prefix}refresh:run:{source}"

    def fetch_key(self, source: str) -> str:
        return f"{self.prefix}refresh:fetch:{source}"

    async def last_run(self, source: str) -> RunRecord | None:
        raw = await self.client.get(self.run_key(source))
        return RunRecord.from_dict(json.loads(raw)) if raw else None

    async def save_run(self, record: RunRecord) -> None:
        await self.client.set(self.run_key(record.source), json.dumps(record.to_dict(), ensure_ascii=False))

    async def fetch_states(self, source: str) -> dict[str, FetchState]:
        raw = await self.client.hgetall(self.fetch_key(source))
        out = {}
        for url, value in raw.items():
            url = url.decode() if isinstance(url, bytes) else url
            out[url] = FetchState.from_dict(json.loads(value))
        return out

    async def save_fetch_states(self, source: str, states: dict[str, FetchState]) -> None:
        key = self.fetch_key(source)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if states:
                pipe.hset(key, mapping={u: json.dumps(s.to_dict(), ensure_ascii=False) for u, s in states.items()})
            await pipe.execute()

    @property
    def roots_key(self) -> str:
        return f"{self.prefix}refresh:roots"

    async def completed_roots(self) -> dict[str, str]:
        raw = await self.client.hgetall(self.roots_key)
        return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()}

    async def save_completed_roots(self, roots: list[str], at: str) -> None:
        if roots:
            await self.client.hset(self.roots_key, mapping=dict.fromkeys(roots, at))

    async def forget_roots(self, roots: list[str]) -> None:
        if roots:
            await self.client.hdel(self.roots_key, *roots)


# --- schedules -------------------------------------------------------------------------------------
def schedule_zone(settings: Settings) -> Any:
    if settings.refresh.timezone:
        return ZoneInfo(settings.refresh.timezone)
    import tzlocal

    return tzlocal.get_localzone()


def _cron_after(source: SourceSettings, moment: datetime, zone: Any) -> datetime:
    from apscheduler.triggers.cron import CronTrigger

    trigger = CronTrigger.from_crontab(str(source.cron), timezone=zone)
    fire = trigger.get_next_fire_time(None, moment.astimezone(zone) + timedelta(seconds=1))
    return fire.astimezone(UTC)


def next_due(source: SourceSettings, last_started: datetime | None, zone: Any, now: datetime | None = None) -> datetime:
    """When ``source`` should run next: at once if it never ran, else one interval (or the next cron
    time) after its last run started, whichever replica or command ran it. May be in the past (overdue)."""
    now = now or utcnow()
    if last_started is None:
        return now
    if source.interval:
        return last_started + timedelta(seconds=source.interval_s or 0)
    return _cron_after(source, last_started, zone)


def is_due(source: SourceSettings, last_started: datetime | None, zone: Any, now: datetime | None = None) -> bool:
    now = now or utcnow()
    if last_started is None:
        return True
    tolerance = min(DUE_TOLERANCE_S, (source.interval_s or 3600) * 0.05)
    return next_due(source, last_started, zone, now) <= now + timedelta(seconds=tolerance)


# --- status ----------------------------------------------------------------------------------------
def source_roots(source: SourceSettings) -> list[str]:
    if source.path:
        return [Path(source.path).resolve().as_posix()]
    if source.confluence:
        return [f"confluence:{source.name}"]
    return [f"urls:{source.name}"]


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


async def knowledge_status(settings: Settings, *, store: KnowledgeStore | None, runs: RunLog | None,
                           redis: Any = None, store_error: str | None = None, redis_error: str | None = None,
                           next_runs: dict[str, datetime | None] | None = None,
                           timeout_s: float = 10.0) -> dict[str, Any]:
    """``{"knowledge_version", "sources": [{"name", "documents", "chunks", "last_run", "next_run"}],
    "services": {"weaviate": {...}, "redis": {...}}}``; a service that is down is reported, not raised."""
    weaviate, read = await check_store(settings, store, lambda s: (s.knowledge_version, s.records()),
                                       timeout_s=timeout_s, error=store_error)
    version, records = read if read is not None else (None, None)
    redis_status = await check_redis(settings, redis, timeout_s=timeout_s, error=redis_error)
    zone = schedule_zone(settings)
    sources = []
    for src in settings.sources:
        last: RunRecord | None = None
        if runs is not None and redis_status["status"] != "down":
            try:
                last = await runs.last_run(src.name)
            except Exception as exc:  # noqa: BLE001
                log.warning("cannot read the last run of %s: %s", src.name, exc)
        documents = chunks = None
        if records is not None:
            roots = set(source_roots(src))
            mine = [r for r in records.values() if r.root in roots]
            documents, chunks = len(mine), sum(r.chunks for r in mine)
        if next_runs is not None and src.name in next_runs:
            upcoming = next_runs[src.name]
        else:
            upcoming = next_due(src, last.started if last else None, zone)
        sources.append({"name": src.name, "documents": documents, "chunks": chunks,
                        "last_run": last.to_dict() if last else None, "next_run": iso(upcoming)})
    return {"knowledge_version": version, "sources": sources,
            "services": {"weaviate": weaviate, "redis": redis_status}}


def format_status(status: dict[str, Any], *, max_failures: int = 5) -> str:
    """The status for people (terminal, Slack, Telegram): a few lines per source."""
    services = status["services"]
    parts = [f"Knowledge version {status['knowledge_version'] if status['knowledge_version'] is not None else '?'}"]
    for name, label in (("weaviate", "Weaviate"), ("redis", "Redis")):
        svc = services[name]
        parts.append(f"{label} {svc['status']}" + (f" ({svc['error']})" if svc.get("error") else ""))
    lines = [" · ".join(parts)]
    if not status["sources"]:
        lines.append("No sources are configured (sources: in the settings file).")
    for src in status["sources"]:
        docs = "?" if src["documents"] is None else src["documents"]
        chunks = "?" if src["chunks"] is None else src["chunks"]
        line = f"• {src['name']}: {docs} documents, {chunks} chunks"
        run = src["last_run"]
        if run:
            when = run["started_at"].replace("T", " ").replace("Z", " UTC")
            record = RunRecord.from_dict(run)
            line += f"; last run {when} ({run['trigger']}): " + record.summary().split(": ", 1)[1]
        else:
            line += "; never refreshed"
        if src["next_run"]:
            line += f"; next run {src['next_run'].replace('T', ' ').replace('Z', ' UTC')}"
        lines.append(line)
        if run and run["failed"]:
            for failure in run["failed"][:max_failures]:
                lines.append(f"    failed: {failure['source']}: {failure['reason']}")
            if len(run["failed"]) > max_failures:
                lines.append(f"    … and {len(run['failed']) - max_failures} more")
    return "\n".join(lines)


# --- reconciling the configuration ----------------------------------------------------------------
class Orphans:
    """Which documents of sources that are no longer configured one run of ``own`` revokes.

    A document is an orphan when its root is no configured source's (``source_roots``): the
    ``urls:<name>`` of a URL source renamed or removed, or a folder that a configured source once
    completed a run with (the completed-roots registry of the ``RunLog``) and none has now. A folder
    indexed ad hoc (``kbbot index PATH``) never was a configured source's root and is left alone.

    Safety, so that no answer goes missing on the way:

    - nothing is revoked until every configured source has completed a run with its current roots
      and a full listing (this run counts once it is through its items): a renamed source has then
      published its documents under its new name first. Until then the orphans are kept, with a warning;
    - a document that a configured source still lists is not an orphan, even if that source could not
      read it (it keeps its version until it is read): what this run listed, the other URL sources'
      pages (configured, or from their sitemaps' last listings) and the files in the other folders.
    """

    def __init__(self, own: SourceSettings, sources: list[SourceSettings], completed: dict[str, str],
                 url_claims: set[str], suffixes: list[str]):
        self.own = own
        self.sources = sources
        self.completed = set(completed)
        self.configured = {root for src in sources for root in source_roots(src)}
        self.url_claims = url_claims
        self.suffixes = suffixes
        #: Roots of the orphans a run kept (None until it checked): the registry forgets the others.
        self.kept_roots: set[str] | None = None

    def is_orphan_root(self, root: str | None) -> bool:
        return (root is not None and root not in self.configured
                and (root.startswith(("urls:", "confluence:")) or root in self.completed))

    def waiting_for(self, own_complete: bool) -> list[str]:
        """The configured sources that have not completed a run with their current roots."""
        done = self.completed | (set(source_roots(self.own)) if own_complete else set())
        return [src.name for src in self.sources if not set(source_roots(src)) <= done]

    def _folder_claims(self, doc_ids: list[str]) -> set[str]:
        claimed: set[str] = set()
        for src in self.sources:
            if src.name == self.own.name or not src.path:
                continue
            root = source_roots(src)[0]
            inside = [d for d in doc_ids if d.startswith(root + "/")]
            if not inside:
                continue
            try:
                files = {p.as_posix() for p in discover([src.path], self.suffixes, include=src.include,
                                                        exclude=src.exclude)}
            except OSError:  # a folder that cannot be listed may still hold them all
                files = set(inside)
            claimed.update(d for d in inside if d in files)
        return claimed

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
        claimed = (seen | self.url_claims | self._folder_claims(list(candidates))) & set(candidates)
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


# --- running ---------------------------------------------------------------------------------------
class Refresher:
    """Runs sources (configured ones by name, or an ad-hoc ``Source``) under the refresh lock."""

    def __init__(self, settings: Settings, store: KnowledgeStore, indexer: Indexer, *, redis: Any = None,
                 runs: RunLog | None = None, lock_factory: Callable[[float], RenewingLock] | None = None):
        self.settings = settings
        self.store = store
        self.indexer = indexer
        self.redis = redis
        if runs is None:
            runs = (RedisRunLog(redis, settings.redis_prefix) if redis is not None
                    else FileRunLog(settings.data_dir / "refresh.json"))
        self.runs = runs
        self._lock_factory = lock_factory
        self.stopping = False  # set on shutdown: a run stops before its next document

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
            from bot.redis_state import RedisLock

            return RedisLock(self.redis, LOCK_NAME, ttl_s=r.lock_ttl_s, prefix=self.settings.redis_prefix,
                             wait_s=wait_s, poll_s=0.5)
        return MemoryLock(LOCK_NAME, ttl_s=r.lock_ttl_s, wait_s=wait_s)

    async def last_run(self, name: str) -> RunRecord | None:
        return await self.runs.last_run(name)

    def _fetcher(self) -> Fetcher:
        r = self.settings.refresh
        return Fetcher(timeout_s=r.fetch_timeout_s, connect_timeout_s=r.connect_timeout_s,
                       max_bytes=int(r.max_download_mb * 1_000_000), user_agent=r.user_agent,
                       allow_hosts=r.allow_hosts)

    def build_source(self, src: SourceSettings, states: dict[str, FetchState] | None = None) -> Source:
        if src.path:
            return FolderSource([src.path], suffixes=self.settings.indexing.extensions, include=src.include,
                                exclude=src.exclude, max_file_mb=self.settings.indexing.max_file_mb)
        if src.confluence:
            return self._confluence(src, states or {})
        fetcher = self._fetcher()
        return UrlSource(src.name, src.urls, fetcher, states=states or {},
                         concurrency=self.settings.refresh.concurrency, max_urls=self.settings.refresh.max_urls,
                         max_sitemaps=self.settings.refresh.max_sitemaps,
                         robots=Robots(fetcher) if src.respect_robots else None)

    def _confluence(self, src: SourceSettings, states: dict[str, FetchState]) -> ConfluenceSource:
        c, r = src.confluence, self.settings.refresh
        assert c is not None
        token = os.environ.get(c.token_env, "").strip()
        client = None
        if token:
            client = ConfluenceClient(c.url, token, user=c.user, timeout_s=r.fetch_timeout_s,
                                      connect_timeout_s=r.connect_timeout_s, max_bytes=int(r.max_download_mb * 1_000_000),
                                      max_retries=c.max_retries, max_retry_wait_s=c.max_retry_wait_s,
                                      user_agent=r.user_agent)
        return ConfluenceSource(src.name, client, spaces=c.spaces, cql=c.cql, attachments=c.attachments,
                                states=states, max_documents=r.max_urls,
                                missing=None if token else f"the environment variable {c.token_env} (the Confluence "
                                                           "token) is not set; nothing was read or revoked")

    async def orphans(self, src: SourceSettings) -> Orphans | None:
        """What a run of ``src`` needs to reconcile the configuration; None (reconcile nothing) when the
        run log cannot be read."""
        try:
            completed = await self.runs.completed_roots()
            url_claims: set[str] = set()
            for other in self.settings.sources:
                if other.name == src.name or not other.urls:
                    continue
                url_claims.update(u for u in map(normalise_url, other.urls) if not is_sitemap(u))
                for url, state in (await self.runs.fetch_states(other.name)).items():
                    url_claims.add(url)
                    url_claims.update(map(normalise_url, state.urls))
        except Exception as exc:  # noqa: BLE001 - keeping documents is the safe way to fail
            log.warning("refresh source=%s: cannot read the run log (%s); documents of sources no longer "
                        "configured are not checked this run", src.name, _reason(exc))
            return None
        return Orphans(src, list(self.settings.sources), completed, url_claims, list(self.settings.indexing.extensions))

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
                  on_wait: Callable[[], None] | None = None) -> RunRecord | None:
        """Refresh source ``name`` now; None when ``only_if_due`` and it was not due (anymore).

        :raises UnknownSource: no such source. :raises RefreshBusy: the lock stayed taken for ``wait_s``.
        """
        src = self.source(name)
        wait_s = self.settings.refresh.lock_wait_s if wait_s is None else wait_s
        lock = await self._acquire(wait_s, on_wait)
        try:
            if only_if_due:
                last = await self.runs.last_run(name)
                if not is_due(src, last.started if last else None, schedule_zone(self.settings)):
                    log.info("refresh source=%s trigger=%s skipped: already run at %s (another replica?)",
                             name, trigger, last.started_at if last else "?")
                    return None
            return await self._run_locked(src, trigger, lock, progress)
        finally:
            if lock.held:
                await lock.release()

    async def _run_locked(self, src: SourceSettings, trigger: str, lock: RenewingLock,
                          progress: Progress | None) -> RunRecord:
        states = await self.runs.fetch_states(src.name) if src.urls or src.confluence else {}
        source = self.build_source(src, states)
        orphans = await self.orphans(src)
        started = utcnow()
        report = IndexReport()
        error: str | None = None

        def listed_completely() -> bool:
            return source.listed_completely if isinstance(source, UrlSource) else True

        def select_orphans(records: dict[str, DocRecord], seen: set[str]) -> list[str]:
            assert orphans is not None
            return orphans.select(records, seen, own_complete=listed_completely())

        def work() -> None:
            try:
                self.indexer.refresh(source, space=src.space, progress=progress, report=report,
                                     should_stop=lambda: lock.lost or self.stopping,
                                     orphans=select_orphans if orphans is not None else None)
            finally:
                if isinstance(source, UrlSource):
                    source.fetcher.close()
                elif isinstance(source, ConfluenceSource):
                    source.close()

        try:
            await asyncio.to_thread(work)
        except (FileNotFoundError, ServiceUnavailable, RefreshAborted, ConfluenceError) as exc:
            error = _reason(exc)
        except Exception as exc:  # noqa: BLE001 - recorded; the next run retries
            log.exception("refresh of %s failed", src.name)
            error = f"{type(exc).__name__}: {_reason(exc)}"
        finished = error is None
        disallowed = 0
        if isinstance(source, UrlSource):
            disallowed = len(source.disallowed)
            unreachable = source.robots_unreachable
            if unreachable and error is None:
                error = "; ".join(f"robots.txt of {host} unreachable ({why})" for host, why in unreachable.items())
                error += ": not fetched this run, its pages keep their indexed versions"
        duration = (utcnow() - started).total_seconds()
        record = RunRecord.of(src.name, trigger, started, duration, report, error, disallowed=disallowed)
        try:
            await self.runs.save_run(record)
            if isinstance(source, UrlSource | ConfluenceSource):
                # A finished run keeps the validators of what it saw; a broken one also keeps the old ones.
                kept = source.updated_states if error is None else {**states, **source.updated_states}
                await self.runs.save_fetch_states(src.name, kept)
            if error is None and listed_completely():
                await self.runs.save_completed_roots(source_roots(src), record.started_at)
            if finished and orphans is not None and orphans.forgettable():
                await self.runs.forget_roots(orphans.forgettable())
        except Exception:  # noqa: BLE001 - the knowledge is refreshed; only its record is missing
            log.exception("could not record the refresh of %s", src.name)
        log_run(record)
        return record

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


def log_run(record: RunRecord) -> None:
    """One structured line per run: logfmt for people and grep, the record in ``extra`` for JSON logs;
    and the run's counts in the metrics."""
    METRICS.observe_refresh(record)
    level = logging.INFO if record.ok and not record.failed else logging.WARNING
    error = f" error={json.dumps(record.error, ensure_ascii=False)}" if record.error else ""
    log.log(level, "refresh source=%s trigger=%s status=%s added=%d changed=%d removed=%d unchanged=%d failed=%d "
            "duration_s=%.2f knowledge_version=%s orphaned=%d disallowed=%d%s", record.source, record.trigger,
            "ok" if record.ok else "error", record.added, record.changed, record.removed, record.unchanged,
            len(record.failed), record.duration_s, record.knowledge_version, record.orphaned, record.disallowed,
            error, extra={"refresh": record.to_dict()})
