"""Throttled delivery of a growing answer to a chat platform, shared by every adapter.

Two pieces, neither of which knows a platform:

- ``StreamWriter``: one ordered writer per answer. Deltas are coalesced into the latest text;
  the writer hands the platform ``Sink`` the *whole* latest text at most every
  ``Cadence.min_interval_s`` and only when it grew. When the platform says "retry after N s"
  (``RetryAfter``), the writer sleeps N s and then sends the *latest* text, so intermediate
  states are dropped but the final text never is. Sends never overlap and never reorder,
  unlike updates fired from a new task per delta.
- ``PlatformRates``: token buckets per ``(scope, method)``, shared by all answers in the process and,
  with ``REDIS_URL``, by every replica (``bot.rate_buckets``), so that every concurrent answer of
  one workspace (the scope) stays inside a method's rate tier together. A 429 on one answer
  ``hold``s the bucket for everyone, on every replica. When callers wait for a
  bucket, the one whose call completes something, and needs the fewest calls to do so, goes
  first (``Priority``): a busy budget is spent on finishing answers, not on showing more of
  unfinished ones.

Each platform's reply has a sink of its own on the same writer and budget: Slack's calls
``chat.appendStream`` or ``chat.update`` (``adapters/slack_reply.py``), Telegram's ``sendMessageDraft``
or ``editMessageText`` (``adapters/telegram_reply.py``). What surrounds them (claims, take-over,
failure display, the final reconciliation) is ``bot/delivery.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.metrics import METRICS
from bot.rate_buckets import BucketStore, MemoryBuckets, Rate
from bot.state import reap

__all__ = ["COMPLETES", "STARTS", "Cadence", "DeliveryFailed", "Priority", "Rate", "PlatformRates", "RetryAfter",
           "Sink", "StreamWriter", "TokenBucket", "cut_point", "in_background", "split_message"]

log = logging.getLogger("kbbot.streaming")

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RetryAfter(Exception):
    """The platform refused a send for now; try again (with the latest text) after ``seconds``."""

    def __init__(self, seconds: float, reason: str = "rate limited"):
        super().__init__(f"{reason}; retry after {seconds:g} s")
        self.seconds = max(0.0, float(seconds))
        self.reason = reason


class DeliveryFailed(RuntimeError):
    """The final text could not be delivered (the platform kept refusing past the writer's bound)."""


class Sink(Protocol):
    """Where a writer's text goes; one sink per answer, called by one writer only (never concurrently)."""

    async def send(self, text: str, final: bool) -> bool:
        """Show ``text``, the whole answer so far (``final``: the last call, with the final text).

        Return ``False`` when nothing needed sending (the visible text did not change), so the
        writer does not count it against the cadence. Raise ``RetryAfter`` to be called again
        later; the writer then passes the latest text, which may be longer.

        A sink may also define ``async ready(final: bool)``: the writer awaits it *before* it takes
        the text, so a wait for a shared rate budget ends with the latest text being sent. An
        intermediate ``ready`` may return ``False`` ("not now": no budget to spare); the writer then
        tries again after ``Cadence.min_interval_s`` with the latest text. A final ``ready`` must wait.
        """


@dataclass(frozen=True)
class Cadence:
    """How often a writer may send."""

    #: Minimum time between two sends of one answer (the final send included).
    min_interval_s: float = 1.0
    #: An intermediate send needs at least this many new characters since the last one.
    min_growth: int = 1
    #: Characters needed before the first send; 1 shows the first token at once.
    first_growth: int = 1
    #: Total ``RetryAfter`` sleeping accepted before the final text is given up as undeliverable.
    max_retry_wait_s: float = 300.0


@dataclass
class WriterStats:
    pushes: int = 0
    sends: int = 0
    retry_waits: int = 0
    retry_wait_s: float = 0.0
    #: Sends that raised something other than ``RetryAfter``.
    errors: int = 0
    #: ``clock()`` of the first send that showed text.
    first_send_at: float | None = None
    #: ``clock()`` of the first ``push`` (the model's first text reached the writer).
    first_push_at: float | None = None


class StreamWriter:
    """The single ordered writer of one answer.

    ``push`` is cheap and never waits for the platform; ``finish`` delivers the final text and
    returns once it is shown (or raises ``DeliveryFailed`` / the sink's error); ``close`` stops
    without a final text, after any send in flight (so a failure message posted next cannot be
    overwritten by a late update).
    """

    def __init__(self, sink: Sink, cadence: Cadence | None = None, *, name: str = "",
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep):
        self.sink = sink
        self.cadence = cadence or Cadence()
        self.name = name
        # The metrics label: the sink's ``platform``, else its class name (SlackSink -> slack).
        self.platform = str(getattr(sink, "platform", "") or type(sink).__name__.removesuffix("Sink").lower()
                            or "unknown")
        self.stats = WriterStats()
        self._clock = clock
        self._sleep = sleep
        self._text = ""
        self._final: str | None = None
        self._sent: str | None = None  # the text of the last successful send
        self._next_allowed = float("-inf")
        self._intermediate_off = False
        self._closed = False
        self._sending = False
        self._retry_waited = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    @property
    def text(self) -> str:
        return self._text

    @property
    def sent_text(self) -> str | None:
        return self._sent

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def push(self, delta: str) -> None:
        if self._closed or self._final is not None or not delta:
            return
        self._text += delta
        self.stats.pushes += 1
        if self.stats.first_push_at is None:
            self.stats.first_push_at = self._clock()
        self._ensure_task()
        self._wake.set()

    async def finish(self, text: str | None = None) -> None:
        """Deliver ``text`` (default: everything pushed) as the final text; wait until it is shown."""
        if self._closed:
            raise RuntimeError(f"writer {self.name!r} is closed")
        if self._final is None:
            self._final = self._text if text is None else text
        self._ensure_task()
        self._wake.set()
        assert self._task is not None
        await asyncio.shield(self._task)
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        """Stop sending; an intermediate send in flight completes first, nothing is sent after it."""
        self._closed = True
        self._wake.set()
        task = self._task
        if task is None or task.done():
            return
        if not self._sending:
            task.cancel()
        with contextlib.suppress(Exception):  # the error was logged by the loop; closing is best effort
            await reap(task)

    # --- the loop --------------------------------------------------------------------------
    def _ensure_task(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"stream writer {self.name}")

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            if self._final is None and self._intermediate_off:
                continue
            delay = self._next_allowed - self._clock()
            if delay > 0:
                await self._sleep(delay)
                if self._closed:
                    return
            if self._final is None and not self._grew_enough(self._text):
                continue
            ready = getattr(self.sink, "ready", None)
            if ready is not None:
                go = await ready(self._final is not None)
                if self._closed:
                    return
                if go is False and self._final is None:
                    # No budget to spare for an intermediate state: look again later (or at the final).
                    self._next_allowed = max(self._next_allowed, self._clock() + self.cadence.min_interval_s)
                    self._wake.set()
                    continue
            final = self._final is not None
            text = self._final if final else self._text
            assert text is not None
            try:
                self._sending = True
                sent = await self.sink.send(text, final)
            except RetryAfter as exc:
                self.stats.retry_waits += 1
                self.stats.retry_wait_s += exc.seconds
                METRICS.retry_waits.labels(self.platform).inc()
                self._retry_waited += exc.seconds
                if final and self._retry_waited > self.cadence.max_retry_wait_s:
                    self._error = DeliveryFailed(
                        f"the final text was refused for {self._retry_waited:.0f} s ({exc.reason})")
                    return
                log.info("writer %s: %s", self.name, exc)
                # Sleep it out, then send whatever is latest by then.
                self._next_allowed = max(self._next_allowed, self._clock() + exc.seconds)
                self._wake.set()
                continue
            except Exception as exc:  # noqa: BLE001 - kept as the final send's error, or intermediates stop
                self.stats.errors += 1
                if final:
                    self._error = exc
                    return
                # Intermediate states are optional: stop them, the final send tries again.
                log.warning("writer %s: an intermediate send failed (%s); only the final text follows",
                            self.name, exc)
                self._intermediate_off = True
                continue
            finally:
                self._sending = False
            if sent:
                self.stats.sends += 1
                if self.stats.first_send_at is None:
                    self.stats.first_send_at = self._clock()
                    if self.stats.first_push_at is not None:
                        METRICS.first_visible.labels(self.platform).observe(
                            max(0.0, self.stats.first_send_at - self.stats.first_push_at))
                self._next_allowed = self._clock() + self.cadence.min_interval_s
                self._sent = text
            if final:
                return

    def _grew_enough(self, text: str) -> bool:
        if self._sent is None:
            return len(text) >= self.cadence.first_growth
        return len(text) - len(self._sent) >= self.cadence.min_growth


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
    process (``MemoryBuckets``, the default) or across replicas (``bot.rate_buckets.RedisBuckets``).

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


#: Background calls of replies made without an owner to track them (kept referenced until done).
_PENDING: set[asyncio.Task[Any]] = set()


def in_background(call: Coroutine[Any, Any, Any], *, name: str,
                  track: Callable[[asyncio.Task[Any]], None] | None = None) -> asyncio.Task[Any]:
    """``call`` in a task of its own that nothing awaits (a courtesy such as taking a reaction back):
    ``track`` (the adapter's task set, which shutdown drains) keeps it, else this module does until done."""
    task = asyncio.create_task(call, name=name)
    if track is not None:
        track(task)
    else:
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)
    return task


# --- long answers ---------------------------------------------------------------------------
def cut_point(text: str, limit: int, not_before: int = 0) -> int:
    """Where to end a message of at most ``limit`` characters: a paragraph break if one lies in the
    second half, else a line break, a sentence end or a space; never before ``not_before``."""
    if len(text) <= limit:
        return len(text)
    window = text[:limit]
    floor = max(not_before, limit // 2)
    for separator in ("\n\n", "\n", ". ", "。", "！", "？", "; ", " "):
        found = window.rfind(separator)
        if found >= 0 and found + len(separator) > floor:
            return found + len(separator)
    for separator in ("\n\n", "\n", " "):
        found = window.rfind(separator)
        if found >= 0 and found + len(separator) > not_before:
            return found + len(separator)
    return limit


def split_message(text: str, limit: int, not_before: int = 0) -> list[str]:
    """``text`` as consecutive parts of at most ``limit`` characters; ``"".join`` gives ``text`` back."""
    parts = []
    while len(text) > limit:
        cut = cut_point(text, limit, not_before)
        parts.append(text[:cut])
        text = text[cut:]
        not_before = 0
    if text or not parts:
        parts.append(text)
    return parts
