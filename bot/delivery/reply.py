"""What every chat platform's reply does the same way: ``StreamedReply`` (acknowledge, stream, finish, fail,
take the acknowledgement back), failure display past rate limits (``show_failure``) and the final text
reconciled over the messages already shown (``reconcile``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from bot.delivery.stream import RetryAfter, StreamWriter
from bot.types import Answer

log = logging.getLogger("kbbot.delivery")


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
