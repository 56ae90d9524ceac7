"""Shared turn state: idempotency claims (dedupe of redelivered events) and named locks.

Two interfaces, two implementations each:

- ``Idempotency``: ``claim(key, ttl_s)`` is true for exactly one caller per key until the
  claim expires or is released; ``release(key)`` lets a failed turn's redelivery be answered;
  ``extend(key, ttl_s)`` moves a held claim's expiry (``Claim``: a short lease while the turn
  runs, so a replica that dies mid-turn frees its event for a redelivery within the lease).
- ``Lock``: a named lock with a TTL that is renewed in the background while held (every
  ``ttl_s / 3``), so a long job keeps it and a crashed holder loses it within ``ttl_s``.
  Ownership is a random token: only the holder renews or releases.

The in-process versions here (``MemoryIdempotency``, ``MemoryLock``) are the embedded default
and only coordinate one process; ``bot.state.redis`` has the Redis versions for replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


class KillPoints:
    """Named steps of a turn's delivery where a replica can die, so tests can make it die exactly there.

    Take-over is only as good as its worst kill point, and a process killed by the kernel dies between
    two awaits, not at a sleep a test guessed. Each step that matters (``Conversations``, ``TurnLease``,
    ``ThreadLocks``) calls ``reach(name)``; a test ``arm`` s one name with what dying means for its
    replica (freeze the task, stop its renewals). Nothing is armed in production: ``reach`` is one dict
    lookup. An armed point fires once, so the replica that takes over passes it.
    """

    def __init__(self) -> None:
        self._armed: dict[str, Callable[[], Any]] = {}

    def arm(self, name: str, action: Callable[[], Any]) -> None:
        self._armed[name] = action

    def disarm(self, name: str | None = None) -> None:
        """Disarm ``name`` (None: every point)."""
        if name is None:
            self._armed.clear()
        else:
            self._armed.pop(name, None)

    async def reach(self, name: str) -> None:
        action = self._armed.pop(name, None)
        if action is not None:
            result = action()
            if asyncio.iscoroutine(result):
                await result


#: The process's kill points (see ``KillPoints``).
KILL_POINTS = KillPoints()


class LockNotAcquired(RuntimeError):
    """``async with lock`` found the lock held elsewhere (within the lock's ``wait_s``)."""


@runtime_checkable
class Idempotency(Protocol):
    async def claim(self, key: str, ttl_s: float) -> bool:
        """True if this call is the first to claim ``key`` within ``ttl_s`` seconds."""

    async def release(self, key: str) -> None:
        """Forget a claim so the same key can be claimed again (e.g. after a failed turn)."""

    async def extend(self, key: str, ttl_s: float) -> bool:
        """Make a held claim expire ``ttl_s`` seconds from now; False if it had expired."""


@runtime_checkable
class Lock(Protocol):
    name: str
    ttl_s: float

    @property
    def held(self) -> bool:
        """This object acquired the lock and has not released it (it may have been lost since)."""

    @property
    def lost(self) -> bool:
        """Renewal found the lock expired or owned by someone else while this object held it."""

    async def acquire(self, blocking: bool = False, timeout: float | None = None) -> bool:
        """Take the lock; with ``blocking``, wait up to ``timeout`` seconds (None: forever)."""

    async def release(self) -> bool:
        """Stop renewing and free the lock; False if it had already expired or changed owner."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...


class RenewingLock(ABC):
    """Acquire/renew/release logic shared by the lock implementations.

    Subclasses provide the three atomic primitives on a backend; this class adds blocking
    acquisition, the background renewal task and the context manager.
    """

    def __init__(self, name: str, *, ttl_s: float = 30.0, wait_s: float = 0.0, poll_s: float = 0.1):
        if ttl_s <= 0:
            raise ValueError(f"lock ttl_s must be positive, got {ttl_s}")
        self.name = name
        self.ttl_s = float(ttl_s)
        self.wait_s = wait_s
        self.poll_s = poll_s
        #: This holder's token, known before the lock is taken: a turn records it with its pending entry
        #: first (``TURN_LOCKS``), so whoever takes the turn over can free exactly this holder's lock.
        self.token = uuid.uuid4().hex
        self._held = False
        self._lost = False
        self._renewal: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        """Where the backend keeps the lock (a pending entry records it with ``token``)."""
        return self.name

    # --- backend primitives ----------------------------------------------------------------
    @abstractmethod
    async def _try_acquire(self) -> bool:
        """Take the lock if free, with a TTL of ``ttl_s``; never waits."""

    @abstractmethod
    async def _renew(self) -> bool:
        """Reset the TTL to ``ttl_s`` if this object still owns the lock."""

    @abstractmethod
    async def _release(self) -> bool:
        """Free the lock if this object still owns it."""

    # --- public API ------------------------------------------------------------------------
    @property
    def held(self) -> bool:
        return self._held

    @property
    def lost(self) -> bool:
        return self._lost

    async def acquire(self, blocking: bool = False, timeout: float | None = None) -> bool:
        if self._held:
            raise RuntimeError(f"lock {self.name!r} is already held by this object")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if await self._try_acquire():
                self._held = True
                self._lost = False
                self._renewal = asyncio.create_task(self._renew_forever(), name=f"renew lock {self.name}")
                return True
            if not blocking or (deadline is not None and loop.time() + self.poll_s > deadline):
                return False
            await asyncio.sleep(self.poll_s)

    async def release(self) -> bool:
        if not self._held:
            raise RuntimeError(f"lock {self.name!r} is not held by this object")
        await self._stop_renewal()
        self._held = False
        released = await self._release()
        if not released:
            logger.warning("lock %r had expired or changed owner before it was released", self.name)
        return released

    async def __aenter__(self) -> Self:
        if await self.acquire(blocking=self.wait_s > 0, timeout=self.wait_s):
            return self
        raise LockNotAcquired(f"lock {self.name!r} is held elsewhere (waited {self.wait_s:g} s)")

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if not self._held:
            return
        try:
            await self.release()
        except Exception:
            # Raising here would hide the body's own outcome; the TTL frees the lock anyway.
            logger.exception("could not release lock %r; it expires within %g s", self.name, self.ttl_s)

    # --- renewal ---------------------------------------------------------------------------
    async def _renew_forever(self) -> None:
        interval = self.ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                still_owned = await self._renew()
            except Exception:
                # A backend hiccup: keep trying; if it lasts past the TTL the lock expires and
                # the next renewal reports it lost.
                logger.warning("renewing lock %r failed; retrying in %g s", self.name, interval, exc_info=True)
                continue
            if not still_owned:
                self._lost = True
                logger.error("lock %r expired or was taken over while held", self.name)
                return

    async def _stop_renewal(self) -> None:
        task, self._renewal = self._renewal, None
        if task is None or task.done():
            return
        task.cancel()
        await reap(task)


class MemoryIdempotency:
    """Claims in a dict with expiry; expired claims are swept as new ones arrive."""

    def __init__(self, *, clock: Clock = time.monotonic, sweep_every: int = 1024):
        self._clock = clock
        self._expires: dict[str, float] = {}
        self._mutex = threading.Lock()
        self._sweep_every = sweep_every
        self._since_sweep = 0

    async def claim(self, key: str, ttl_s: float) -> bool:
        now = self._clock()
        with self._mutex:
            self._since_sweep += 1
            if self._since_sweep >= self._sweep_every:
                self._since_sweep = 0
                self._expires = {k: t for k, t in self._expires.items() if t > now}
            expires = self._expires.get(key)
            if expires is not None and expires > now:
                return False
            self._expires[key] = now + ttl_s
            return True

    async def release(self, key: str) -> None:
        with self._mutex:
            self._expires.pop(key, None)

    async def extend(self, key: str, ttl_s: float) -> bool:
        now = self._clock()
        with self._mutex:
            if self._expires.get(key, now) <= now:
                return False
            self._expires[key] = now + ttl_s
            return True


class MemoryLockTable:
    """The locks of one process: name -> (owner token, expiry)."""

    def __init__(self, *, clock: Clock = time.monotonic):
        self._clock = clock
        self._locks: dict[str, tuple[str, float]] = {}
        self._mutex = threading.Lock()

    def try_acquire(self, name: str, token: str, ttl_s: float) -> bool:
        now = self._clock()
        with self._mutex:
            current = self._locks.get(name)
            if current is not None and current[1] > now:
                return False
            self._locks[name] = (token, now + ttl_s)
            return True

    def renew(self, name: str, token: str, ttl_s: float) -> bool:
        now = self._clock()
        with self._mutex:
            current = self._locks.get(name)
            if current is None or current[0] != token or current[1] <= now:
                return False
            self._locks[name] = (token, now + ttl_s)
            return True

    def release(self, name: str, token: str) -> bool:
        now = self._clock()
        with self._mutex:
            current = self._locks.get(name)
            if current is None or current[0] != token:
                return False
            del self._locks[name]
            return current[1] > now

    def locked(self, name: str) -> bool:
        with self._mutex:
            current = self._locks.get(name)
            return current is not None and current[1] > self._clock()


#: The process-wide table ``MemoryLock`` uses unless given another one.
PROCESS_LOCKS = MemoryLockTable()


class MemoryLock(RenewingLock):
    """A named lock of this process with the same TTL and renewal semantics as ``RedisLock``."""

    def __init__(self, name: str, *, ttl_s: float = 30.0, wait_s: float = 0.0, poll_s: float = 0.05,
                 table: MemoryLockTable | None = None):
        super().__init__(name, ttl_s=ttl_s, wait_s=wait_s, poll_s=poll_s)
        self.table = PROCESS_LOCKS if table is None else table

    async def _try_acquire(self) -> bool:
        return self.table.try_acquire(self.name, self.token, self.ttl_s)

    async def _renew(self) -> bool:
        return self.table.renew(self.name, self.token, self.ttl_s)

    async def _release(self) -> bool:
        return self.table.release(self.name, self.token)


class ThreadTurnLock:
    """Turns of one thread run one after another (history order); the lock is dropped when unused."""

    def __init__(self, table: dict[str, tuple[asyncio.Lock, int]], key: str):
        self.table = table
        self.key = key

    async def __aenter__(self) -> None:
        lock, users = self.table.get(self.key) or (asyncio.Lock(), 0)
        self.table[self.key] = (lock, users + 1)
        await lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        lock, users = self.table[self.key]
        lock.release()
        if users <= 1:
            del self.table[self.key]
        else:
            self.table[self.key] = (lock, users - 1)


#: Set by the turn running in this task (``bot.conversation``: its ``TurnLease.holds``): each shared lock
#: the turn is about to take is handed to it first, to be recorded with the turn's pending entry. A
#: replica that dies holding a thread's lock then leaves it to whoever takes the turn over, who frees
#: it with the entry instead of waiting out its TTL (30 s).
TURN_LOCKS: contextvars.ContextVar[Callable[[RenewingLock], Awaitable[None]] | None] = contextvars.ContextVar(
    "turn_locks", default=None)


class ThreadLocks:
    """One turn per conversation thread at a time, so history stays in order: in this process (an
    ``asyncio.Lock`` per thread, first come first served) and, given ``shared`` (a factory of
    ``RedisLock`` s), across every replica: two replicas answering one thread do not interleave turns."""

    def __init__(self, shared: Callable[[str], RenewingLock] | None = None):
        self.shared = shared
        self._table: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, thread_key: str) -> AsyncIterator[None]:
        """Waits for the thread's turn; ``LockNotAcquired`` if another replica keeps it past the lock's wait."""
        async with ThreadTurnLock(self._table, thread_key):
            if self.shared is None:
                yield
                return
            lock = self.shared(f"thread:{thread_key}")
            recorded = TURN_LOCKS.get()
            if recorded is not None:  # before it is taken: no step where it is held and not recorded
                await recorded(lock)
            async with lock:
                await KILL_POINTS.reach("thread locked")
                yield


async def claim_all(idempotency: Idempotency, keys: list[str], ttl_s: float) -> list[str] | None:
    """Claims every key, or none: ``None`` when one was already claimed (a duplicate delivery).

    If the store itself fails, the event is answered without dedupe: a possible duplicate is
    better than silence.
    """
    claimed: list[str] = []
    try:
        for key in keys:
            if not await idempotency.claim(key, ttl_s):
                for done in claimed:
                    await idempotency.release(done)
                return None
            claimed.append(key)
    except Exception:
        logger.exception("the idempotency store failed; answering without dedupe")
    return claimed


class Claim:
    """The dedupe keys claimed for one event, held until its turn ends (``take_claim``).

    With ``lease_s`` the keys are held for that long and renewed every ``lease_s / 3`` while the turn
    runs (``held``): a process that dies mid-turn stops renewing, and its event can be claimed (and
    answered) on a redelivery ``lease_s`` later. Without, they are claimed for ``ttl_s`` at once.
    ``finish`` keeps them for the dedupe ``ttl_s`` after an answer, or releases them after a failure.
    A claim with no keys (the store failed: answered without dedupe) holds nothing.
    """

    def __init__(self, idempotency: Idempotency, keys: list[str], *, ttl_s: float, lease_s: float | None = None):
        self.idempotency = idempotency
        self.keys: tuple[str, ...] = tuple(keys)
        self.ttl_s = ttl_s
        self.lease_s = lease_s
        self._renewal = (asyncio.create_task(self._renew(), name="renew claims")
                         if lease_s is not None and keys else None)
        self._finished = False

    def __repr__(self) -> str:
        return f"Claim({list(self.keys)!r}, lease_s={self.lease_s})"

    @property
    def held(self) -> bool:
        """Held on a renewed lease (a turn recorded as pending needs one)."""
        return self.lease_s is not None and bool(self.keys)

    async def renew(self) -> None:
        """Extend every key by ``lease_s`` once (a ``TurnLease`` renews them with its entry)."""
        if self.lease_s is None:
            return
        for key in self.keys:
            await self.idempotency.extend(key, self.lease_s)

    async def _renew(self) -> None:
        assert self.lease_s is not None
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.renew()
            except Exception:  # the next round tries again; the lease covers two misses
                logger.exception("could not renew the claims %s", list(self.keys))

    async def stop_renewing(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None

    async def finish(self, answered: bool) -> None:
        """The event is handled: kept for ``ttl_s`` (answered) or released (a redelivery may try again).
        Finishing twice does nothing (a command's ``finally`` after its own finish)."""
        await self.stop_renewing()
        if self._finished:
            return
        self._finished = True
        if not answered:
            await release_all(self.idempotency, list(self.keys))
            return
        if self.lease_s is None:
            return  # claimed for ttl_s already
        try:
            for key in self.keys:
                await self.idempotency.extend(key, self.ttl_s)
        except Exception:
            logger.exception("could not keep the claims %s; a redelivery after %.0f s could be answered again",
                             list(self.keys), self.lease_s)


async def take_claim(idempotency: Idempotency, keys: list[str], *, ttl_s: float,
                     lease_s: float | None = None) -> Claim | None:
    """``claim_all`` as a ``Claim``: ``None`` for a duplicate; with ``lease_s`` held on a renewed lease."""
    claimed = await claim_all(idempotency, keys, lease_s if lease_s is not None else ttl_s)
    return None if claimed is None else Claim(idempotency, claimed, ttl_s=ttl_s, lease_s=lease_s)


async def release_all(idempotency: Idempotency, keys: list[str]) -> None:
    """Releases claims (after a failed turn, so a redelivery can still be answered)."""
    for key in keys:
        try:
            await idempotency.release(key)
        except Exception:
            logger.exception("could not release the claim %s", key)


async def reap(task: asyncio.Task[Any]) -> None:
    """Await a task that was cancelled (or is ending): its cancellation stays its own, but the caller's
    does not, so a shutdown that cancels the caller while it waits still stops it. An error the task
    raised propagates."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


class TaskSet:
    """Tasks in flight (a platform's handlers, turns taken over): shutdown drains them, tests wait
    until they settle."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def track_current(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.track(task)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Also wait for ``task`` (work a handler left running in the background)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float | None = None) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def settle(self, quiet_s: float) -> None:
        """Returns once no task is left, including tasks started by the ones awaited."""
        while True:
            await asyncio.sleep(quiet_s)
            if not self._tasks:
                return
            await asyncio.gather(*set(self._tasks), return_exceptions=True)
