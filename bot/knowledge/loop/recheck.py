"""Approved answers re-checked after a refresh, instead of silently retired.

An approved answer cites documents; once one of them changed or went away the answer is never served
in its old form (the ``Answerer`` checks the cited versions on every hit). After a refresh each such
answer is answered again, posted to nobody, and *held* in the answer cache with the new answer; its
reviewer (``approvals.reviewers_channel`` on Slack when set, else the reviewer who approved it; on
Telegram that reviewer, or every ``telegram.reviewers`` id) gets the old and the new answer with
"Keep approved" (the new answer becomes the approved one, of the new knowledge version) and "Retire".
Nothing is served as approved until one of them is clicked.

Both answers hold what their audience may read: the new one is answered for the audience the approval
was written for (``ApprovedAnswer.audience``), and the request goes only where every reader may read every
document either cites (``RecheckRequest.may_post``: the same ``Audiences`` rule as a turn's), else to the
approver privately.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from bot.knowledge.refresh import RefreshChanges
from bot.permissions import Audience, Audiences
from bot.state.cache import AnswerCache, ApprovedAnswer
from bot.types import Answer, Citation, Inquiry

log = logging.getLogger("kbbot.loop")

#: ``Answerer.rerun``: a question answered again, unseen, for an audience.
Rerun = Callable[[str, Inquiry, Audience], Awaitable[Answer]]


@dataclass(frozen=True)
class RecheckRequest:
    """What a reviewer is asked: the approved answer and the re-run's."""

    turn_id: str  # the approval's turn: what both buttons name
    question: str
    tenant: str  # "slack:T123", "telegram:<bot id>"
    approved_by: str  # the platform's user id of the reviewer who approved it
    approver_name: str
    old_text: str
    old_citations: list[Citation]
    new: Answer
    knowledge_version: int = 0
    #: Whether a place may be shown both answers (``ApprovalRecheck``: every reader there may read every
    #: document either cites); None: no place but the approver's own chat.
    readable_in: Callable[[Inquiry], Awaitable[bool]] | None = None

    async def may_post(self, where: Inquiry) -> bool:
        """Whether the request may be posted ``where`` (an inquiry standing for that place and its readers)."""
        return self.readable_in is not None and await self.readable_in(where)

    @property
    def platform(self) -> str:
        return self.tenant.partition(":")[0]

    @property
    def answered(self) -> bool:
        """Whether the new answer could be kept (a not-found re-run can only be retired)."""
        return self.new.outcome.value == "answered"


class ReviewerDesk(Protocol):
    """Where reviewers are reached outside a turn (the adapters supply one per platform)."""

    async def ask_recheck(self, request: RecheckRequest) -> bool:
        """Sends ``request`` with "Keep approved" and "Retire"; False if no platform could take it."""

    async def tell(self, text: str) -> bool:
        """A plain message to the reviewers (a golden replay's failure); False if none was reached."""


def inquiry_of(entry: ApprovedAnswer) -> Inquiry:
    """A turn-less inquiry in the approval's spaces and workspace (nothing is posted to it)."""
    platform, _, tenant = entry.tenant.partition(":")
    return Inquiry(platform=platform or "recheck", tenant=tenant, channel="", thread_key=f"recheck:{entry.turn_id}",
                   user_id="", text=entry.asked or entry.question, spaces=tuple(entry.spaces or ("default",)))


class ApprovalRecheck:
    """``run(changes)``: re-answer and hold the approvals a refresh touched, and ask their reviewers."""

    def __init__(self, cache: AnswerCache, rerun: Rerun, desk: ReviewerDesk | None,
                 is_current: Callable[[str, int], bool] | None = None, *, audiences: Audiences | None = None,
                 readers: Callable[[str], list[str] | None] | None = None):
        self.cache = cache
        self.rerun = rerun
        self.desk = desk
        self.is_current = is_current
        #: Who is in a place (``bot.permissions``) and who may read a document now (its record's readers;
        #: None: no such document): where a re-check may be posted. Without ``readers``, nowhere but the
        #: approver's own chat.
        self.audiences = audiences
        self.readers = readers

    def _readable_in(self, entry: ApprovedAnswer, new: Answer) -> Callable[[Inquiry], Awaitable[bool]] | None:
        if self.readers is None:
            return None
        readers_of = self.readers
        cited = sorted({c["doc_id"] for c in entry.citations} | {c.doc_id for c in new.citations})

        async def readable_in(where: Inquiry) -> bool:
            found = await asyncio.to_thread(lambda: [readers_of(doc_id) for doc_id in cited])
            if entry.readers is not None:
                found.append(entry.readers)
            if any(r is None for r in found):  # a document gone: who could read it is unknown
                return False
            audience = await self.audiences.of(where) if self.audiences is not None \
                else Audience.public(private=where.private)
            return all(audience.admits({"readers": r}) for r in found)

        return readable_in

    async def _touched(self, entry: ApprovedAnswer, changes: RefreshChanges) -> bool:
        if entry.held is not None and entry.held.get("knowledge_version", 0) >= changes.knowledge_version:
            return False  # already re-checked on this knowledge, waiting for its reviewer
        if changes.touches(entry.citations):
            return True
        if self.is_current is None:
            return False
        # Also what a refresh outside this process (``kbbot refresh``) changed since.
        check = self.is_current
        current = await asyncio.to_thread(lambda: [check(c["doc_id"], int(c["version"])) for c in entry.citations])
        return not all(current)

    async def run(self, changes: RefreshChanges) -> list[RecheckRequest]:
        asked = []
        for entry in await self.cache.entries():
            if not await self._touched(entry, changes):
                continue
            try:
                new = await self.rerun(entry.asked or entry.question, inquiry_of(entry), entry.written_for())
            except Exception as exc:  # noqa: BLE001 - the approval stays unserved; the next refresh tries again
                log.warning("re-check of approved turn %s failed (%s); it is not served until a re-check works",
                            entry.turn_id, type(exc).__name__)
                continue
            held = {"text": new.text, "citations": [c.to_dict() for c in new.citations], "outcome": new.outcome.value,
                    "knowledge_version": changes.knowledge_version, "at": time.time()}
            if not await self.cache.hold(entry.turn_id, held):
                continue  # withdrawn meanwhile
            request = RecheckRequest(entry.turn_id, entry.asked or entry.question, entry.tenant, entry.approved_by,
                                     entry.approver_name, entry.text, [Citation(**c) for c in entry.citations], new,
                                     changes.knowledge_version, self._readable_in(entry, new))
            delivered = self.desk is not None and await self.desk.ask_recheck(request)
            log.info("approved turn %s re-checked after a refresh (%s); reviewer %s", entry.turn_id,
                     new.outcome.value, "asked" if delivered else "NOT reached: no platform for " + entry.tenant)
            asked.append(request)
        return asked
