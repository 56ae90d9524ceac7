"""Each run's record, and where records and fetch states are kept: a file, or Redis for every replica."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from bot.knowledge.refresh.schedule import iso, parse_iso
from bot.messages import say
from bot.metrics import METRICS
from bot.settings import Settings
from pipelines.indexing import FormatCounts, IndexReport
from pipelines.sources.fetcher import FetchState

log = logging.getLogger("kbbot.refresh")


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
    permissions: int = 0  # documents whose readers changed at the source (updated in place, nothing embedded)
    #: Per file type: {"documents", "ocr_pages", "failed"} converted this run.
    formats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Documents held back (readable by nobody): why -> how many (``IndexReport.held``).
    held: dict[str, int] = field(default_factory=dict)

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
            record.permissions = len(report.permissions)
            record.failed = [{"source": f.source, "reason": f.reason} for f in report.failed[: cls.MAX_FAILURES]]
            record.knowledge_version = report.knowledge_version or None
            record.formats = {name: asdict(counts) for name, counts in sorted(report.formats.items())}
            record.held = dict(report.held)
        return record

    def held_lines(self) -> list[str]:
        """Why documents are held back, one line per reason: ``3 held back (readable by nobody): <why>``."""
        return [f"{n} held back (readable by nobody): {why}" for why, n in sorted(self.held.items())]

    def summary(self, language: str = "en") -> str:
        """One line: what the run did, or why it failed (``source: outcome``)."""
        return f"{self.source}: {self.outcome(language)}"

    def outcome(self, language: str = "en") -> str:
        """What the run did, or why it failed, in ``language`` (``bot.messages``)."""
        counts = say("run_counts", language, added=self.added, changed=self.changed, removed=self.removed,
                     unchanged=self.unchanged, failed=len(self.failed))
        if self.disallowed:
            counts += say("run_disallowed", language, count=self.disallowed)
        if self.orphaned:
            counts += say("run_orphaned", language, count=self.orphaned)
        if self.permissions:
            counts += say("run_permissions", language, count=self.permissions)
        if self.held:
            counts += say("run_held", language, count=sum(self.held.values()))
        if self.formats:
            counts += " (" + "; ".join(f"{name}: {FormatCounts(**c).summary()}" for name, c in self.formats.items()) + ")"
        text = say("run_ok", language, seconds=self.duration_s, counts=counts) if self.ok else \
            say("run_failed", language, seconds=self.duration_s, error=self.error, counts=counts)
        if self.knowledge_version is not None:
            text += say("run_version", language, version=self.knowledge_version)
        return text


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



def run_log(settings: Settings, redis: Any) -> RunLog:
    """Where runs are recorded: in Redis (``redis``, a connected client) when given, else in
    ``<data_dir>/refresh.json``."""
    return RedisRunLog(redis, settings.redis_prefix) if redis is not None else FileRunLog(settings.data_dir / "refresh.json")


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
