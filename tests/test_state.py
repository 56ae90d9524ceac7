"""The in-process idempotency and lock implementations (the embedded default)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bot.state import Idempotency, Lock, LockNotAcquired, MemoryIdempotency, MemoryLock, MemoryLockTable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_memory_implementations_satisfy_the_protocols() -> None:
    assert isinstance(MemoryIdempotency(), Idempotency)
    assert isinstance(MemoryLock("x", table=MemoryLockTable()), Lock)


async def test_claim_once_until_the_ttl_passes() -> None:
    clock = FakeClock()
    idem = MemoryIdempotency(clock=clock)
    assert await idem.claim("slack:T1:evt1", 60)
    assert not await idem.claim("slack:T1:evt1", 60)
    assert await idem.claim("slack:T1:evt2", 60)
    clock.now += 59.9
    assert not await idem.claim("slack:T1:evt1", 60)
    clock.now += 0.2
    assert await idem.claim("slack:T1:evt1", 60)


async def test_release_allows_a_new_claim() -> None:
    idem = MemoryIdempotency()
    assert await idem.claim("k", 60)
    await idem.release("k")
    assert await idem.claim("k", 60)
    await idem.release("never-claimed")  # no error


async def test_concurrent_claims_have_one_winner() -> None:
    idem = MemoryIdempotency()
    results = await asyncio.gather(*(idem.claim("same", 60) for _ in range(50)))
    assert results.count(True) == 1


async def test_expired_claims_are_swept() -> None:
    clock = FakeClock()
    idem = MemoryIdempotency(clock=clock, sweep_every=10)
    for i in range(9):
        await idem.claim(f"old{i}", 1)
    clock.now += 5
    await idem.claim("new", 1)  # the 10th claim sweeps
    assert list(idem._expires) == ["new"]


async def test_lock_is_exclusive_and_released() -> None:
    table = MemoryLockTable()
    a, b = MemoryLock("refresh", table=table), MemoryLock("refresh", table=table)
    assert await a.acquire()
    assert a.held and not a.lost
    assert not await b.acquire()
    assert await MemoryLock("other", table=table).acquire()
    assert await a.release()
    assert not a.held
    assert await b.acquire()
    assert await b.release()


async def test_acquire_twice_or_release_unheld_is_an_error() -> None:
    lock = MemoryLock("x", table=MemoryLockTable())
    with pytest.raises(RuntimeError, match="not held"):
        await lock.release()
    assert await lock.acquire()
    with pytest.raises(RuntimeError, match="already held"):
        await lock.acquire()
    await lock.release()


async def test_blocking_acquire_waits_for_release_or_times_out() -> None:
    table = MemoryLockTable()
    a, b = MemoryLock("job", table=table), MemoryLock("job", table=table)
    assert await a.acquire()
    assert not await b.acquire(blocking=True, timeout=0.15)

    async def release_soon() -> None:
        await asyncio.sleep(0.1)
        await a.release()

    releaser = asyncio.create_task(release_soon())
    assert await b.acquire(blocking=True, timeout=2)
    await releaser
    await b.release()


async def test_context_manager_raises_when_held_elsewhere() -> None:
    table = MemoryLockTable()
    async with MemoryLock("job", table=table) as held:
        assert held.held
        with pytest.raises(LockNotAcquired, match="'job' is held elsewhere"):
            async with MemoryLock("job", table=table):
                pass
    assert not table.locked("job")


async def test_context_manager_releases_on_error() -> None:
    table = MemoryLockTable()
    with pytest.raises(ValueError):
        async with MemoryLock("job", table=table):
            raise ValueError("boom")
    assert not table.locked("job")


async def test_renewal_keeps_the_lock_past_its_ttl() -> None:
    table = MemoryLockTable()
    holder = MemoryLock("job", ttl_s=0.3, table=table)
    assert await holder.acquire()
    await asyncio.sleep(0.8)  # well past the TTL: only renewal keeps it
    assert table.locked("job")
    assert not await MemoryLock("job", table=table).acquire()
    assert not holder.lost
    assert await holder.release()


async def test_a_holder_that_stops_renewing_loses_the_lock() -> None:
    table = MemoryLockTable()

    # The holder's event loop ends without releasing: its renewal task dies with it.
    def crashed_holder() -> None:
        async def hold() -> None:
            assert await MemoryLock("job", ttl_s=0.3, table=table).acquire()

        asyncio.run(hold())

    thread = threading.Thread(target=crashed_holder)
    thread.start()
    thread.join()
    assert table.locked("job")
    waiter = MemoryLock("job", table=table)
    assert not await waiter.acquire()
    assert await waiter.acquire(blocking=True, timeout=2)
    await waiter.release()


async def test_lost_lock_is_reported_and_not_freed_for_the_new_owner() -> None:
    clock = FakeClock()
    table = MemoryLockTable(clock=clock)
    old = MemoryLock("job", ttl_s=0.15, table=table)
    assert await old.acquire()
    clock.now += 1  # the holder stalled past its TTL (no renewal ran)
    new = MemoryLock("job", ttl_s=30, table=table)
    assert await new.acquire()
    await asyncio.sleep(0.15)  # old's next renewal notices
    assert old.lost
    assert not await old.release()
    assert table.locked("job")
    assert await new.release()
