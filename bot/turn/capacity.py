"""How much one process takes on at once: turns in flight, and a bounded queue behind them, shared
fairly between the workspaces (parties) that ask.

Every chat event becomes a handler task (bolt and aiogram start one per event), so a flood would
otherwise become as many turns, each holding memory and model calls. ``TurnGate`` admits a turn
only while fewer than ``max_in_flight + max_queued`` are admitted; an admitted turn waits for one
of ``max_in_flight`` running places (after its thread's lock, so a busy thread does not hold a place
while it waits). Beyond the bound the asker gets a short "busy" line at once. The rate limits
(``bot.turn.limits``) are checked before a turn is admitted, so a refused question never takes a place.

One process serves many workspaces (Slack Enterprise Grid, several bots), so one busy workspace must
not starve a quiet one (issue 28, item 6). Two rules see to it:

- the last ``reserve`` places of the queue (a quarter of it) are kept for parties that hold fewer
  than ``reserve`` places: a workspace flooding the gate is told "busy" before a quiet one is;
- a freed running place goes to the waiting party that runs the fewest turns (the earliest waiter
  among equals), not to whoever queued first: a quiet workspace's question starts with the next free
  place instead of behind the busy workspace's whole queue.

With a single party both rules reduce to the plain bounded FIFO queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
from collections import Counter, deque
from collections.abc import AsyncIterator
from pathlib import Path


def usable_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may really run on: the CPUs it is pinned to, less a container's CPU quota.

    ``os.cpu_count()`` counts the host's cores; in a container limited to two of sixty-four it would
    say 64. The affinity mask (``taskset``, ``docker --cpuset-cpus``) and the cgroup's quota
    (``docker --cpus``, Kubernetes' CPU limit: cgroup v2's ``cpu.max``, v1's ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``) are what the scheduler enforces. A fractional quota rounds up: 1.5 CPUs can
    run two threads at once, part of the time."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota(root: Path) -> float | None:
    """CPUs' worth of time the cgroup may use per period, or None when it is unlimited or unreadable."""
    try:
        if (root / "cpu.max").is_file():  # cgroup v2: "max 100000" or "200000 100000"
            limit, period = (root / "cpu.max").read_text().split()[:2]
            return None if limit == "max" else int(limit) / int(period)
        v1 = root / "cpu"
        if (v1 / "cpu.cfs_quota_us").is_file():
            limit_us = int((v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((v1 / "cpu.cfs_period_us").read_text())
            return None if limit_us <= 0 else limit_us / period_us
    except (OSError, ValueError):
        return None  # an odd mount: fall back to the affinity mask rather than fail a turn
    return None


@functools.cache
def process_cores() -> int:
    """``usable_cores()`` read once: a process's limits do not change under it in practice."""
    return usable_cores()


class TurnGate:
    def __init__(self, max_in_flight: int = 32, max_queued: int = 64):
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError("max_in_flight must be at least 1 and max_queued not negative")
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.reserve = max_queued // 4
        self.admitted = 0
        self.running = 0
        self._admitted_by: Counter[str] = Counter()
        self._running_by: Counter[str] = Counter()
        # Per party, the turns waiting for a running place: (arrival number, future set when handed one).
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def admit(self, party: str = "") -> bool:
        """Takes a place for one turn of ``party``; False when there is none for it (the caller
        answers "busy")."""
        bound = self.max_in_flight + self.max_queued
        if self.admitted >= bound:
            return False
        if self.admitted >= bound - self.reserve and self._admitted_by[party] >= self.reserve:
            return False  # the reserved places are for parties that hold few
        self.admitted += 1
        self._admitted_by[party] += 1
        return True

    def leave(self, party: str = "") -> None:
        self.admitted -= 1
        self._admitted_by[party] -= 1
        if self._admitted_by[party] <= 0:
            del self._admitted_by[party]

    @contextlib.asynccontextmanager
    async def slot(self, party: str = "") -> AsyncIterator[None]:
        """One of the ``max_in_flight`` running places (an admitted turn waits here)."""
        if self.running < self.max_in_flight and not self._waiting:
            self._take(party)
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (next(self._arrivals), waiter)
            self._waiting.setdefault(party, deque()).append(entry)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # handed a place as it was cancelled
                    self._give_back(party)
                else:
                    self._forget(party, entry)
                raise
        try:
            yield
        finally:
            self._give_back(party)

    def _take(self, party: str) -> None:
        self.running += 1
        self._running_by[party] += 1

    def _give_back(self, party: str) -> None:
        self.running -= 1
        self._running_by[party] -= 1
        if self._running_by[party] <= 0:
            del self._running_by[party]
        self._hand_on()

    def _forget(self, party: str, entry: tuple[int, asyncio.Future[None]]) -> None:
        queue = self._waiting.get(party)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(entry)
            if not queue:
                del self._waiting[party]

    def _hand_on(self) -> None:
        """Free places go to the waiting party running the fewest turns. The place is counted as
        taken here, before the waiter wakes, so a turn arriving meanwhile cannot take it first."""
        while self.running < self.max_in_flight and self._waiting:
            party = min(self._waiting, key=lambda p: (self._running_by[p], self._waiting[p][0][0]))
            queue = self._waiting[party]
            _, waiter = queue.popleft()
            if not queue:
                del self._waiting[party]
            if waiter.done():  # cancelled while waiting; its task forgets nothing more
                continue
            self._take(party)
            waiter.set_result(None)
