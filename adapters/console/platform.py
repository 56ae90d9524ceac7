"""The console adapter: a terminal conversation, answers streamed as they are produced."""

from __future__ import annotations

import sys
from typing import TextIO

from bot.types import Answer, Inquiry, Outcome


def render_sources(answer: Answer) -> str:
    if not answer.citations:
        return ""
    lines = ["", "Sources:"]
    for c in answer.citations:
        where = (c.url or c.source) if c.source != c.title else ""
        lines.append(f"  [{c.index}] {c.label}" + (f" — {where}" if where else ""))
    return "\n".join(lines)


class ConsoleReply:
    """Writes deltas straight to the terminal; the final answer adds its sources."""

    def __init__(self, out: TextIO = sys.stdout, *, stream: bool = True):
        self.out = out
        self.stream = stream
        self._pushed = False

    async def start(self) -> None:
        pass

    async def push(self, delta: str) -> None:
        if self.stream:
            self.out.write(delta)
            self.out.flush()
            self._pushed = True

    async def finish(self, answer: Answer) -> None:
        if not self._pushed:
            self.out.write(answer.text)
        label = {Outcome.NOT_FOUND: " (not found in the knowledge base)"}.get(answer.outcome, "")
        self.out.write(render_sources(answer) + label + "\n")
        self.out.flush()

    async def fail(self, message: str) -> None:
        if self._pushed:
            self.out.write("\n")
        self.out.write(f"⚠ {message}\n")
        self.out.flush()


def console_inquiry(text: str, thread: str) -> Inquiry:
    return Inquiry(platform="console", tenant="local", channel="console", thread_key=f"console:{thread}",
                   user_id="console", text=text, private=True)
