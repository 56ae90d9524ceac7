"""CPU seconds the processes of a run used, read from ``/proc`` (Linux), by role.

A burst on one machine is bounded by the CPU everything in it needs (kbbot, the Weaviate server, Redis,
the fakes): with two cores, 8 s of CPU cannot finish before 4 s whatever the order of the work. This
says where those seconds went, so a floor is a measured figure and not a guess.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields after it follow the last ")".
    return raw[raw.rindex(")") + 2:].split()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 once it is gone)."""
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / TICKS


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def named(*names: str) -> list[int]:
    """The processes whose command name is one of ``names`` (``weaviate``, ``redis-server``)."""
    pids = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                pids.append(int(entry.name))
    return pids


class CpuMeter:
    """CPU seconds by role between ``start()`` and ``stop()``; a role is a list of process ids, or a
    root whose whole tree counts (read at both ends: a worker started in between counts from 0)."""

    def __init__(self, roles: dict[str, Iterable[int]], trees: dict[str, int] | None = None):
        self.roles = {role: list(pids) for role, pids in roles.items()}
        self.trees = dict(trees or {})
        self._before: dict[str, dict[int, float]] = {}

    def _pids(self, role: str) -> list[int]:
        return tree(self.trees[role]) if role in self.trees else self.roles[role]

    def _read(self) -> dict[str, dict[int, float]]:
        return {role: {pid: cpu_s(pid) for pid in self._pids(role)} for role in [*self.roles, *self.trees]}

    def start(self) -> None:
        self._before = self._read()
        self.started = time.monotonic()
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]  # (seconds after start, CPU s of all roles)

    def _used(self, now: dict[str, dict[int, float]]) -> dict[str, float]:
        return {role: round(sum(cpu - self._before.get(role, {}).get(pid, 0.0) for pid, cpu in pids.items()), 2)
                for role, pids in now.items()}

    async def sample(self, every_s: float = 0.1) -> None:
        """Until cancelled: the CPU used so far, every ``every_s`` (``by``)."""
        while True:
            await asyncio.sleep(every_s)
            self.samples.append((time.monotonic() - self.started, sum(self._used(self._read()).values())))

    def by(self, seconds: float) -> float | None:
        """CPU seconds all roles had used ``seconds`` after ``start()`` (interpolated between samples)."""
        for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False):
            if t0 <= seconds <= t1:
                return round(c0 + (c1 - c0) * (seconds - t0) / (t1 - t0), 2) if t1 > t0 else c1
        return None

    def stop(self) -> dict[str, float]:
        return self._used(self._read())
