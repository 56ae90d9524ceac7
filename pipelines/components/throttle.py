"""Model calls admitted before they go, whichever turn or step makes them.

``Throttled`` wraps a chat generator so each ``run`` / ``run_async`` holds one place of a
``CallAdmission`` for the whole call, streaming included; the answer generator and the helper
generator (rewrite, guard, grade, reformulate) share one. ``ModelCallSlots`` is a fixed number of
places in this process (the model kbbot runs itself); a hosted model's admission adapts to what its
provider allows (``bot.turn.model_calls``). A call that finds no place waits: the turn's own timeout
bounds the wait.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

from haystack import component
from haystack.dataclasses import ChatMessage


async def warm_up_async(generator: Any) -> None:
    """``generator`` warmed as an async run needs it, the way Haystack's ``Pipeline.warm_up_async`` warms a
    component: its own ``warm_up_async`` (Anthropic's makes the async client a turn uses, where its
    ``warm_up`` makes a sync client no turn does), else its ``warm_up``. Our wrappers of a generator
    pass it on with this."""
    if callable(warm := getattr(generator, "warm_up_async", None)):
        await warm()
    elif callable(warm := getattr(generator, "warm_up", None)):
        warm()


class CallAdmission(Protocol):
    async def enter(self) -> Any:
        """Wait for a place; returns the ticket ``leave`` takes."""

    async def leave(self, ticket: Any) -> None: ...


class ModelCallSlots:
    """A counting semaphore usable from threads (sync pipeline runs) and event loops alike."""

    POLL_S = 0.02

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("the model call limit must be at least 1")
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)
        self.in_use = 0
        self.peak = 0
        self._count = threading.Lock()

    def _took(self) -> None:
        with self._count:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)

    def acquire(self) -> None:
        self._free.acquire()
        self._took()

    async def acquire_async(self) -> None:
        # A threading semaphore shared with sync callers; polled so the event loop never blocks.
        while not self._free.acquire(blocking=False):
            await asyncio.sleep(self.POLL_S)
        self._took()

    def release(self) -> None:
        with self._count:
            self.in_use -= 1
        self._free.release()

    async def enter(self) -> None:
        await self.acquire_async()

    async def leave(self, ticket: None = None) -> None:
        self.release()


@component
class Throttled:
    """A chat generator behind a ``CallAdmission``; same inputs and ``replies`` output."""

    def __init__(self, generator: Any, slots: CallAdmission):
        self.generator = generator
        self.slots = slots

    def warm_up(self) -> None:
        if hasattr(self.generator, "warm_up"):
            self.generator.warm_up()

    async def warm_up_async(self) -> None:
        await warm_up_async(self.generator)

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], streaming_callback: Callable[..., Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        acquire = getattr(self.slots, "acquire", None)
        if acquire is None:  # an admission shared in Redis waits in the event loop only
            raise RuntimeError(f"{type(self.slots).__name__} admits async calls only: run the pipeline with run_async")
        acquire()
        try:
            return self.generator.run(messages=messages, streaming_callback=streaming_callback,
                                      generation_kwargs=generation_kwargs)
        finally:
            self.slots.release()

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage], streaming_callback: Callable[..., Any] | None = None,
                        generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        ticket = await self.slots.enter()
        try:
            return await self.generator.run_async(messages=messages, streaming_callback=streaming_callback,
                                                  generation_kwargs=generation_kwargs)
        finally:
            await asyncio.shield(self.slots.leave(ticket))  # a cancelled turn still frees its place
