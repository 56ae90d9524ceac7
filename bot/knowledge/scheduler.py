"""Scheduled refreshes inside ``kbbot serve``: one APScheduler job per configured source.

Each job runs ``Refresher.run(name, only_if_due=True)``: it waits for the refresh lock (so one
refresh runs at a time across every replica), then checks the source's shared last run record and
does nothing if another replica (or an admin) already ran it for this turn; so replicas racing for
the same turn refresh once. A job is never started twice at once (``max_instances=1``), missed turns
collapse into one (``coalesce``), and after every turn the job's next run is set from the shared
record (one interval, or the next cron time, after the last run started): all replicas agree on it.
A source with ``permissions_interval`` has a second job, ``<name>/permissions``: a permissions-only
run (``kbbot refresh --permissions-only``) one such interval after its permissions were last read,
by either kind of run, raced for and recorded the same way.
A failing source is recorded, logged, and simply runs again at its next turn; the other sources'
jobs are independent. The refresh itself runs in a worker thread (see ``bot.knowledge.refresh``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.knowledge.refresh import RefreshBusy, Refresher, RunRecord, next_due, permissions_run_name, schedule_zone, utcnow
from bot.knowledge.status import failure_lines, format_status, knowledge_status
from bot.messages import say
from bot.settings import SourceSettings

log = logging.getLogger("kbbot.scheduler")


class RefreshScheduler:
    """The jobs of one process; ``start()`` inside the running event loop, ``stop()`` on shutdown."""

    def __init__(self, refresher: Refresher, *, wait_s: float | None = None):
        self.refresher = refresher
        self.zone = schedule_zone(refresher.settings)
        self.wait_s = refresher.settings.refresh.lock_wait_s if wait_s is None else wait_s
        self.scheduler = AsyncIOScheduler(timezone=self.zone)
        self.runs: list[RunRecord] = []  # the runs this process made (tests, health)
        self._running: set[asyncio.Task[Any]] = set()
        self._stopping = False

    def _trigger(self, source: SourceSettings, permissions: bool = False) -> Any:
        if permissions:
            return IntervalTrigger(seconds=source.permissions_interval_s, timezone=self.zone)
        if source.interval:
            return IntervalTrigger(seconds=source.interval_s, timezone=self.zone)
        return CronTrigger.from_crontab(str(source.cron), timezone=self.zone)

    async def _next_time(self, source: SourceSettings, permissions: bool = False) -> datetime:
        try:
            if permissions:
                last_started = await self.refresher.permissions_read(source.name)
            else:
                last = await self.refresher.last_run(source.name)
                last_started = last.started if last else None
        except Exception:  # noqa: BLE001 - Redis down: try again soon rather than never
            log.exception("cannot read the last run of %s; trying again in a minute", source.name)
            return utcnow() + timedelta(minutes=1)
        due = next_due(source, last_started, self.zone, permissions=permissions)
        return max(due, utcnow() + timedelta(seconds=1))

    async def start(self) -> None:
        for source in self.refresher.settings.sources:
            kinds = [False, True] if source.permissions_interval else [False]
            for permissions in kinds:
                job_id = permissions_run_name(source.name) if permissions else source.name
                first = await self._next_time(source, permissions)
                self.scheduler.add_job(self._job, trigger=self._trigger(source, permissions),
                                       args=[source.name, permissions], id=job_id, name=f"refresh {job_id}",
                                       max_instances=1, coalesce=True, misfire_grace_time=None, next_run_time=first)
                schedule = f"every {source.permissions_interval}" if permissions else source.schedule
                log.info("source %s (%s, %s): next %s at %s", source.name, source.kind.name, schedule,
                         "permissions refresh" if permissions else "refresh", first.isoformat(timespec="seconds"))
        self.scheduler.start()

    async def _job(self, name: str, permissions: bool = False) -> None:
        if self._stopping:  # handed over by a wakeup before stop() but started after it: touch nothing
            return
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            record = await self.refresher.run(name, trigger="schedule", only_if_due=True, wait_s=self.wait_s,
                                              permissions_only=permissions)
            if record is not None:
                self.runs.append(record)
        except RefreshBusy as exc:
            log.warning("refresh source=%s trigger=schedule skipped: %s; next turn retries", name, exc)
        except Exception:  # noqa: BLE001 - one source's failure never stops the scheduler
            log.exception("refresh source=%s trigger=schedule crashed; next turn retries", name)
        finally:
            try:
                await self._reschedule(name, permissions)
                if not permissions:  # a refresh read the permissions too: their next run moves with it
                    await self._reschedule(name, True)
            finally:
                # Only now: stop() waits for the tasks in here, and rescheduling reads Redis.
                if task is not None:
                    self._running.discard(task)

    async def _reschedule(self, name: str, permissions: bool = False) -> None:
        source = self.refresher.sources.get(name)
        if source is None or self._stopping or not self.scheduler.running:
            return
        job = self.scheduler.get_job(permissions_run_name(name) if permissions else name)
        if job is not None:
            job.modify(next_run_time=await self._next_time(source, permissions))

    def next_runs(self) -> dict[str, datetime | None]:
        out: dict[str, datetime | None] = {}
        for job in self.scheduler.get_jobs():
            out[job.id] = job.next_run_time
        return out

    async def stop(self, timeout_s: float = 30.0) -> None:
        """No new runs; a run in progress stops before its next document (waits up to ``timeout_s``).

        Once this returns no job of this scheduler uses Redis or the store, so they can be closed:
        ``AsyncIOScheduler.shutdown`` only takes effect on a later turn of the event loop (a wakeup
        already queued still hands jobs over until then) and cancels the jobs it ran, a run in its
        worker thread included, instead of letting them stop. So the scheduler is paused at once (a
        queued wakeup hands nothing over), a job started from now on returns at once, the jobs running
        are waited for, and only then is the scheduler shut down (cancelling what outlived ``timeout_s``).
        """
        self._stopping = True
        self.refresher.stopping = True
        if self.scheduler.state == STATE_RUNNING:
            self.scheduler.pause()
        if self._running:
            _, late = await asyncio.wait(set(self._running), timeout=timeout_s)
            if late:
                log.warning("%d scheduled refresh(es) still running after %g s; cancelling them", len(late), timeout_s)
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)


class KnowledgeAdmin:
    """What the chat adapters' admin commands do: the status text, and a refresh now."""

    def __init__(self, refresher: Refresher, scheduler: RefreshScheduler | None = None):
        self.refresher = refresher
        self.scheduler = scheduler

    async def status(self) -> dict[str, Any]:
        r = self.refresher
        return await knowledge_status(r.settings, store=r.store, runs=r.runs, redis=r.redis,
                                      next_runs=self.scheduler.next_runs() if self.scheduler else None)

    async def status_text(self, language: str = "en") -> str:
        return format_status(await self.status(), language=language)

    def check(self, name: str | None, language: str = "en") -> str | None:
        """Why ``refresh name`` cannot run (unknown source, nothing configured), else None."""
        sources = self.refresher.sources
        if not sources:
            return say("admin_no_sources", language)
        if name and name not in sources:
            return say("admin_unknown_source", language, name=name, sources=", ".join(sources))
        return None

    async def refresh_text(self, name: str | None, *, trigger: str = "admin", language: str = "en") -> str:
        """Runs ``name`` (or every source) now and says what happened, one line per source."""
        problem = self.check(name, language)
        if problem:
            return problem
        names = [name] if name else list(self.refresher.sources)
        lines = []
        for each in names:
            try:
                record = await self.refresher.run(each, trigger=trigger)
            except RefreshBusy as exc:
                lines.append(say("refresh_busy", language, source=each, reason=exc))
                continue
            assert record is not None
            lines.append(record.summary(language))
            lines.extend(failure_lines(record.failed, 5, language))
        return "\n".join(lines)
