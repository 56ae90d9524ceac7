"""Expert replies kept: what a person answers in a thread kbbot could not answer becomes knowledge, once a
reviewer says so.

A thread is *open* once a turn in it ends ``not_found`` or its answer gets a 👎 (``after_turn``,
``after_feedback``: its question, asker, spaces and kbbot's messages are kept in the ``ExpertStore``). The
first later reply there by someone other than the asker (in a Telegram group, a reply to one of kbbot's
messages of that turn) is *offered* (``offer``), and the thread closes: kept under an id of its own, its
links removed (``kept_text``; at most ``MAX_REPLY_CHARS``, what reviewers are shown whole), and offered to
the approved-answer cache as the thread question's answer (an offer is what every approvable answer is:
kept pending, served to nobody). The adapter then shows the platform's reviewers the whole kept text and
two buttons naming that id:

- "Save as approved answer" (``approve``): the existing approval of an offered answer
  (``AnswerCache.approve``): the same question in the same spaces and workspace gets the reply,
  labelled with its author, under the line saying which reviewer approved it, where the place it was
  said in admits the asking audience (``place_readers``), for ``approvals.uncited_days``;
- "Add to the knowledge base" (``capture``): the reply written into the source ``insights.capture_source``
  as its kind writes one (``SourceKind.capture``): a Markdown document (question, reply, author, date,
  link to the thread) in a folder source, under the place it was said in (``pipelines.sources.folder``:
  read by that place; indexed on its next refresh), or a draft page in a Confluence source's first space.

Nothing is kept without a reviewer's click; each click counts once (``ExpertStore.take``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bot.knowledge.loop.expert_store import ExpertStore
from bot.messages import say
from bot.permissions import Audience
from bot.state.cache import AnswerCache, CacheKey, audience_record
from bot.state.feedback import Feedback
from bot.state.turn_log.store import TurnLog
from bot.types import Answer, Inquiry, Outcome, Trace
from pipelines.sources.kind import Capture, Captured
from pipelines.text import detect_language, restrict_links

log = logging.getLogger("kbbot.expert")

#: The longest reply offered (after its links are removed): what reviewers are shown whole, on every platform.
MAX_REPLY_CHARS = 3000


class ExpertStatus(str, enum.Enum):
    DONE = "done"
    NOT_REVIEWER = "not_reviewer"
    EXPIRED = "expired"  # the reply is no longer kept, or (approval) the knowledge changed since
    ALREADY = "already"  # another reviewer clicked it first
    DISABLED = "disabled"  # approved answers off, or no capture_source
    FAILED = "failed"


@dataclass(frozen=True)
class Result:
    status: ExpertStatus
    #: DONE: where the reply went (a file, a draft page's link); ALREADY: who clicked first.
    detail: str = ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _date(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")


def place_readers(place: Audience) -> list[str]:
    """Who may read what was said in a place: the place itself (``channel:<id>``, read by whoever is there
    later too) and each member known by name (``user:`` principals); never ``public``, and nobody when the
    place has neither."""
    people = (place.asker or frozenset(),) if place.private else place.each
    readers = {p for member in people for p in member if p.startswith("user:")}
    return sorted(readers | ({place.channel} if place.channel else set()))


def captured(reply: dict[str, Any], reviewer: str) -> Captured:
    """A kept reply as a source's ``Capture`` writes it."""
    return Captured(id=reply["id"], question=reply["question"], text=reply["text"],
                    author=reply["author_name"] or reply["author"], date=_date(reply["at"]),
                    link=reply.get("link") or "", thread_key=reply.get("thread_key") or "", reviewer=reviewer,
                    platform=reply["platform"], channel=reply["channel"])


class ExpertReplies:
    def __init__(self, store: ExpertStore, *, cache: AnswerCache | None = None, identity: tuple[str, str] = ("", ""),
                 knowledge_version: Callable[[], int] | None = None, turns: TurnLog | None = None,
                 capture: Capture | None = None, clock: Callable[[], float] = time.time,
                 audience: Callable[[Inquiry], Awaitable[Audience]] | None = None,
                 projected: Callable[[Audience], Awaitable[Audience]] | None = None):
        self.store = store
        self.cache = cache
        #: Who is where a reply was said (``Audiences.of`` of its thread, members looked up): its answer is
        #: served only to audiences that place admits (``place_readers``); None: public documents' readers.
        self.audience = audience
        #: The audience narrowed to what documents name (``Answerer.projected``): the approval's key.
        self.projected = projected
        self.identity = identity
        self.knowledge_version = knowledge_version
        self.turns = turns
        self.capture_to = capture
        self.clock = clock

    # --- threads kbbot could not answer ------------------------------------------------------------
    async def after_turn(self, inquiry: Inquiry, answer: Answer, messages: list[str] | None = None) -> None:
        """``messages``: the ids of kbbot's messages of the answer (``PostsMessages``): where the platform's
        conversation is the whole chat (a Telegram group), only a reply to one of them is an expert's."""
        if answer.outcome is not Outcome.NOT_FOUND:
            return
        await self._open(inquiry.thread_key, {
            "question": inquiry.text.strip(), "asker": inquiry.user_id, "spaces": list(inquiry.spaces),
            "platform": inquiry.platform, "tenant": inquiry.tenant, "channel": inquiry.channel,
            "turn_id": answer.trace.turn_id, "at": inquiry.received_at, "why": "not_found",
            "private": inquiry.private, "messages": list(messages or [])})

    async def after_feedback(self, item: Feedback) -> None:
        if item.rating != "down" or self.turns is None:
            return
        record = await self.turns.get(item.turn_id)
        if record is None or not record.reply_to:  # no record, or one that names nobody (hashed ids)
            return
        await self._open(record.thread_key, {
            "question": record.question, "asker": record.user, "spaces": list(record.spaces),
            "platform": record.platform, "tenant": record.tenant, "channel": record.channel,
            "turn_id": record.turn_id, "at": record.at, "why": "disliked", "private": record.in_private,
            "messages": [item.message_id]})

    async def _open(self, thread_key: str, gap: dict[str, Any]) -> None:
        try:
            await self.store.open_gap(thread_key, gap)
        except Exception:  # noqa: BLE001 - only the offer of a later expert reply is lost
            log.exception("could not keep %s as a thread kbbot could not answer", thread_key)

    @staticmethod
    def _answers(gap: dict[str, Any] | None, author: str, replying_to: str | None) -> bool:
        if gap is None or str(gap.get("asker")) == author:
            return False
        return replying_to is None or replying_to in gap.get("messages", [])

    async def is_open_for(self, thread_key: str, author: str, *, replying_to: str | None = None) -> bool:
        """Whether a message by ``author`` in the thread is an expert's reply: the thread is open, ``author`` is
        not the asker (whose messages stay questions), and where the conversation is the whole chat (a
        Telegram group) the message replies to kbbot's answer there (``replying_to``: the id of the message
        it replies to, "" for none; None where the thread is the question's own, as on Slack)."""
        return self._answers(await self.store.gap(thread_key), author, replying_to)

    @staticmethod
    def kept_text(text: str) -> str:
        """What is kept of a reply, shown to reviewers and served: no links (an answer links only to its
        sources' hosts, and a reply has none)."""
        return restrict_links(text.strip(), set())[0]

    @classmethod
    def too_long(cls, text: str) -> bool:
        """Whether a reply is longer than reviewers are shown whole (``MAX_REPLY_CHARS``): not offered."""
        return len(cls.kept_text(text)) > MAX_REPLY_CHARS

    # --- a reply offered ---------------------------------------------------------------------------
    async def offer(self, thread_key: str, *, author: str, author_name: str, text: str, link: str = "",
                    replying_to: str | None = None) -> dict[str, Any] | None:
        """The reply of ``author`` kept for the reviewers (with its ``id``, which their buttons name), or
        None when it is not an expert's reply (``is_open_for``), is empty or too long, or another reply took
        the thread first: a thread takes one reply."""
        kept = self.kept_text(text)
        if not kept or len(kept) > MAX_REPLY_CHARS:
            return None
        if not self._answers(await self.store.gap(thread_key), author, replying_to):
            return None
        gap = await self.store.take_gap(thread_key)
        if gap is None:
            return None
        reply = {"id": uuid.uuid4().hex, "thread_key": thread_key, "question": gap["question"],
                 "asker": gap.get("asker"), "private": bool(gap.get("private")),
                 "spaces": gap["spaces"], "platform": gap["platform"], "tenant": gap["tenant"],
                 "channel": gap["channel"], "asked_at": gap["at"], "author": author,
                 "author_name": author_name or author, "text": kept, "link": link, "at": self.clock()}
        await self.store.keep_reply(reply["id"], reply)
        await self._offer_as_answer(reply)
        log.info("thread %s: a reply by %s is offered to the reviewers (%s)", thread_key, author, reply["id"])
        return reply

    def _tenant(self, reply: dict[str, Any]) -> str:
        return f"{reply['platform']}:{reply['tenant']}" if reply["tenant"] else reply["platform"]

    async def _offer_as_answer(self, reply: dict[str, Any]) -> None:
        if self.cache is None or self.knowledge_version is None:
            return
        version = await asyncio.to_thread(self.knowledge_version)
        asked = Inquiry(reply["platform"], reply["tenant"], reply["channel"], reply["thread_key"],
                        str(reply.get("asker") or ""), reply["question"], spaces=tuple(reply["spaces"]),
                        private=bool(reply.get("private")))
        place = await self.audience(asked) if self.audience is not None else Audience.public(private=asked.private)
        projected = await self.projected(place) if self.projected is not None else place
        key = CacheKey.of(reply["question"], reply["spaces"], version, *self.identity, tenant=self._tenant(reply),
                          audience=projected.key)
        language = detect_language(reply["question"])
        text = say("expert_answer", language, author=_one_line(reply["author_name"]), date=_date(reply["at"]),
                   text=reply["text"])
        await self.cache.offer(reply["id"], key, Answer(text=text, outcome=Outcome.ANSWERED, trace=Trace()),
                               audience=audience_record(projected), readers=place_readers(place))

    # --- reviewers' clicks -------------------------------------------------------------------------
    async def _taken(self, reply_id: str, action: str, *, reviewer: str, name: str, is_reviewer: bool,
                     enabled: bool) -> dict[str, Any] | Result:
        """The checks both clicks make first: a reviewer, the action configured, the reply still kept
        and not already handled (``action`` is taken for this click); the reply, or the Result to show."""
        if not is_reviewer:
            return Result(ExpertStatus.NOT_REVIEWER)
        if not enabled:
            return Result(ExpertStatus.DISABLED)
        reply = await self.store.reply(reply_id)
        if reply is None:
            return Result(ExpertStatus.EXPIRED)
        if (before := await self.store.take(reply_id, action, name or reviewer)) is not None:
            return Result(ExpertStatus.ALREADY, before)
        return reply

    async def approve(self, reply_id: str, *, reviewer: str, name: str, is_reviewer: bool) -> Result:
        """"Save as approved answer"."""
        try:
            reply = await self._taken(reply_id, "approve", reviewer=reviewer, name=name, is_reviewer=is_reviewer,
                                      enabled=self.cache is not None)
            if isinstance(reply, Result):
                return reply
            assert self.cache is not None
            approved = await self.cache.approve(reply_id, reviewer, name, tenant=self._tenant(reply))
        except Exception:
            log.exception("reply %s: the approval failed", reply_id)
            return Result(ExpertStatus.FAILED)
        if approved is None:
            return Result(ExpertStatus.EXPIRED)
        log.info("reply %s by %s approved by %s as the answer to %r", reply_id, reply["author"], reviewer,
                 reply["question"])
        return Result(ExpertStatus.DONE, reply["question"])

    async def capture(self, reply_id: str, *, reviewer: str, name: str, is_reviewer: bool) -> Result:
        """"Add to the knowledge base"."""
        try:
            reply = await self._taken(reply_id, "capture", reviewer=reviewer, name=name, is_reviewer=is_reviewer,
                                      enabled=self.capture_to is not None)
        except Exception:
            log.exception("reply %s: could not read it", reply_id)
            return Result(ExpertStatus.FAILED)
        if isinstance(reply, Result):
            return reply
        assert self.capture_to is not None
        try:
            where = await asyncio.to_thread(self.capture_to.write, captured(reply, name or reviewer))
        except Exception as exc:  # noqa: BLE001 - the click may be tried again
            log.error("reply %s: could not add it to the knowledge base (%s: %s)", reply_id, type(exc).__name__, exc)
            await self.store.release(reply_id, "capture")
            return Result(ExpertStatus.FAILED)
        log.info("reply %s by %s added to the knowledge base by %s: %s", reply_id, reply["author"], reviewer, where)
        return Result(ExpertStatus.DONE, where)
