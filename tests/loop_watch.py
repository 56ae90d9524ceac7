"""How long an event loop stands still: a task that asks to run every ``every`` seconds and records how
late each of its turns came (``tests/test_grounding.py``, ``bench.gate``)."""

from __future__ import annotations

import asyncio
import time


class LoopWatch:
    def __init__(self, every: float = 0.005):
        self.every = every
        self.lateness: list[float] = []  # seconds each tick came after it was due
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    async def _tick(self) -> None:
        last = time.perf_counter()
        while not self._done.is_set():
            await asyncio.sleep(self.every)
            now = time.perf_counter()
            self.lateness.append(max(0.0, now - last - self.every))
            last = now

    @property
    def longest(self) -> float:
        return max(self.lateness, default=0.0)

    async def __aenter__(self) -> LoopWatch:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(self.every * 4)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        if self._task is not None:
            await self._task
