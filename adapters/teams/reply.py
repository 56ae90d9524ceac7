"""Teams replies: one answer shown in its conversation, paced and within Teams' rate limits.

``TeamsMessages`` is one answer's messages (``bot.delivery.reply.AnswerMessages``); the platform gives
``Answerer.answer`` a ``ChatReply`` over them, which paces, reconciles and shows failures the same way on
every platform. What Teams does:

- personal chats stream ("Stream bot messages"): the acknowledgement is an informative update ("Searching
  the knowledge base…", ``streamSequence`` 1) whose answer is the stream's id; each later state is a
  ``typing`` activity with that id, the next sequence number and the whole text so far, at most one per
  ``stream_interval_s``; the final text is a ``message`` with ``streamType`` final carrying the citations,
  the AI label and the feedback loop. A stream past its 2 minutes ("exceeded streaming time") is an
  ordinary message from then on, updated like one; Stop ("cancelled by user") ends what kbbot shows of
  the answer; a conversation that refuses streams is answered by edits, and the tenant is left unstreamed
  for an hour (``Delivery.refused_capabilities``);
- channels (in the question's reply chain) and group chats, or ``stream_mode: edit``: a "typing…"
  indicator, then one message posted and updated (``edit_interval_s`` apart), split into more messages
  past ``max_message_chars``;
- every call takes a token from its conversation's budget and from the app's in the tenant (``make_rates``);
  intermediate states go only with budget to spare in both; a 429 holds the conversation's budget for
  everyone and becomes ``RetryAfter``, slept out by the writer, which then sends the latest text.

Also here: which turn an answer's last message belongs to (``AnswerTurns``), since Teams' 👍/👎 names only
the message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from microsoft_teams.api import ApiClient, ChannelData, MessageActivityInput, TypingActivityInput

from adapters.teams.connector import (
    STREAM_CANCELLED,
    STREAM_COMPLETED,
    STREAM_NOT_ALLOWED,
    STREAM_TIMED_OUT,
    Connector,
    error_of,
)
from adapters.teams.settings import TeamsSettings
from adapters.teams.text import answer_message, neutralise
from bot.delivery.buckets import RedisBuckets
from bot.delivery.rates import COMPLETES, PlatformRates, Priority, Rate
from bot.delivery.reply import Cadence, RetryAfter, show_failure, split_message
from bot.messages import say
from bot.types import Answer

log = logging.getLogger("kbbot.teams")

#: Sends per bot per conversation. Teams documents 7 per second, 8 per 2 s, 60 per 30 s and 1,800 an
#: hour: 29 a minute with 6 at once stays inside each (6 + 0.5 in a second, 6 + 1 in two, 6 + 14.5 in
#: 30 s, 6 + 1,740 in an hour). A stream of one answer sends at most 40 a minute: past the burst its
#: intermediate states wait for spare tokens.
CONVERSATION_RATE = Rate(per_minute=29, burst=6, reserve=2)
#: Per app per tenant Teams allows 50 requests a second: 45 with 5 at once.
APP_SEND = "app"
APP_RATE = Rate(per_minute=45 * 60, burst=5, reserve=2)


@dataclass(frozen=True)
class TeamsPlace:
    """Where an answer goes: a conversation on its connector (a channel's reply chain as
    ``19:…;messageid=<root>``)."""

    service_url: str
    conversation: str
    #: ``personal``, ``groupChat`` or ``channel``.
    kind: str
    tenant: str
    user: str = ""
    #: The question's activity id.
    question_id: str = ""

    @property
    def base(self) -> str:
        """The conversation without its reply chain: what Teams' limits count."""
        return self.conversation.partition(";messageid=")[0]

    @property
    def key(self) -> str:
        """The thread's key: the reply chain in a channel, the whole chat elsewhere."""
        return f"teams:{self.tenant}:{self.conversation}"

    @property
    def personal(self) -> bool:
        return self.kind == "personal"


@dataclass
class _Posted:
    id: str
    text: str
    #: It carries what the last part carries (citations, label, feedback).
    last: bool = False
    #: A stream not yet ended by its final message.
    streaming: bool = False


def send_budgets(place: TeamsPlace) -> tuple[tuple[str, str], tuple[str, str]]:
    """The ``(scope, method)`` buckets one call to ``place`` spends: its conversation's and the app's in
    its tenant."""
    return (place.base, "send"), (f"tenant:{place.tenant}", APP_SEND)


async def take_send_budget(rates: PlatformRates, place: TeamsPlace, priority: Priority | None = None) -> None:
    for scope, method in send_budgets(place):
        await rates.acquire(scope, method, priority)


def make_rates(settings: TeamsSettings, redis: Any = None, prefix: str = "kbbot:") -> PlatformRates:
    """Every conversation's budget and the app's per tenant, in buckets every replica of this app shares
    in ``redis`` (``{prefix}rate:teams:{app id}:{scope}:{method}``), or this process's without it."""
    store = None
    if redis is not None:
        app = settings.app_id.get_secret_value() if settings.app_id is not None else ""
        store = RedisBuckets(redis, prefix=f"{prefix}rate:teams:{app}:")
    return PlatformRates(rates={APP_SEND: APP_RATE}, default=CONVERSATION_RATE, store=store)


class TeamsMessages:
    """One Teams answer's messages (``bot.delivery.reply.AnswerMessages``), driven by its ``ChatReply``.

    ``posted`` are the messages shown for this answer, in order; while streaming, the last is the
    stream's (``streaming``), ended by the final text's ``edit``."""

    platform = "teams"

    def __init__(self, connector: Connector, place: TeamsPlace, settings: TeamsSettings, rates: PlatformRates, *,
                 stream: bool, language: str = "en", on_stream_refused: Callable[[], None] | None = None,
                 on_final: Callable[[str, str], Awaitable[None]] | None = None, review: bool = False):
        self.connector = connector
        self.place = place
        self.settings = settings
        self.rates = rates
        self.stream = stream
        self.language = language
        self.limit = settings.max_message_chars
        self.stream_cadence = Cadence(min_interval_s=settings.stream_interval_s)
        self.edit_cadence = Cadence(min_interval_s=settings.edit_interval_s)
        self._on_stream_refused = on_stream_refused
        self._on_final = on_final
        self.review = review  # approval buttons under the answer (a reviewer may click them here)
        self.posted: list[_Posted] = []
        self.stream_id: str | None = None
        self.sequence = 0
        self.answer: Answer | None = None
        #: The user pressed Stop: nothing more is shown.
        self.stopped = False
        self._prepaid = False
        self._ack: asyncio.Task[None] | None = None
        self._ack_in_flight = False
        self._taken_at = rates.clock()
        #: When the stream's last request was answered: Teams takes the next one a second later at the
        #: soonest, the informative update's and the final message's included (the writer paces only its own).
        self._streamed_at = float("-inf")

    @property
    def cadence(self) -> Cadence:
        return self.stream_cadence if self.stream else self.edit_cadence

    def _texted(self) -> bool:
        return any(p.text for p in self.posted)

    # --- calls ----------------------------------------------------------------------------------------
    async def _call(self, what: str, call: Callable[[ApiClient], Awaitable[Any]], *,
                    priority: Priority | None = None) -> Any:
        if self._prepaid:
            self._prepaid = False
        else:
            await take_send_budget(self.rates, self.place, priority)
        try:
            return await self.connector.call(self.place.service_url, what, call)
        except RetryAfter as exc:
            await self.rates.hold(self.place.base, "send", exc.seconds)
            raise

    async def _create(self, what: str, activity: Any, *, priority: Priority | None = None) -> str:
        sent = await self._call(what, lambda api: api.conversations.create_activity(self.place.conversation,
                                                                                   activity), priority=priority)
        return str(getattr(sent, "id", "") or "")

    async def _update(self, message_id: str, activity: MessageActivityInput) -> None:
        await self._call("update", lambda api: api.conversations.update_activity(self.place.conversation,
                                                                                 message_id, activity))

    # --- the acknowledgement ----------------------------------------------------------------------------
    async def acknowledge(self) -> None:
        """At once, before the turn waits: the informative update that opens the stream (personal chats),
        or "typing…" (chats: Teams shows none in channels, where the budget is every reply chain's); in the
        background, so the turn never waits for the conversation's budget."""
        if self.place.kind == "channel" and not self.stream:
            return
        if self._ack is None and not self.posted:
            self._ack = asyncio.create_task(self._acknowledge(), name=f"acknowledge {self.place.key}")

    async def _acknowledge(self) -> None:
        # One call makes the question seen: it goes before the texts of questions already seen.
        await take_send_budget(self.rates, self.place, (COMPLETES, 0, self._taken_at))
        self._prepaid = True
        self._ack_in_flight = True
        try:
            if self.stream:
                update = TypingActivityInput(text=say("searching", self.language)).with_channel_data(
                    ChannelData(stream_type="informative")).add_stream_update(1)
                stream_id = await self._create("informative update", update)
                self._streamed_at = time.monotonic()
                if stream_id and self.stream_id is None:
                    self.stream_id, self.sequence = stream_id, 1
                    self.posted.append(_Posted(stream_id, "", streaming=True))
            else:
                await self._create("typing", TypingActivityInput())
        except RetryAfter as exc:  # a courtesy: the budget is held, the text comes when it may
            log.info("%s: the acknowledgement was throttled (%s)", self.place.key, exc)
        except httpx.HTTPStatusError as exc:
            status, code, message = error_of(exc)
            if self.stream and status == 403 and STREAM_NOT_ALLOWED in message.lower():
                self._streams_refused(message)
            else:
                log.info("%s: the acknowledgement was refused: %s %s %s", self.place.key, status, code, message)
        finally:
            self._prepaid = False
            self._ack_in_flight = False

    async def _ack_settled(self) -> None:
        """Before the first text: an acknowledgement still waiting for its budget is dropped (text
        acknowledges too); one on its way is awaited, so its stream id is known and its sequence first."""
        task = self._ack
        if task is None or task.done():
            return
        if not self._ack_in_flight:
            task.cancel()
        await asyncio.wait({task})

    def _streams_refused(self, message: str) -> None:
        log.info("%s: Teams refuses streaming here (%s); posting and updating instead", self.place.key, message)
        self.stream = False
        if self._on_stream_refused is not None:
            self._on_stream_refused()

    # --- the text ---------------------------------------------------------------------------------------
    async def ready(self, final: bool) -> bool:
        """The first text and the final text wait for the budget (in ``_call``); an intermediate state
        goes only with budget to spare in the conversation and the app's, so it never delays another
        answer's first or final text."""
        if final or self._prepaid or not self._texted():
            return True
        self._prepaid = await self.rates.try_acquire_all(*send_budgets(self.place))
        return self._prepaid

    async def _unpaid(self) -> bool:
        """Nothing was sent: a token taken by ``ready`` goes back."""
        if self._prepaid:
            self._prepaid = False
            for scope, method in send_budgets(self.place):
                await self.rates.refund(scope, method)
        return False

    async def show(self, text: str) -> bool:
        if self.stopped:
            return await self._unpaid()
        await self._ack_settled()
        parts = split_message(neutralise(text.strip()), self.limit)
        if not parts or not parts[0]:
            return await self._unpaid()
        if self.stream:
            if len(parts) > 1:  # a stream is one message: the final text splits it
                return await self._unpaid()
            streamed = await self._stream(parts[0])
            if streamed is not None:
                return streamed
        return await self._edits(parts)

    async def _stream(self, text: str) -> bool | None:
        """One streaming update; None when the answer goes on as edits (the stream refused or over)."""
        current = self.posted[-1] if self.posted and self.posted[-1].streaming else None
        if current is not None and current.text == text:
            return await self._unpaid()
        update = TypingActivityInput(text=text)
        if self.stream_id is not None:
            update = update.with_id(self.stream_id)
        update = update.add_stream_update(self.sequence + 1)
        await self._stream_paced()
        try:
            stream_id = await self._create("streaming update", update)
        except httpx.HTTPStatusError as exc:
            return await self._stream_refused(exc)
        self._streamed_at = time.monotonic()
        self.sequence += 1
        if current is None:
            self.stream_id = stream_id or self.stream_id
            current = _Posted(self.stream_id or "", "", streaming=True)
            self.posted.append(current)
        current.text = text
        return True

    async def _stream_paced(self) -> None:
        wait = self._streamed_at + self.settings.stream_interval_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _stream_refused(self, exc: httpx.HTTPStatusError) -> bool | None:
        status, code, message = error_of(exc)
        lowered = message.lower()
        if status != 403:
            raise exc
        if STREAM_CANCELLED in lowered:
            log.info("%s: the user stopped the answer", self.place.key)
            self.stopped = True
            return False
        if STREAM_TIMED_OUT in lowered or STREAM_COMPLETED in lowered:
            # Past its 2 minutes the stream's message is an ordinary one: the rest of the answer updates it.
            log.info("%s: the stream ended (%s); updating its message instead", self.place.key, message)
            self.stream = False
            for posted in self.posted:
                posted.streaming = False
            return None
        if STREAM_NOT_ALLOWED in lowered:
            self._streams_refused(message)
            return None
        raise exc

    async def _edits(self, parts: list[str]) -> bool:
        sent = False
        for i, part in enumerate(parts):
            if i < len(self.posted) - 1:
                continue  # completed messages are repaired by the final call only
            if i < len(self.posted):
                if self.posted[i].text != part:
                    await self._update(self.posted[i].id, MessageActivityInput(text=part))
                    self.posted[i].text = part
                    sent = True
            else:
                message_id = await self._create("post", MessageActivityInput(text=part))
                self.posted.append(_Posted(message_id, part))
                sent = True
        if not sent:
            await self._unpaid()
        return sent

    # --- the final text, reconciled by the reply --------------------------------------------------------
    def complete(self, answer: Answer) -> None:
        self.answer = answer

    def final_parts(self, text: str) -> list[str]:
        return split_message(neutralise(text.strip()) or "…", self.limit)

    @staticmethod
    def same(posted: _Posted, part: str, last: bool) -> bool:
        return posted.text == part and posted.last == last and not posted.streaming

    def _message(self, part: str, last: bool) -> MessageActivityInput:
        return answer_message(part, self.answer, last=last, feedback=self.settings.feedback, review=self.review,
                              language=self.language)

    async def edit(self, posted: _Posted, part: str, last: bool) -> None:
        if self.stopped:
            return
        message = self._message(part, last)
        if posted.streaming:
            message.id = posted.id
            await self._stream_paced()
            try:
                await self._call("final message", lambda api: api.conversations.create_activity(
                    self.place.conversation, message.add_stream_final()), priority=(COMPLETES, 1, self._taken_at))
            except httpx.HTTPStatusError as exc:
                if await self._stream_refused(exc) is False:
                    return  # stopped by the user: the message keeps what it showed
                posted.streaming = False
                await self._update(posted.id, self._message(part, last))
        else:
            await self._update(posted.id, message)
        posted.text, posted.last, posted.streaming = part, last, False

    async def add(self, part: str, last: bool) -> None:
        if self.stopped:
            return
        message_id = await self._create("post", self._message(part, last), priority=(COMPLETES, 1, self._taken_at))
        self.posted.append(_Posted(message_id, part, last))

    async def delete(self, posted: _Posted) -> None:
        try:
            await self._call("delete", lambda api: api.conversations.delete_activity(self.place.conversation,
                                                                                     posted.id))
        except httpx.HTTPStatusError as exc:
            log.warning("%s: could not delete a superseded message %s: %s", self.place.key, posted.id, error_of(exc))
        self.posted.remove(posted)

    async def final_shown(self) -> None:
        if self._on_final is not None and self.answer is not None and self.posted and self.answer.trace.turn_id:
            await self._on_final(self.posted[-1].id, self.answer.trace.turn_id)

    # --- failure ----------------------------------------------------------------------------------------
    async def show_failure(self, message: str) -> None:
        """``message`` in place of what was being filled (a stream ended with it), else posted."""
        body = f"⚠️ {neutralise(message)}"

        async def replace() -> bool:
            if not self.posted or self.stopped:
                return False
            try:
                await self.edit(self.posted[-1], body, False)
                return True
            except httpx.HTTPStatusError as exc:
                log.warning("%s: could not replace the partial answer (%s); posting the failure", self.place.key,
                            error_of(exc))
                return False

        async def post() -> None:
            message_id = await self._create("post", MessageActivityInput(text=body))
            self.posted.append(_Posted(message_id, body))

        await show_failure(replace, post)

    async def settle(self) -> None:
        await self._ack_settled()

    async def take_back(self, *, failed: bool) -> None:
        """Teams' typing and informative updates end by themselves once text is shown."""
        if self._ack is not None and not self._ack.done() and not self._ack_in_flight:
            self._ack.cancel()

    def message_ids(self) -> list[str]:
        return [posted.id for posted in self.posted if posted.id]


class AnswerTurns:
    """Which turn an answer's last message belongs to, for ``ttl_s`` (Teams' 👍/👎 names only the
    message): in Redis when there is one (every replica reads the clicks), else in this process."""

    LOCAL = 10_000

    def __init__(self, redis: Any = None, prefix: str = "kbbot:", ttl_s: float = 30 * 86400.0):
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = ttl_s
        #: What this process recorded (message key -> (turn id, until)).
        self.local: dict[str, tuple[str, float]] = {}

    def _key(self, conversation: str, message_id: str) -> str:
        return f"{self.prefix}teams:answer:{conversation.partition(';messageid=')[0]}:{message_id}"

    async def record(self, conversation: str, message_id: str, turn_id: str) -> None:
        key = self._key(conversation, message_id)
        if len(self.local) >= self.LOCAL:
            self.local.pop(next(iter(self.local)))
        self.local[key] = (turn_id, time.time() + self.ttl_s)
        if self.redis is not None:
            try:
                await self.redis.set(key, turn_id, ex=int(self.ttl_s))
            except Exception as exc:  # noqa: BLE001 - only a later click on this message is lost
                log.warning("could not record the turn of message %s (%s)", message_id, type(exc).__name__)

    def peek(self, conversation: str, message_id: str) -> str | None:
        """What this process recorded for the message (no Redis)."""
        found = self.local.get(self._key(conversation, message_id))
        return found[0] if found is not None and found[1] > time.time() else None

    async def turn_of(self, conversation: str, message_id: str) -> str | None:
        if self.redis is not None:
            found = await self.redis.get(self._key(conversation, message_id))
            if found is not None:
                return found.decode() if isinstance(found, bytes) else str(found)
        return self.peek(conversation, message_id)
