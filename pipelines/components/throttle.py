"""At most N model calls at once in this process, whichever turn or step makes them.

``ModelCallSlots`` is shared by the answer generator and the helper generator (rewrite, guard,
grade, reformulate); ``Throttled`` wraps a chat generator so each ``run`` / ``run_async`` holds one
slot for the whole call, streaming included. A call that finds every slot taken waits: the turn's
own timeout bounds the wait.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from haystack import component
from haystack.dataclasses import ChatMessage


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


@component
class Throttled:
    """A chat generator behind ``ModelCallSlots``; same inputs and ``replies`` output."""

    def __init__(self, generator: Any, slots: ModelCallSlots):
        self.generator = generator
        self.slots = slots

    def warm_up(self) -> None:
        if hasattr(self.generator, "warm_up"):
            self.generator.warm_up()

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], streaming_callback: Callable[..., Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        self.slots.acquire()
        try:
            return self.generator.run(messages=messages, streaming_callback=streaming_callback,
                                      generation_kwargs=generation_kwargs)
        finally:
            self.slots.release()

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage], streaming_callback: Callable[..., Any] | None = None,
                        generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.slots.acquire_async()
        try:
            return await self.generator.run_async(messages=messages, streaming_callback=streaming_callback,
                                                  generation_kwargs=generation_kwargs)
        finally:
            self.slots.release()
