"""The conversation service: every flow a chat platform offers besides the turn, written once for all of them.

An adapter translates its platform's events into calls here and renders what comes back; it holds
no flow of its own. ``Conversations`` owns:

- the turn's owner, ``turns`` (``bot.delivery.turns.Turns``: arrival, pending record, claim, lease, the
  Answerer's turn, its end or failure, take-over), built on this service's answerer and claims;
- feedback clicks (👍 / 👎) and review clicks (approve / withdraw an answer, reviewers only);
- expert replies offered to reviewers and their clicks (``bot.knowledge.loop.expert``);
- admin commands (status, refresh a source) and preference commands (prefs, remember, forget, and
  starting a thread afresh).

Results are typed (``ReviewStatus``, ``AdminStatus``): the words a user sees are the adapter's,
in its platform's format and the user's language.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bot.delivery.turns import HandledTurn, TakeOver, Turns
from bot.knowledge.loop.expert import ExpertReplies, ExpertStatus
from bot.knowledge.loop.expert import Result as ExpertResult
from bot.knowledge.scheduler import KnowledgeAdmin
from bot.preference_commands import run_command
from bot.state import Idempotency, ThreadLocks
from bot.state.cache import AnswerCache
from bot.state.feedback import Feedback, FeedbackStore, MemoryFeedback
from bot.state.history import HistoryStore
from bot.state.preferences import PreferenceStore
from bot.state.turn_log.recorder import TurnRecorder
from bot.turn.answering import Answerer
from bot.types import Answer

log = logging.getLogger("kbbot.conversation")


class ReviewStatus(str, enum.Enum):
    APPROVED = "approved"
    WITHDRAWN = "withdrawn"
    NOT_REVIEWER = "not_reviewer"
    DISABLED = "disabled"  # approved answers are off (approvals.enabled)
    EXPIRED = "expired"  # the turn was never offered, or its offer expired
    NOTHING_TO_WITHDRAW = "nothing_to_withdraw"
    FAILED = "failed"
    KEPT = "kept"  # a re-checked approval: the new answer is approved now
    RETIRED = "retired"  # a re-checked approval: gone
    NOT_HELD = "not_held"  # nothing of that turn waits for a re-check decision (already decided)


@dataclass(frozen=True)
class Review:
    status: ReviewStatus
    #: The approved answer (``APPROVED`` only).
    answer: Answer | None = None


class AdminStatus(str, enum.Enum):
    DONE = "done"  # ``text`` is the status or the refresh's result
    FAILED = "failed"
    NOT_ADMIN = "not_admin"
    UNAVAILABLE = "unavailable"  # this process has no knowledge admin
    REFUSED = "refused"  # ``text`` says why (an unknown source, no sources)


@dataclass(frozen=True)
class AdminResult:
    status: AdminStatus
    text: str = ""


@dataclass
class Kept:
    """What turns leave beyond their thread, kept together as the runtime builds them: 👍/👎, approved
    answers (None: approvals are off), users' preferences and the turn log (None: not recorded)."""

    feedback: FeedbackStore = field(default_factory=MemoryFeedback)
    approved: AnswerCache | None = None
    preferences: PreferenceStore | None = None
    turns: TurnRecorder | None = None


@dataclass
class Conversations:
    """One service for every platform; built by the composition root (``Runtime.conversations``)."""

    answerer: Answerer
    idempotency: Idempotency
    history: HistoryStore
    thread_locks: ThreadLocks = field(default_factory=ThreadLocks)
    kept: Kept = field(default_factory=Kept)
    admin: KnowledgeAdmin | None = None
    on_turn: Callable[[HandledTurn], None] | None = None
    #: None: turns are not recorded as pending (nothing is taken over).
    takeover: TakeOver | None = None
    #: Expert replies kept (``bot.knowledge.loop.expert``); None: not offered.
    expert: ExpertReplies | None = None
    #: Every chat turn's life (``bot.delivery.turns``), on this service's answerer and claims.
    turns: Turns = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.turns = Turns(self.answerer, self.idempotency, self.takeover, on_turn=self.on_turn,
                           after_turn=self.expert.after_turn if self.expert is not None else None)

    async def answered_before(self, thread_key: str) -> bool:
        """Whether the thread has history (a follow-up there is meant for kbbot)."""
        try:
            return bool(await self.history.load(thread_key))
        except Exception:
            log.exception("could not read the history of %s; not treating the message as a follow-up", thread_key)
            return False

    async def start_afresh(self, thread_key: str) -> bool:
        """Forgets the thread's history (not in the middle of one of its turns); False when that failed."""
        try:
            async with self.thread_locks.hold(thread_key):
                await self.history.clear(thread_key)
        except Exception:
            log.exception("could not clear the history of %s", thread_key)
            return False
        return True

    # --- clicks -------------------------------------------------------------------------------------
    async def record_feedback(self, item: Feedback) -> bool:
        try:
            await self.kept.feedback.record(item)
        except Exception:
            log.exception("turn %s: could not store the feedback", item.turn_id)
            return False
        log.info("turn %s: feedback %s from %s", item.turn_id, item.rating, item.user_id)
        if self.expert is not None:
            try:
                await self.expert.after_feedback(item)
            except Exception:  # noqa: BLE001 - the click is stored; only a later expert reply's offer is lost
                log.exception("turn %s: could not open its thread to expert replies", item.turn_id)
        return True

    async def expert_reply(self, thread_key: str, *, author: str, author_name: str, text: str,
                           link: str = "", replying_to: str | None = None) -> dict[str, Any] | None:
        """A message by ``author`` in a thread kbbot could not answer (or whose answer got a 👎), kept for
        the reviewers to save (``keep_expert_reply``); None when it is not such a reply (no open thread,
        the asker's own message, not a reply to kbbot's message where ``replying_to`` is given, another
        reply first, expert replies off, too long) or could not be kept (logged)."""
        if self.expert is None:
            return None
        try:
            return await self.expert.offer(thread_key, author=author, author_name=author_name, text=text, link=link,
                                           replying_to=replying_to)
        except Exception:
            log.exception("%s: could not keep the reply of %s for the reviewers", thread_key, author)
            return None

    async def is_expert_reply(self, thread_key: str, author: str, *, replying_to: str | None = None) -> bool:
        """Whether ``author``'s message in the thread is a reply to keep rather than a question to answer
        (``ExpertReplies.is_open_for``)."""
        if self.expert is None:
            return False
        try:
            return await self.expert.is_open_for(thread_key, author, replying_to=replying_to)
        except Exception:  # noqa: BLE001 - treated as it was before: a follow-up question
            log.exception("%s: could not tell whether a message is an expert reply", thread_key)
            return False

    async def keep_expert_reply(self, reply_id: str, *, capture: bool, reviewer: str, name: str,
                                is_reviewer: bool) -> ExpertResult:
        """A reviewer's click on "Save as approved answer" (``capture`` False) or "Add to the knowledge base"."""
        if self.expert is None:
            return ExpertResult(ExpertStatus.DISABLED)
        keep = self.expert.capture if capture else self.expert.approve
        return await keep(reply_id, reviewer=reviewer, name=name, is_reviewer=is_reviewer)

    async def review(self, turn_id: str, *, approving: bool, reviewer: bool, user: str, display_name: str,
                     tenant: str) -> Review:
        """Approve (or withdraw the approval of) the answer of ``turn_id``; ``reviewer`` is whether the
        platform's settings name ``user`` a reviewer."""
        what = "approval" if approving else "withdrawal"
        if not reviewer:
            log.info("refused %s of turn %s by %s: not a reviewer", what, turn_id, user)
            return Review(ReviewStatus.NOT_REVIEWER)
        cache = self.kept.approved
        if cache is None:
            return Review(ReviewStatus.DISABLED)
        approved: Answer | None = None
        try:
            if approving:
                approved = await cache.approve(turn_id, user, display_name, tenant=tenant)
                if approved is None:
                    log.info("turn %s cannot be approved (expired or never offered); click by %s", turn_id, user)
                    return Review(ReviewStatus.EXPIRED)
            elif not await cache.withdraw(turn_id):
                log.info("turn %s: no approval to withdraw; click by %s", turn_id, user)
                return Review(ReviewStatus.NOTHING_TO_WITHDRAW)
        except Exception:
            log.exception("turn %s: the %s failed", turn_id, what)
            return Review(ReviewStatus.FAILED)
        log.info("turn %s %s by %s", turn_id, "approved" if approving else "approval withdrawn", user)
        return Review(ReviewStatus.APPROVED, approved) if approving else Review(ReviewStatus.WITHDRAWN)

    async def decide_recheck(self, turn_id: str, *, keep: bool, reviewer: bool, user: str,
                             display_name: str) -> Review:
        """"Keep approved" (the re-checked answer becomes the approved one) or "Retire" on an approval
        held after its sources changed (``bot/knowledge/loop/recheck.py``); reviewers only."""
        if not reviewer:
            log.info("refused the re-check decision on turn %s by %s: not a reviewer", turn_id, user)
            return Review(ReviewStatus.NOT_REVIEWER)
        cache = self.kept.approved
        if cache is None:
            return Review(ReviewStatus.DISABLED)
        try:
            if keep:
                kept = await cache.keep(turn_id, user, display_name)
                if kept is None:
                    return Review(ReviewStatus.NOT_HELD)
                log.info("turn %s: the re-checked answer kept approved by %s", turn_id, user)
                return Review(ReviewStatus.KEPT, kept.to_answer())
            if not await cache.retire(turn_id):
                return Review(ReviewStatus.NOT_HELD)
        except Exception:
            log.exception("turn %s: the re-check decision failed", turn_id)
            return Review(ReviewStatus.FAILED)
        log.info("turn %s: the approval retired after its re-check by %s", turn_id, user)
        return Review(ReviewStatus.RETIRED)

    # --- commands -----------------------------------------------------------------------------------
    async def admin_command(self, verb: str, source: str | None, *, user: str, is_admin: bool,
                            started: Callable[[str | None], Awaitable[Any]], language: str = "en") -> AdminResult:
        """``status`` or ``refresh [source]``; ``started(source)`` is awaited once the command is
        accepted and before its work runs (a refresh takes a while: the adapter says so first). The
        result's text is in ``language`` (the admin's)."""
        if not is_admin:
            log.info("refused %s from %s: not an admin", verb, user)
            return AdminResult(AdminStatus.NOT_ADMIN)
        if self.admin is None:
            return AdminResult(AdminStatus.UNAVAILABLE)
        if verb == "refresh":
            problem = self.admin.check(source, language)
            if problem:
                return AdminResult(AdminStatus.REFUSED, problem)
        await started(source)
        try:
            if verb == "status":
                text = await self.admin.status_text(language)
            else:
                log.info("refresh %s by %s", source or "(all)", user)
                text = await self.admin.refresh_text(source, language=language)
        except Exception:
            log.exception("the %s command failed", verb)
            return AdminResult(AdminStatus.FAILED)
        return AdminResult(AdminStatus.DONE, text)

    async def preference_command(self, platform: str, tenant: str, user: str, words: list[str], *, prefix: str,
                             language: str = "en", channel: str = "") -> str:
        """``prefs …``, ``remember on|off``, ``forget``: the user's answering preferences, in their words
        (``channel``: where the command was given, for ``prefs followups off here``)."""
        return await run_command(self.kept.preferences, platform, tenant, user, words, prefix=prefix, language=language,
                                 turns=self.kept.turns, channel=channel)

    async def user_language(self, platform: str, tenant: str, user: str) -> str | None:
        """The language a user chose in their preferences, if any."""
        if self.kept.preferences is None:
            return None
        try:
            return (await self.kept.preferences.load(platform, tenant, user)).effective().get("language") or None
        except Exception:  # noqa: BLE001 - only the language of a short notice depends on it
            return None
