"""A Reply that records what an adapter would have shown."""

from __future__ import annotations

from bot.types import Answer


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
