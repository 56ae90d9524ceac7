"""The turn gate shared between workspaces (issue 28, item 6): one busy workspace can neither take
every queued place nor make a quiet workspace's question wait behind its whole queue."""

from __future__ import annotations

import asyncio
import os

import pytest

from bot.turn.capacity import TurnGate, usable_cores


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


# --- the cores a process may use (the guard runs beside retrieval only while one is spare) ---


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_usable_cores_is_the_affinity_mask_without_a_cgroup_quota(tmp_path):
    assert usable_cores(tmp_path) == _affinity()  # no cpu.max, no v1 files: nothing limits the mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(tmp_path) == _affinity()


@pytest.mark.parametrize(("content", "expected"), [("100000 100000\n", 1), ("50000 100000\n", 1), ("150000 100000\n", 2)])
def test_a_cgroup_v2_quota_caps_the_cores_rounding_a_fraction_up(tmp_path, content, expected):
    (tmp_path / "cpu.max").write_text(content)
    assert usable_cores(tmp_path) == min(expected, _affinity())


def test_a_cgroup_v1_quota_caps_the_cores_and_minus_one_means_none(tmp_path):
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    assert usable_cores(tmp_path) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cores(tmp_path) == _affinity()


def test_an_unreadable_quota_falls_back_to_the_mask(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert usable_cores(tmp_path) == _affinity()
