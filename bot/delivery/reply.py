"""One platform-free reply: what every chat platform's answer does the same way, paced to its rate tiers.

- ``StreamWriter``: one ordered writer per answer. Deltas are coalesced into the latest text; the writer
  hands the platform's ``Sink`` the *whole* latest text at most every ``Cadence.min_interval_s`` and only
  when it grew, once the sink is ``ready`` (its rate budget, ``bot.delivery.rates``). When the platform says
  "retry after N s" (``RetryAfter``), the writer sleeps N s and then sends the *latest* text, so
  intermediate states are dropped but the final text never is. Sends never overlap and never reorder.
- ``StreamedReply``: the reply's flow, in this order: ``start`` acknowledges the question, ``push`` feeds
  the writer, ``finish`` completes the text with the platform's sources and buttons, ``fail`` closes the
  stream and shows the failure (``show_failure``: the partial answer replaced, else posted, past rate
  limits), and after either the acknowledgement is taken back.
- ``reconcile``: the final text, as the platform's message parts, over the messages already shown
  (each kept, edited or deleted, the rest posted).

A platform's reply (``adapters/slack/reply.py``, ``adapters/telegram/reply.py``) supplies its sink (post,
edit, stream calls) and its acknowledgement; what surrounds a turn (claims, take-over) is
``bot.delivery.turns`` and ``bot.delivery.gate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bot.metrics import METRICS
from bot.state import reap
from bot.types import Answer

__all__ = ["Cadence", "DeliveryFailed", "RetryAfter", "Sink", "StreamWriter", "StreamedReply", "cut_point",
           "in_background", "reconcile", "show_failure", "split_message"]

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

    #: The platform's name, the label of the writer's metrics.
    platform: str

    async def ready(self, final: bool) -> bool:
        """Awaited *before* the writer takes the text, so a wait for a shared rate budget ends with the
        latest text being sent. An intermediate ``ready`` may return ``False`` ("not now": no budget to
        spare); the writer then tries again after ``Cadence.min_interval_s`` with the latest text. A final
        ``ready`` must wait (and return True)."""

    async def send(self, text: str, final: bool) -> bool:
        """Show ``text``, the whole answer so far (``final``: the last call, with the final text).

        Return ``False`` when nothing needed sending (the visible text did not change), so the
        writer does not count it against the cadence. Raise ``RetryAfter`` to be called again
        later; the writer then passes the latest text, which may be longer.
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
        self.platform = sink.platform
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
            go = await self.sink.ready(self._final is not None)
            if self._closed:
                return
            if not go and self._final is None:
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


# --- what every platform's reply does --------------------------------------------------------------
class FailureShown(Protocol):
    async def show_failure(self, message: str) -> None:
        """The failed turn's message in place of what was being filled, else posted (``show_failure``)."""


class StreamedReply:
    """What every chat platform's ``Reply`` does the same way, in this order: ``start`` acknowledges the
    question (if the Answerer did not already), ``push`` hands the text to the answer's ``StreamWriter``,
    ``finish`` adds the platform's sources and buttons and completes the text, ``fail`` closes the
    stream and shows the failure, and after either the acknowledgement is taken back.

    A platform's reply supplies ``acknowledge``, ``final_extras`` (what goes with the final text),
    ``settle_acknowledgement`` (before a failure is shown: no acknowledgement may land after it) and
    ``take_back`` (the acknowledgement's undoing once the answer or failure is shown).
    """

    writer: StreamWriter
    sink: FailureShown
    #: The failure message shown, when the turn failed.
    failed: str | None = None

    async def acknowledge(self) -> None:
        raise NotImplementedError

    def final_extras(self, answer: Answer) -> None:
        raise NotImplementedError

    async def settle_acknowledgement(self) -> None:
        raise NotImplementedError

    async def take_back(self, *, failed: bool) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        await self.acknowledge()  # already done when the Answerer acknowledged first

    async def push(self, delta: str) -> None:
        self.writer.push(delta)

    async def finish(self, answer: Answer) -> None:
        self.final_extras(answer)
        try:
            await self.writer.finish(answer.text)
        finally:
            await self.take_back(failed=False)

    async def fail(self, message: str) -> None:
        self.failed = message
        await self.writer.close()
        await self.settle_acknowledgement()
        try:
            await self.sink.show_failure(message)
        except Exception:
            log.exception("%s: could not show the failure message", self.writer.name)
        await self.take_back(failed=True)


async def show_failure(replace: Callable[[], Awaitable[bool]], post: Callable[[], Awaitable[None]], *,
                       attempts: int = 4) -> None:
    """A failed turn's message: ``replace`` puts it in the message being filled (False: there is none,
    or the platform refused), else ``post`` sends it; a ``RetryAfter`` is slept out, ``attempts`` times."""
    for attempt in range(attempts):
        try:
            if not await replace():
                await post()
            return
        except RetryAfter as wait:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(wait.seconds)


Shown = TypeVar("Shown")
Part = TypeVar("Part")


async def reconcile(shown: list[Shown], parts: Sequence[Part], *, same: Callable[[Shown, Part, bool], bool],
                    edit: Callable[[Shown, Part, bool], Awaitable[None]], add: Callable[[Part, bool], Awaitable[None]],
                    delete: Callable[[Shown], Awaitable[None]]) -> None:
    """The final text, as ``parts``, over the messages already ``shown`` for an answer: each shown
    message that already holds its part (``same``; the last part carries sources and buttons) stays, the
    others are edited, the parts beyond them are added (``add`` appends to ``shown``) and the messages
    beyond the parts are deleted (``delete`` removes from ``shown``)."""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if i < len(shown):
            if not same(shown[i], part, last):
                await edit(shown[i], part, last)
        else:
            await add(part, last)
    while len(shown) > len(parts):  # the final text is shorter than what was shown
        await delete(shown[-1])
