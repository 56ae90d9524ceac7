"""How much one process takes on at once: turns in flight, and a bounded queue behind them.

Every chat event becomes a handler task (bolt and aiogram start one per event), so a flood would
otherwise become as many turns, each holding memory and model calls. ``TurnGate`` admits a turn
only while fewer than ``max_in_flight + max_queued`` are admitted; an admitted turn waits for one
of ``max_in_flight`` running slots (after its thread's lock, so a busy thread does not hold a slot
while it waits). Beyond the bound the asker gets a short "busy" line at once. The rate limits
(``bot.limits``) are checked before a turn is admitted, so a refused question never takes a place.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class TurnGate:
    def __init__(self, max_in_flight: int = 32, max_queued: int = 64):
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError("max_in_flight must be at least 1 and max_queued not negative")
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.admitted = 0
        self.running = 0
        self._slots: asyncio.Semaphore | None = None

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def admit(self) -> bool:
        """Takes a place for one turn; False when the queue is full (the caller answers "busy")."""
        if self.admitted >= self.max_in_flight + self.max_queued:
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        self.admitted -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the ``max_in_flight`` running places (an admitted turn waits here)."""
        if self._slots is None:  # made in the loop that uses it
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            self.running += 1
            try:
                yield
            finally:
                self.running -= 1
