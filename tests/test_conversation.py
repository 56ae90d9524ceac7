"""The conversation service on its own, on the indexed sample knowledge base: what every platform's
adapter relies on (claims kept or released, reviews, admin and preference commands, a thread afresh)."""

from __future__ import annotations

from bot.conversation import AdminStatus, Conversations, HandledTurn, ReviewStatus
from bot.runtime import Runtime
from bot.types import Inquiry, Outcome
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"


def inquiry(text: str, thread: str, user: str = "u1") -> Inquiry:
    return Inquiry("test", "t1", "c1", f"test:{thread}", user, text)


async def test_a_claim_is_kept_after_an_answer_and_released_after_a_failure(kb_runtime: Runtime):
    turns: list[HandledTurn] = []
    conversations = kb_runtime.conversations(on_turn=turns.append)
    claimed = await conversations.turns.claim(["test:event:1"], 60)
    answer = await conversations.turns.answer(inquiry(QUESTION, "a"), RecordingReply(), claimed=claimed,
                                        event_id="1", kind="dm")
    assert answer is not None and answer.outcome is Outcome.ANSWERED
    assert await conversations.turns.claim(["test:event:1"], 60) is None, "answered: a redelivery is not answered again"

    claimed = await conversations.turns.claim(["test:event:2"], 60)
    reply = RecordingReply()
    failed = await conversations.turns.answer(inquiry("   ", "b"), reply, claimed=claimed, event_id="2", kind="dm")
    assert failed is not None and failed.outcome is Outcome.ERROR and reply.failure
    again = await conversations.turns.claim(["test:event:2"], 60)
    assert again is not None and again.keys == ("test:event:2",), "failed: a redelivery may try again"
    assert [(t.event_id, t.kind, t.answer.outcome) for t in turns] == [("1", "dm", Outcome.ANSWERED),
                                                                       ("2", "dm", Outcome.ERROR)]


async def test_reviews_say_what_happened(kb_runtime: Runtime):
    conversations = kb_runtime.conversations()
    first = await conversations.turns.answer(inquiry(QUESTION, "r"), RecordingReply(), claimed=None, event_id="1", kind="dm")
    assert first is not None and first.approvable
    turn_id = first.trace.turn_id

    async def review(approving: bool, reviewer: bool = True, turn: str = turn_id) -> ReviewStatus:
        return (await conversations.review(turn, approving=approving, reviewer=reviewer, user="R1",
                                           display_name="Rita", tenant="test:t1")).status

    assert await review(True, reviewer=False) is ReviewStatus.NOT_REVIEWER
    assert await review(True, turn="0" * 32) is ReviewStatus.EXPIRED
    approved = await conversations.review(turn_id, approving=True, reviewer=True, user="R1", display_name="Rita",
                                          tenant="test:t1")
    assert approved.status is ReviewStatus.APPROVED and approved.answer is not None
    assert "4,000" in approved.answer.text
    assert await review(False) is ReviewStatus.WITHDRAWN
    assert await review(False) is ReviewStatus.NOTHING_TO_WITHDRAW
    off = Conversations(kb_runtime.answerer, kb_runtime.idempotency, kb_runtime.history)
    assert (await off.review(turn_id, approving=True, reviewer=True, user="R1", display_name="",
                             tenant="test:t1")).status is ReviewStatus.DISABLED


async def test_admin_commands_are_refused_before_anything_starts(kb_runtime: Runtime):
    conversations = kb_runtime.conversations()
    started: list[str | None] = []

    async def start(source: str | None) -> None:
        started.append(source)

    refused = await conversations.admin_command("refresh", "docs", user="u", is_admin=False, started=start)
    unavailable = await conversations.admin_command("status", None, user="u", is_admin=True, started=start)
    assert (refused.status, unavailable.status, started) == (AdminStatus.NOT_ADMIN, AdminStatus.UNAVAILABLE, [])


async def test_preference_commands_and_a_thread_afresh(kb_runtime: Runtime):
    conversations = kb_runtime.conversations()
    said = await conversations.preference_command("test", "t1", "u1", ["prefs", "concise"], prefix="/")
    assert said.startswith("Your answering preferences") and "concise" in said
    assert await conversations.user_language("test", "t1", "u1") is None
    await conversations.preference_command("test", "t1", "u1", ["prefs", "lang", "zh"], prefix="/")
    assert await conversations.user_language("test", "t1", "u1") == "zh"

    await conversations.turns.answer(inquiry(QUESTION, "f"), RecordingReply(), claimed=None, event_id="1", kind="dm")
    assert await conversations.answered_before("test:f")
    assert await conversations.start_afresh("test:f")
    assert not await conversations.answered_before("test:f")
