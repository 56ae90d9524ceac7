"""Writes turn records as turns end, and adds what happens to them later (feedback, approvals).

Recording never fails a turn: a record that cannot be written is logged and the answer stands.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bot.state.feedback import Feedback, FeedbackStore
from bot.state.turn_log.records import TurnRecord, user_key
from bot.state.turn_log.store import TurnLog
from bot.types import Answer, Inquiry

log = logging.getLogger("kbbot.insights")


class TurnRecorder:
    def __init__(self, log_: TurnLog, *, hash_key: str | None = None):
        self.log = log_
        self.hash_key = hash_key

    async def keep(self, inquiry: Inquiry, answer: Answer) -> None:
        try:
            await self.log.add(TurnRecord.of_turn(inquiry, answer, hash_key=self.hash_key))
        except Exception as exc:  # noqa: BLE001 - the answer was already given; only its record is lost
            log.warning("turn %s: the turn record was not kept (%s)", answer.trace.turn_id, type(exc).__name__)

    async def feedback(self, item: Feedback) -> None:
        try:
            await self.log.set_feedback(item.turn_id, user_key(item.user_id, self.hash_key), item.rating)
        except Exception as exc:  # noqa: BLE001 - the click itself is stored by the feedback store
            log.warning("turn %s: feedback not added to the turn record (%s)", item.turn_id, type(exc).__name__)

    async def approval(self, turn_id: str, by: str | None) -> None:
        approval = None if by is None else {"by": by, "at": time.time()}
        try:
            await self.log.set_approval(turn_id, approval)
        except Exception as exc:  # noqa: BLE001 - the approval itself is in the answer cache
            log.warning("turn %s: approval not added to the turn record (%s)", turn_id, type(exc).__name__)

    async def forget(self, platform: str, tenant: str, user_id: str) -> int:
        return await self.log.forget(platform, tenant, user_key(user_id, self.hash_key))

    async def close(self) -> None:
        await self.log.close()


class RecordingFeedback:
    """A ``FeedbackStore`` that also adds each click to the turn's record."""

    def __init__(self, inner: FeedbackStore, recorder: TurnRecorder):
        self.inner = inner
        self.recorder = recorder

    async def record(self, feedback: Feedback) -> None:
        await self.inner.record(feedback)
        await self.recorder.feedback(feedback)

    def __getattr__(self, name: str) -> Any:  # e.g. MemoryFeedback.items in tests
        return getattr(self.inner, name)


class RecordingApprovals:
    """An ``AnswerCache`` whose approvals and withdrawals, whoever makes them (a reviewer in chat,
    the admin page), are also noted on the turn's record."""

    def __init__(self, inner: Any, recorder: TurnRecorder):
        self.inner = inner
        self.recorder = recorder

    async def approve(self, turn_id: str, reviewer: str, *args: Any, **kwargs: Any) -> Any:
        approved = await self.inner.approve(turn_id, reviewer, *args, **kwargs)
        if approved is not None:
            name = kwargs.get("name") or (args[0] if args else "")
            await self.recorder.approval(turn_id, name or reviewer)
        return approved

    async def withdraw(self, turn_id: str, *args: Any, **kwargs: Any) -> bool:
        withdrawn = await self.inner.withdraw(turn_id, *args, **kwargs)
        if withdrawn:
            await self.recorder.approval(turn_id, None)
        return withdrawn

    async def retire(self, turn_id: str) -> bool:
        retired = await self.inner.retire(turn_id)
        if retired:
            await self.recorder.approval(turn_id, None)
        return retired

    async def keep(self, turn_id: str, reviewer: str, name: str = "") -> Any:
        kept = await self.inner.keep(turn_id, reviewer, name)
        if kept is not None:
            await self.recorder.approval(turn_id, name or reviewer)
        return kept

    async def offer(self, *args: Any, **kwargs: Any) -> None:
        await self.inner.offer(*args, **kwargs)

    async def lookup(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.lookup(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
