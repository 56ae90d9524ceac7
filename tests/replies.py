"""A Reply that records what an adapter would have shown."""

from __future__ import annotations

import asyncio
import time

from bot.types import Answer, Inquiry, Outcome, Reply


class RecordingReply:
    def __init__(self) -> None:
        self.started = False
        self.deltas: list[str] = []
        self.final: Answer | None = None
        self.failure: str | None = None

    async def start(self) -> None:
        self.started = True

    async def push(self, delta: str) -> None:
        self.deltas.append(delta)

    async def finish(self, answer: Answer) -> None:
        self.final = answer

    async def fail(self, message: str) -> None:
        self.failure = message

    @property
    def streamed(self) -> str:
        return "".join(self.deltas)


class Stuck:
    """An Answerer that shows part of an answer and then never ends: its replica is about to die.
    With ``block_s`` it blocks its event loop that long instead (a stall), then finishes."""

    def __init__(self, text: str = "Grease the bearings ", *, block_s: float = 0.0) -> None:
        self.text = text
        self.block_s = block_s
        self.writing = asyncio.Event()
        self.cancelled_at: float | None = None

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        await reply.start()
        await reply.push(self.text)
        self.writing.set()
        if self.block_s:
            time.sleep(self.block_s)
            await reply.finish(Answer("Grease the bearings every 2,000 hours.", Outcome.ANSWERED))
            return Answer("", Outcome.ANSWERED)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            raise
        raise AssertionError("unreachable")
