"""Rate budgets: token buckets per ``(scope, method)`` shared by every answer of a platform account.

``PlatformRates`` holds one ``TokenBucket`` per ``(scope, method)``, in this process (``MemoryBuckets``) or,
with ``REDIS_URL``, shared by every replica (``bot.delivery.buckets.RedisBuckets``), so that every
concurrent answer of one workspace (the scope) stays inside a method's rate tier together. A 429 on one
answer ``hold``s the bucket for everyone, on every replica. When callers wait for a bucket, the one whose
call completes something, and needs the fewest calls to do so, goes first (``Priority``): a busy budget
is spent on finishing answers, not on showing more of unfinished ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from bot.delivery.buckets import BucketStore, MemoryBuckets, Rate

__all__ = ["COMPLETES", "STARTS", "PlatformRates", "Priority", "Rate", "TokenBucket"]

log = logging.getLogger("kbbot.streaming")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


# --- rate budget ---------------------------------------------------------------------------
#: The order in which waiting callers get a bucket's tokens: the smallest key first, and among
#: equal keys the earliest caller. A key is ``(rank, calls_left, since)``: ``rank`` is what the call
#: is for (``COMPLETES``/``STARTS``), ``calls_left`` how many calls the caller still needs before
#: it is done, ``since`` when it became ready (``clock()``). Shortest-remaining first, then first
#: come, is what minimises the mean wait for complete answers when every call costs the same token.
Priority = tuple[int, int, float]
#: The call completes something a person waits for: an answer's final text, a click's result.
COMPLETES = 0
#: The call shows a first or intermediate state of something not yet complete.
STARTS = 1


class _Waiter:
    __slots__ = ("future", "priority", "seq")

    def __init__(self, future: asyncio.Future[None], priority: Priority | Callable[[], Priority], seq: int):
        self.future = future
        self.priority = priority
        self.seq = seq

    def key(self) -> tuple[Priority, int]:
        # Read at every grant: a caller whose state changed while it waited (its answer completed)
        # moves up the queue at once.
        priority = self.priority() if callable(self.priority) else self.priority
        return priority, self.seq


class TokenBucket:
    """One ``(scope, method)`` bucket of a ``BucketStore`` (``burst`` tokens refilled at
    ``per_minute / 60`` per second) and this process's callers waiting for it.

    Waiting callers are served by ``Priority`` (see there), not by arrival alone: a final text
    that could complete an answer takes the next token before an earlier caller's first text. The
    queue is this process's: with buckets shared in Redis, each replica orders its own waiters, the
    replicas' waiters take tokens as they come, and a spare-only call (``try_acquire``) anywhere
    yields to a waiter anywhere (the store's "wanted" mark).
    """

    def __init__(self, rate: Rate, *, store: BucketStore | None = None, key: str = "",
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep):
        self.rate = rate
        self.key = key
        self.store: BucketStore = store if store is not None else MemoryBuckets(clock)
        self._clock = clock
        self._sleep = sleep
        self._waiters: list[_Waiter] = []
        self._seq = 0
        self._dispatcher: asyncio.Task[None] | None = None

    @property
    def _one(self) -> list[tuple[str, Rate]]:
        return [(self.key, self.rate)]

    async def tokens(self) -> float:
        return (await self.store.peek(self.key, self.rate))[0]

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def eta(self) -> float:
        """Seconds until a caller arriving now could take a token, if nobody else were waiting."""
        return (await self.store.peek(self.key, self.rate))[1]

    async def acquire(self, priority: Priority | Callable[[], Priority] | None = None) -> float:
        """Take one token, waiting as needed; returns the seconds waited.

        ``priority`` orders the waiting callers (default: ``COMPLETES``, in order of arrival); a
        callable is read again at every grant, so a waiting caller can move up.
        """
        started = self._clock()
        if not self._waiters and await self.store.take(self._one) <= 0:
            return 0.0
        self._seq += 1
        waiter = _Waiter(asyncio.get_running_loop().create_future(),
                         priority if priority is not None else (COMPLETES, 1, started), self._seq)
        self._waiters.append(waiter)
        dispatcher = self._dispatcher
        if dispatcher is None or dispatcher.done() or dispatcher.get_loop() is not asyncio.get_running_loop():
            self._dispatcher = asyncio.create_task(self._dispatch(), name="token bucket")
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                await asyncio.shield(self.refund())  # granted, but its caller is gone
            raise
        return self._clock() - started

    def _live_waiters(self) -> list[_Waiter]:
        # Waiters gone, or left behind by an event loop that has ended, are dropped.
        loop = asyncio.get_running_loop()
        self._waiters = [w for w in self._waiters if not w.future.done() and w.future.get_loop() is loop]
        return self._waiters

    async def _dispatch(self) -> None:
        """Hand out tokens as they come, each to the first waiter by priority at that moment; every
        token free at once in one call to the store (with Redis, one round trip per batch, not per
        waiter: on a busy event loop each round trip waits its turn, and 50 acknowledgements queued for
        the bot's budget were served at the loop's pace, not the budget's).
        One sleeper per bucket: with a fake clock whose sleep advances it, time stays consistent."""
        while self._live_waiters():
            taken, delay = await self.store.take_some(self.key, self.rate, len(self._waiters))
            if not taken:
                await self._sleep(delay)
                continue
            live = sorted(self._live_waiters(), key=_Waiter.key)
            for waiter in live[:taken]:
                self._waiters.remove(waiter)
                waiter.future.set_result(None)
            for _ in range(taken - len(live)):  # waiters left while the store answered
                await self.refund()
            # Let the granted callers run before the next grant re-reads the priorities.
            await asyncio.sleep(0)

    async def try_acquire(self) -> bool:
        """Take a token only if one is free now and nobody is waiting for one (waiters go first)."""
        if self._waiters:
            return False
        return await self.store.take(self._one, spare=True) <= 0

    async def refund(self) -> None:
        """Give back a token taken but not used (its call was not made)."""
        await self.store.give_back(self.key, self.rate)

    async def hold(self, seconds: float) -> None:
        """Let nothing through for ``seconds`` (the platform answered 429 with this Retry-After);
        afterwards one call may go at once and the rest follow at the normal rate."""
        await self.store.hold(self.key, self.rate, seconds)


@dataclass
class PlatformRates:
    """Token buckets by ``(scope, method)``: every answer with the same scope shares them, in this
    process (``MemoryBuckets``, the default) or across replicas (``bot.delivery.buckets.RedisBuckets``).

    ``rates`` maps a method name to its allowance; methods without one use ``default``, or are
    not limited when ``default`` is ``None``.
    """

    rates: Mapping[str, Rate] = field(default_factory=dict)
    default: Rate | None = None
    clock: Clock = time.monotonic
    sleep: Sleep = asyncio.sleep
    store: BucketStore | None = None
    _buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.store is None:
            self.store = MemoryBuckets(self.clock)

    def bucket(self, scope: str, method: str) -> TokenBucket | None:
        key = (scope, method)
        found = self._buckets.get(key)
        if found is None:
            rate = self.rates.get(method, self.default)
            if rate is None:
                return None
            found = self._buckets[key] = TokenBucket(rate, store=self.store, key=f"{scope}:{method}",
                                                     clock=self.clock, sleep=self.sleep)
        return found

    async def acquire(self, scope: str, method: str,
                      priority: Priority | Callable[[], Priority] | None = None) -> float:
        """Take a token of ``(scope, method)``, waiting in ``priority`` order (see ``TokenBucket.acquire``)."""
        bucket = self.bucket(scope, method)
        if bucket is None:
            return 0.0
        waited = await bucket.acquire(priority)
        if waited > 0.05:
            log.debug("rate budget: %s %s waited %.2f s", scope, method, waited)
        return waited

    async def try_acquire(self, scope: str, method: str) -> bool:
        """Take a token of ``(scope, method)`` if one is free now, without waiting (True when unlimited)."""
        bucket = self.bucket(scope, method)
        return True if bucket is None else await bucket.try_acquire()

    async def refund(self, scope: str, method: str) -> None:
        """Give back a token of ``(scope, method)`` taken but not used."""
        bucket = self.bucket(scope, method)
        if bucket is not None:
            await bucket.refund()

    async def eta(self, scope: str, method: str) -> float:
        """Seconds until a token of ``(scope, method)`` is free (0: now, or not limited)."""
        bucket = self.bucket(scope, method)
        return 0.0 if bucket is None else await bucket.eta()

    async def try_acquire_all(self, *keys: tuple[str, str]) -> bool:
        """``try_acquire`` of several ``(scope, method)`` buckets: all of them, or none (one atomic
        take in the store: nothing is taken from one bucket when another has nothing to spare)."""
        buckets = [b for b in (self.bucket(scope, method) for scope, method in keys) if b is not None]
        if any(b.waiting for b in buckets):
            return False
        assert self.store is not None
        return await self.store.take([(b.key, b.rate) for b in buckets], spare=True) <= 0

    async def hold(self, scope: str, method: str, seconds: float) -> None:
        bucket = self.bucket(scope, method)
        if bucket is not None:
            await bucket.hold(seconds)
