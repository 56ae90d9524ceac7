"""One platform-free reply: what every chat platform's answer does the same way, paced to its rate tiers.

- ``StreamWriter``: one ordered writer per answer. Deltas are coalesced into the latest text; the writer
  hands the platform's ``Sink`` the *whole* latest text at most every ``Cadence.min_interval_s`` and only
  when it grew, once the sink is ``ready`` (its rate budget, ``bot.delivery.rates``). When the platform says
  "retry after N s" (``RetryAfter``), the writer sleeps N s and then sends the *latest* text, so
  intermediate states are dropped but the final text never is. Sends never overlap and never reorder.
- ``ChatReply``: the one ``Reply`` of every chat platform, in this order: ``acknowledge``/``start`` show
  the question taken, ``push`` feeds the writer, ``finish`` completes the text with the platform's
  sources and buttons and reconciles it over what is shown, ``fail`` closes the stream and shows the
  failure (``show_failure``: the partial answer replaced, else posted, past rate limits), and after
  either the acknowledgement is taken back.
- ``reconcile``: the final text, as the platform's message parts, over the messages already shown
  (each kept, edited or deleted, the rest posted).

A platform supplies one answer's messages as plain operations (``AnswerMessages``: acknowledge, ready,
show, the final parts and their same/edit/add/delete, show_failure; ``adapters/slack/reply.py``,
``adapters/telegram/reply.py``); nothing of it calls back into the reply. What surrounds a turn (claims,
take-over) is ``bot.delivery.turns`` and ``bot.delivery.gate``.
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

__all__ = ["AnswerMessages", "Cadence", "ChatReply", "DeliveryFailed", "RetryAfter", "Sink", "StreamWriter", "cut_point",
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
class AnswerMessages(Protocol):
    """One answer's messages on a chat platform: the plain operations a ``ChatReply`` drives, in the
    platform's folder (``adapters/slack/reply.py``, ``adapters/telegram/reply.py``). Nothing here calls
    back into the reply: the platform answers, the reply decides when."""

    #: The platform's name, the label of the writer's metrics.
    platform: str
    #: How often this answer may be sent now (a platform that falls back from streaming to edits
    #: paces the rest of the answer as edits).
    cadence: Cadence
    #: The messages already posted for this answer, in order (what ``reconcile`` goes over).
    posted: list[Any]

    async def acknowledge(self) -> None:
        """Show at once that the question was taken (a status, typing, a reaction); returns when the
        turn may go on. Called again when the turn starts: a second call does nothing."""

    async def settle(self) -> None:
        """A failure is about to be shown: no acknowledgement may land after it."""

    async def take_back(self, *, failed: bool) -> None:
        """The answer or its failure is shown: the acknowledgement's undoing (a reaction, a status)."""

    async def ready(self, final: bool) -> bool:
        """``Sink.ready``: the rate budget of the coming call, taken before the writer takes its text."""

    async def show(self, text: str) -> bool:
        """The answer so far (the whole text), as an intermediate state; False when nothing changed on
        screen. May raise ``RetryAfter``."""

    def complete(self, answer: Answer) -> None:
        """The answer is complete: what its last message carries (sources, buttons)."""

    def final_parts(self, text: str) -> Sequence[Any]:
        """The final text as the platform's message parts (rendered, split to its size)."""

    def same(self, shown: Any, part: Any, last: bool) -> bool:
        """``shown`` already holds ``part`` (with what the last part carries when ``last``)."""

    async def edit(self, shown: Any, part: Any, last: bool) -> None: ...

    async def add(self, part: Any, last: bool) -> None:
        """``part`` in a message of its own (appended to ``posted``)."""

    async def delete(self, shown: Any) -> None:
        """A message the final text no longer needs (removed from ``posted``)."""

    async def final_shown(self) -> None:
        """The final text is on screen: what was kept for finishing it goes back."""

    async def show_failure(self, message: str) -> None:
        """The failed turn's message in place of what was being filled, else posted (``show_failure``)."""

    def message_ids(self) -> list[str]:
        """Ids of the messages posted so far for this answer (``PostsMessages``)."""


class ChatReply:
    """The ``Reply`` of one answer on a chat platform, the same on every platform: ``acknowledge`` (and
    ``start``) show the question taken, ``push`` hands the text to the answer's ``StreamWriter``,
    ``finish`` completes it with the platform's sources and buttons and reconciles the final text over
    what is shown (``reconcile``), ``fail`` stops the stream and shows the failure; after either the
    acknowledgement is taken back. The platform supplies ``messages`` (``AnswerMessages``)."""

    def __init__(self, messages: AnswerMessages, *, name: str):
        self.messages = messages
        self.platform = messages.platform
        self.writer = StreamWriter(self, messages.cadence, name=name)
        #: The failure message shown, when the turn failed.
        self.failed: str | None = None

    # --- Reply -----------------------------------------------------------------------------------
    async def acknowledge(self) -> None:
        await self.messages.acknowledge()

    async def start(self) -> None:
        await self.messages.acknowledge()  # already done when the Answerer acknowledged first

    async def push(self, delta: str) -> None:
        self.writer.push(delta)

    async def finish(self, answer: Answer) -> None:
        self.messages.complete(answer)
        try:
            await self.writer.finish(answer.text)
        finally:
            await self.messages.take_back(failed=False)

    async def fail(self, message: str) -> None:
        self.failed = message
        await self.writer.close()
        await self.messages.settle()
        try:
            await self.messages.show_failure(message)
        except Exception:
            log.exception("%s: could not show the failure message", self.writer.name)
        await self.messages.take_back(failed=True)

    def message_ids(self) -> list[str]:
        return self.messages.message_ids()

    async def stop(self) -> None:
        """Stop writing (a turn taken over while alive); a send in flight completes first, so the ids of
        what it posted are known."""
        await self.writer.close()

    # --- the writer's sink -----------------------------------------------------------------------
    async def ready(self, final: bool) -> bool:
        go = await self.messages.ready(final)
        self.writer.cadence = self.messages.cadence
        return go

    async def send(self, text: str, final: bool) -> bool:
        messages = self.messages
        if not final:
            sent = await messages.show(text)
            self.writer.cadence = messages.cadence
            return sent
        await reconcile(messages.posted, messages.final_parts(text), same=messages.same, edit=messages.edit,
                        add=messages.add, delete=messages.delete)
        await messages.final_shown()
        return True


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
