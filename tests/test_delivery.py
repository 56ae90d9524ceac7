"""A third platform against the delivery layer (``bot/delivery/``): a minimal console supplies only
what differs (post, edit, delete, its account, how a reply is rebuilt) and gets the gate, claims,
take-over of a dead replica's turn, the paced stream, the final text and failure display from the
layer, as Slack and Telegram do."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.conversation import Conversations
from bot.delivery.gate import Access, Delivery
from bot.delivery.pending import MemoryPendingTurns, PendingTurn
from bot.delivery.reply import Cadence, ChatReply, reconcile, show_failure, split_message
from bot.delivery.turns import Arrival, TakeOver
from bot.state import MemoryIdempotency
from bot.state.history import SqliteHistory
from bot.types import Answer, Inquiry, Outcome
from tests.replies import Stuck

QUESTION = "How often should the bearings be greased?"
ANSWER = "Grease the bearings every 2,000 operating hours. Use the lithium grease named in the manual."
LEASE = 0.6


@dataclass
class Screen:
    """The console's whole "API": numbered lines that can be written, rewritten and removed."""

    lines: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    ids: Any = field(default_factory=lambda: itertools.count(1))

    def write(self, text: str) -> str:
        line = str(next(self.ids))
        self.lines[line] = text
        return line

    def shown(self) -> list[str]:
        return list(self.lines.values())


@dataclass
class Line:
    id: str
    text: str


class ConsoleMessages:
    """Post, edit, delete: the platform's part of a reply (``AnswerMessages``). Pacing the stream,
    reconciling the final text and showing a failure past rate limits are the delivery layer's
    (``ChatReply``, ``reconcile``, ``show_failure``); a console has nothing to acknowledge."""

    platform = "console"
    cadence = Cadence(min_interval_s=0.01)

    def __init__(self, screen: Screen, width: int = 60):
        self.screen = screen
        self.width = width
        self.posted: list[Line] = []

    async def add(self, text: str, last: bool = False) -> None:
        self.posted.append(Line(self.screen.write(text), text))

    async def edit(self, line: Line, text: str, last: bool = False) -> None:
        self.screen.lines[line.id] = line.text = text

    async def delete(self, line: Line) -> None:
        del self.screen.lines[line.id]
        self.screen.removed.append(line.id)
        self.posted.remove(line)

    @staticmethod
    def same(line: Line, part: str, last: bool) -> bool:
        return line.text == part

    def final_parts(self, text: str) -> list[str]:
        return split_message(text, self.width)

    async def show(self, text: str) -> bool:
        await reconcile(self.posted, self.final_parts(text), same=self.same, edit=self.edit, add=self.add,
                        delete=self.delete)
        return True

    async def ready(self, final: bool) -> bool:
        return True

    async def show_failure(self, message: str) -> None:
        async def replace() -> bool:
            if not self.posted:
                return False
            await self.edit(self.posted[-1], f"! {message}")
            return True

        await show_failure(replace, lambda: self.add(f"! {message}"))

    def message_ids(self) -> list[str]:
        return [line.id for line in self.posted]

    def complete(self, answer: Answer) -> None:
        pass

    async def final_shown(self) -> None:
        pass

    async def acknowledge(self) -> None:
        pass

    async def settle(self) -> None:
        pass

    async def take_back(self, *, failed: bool) -> None:
        pass


def console_reply(screen: Screen) -> ChatReply:
    return ChatReply(ConsoleMessages(screen), name="console")


class Console:
    """The console as a ``bot.delivery.Platform``."""

    name = "console"

    def __init__(self, screen: Screen):
        self.screen = screen

    async def account(self) -> str:
        return "console:desk-1"

    def rebuild(self, turn: PendingTurn) -> ChatReply:
        return console_reply(self.screen)

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        self.screen.lines.pop(message_id, None)
        self.screen.removed.append(message_id)
        return True

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        self.screen.lines[message_id] = text


class Answers:
    """An Answerer that streams two pieces and finishes (or fails, as the real one shows a failure)."""

    def __init__(self, fail: bool = False):
        self.fail = fail

    async def answer(self, inquiry: Inquiry, reply: Any) -> Answer:
        await reply.start()
        await reply.push("Grease the bearings ")
        if self.fail:
            await reply.fail("The knowledge base cannot be reached right now. Please try again shortly.")
            return Answer("", Outcome.ERROR)
        await reply.push("every 2,000 hours.")
        answer = Answer(ANSWER, Outcome.ANSWERED)
        await reply.finish(answer)
        return answer


@dataclass
class Replica:
    conversations: Conversations
    delivery: Delivery
    console: Console


def replica(tmp: Path, name: str, answerer: Any, *, screen: Screen, pending: MemoryPendingTurns,
            idempotency: MemoryIdempotency) -> Replica:
    conversations = Conversations(answerer, idempotency, SqliteHistory(tmp / f"{name}.sqlite3"),
                                  takeover=TakeOver(pending, name))
    console = Console(screen)
    delivery = Delivery(conversations.turns, console)
    delivery.check(lambda access: None if access.user != "mallory" else "not on the desk's list")
    conversations.turns.serve(delivery)  # as the composition root does for every chat platform
    return Replica(conversations, delivery, console)


async def ask(r: Replica, n: int, user: str = "alice") -> Answer | None:
    """What a console adapter does with a line typed at the desk."""
    if not r.delivery.admit(Access("question", user, "desk-1", "desk-1", private=True)):
        return None
    inquiry = Inquiry("console", "desk-1", "desk-1", "console:desk-1", user, QUESTION)
    accepted = await r.delivery.accept(Arrival(inquiry, [f"console:line:{n}"], str(n), "line", target={"desk": "desk-1"},
                                               ttl_s=60, lease_s=LEASE, crashed="Something went wrong."))
    if accepted is None:
        return None
    return await r.delivery.answer(accepted, console_reply(r.console.screen))


async def test_a_third_platform_gets_the_gate_claims_takeover_and_failure_display(tmp_path: Path):
    screen, pending, idempotency = Screen(), MemoryPendingTurns(), MemoryIdempotency()
    stores = {"screen": screen, "pending": pending, "idempotency": idempotency}

    # The gate and claims: a line is answered once, a stranger not at all.
    a = replica(tmp_path, "A", Answers(), **stores)
    answer = await ask(a, 1)
    assert answer is not None and answer.outcome is Outcome.ANSWERED
    assert screen.shown() == split_message(ANSWER, 60), "the final text reconciled over what streamed"
    assert await ask(a, 1) is None, "a redelivery is not answered twice"
    assert await ask(a, 2, user="mallory") is None and not idempotency._expires.get("console:line:2")

    # Failure display: the partial answer is replaced by the message.
    screen.lines.clear()
    failed = replica(tmp_path, "F", Answers(fail=True), **stores)
    await ask(failed, 3)
    assert screen.shown() == ["! The knowledge base cannot be reached right now. Please try again shortly."]

    # Take-over: replica D dies mid-answer; E (same account) deletes the half-written line and answers once.
    screen.lines.clear()
    stuck = Stuck("Grease the bearings ")
    d = replica(tmp_path, "D", stuck, **stores)
    turn = asyncio.create_task(ask(d, 4))
    await stuck.writing.wait()
    await asyncio.sleep(0.4)  # the lease records the line's id
    [orphan] = list(screen.lines)
    turn.cancel()  # SIGKILL
    await asyncio.gather(turn, return_exceptions=True)
    e = replica(tmp_path, "E", Answers(), **stores)
    await asyncio.sleep(LEASE * 1.6)
    assert await e.conversations.turns.recover() == 1
    await e.conversations.turns.recovering.settle(0.05)
    assert orphan in screen.removed and orphan not in screen.lines
    assert screen.shown() == split_message(ANSWER, 60), "answered once, in full"
