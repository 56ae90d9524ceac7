"""Killing a replica at one exact step of a turn (``bot.state.KILL_POINTS``), as SIGKILL would: the step
is named, never guessed with a sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bot.state import KILL_POINTS

#: The background work of a replica that SIGKILL stops with it: its lease, its claims, its locks.
RENEWALS = ("lease ", "renew claims", "renew lock ")


def die_at(point: str) -> asyncio.Event:
    """Arms ``point``: the replica that reaches it dies there, as SIGKILL leaves it: its turn never goes
    on (no ``finally`` runs: a thread lock stays held, nothing is removed, no acknowledgement is sent),
    nothing of it is renewed. The event is set once it died. Only the dying replica may have a turn
    running at that moment (every renewal in the process stops)."""
    killed = asyncio.Event()

    async def dying() -> None:
        for task in asyncio.all_tasks():
            if task.get_name().startswith(RENEWALS):
                task.cancel()
        killed.set()
        await asyncio.Event().wait()  # frozen: the test cancels it at the end, long after the take-over

    KILL_POINTS.arm(point, dying)
    return killed


async def died(killed: asyncio.Event) -> None:
    """Waits for the armed replica to reach its kill point (a step that does not exist fails here)."""
    async with asyncio.timeout(10):
        await killed.wait()


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    """No point stays armed for the next test (one the code under test never reached)."""
    yield
    KILL_POINTS.disarm()
