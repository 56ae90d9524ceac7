"""The refresh scheduler against real Redis and Weaviate: replicas racing for a job run it once, a
dead replica's lock expires, a failing source is retried without stopping the others, every run logs
one structured line, and chat turns keep flowing while a refresh embeds."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED

from bot.knowledge.refresh import RunRecord, is_due, next_due, utcnow
from bot.knowledge.scheduler import RefreshScheduler
from bot.settings import SourceSettings
from tests.refresh_helpers import REDIS_URL, SERVICES_MISSING, Stack, drop_prefix, folder_source

pytestmark = pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")

DOCS = {
    "fault-e917.md": "# Fault code E-917\n\nFault E-917 means the cooling fan of the HL-D50 drive is blocked.\n",
    "grease.txt": "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 hours.\n",
}


@pytest.fixture
def names(tmp_path: Path) -> dict[str, str]:
    tag = uuid.uuid4().hex[:10]
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text, encoding="utf-8")
    return {"collection": f"Sched{tag}", "prefix": f"kbbot-test-{tag}:"}


@pytest.fixture
async def replicas(tmp_path: Path, names: dict[str, str]) -> AsyncIterator[list[Stack]]:
    """Two replicas: each its own runtime, Weaviate client and Redis client, sharing the collection and prefix."""
    assert REDIS_URL
    made: list[Stack] = []
    for i in range(2):
        stack = Stack(tmp_path / f"data{i}", names["collection"], names["prefix"],
                      [folder_source("docs", tmp_path / "docs")])
        made.append(await stack.start())
    yield made
    made[0].runtime.store.drop()
    for stack in made:
        await stack.close()
    await drop_prefix(REDIS_URL, names["prefix"])


def turns_ended(scheduler: RefreshScheduler) -> Counter[str]:
    """How many turns of each job of ``scheduler`` have ended (counted from now on)."""
    ended: Counter[str] = Counter()
    scheduler.scheduler.add_listener(lambda event: ended.update([event.job_id]), EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    return ended


async def settled(*schedulers: RefreshScheduler, timeout_s: float = 120) -> None:
    """Until every job ran its turn: each job's turn ended on every replica, nothing running and every
    next run at least half an hour away. Not the next runs alone: APScheduler moves a job's next run
    on when it hands the job over, before the job's task starts (and is seen running)."""
    ended = [turns_ended(s) for s in schedulers]
    deadline = time.monotonic() + timeout_s
    while True:
        await asyncio.sleep(0.2)
        later = utcnow() + timedelta(minutes=30)
        done = all(counts[job] >= 1 for s, counts in zip(schedulers, ended, strict=True) for job in s.next_runs())
        busy = any(s._running for s in schedulers)
        upcoming = [t for s in schedulers for t in s.next_runs().values()]
        if done and not busy and all(t is not None and t > later for t in upcoming):
            return
        assert time.monotonic() < deadline, "the scheduled runs did not finish"


async def test_two_replicas_racing_for_a_job_run_it_once(replicas: list[Stack]):
    schedulers = [RefreshScheduler(r.refresher) for r in replicas]  # type: ignore[arg-type]
    for s in schedulers:
        await s.start()  # never refreshed: both replicas schedule it for now
    try:
        await settled(*schedulers)
    finally:
        for s in schedulers:
            await s.stop()
    runs = [run for s in schedulers for run in s.runs]
    assert len(runs) == 1 and runs[0].added == 2, runs
    assert sum(r.embedded for r in replicas) == 2, "the documents were embedded once in all"
    assert replicas[0].runtime.store.knowledge_version == 1
    # Both replicas agree on the next turn: one interval after the run that happened.
    expected = runs[0].started.replace(microsecond=0)
    for s in schedulers:
        [upcoming] = s.next_runs().values()
        assert upcoming is not None
        assert abs((upcoming - expected).total_seconds() - 3600) < 2


async def test_a_dead_replicas_lock_expires_and_the_previous_knowledge_stays_served(replicas: list[Stack],
                                                                                   tmp_path: Path):
    live = replicas[0]
    assert live.refresher is not None and (await live.refresher.run("docs")).added == 2  # type: ignore[union-attr]
    (tmp_path / "docs" / "grease.txt").write_text(DOCS["grease.txt"].replace("20 g", "45 g"), encoding="utf-8")

    # Another replica took the lock and renews it (as a running refresh does) until the question below
    # is answered; then it dies mid-run: its lock is never renewed or released again. (Not dead from
    # the start: on a loaded machine the question can take longer than the lock's TTL, and the live
    # replica then refreshed before it was answered.)
    other = replicas[1].runtime.redis
    lock_key = f"{replicas[1].settings.redis_prefix}lock:refresh"
    ttl_s = replicas[1].settings.refresh.lock_ttl_s
    token = b"token-of-a-replica-about-to-die"
    assert await other.set(lock_key, token, nx=True, px=int(ttl_s * 1000))
    renewed_at = [time.monotonic()]
    renewals: list[bool] = []

    async def renewing() -> None:
        while True:
            await asyncio.sleep(ttl_s / 4)
            held = await other.get(lock_key) == token and bool(await other.pexpire(lock_key, int(ttl_s * 1000)))
            renewals.append(held)
            renewed_at.append(time.monotonic())

    alive = asyncio.create_task(renewing())
    try:
        run = asyncio.create_task(live.refresher.run("docs", trigger="schedule"))
        await asyncio.sleep(1)
        assert not run.done(), "the live replica waits for the lock"
        answer = await live.ask("How much grease do the HL-M300 bearings need?")
    finally:
        alive.cancel()
        await asyncio.gather(alive, return_exceptions=True)
    assert all(renewals), "the other replica held its lock until it died"
    assert not run.done(), "the live replica waited for the lock while the question was answered"
    assert "20 g" in answer.text, "the previous knowledge is served meanwhile"
    record = await asyncio.wait_for(run, 30)
    assert record is not None and record.changed == 1
    assert time.monotonic() - renewed_at[-1] >= ttl_s - 0.5, "it ran only once the dead replica's lock expired"
    answer = await live.ask("How much grease do the HL-M300 bearings need?")
    assert "45 g" in answer.text


async def test_a_failing_source_is_retried_and_does_not_stop_the_others(replicas: list[Stack], tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture):
    stack = replicas[0]
    missing = tmp_path / "later"
    stack.settings.sources = [
        SourceSettings(name="broken", path=str(missing), interval="2s"),
        folder_source("docs", tmp_path / "docs", interval="1h"),
    ]
    scheduler = RefreshScheduler(stack.refresher)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="kbbot.refresh")
    await scheduler.start()
    try:
        deadline = time.monotonic() + 60
        while not ({"broken", "docs"} <= {r.source for r in scheduler.runs}):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        missing.mkdir()
        (missing / "vibration.md").write_text("# Vibration\n\nKeep HL-M200 vibration below 2.8 mm/s RMS.\n",
                                              encoding="utf-8")
        while not any(r.source == "broken" and r.ok for r in scheduler.runs):
            assert time.monotonic() < deadline, [r.summary() for r in scheduler.runs]
            await asyncio.sleep(0.2)
    finally:
        await scheduler.stop()
    broken = [r for r in scheduler.runs if r.source == "broken"]
    assert not broken[0].ok and "no such file or folder" in (broken[0].error or "")
    assert broken[-1].ok and broken[-1].added == 1
    [docs_run] = [r for r in scheduler.runs if r.source == "docs"]
    assert docs_run.ok and docs_run.added == 2

    lines = [r.getMessage() for r in caplog.records if r.name == "kbbot.refresh"
             and r.getMessage().startswith("refresh source=") and " status=" in r.getMessage()]
    assert len(lines) == len(scheduler.runs), lines  # one structured line per run
    ok_line = next(line for line in lines if line.startswith("refresh source=docs"))
    assert ok_line.startswith("refresh source=docs trigger=schedule status=ok added=2 changed=0 removed=0 "
                              "unchanged=0 failed=0 duration_s=")
    error_line = next(line for line in lines if line.startswith("refresh source=broken"))
    assert "status=error" in error_line and "no such file or folder" in error_line
    record = next(r for r in caplog.records if r.getMessage() == ok_line)
    assert RunRecord.from_dict(record.refresh).added == 2  # type: ignore[attr-defined]


async def test_chat_turns_keep_flowing_while_a_refresh_embeds(replicas: list[Stack], tmp_path: Path):
    stack = replicas[0]
    assert stack.refresher is not None
    for i in range(6):
        (tmp_path / "docs" / f"manual-{i}.md").write_text(
            f"# Manual {i}\n\n" + " ".join(f"Step {n}: check terminal X{i}{n} torque." for n in range(60)),
            encoding="utf-8")
    gaps: list[float] = []
    answers = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    run = asyncio.create_task(stack.refresher.run("docs"))
    try:
        while not run.done():
            answers.append(await stack.ask("What does fault E-917 mean?"))
        record = await run
    finally:
        tick.cancel()
    assert record is not None and record.added == 8
    assert answers, "questions were answered while the refresh ran"
    assert max(gaps) < 2.0, f"the event loop stalled for {max(gaps):.2f} s"


def test_due_and_next_run_follow_the_last_run_whoever_made_it():
    zone = "UTC"
    hourly = SourceSettings(name="a", path="/x", interval="1h")
    nightly = SourceSettings(name="b", path="/x", cron="0 3 * * *")
    from datetime import datetime
    from zoneinfo import ZoneInfo

    utc = ZoneInfo(zone)
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert is_due(hourly, None, utc, now) and next_due(hourly, None, utc, now) == now
    assert not is_due(hourly, now - timedelta(minutes=30), utc, now)
    assert is_due(hourly, now - timedelta(minutes=60), utc, now)
    assert next_due(hourly, now - timedelta(minutes=30), utc, now) == now + timedelta(minutes=30)
    assert next_due(nightly, now, utc, now) == datetime(2026, 5, 2, 3, 0, tzinfo=UTC)
    assert not is_due(nightly, datetime(2026, 5, 1, 3, 0, 5, tzinfo=UTC), utc, now)
    assert is_due(nightly, datetime(2026, 4, 30, 3, 0, 5, tzinfo=UTC), utc, now)


async def test_a_run_that_loses_its_lock_stops_before_its_next_document(replicas: list[Stack], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    stack = replicas[0]
    assert stack.refresher is not None
    for i in range(8):
        (tmp_path / "docs" / f"step-{i}.md").write_text(f"# Step {i}\n\nTighten terminal X{i} to {i + 1} N·m.\n",
                                                       encoding="utf-8")
    embedder = stack.runtime.document_embedder
    real_run = embedder.run

    def slow(documents):  # noqa: ANN001, ANN202
        time.sleep(0.5)
        return real_run(documents)

    monkeypatch.setattr(embedder, "run", slow)
    run = asyncio.create_task(stack.refresher.run("docs"))
    while not stack.runtime.store.records():
        await asyncio.sleep(0.05)
    # Another process took the lock over (as after an expiry during a long pause): the next renewal sees it.
    await stack.runtime.redis.set(f"{stack.settings.redis_prefix}lock:refresh", "someone-else",
                                  px=int(stack.settings.refresh.lock_ttl_s * 1000))
    record = await asyncio.wait_for(run, 60)
    assert record is not None and not record.ok
    assert (record.error or "").startswith("stopped after "), record.error
    assert 1 <= record.added < 10, "it stopped mid-run, keeping what it had published"
    assert len(stack.runtime.store.records()) == record.added


async def test_stopping_lets_a_running_turn_stop_and_starts_none_after(replicas: list[Stack],
                                                                     monkeypatch: pytest.MonkeyPatch):
    refresher = replicas[0].refresher
    assert refresher is not None
    started = asyncio.Event()
    outcome: list[str] = []

    async def run(name: str, **options: object) -> None:
        started.set()
        try:
            while not refresher.stopping:  # as a real run: it stops before its next document
                await asyncio.sleep(0.05)
            await refresher.last_run(name)  # and still reads Redis on its way out
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("stopped")

    monkeypatch.setattr(refresher, "run", run)
    scheduler = RefreshScheduler(refresher)
    await scheduler.start()
    try:
        await asyncio.wait_for(started.wait(), 30)
    finally:
        await scheduler.stop()
    assert outcome == ["stopped"], "stop() lets the run stop rather than cancel it"
    assert not scheduler._running
    # A turn the scheduler handed over just before stop() but that starts after it does nothing.
    await scheduler._job("docs")
    assert outcome == ["stopped"]
