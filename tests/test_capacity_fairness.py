"""The turn gate shared between workspaces (issue 28, item 6): one busy workspace can neither take
every queued place nor make a quiet workspace's question wait behind its whole queue."""

from __future__ import annotations

import asyncio

import pytest

from bot.capacity import TurnGate


async def hold(gate: TurnGate, party: str, started: list[str], release: asyncio.Event) -> None:
    async with gate.slot(party):
        started.append(party)
        await release.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_freed_place_goes_to_the_quiet_workspace_before_the_busy_ones_queue():
    gate = TurnGate(max_in_flight=2, max_queued=10)
    started: list[str] = []
    releases = [asyncio.Event() for _ in range(8)]
    busy = [asyncio.create_task(hold(gate, "slack:TBUSY", started, releases[i])) for i in range(7)]
    await settle()
    assert started == ["slack:TBUSY"] * 2
    quiet = asyncio.create_task(hold(gate, "slack:TQUIET", started, releases[7]))
    await settle()
    releases[0].set()  # the first busy turn ends: one place is free, five busy turns waited longer
    await settle()
    assert started[-1] == "slack:TQUIET", started
    assert gate.running == 2
    for release in releases:
        release.set()
    await asyncio.gather(*busy, quiet)
    assert gate.running == 0 and not gate._waiting


async def test_with_one_workspace_the_places_are_handed_in_arrival_order():
    gate = TurnGate(max_in_flight=1, max_queued=4)
    order: list[int] = []
    release = asyncio.Event()

    async def turn(n: int) -> None:
        async with gate.slot("telegram:bot"):
            order.append(n)
            await release.wait()

    tasks = []
    for n in range(4):
        tasks.append(asyncio.create_task(turn(n)))
        await settle()
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]


def test_the_last_quarter_of_the_queue_is_kept_for_workspaces_that_hold_few_places():
    gate = TurnGate(max_in_flight=4, max_queued=8)  # 12 places, 2 reserved
    admitted_busy = sum(gate.admit("slack:TBUSY") for _ in range(20))
    assert admitted_busy == 10, "the busy workspace stops short of the reserved places"
    assert gate.admit("slack:TQUIET") and gate.admit("slack:TQUIET")
    assert not gate.admit("slack:TQUIET"), "the gate is full now, for everyone"
    gate.leave("slack:TBUSY")
    assert not gate.admit("slack:TBUSY"), "a freed place below the bound is still a reserved one"
    gate.leave("slack:TQUIET")
    gate.leave("slack:TQUIET")
    assert gate.admit("slack:TOTHER")
    assert gate.admitted == 10 and sorted(gate._admitted_by) == ["slack:TBUSY", "slack:TOTHER"]


def test_a_single_workspace_may_fill_a_small_queue_whole():
    gate = TurnGate(max_in_flight=2, max_queued=3)  # a quarter of 3 reserves nothing
    assert sum(gate.admit("slack:T1") for _ in range(6)) == 5


@pytest.mark.parametrize("handed_first", [False, True])
async def test_a_turn_cancelled_while_it_waits_loses_no_place(handed_first):
    gate = TurnGate(max_in_flight=1, max_queued=4)
    started: list[str] = []
    first_done, second_done, third_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(hold(gate, "a", started, first_done))
    await settle()
    second = asyncio.create_task(hold(gate, "b", started, second_done))
    third = asyncio.create_task(hold(gate, "c", started, third_done))
    await settle()
    if handed_first:
        first_done.set()  # the place is handed to "b" and counted before "b" wakes...
        await asyncio.sleep(0)
    second.cancel()  # ...and "b" is cancelled: the place goes on to "c" either way
    with pytest.raises(asyncio.CancelledError):
        await second
    first_done.set()
    await settle()
    assert started == ["a", "c"] and gate.running == 1
    third_done.set()
    await asyncio.gather(first, third)
    assert gate.running == 0 and not gate._waiting and not gate._running_by
