"""Slack replies: one answer rendered in its thread, paced and within the workspace's rate budget.

``SlackMessages`` is one answer's messages (``bot.delivery.reply.AnswerMessages``); the adapter gives
``Answerer.answer`` a ``ChatReply`` over them, which paces, reconciles and shows failures the same way on
every platform. What Slack does:

- the question acknowledged at once: the status, or an 👀 reaction when the status budget is spent
  (each method has a tier of its own; the reaction is taken back once the answer's first message is shown,
  when Slack clears the status);
- native streaming (``chat.startStream`` / ``appendStream`` / ``stopStream`` through slack-sdk's
  ``AsyncChatStream``), paced by one ``StreamWriter`` per answer and a ``PlatformRates`` shared by all
  answers of a workspace; where Slack refuses streaming, or no stream can start without waiting for
  the workspace's ``chat.startStream`` budget (many answers at once), one message posted and
  updated with ``chat.update``; intermediate states use spare budget only, so finals never queue
  behind them;
- in a busy channel, where every answer's first message waits for the channel's
  ``chat.postMessage`` (about one a second), the budget goes to complete answers first (fewest
  messages left, then the earliest complete), and a complete answer takes a free stream start and
  stop (workspace tiers) rather than wait for the channel;
- the final message: the answer as Markdown with the blocks of ``adapters.slack.text`` (sources,
  👍/👎, review buttons) on the last one; answers longer than one message are split at paragraph
  boundaries;
- a failed turn ends with the Answerer's friendly message in the thread and the status cleared.

The final reconciliation is the reply's (``bot.delivery.reply.reconcile`` over ``final_parts``, ``same``,
``edit``, ``add``, ``delete``); the failure's retries past rate limits are ``bot.delivery.reply.show_failure``.

Also here: the Web API client (``make_client``: ``SLACK_API_URL``, 429s and 5xx retried), the
per-method rates (``DEFAULT_RATES``, ``make_rates``) and the reading of Slack API errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_chat_stream import AsyncChatStream
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.settings import SlackSettings
from adapters.slack.text import final_blocks, neutralise, notification_text, stable_prefix
from bot.delivery.buckets import RedisBuckets
from bot.delivery.rates import COMPLETES, STARTS, PlatformRates, Priority, Rate
from bot.delivery.reply import Cadence, RetryAfter, cut_point, in_background, show_failure, split_message
from bot.metrics import METRICS
from bot.settings.base import reveal
from bot.types import Answer

log = logging.getLogger("kbbot.slack")

STATUS = "assistant.threads.setStatus"
STREAM_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream")
REACT = "reactions.add"
UNREACT = "reactions.remove"

#: Calls per minute per workspace (chat.postMessage: per channel) and the burst allowed. Slack's tiers:
#: appendStream Tier 4 (100+/min), update and reactions.add Tier 3 (50+/min), stopStream and
#: reactions.remove Tier 2 (20+/min); postMessage about 1 per second per channel, "short bursts"
#: allowed. The status has "special" limits, not published, and delete's is not documented: Tier 3
#: assumed. startStream's is not documented either; it gets stopStream's, since every stream started
#: must be stopped. A bucket lets through at most ``burst + per_minute`` calls in any minute, so every
#: tier's two add up to Slack's figure: kbbot's own calls never meet a 429, whose Retry-After (up to a
#: minute for a Tier 2 method) would hold the whole workspace's or channel's budget. postMessage is
#: one call every 1.05 s with no burst, so no six of them fall within five seconds. Streams start only
#: with a token free at once: the other answers post and edit instead. The status and the reaction are
#: the two ways to acknowledge a question; their bursts add up to 50 questions shown "seen" at once,
#: whatever the chat.* budgets are doing.
DEFAULT_RATES: dict[str, Rate] = {
    "chat.startStream": Rate(10, burst=10),
    "chat.appendStream": Rate(90, burst=10),
    "chat.stopStream": Rate(10, burst=10),
    "chat.update": Rate(45, burst=5),
    "chat.postMessage": Rate(57, burst=1),
    "chat.delete": Rate(45, burst=5),
    # Reviewers' notes (expert replies, refused clicks): Tier 4, far below what answers need of their own.
    "chat.postEphemeral": Rate(90, burst=10),
    STATUS: Rate(15, burst=35),
    REACT: Rate(25, burst=25),
    # Never urgent: a removal waits for its turn rather than meet a 429.
    UNREACT: Rate(15, burst=5),
}
#: A reaction is added only with the token that takes it back reserved (see ``_acknowledge``).
REACT_PAIR = (REACT, UNREACT)


def retry_after_of(error: SlackApiError, default: float = 1.0) -> float:
    headers = getattr(error.response, "headers", None) or {}
    for key, value in dict(headers).items():
        if key.lower() == "retry-after":
            if isinstance(value, (list, tuple)):
                value = value[0] if value else default
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return default
    return default


def error_code(error: SlackApiError) -> str:
    try:
        return str(error.response.get("error") or "")
    except Exception:  # noqa: BLE001 - a response without a body
        return ""


def _is_rate_limited(error: SlackApiError) -> bool:
    return getattr(error.response, "status_code", None) == 429 or error_code(error) == "ratelimited"


# --- where an answer goes ----------------------------------------------------------------------
@dataclass(frozen=True)
class SlackThread:
    team: str
    channel: str
    thread_ts: str
    user: str
    is_dm: bool = False
    #: The question's own message (what an acknowledging reaction goes on); "" when unknown.
    question_ts: str = ""

    @property
    def key(self) -> str:
        return f"slack:{self.team}:{self.channel}:{self.thread_ts}"


@dataclass
class _Posted:
    ts: str
    text: str
    final: bool = False


class SlackMessages:
    """One Slack answer's messages (``bot.delivery.reply.AnswerMessages``), driven by its ``ChatReply``.

    Intermediate calls (``show``) get the whole text so far and show its stable prefix (native:
    appended to a stream; edit: the message replaced). The final text is split into messages of at
    most ``max_message_chars`` (``final_parts``) and reconciled by the reply over those shown, with
    sources and buttons on the last one.

    The acknowledgement is the status ("Searching the knowledge base…", which Slack clears when the
    answer is posted) or, when the workspace's status budget is spent, a reaction (``ack_reaction``)
    on the question, removed once the answer's first message is shown. Both come from budgets of
    their own, never from the chat.* budgets the answers need, so a busy channel still sees every
    question taken.
    """

    platform = "slack"

    def __init__(self, client: AsyncWebClient, where: SlackThread, settings: SlackSettings, rates: PlatformRates,
                 *, native: bool = True, on_stream_refused: Callable[[str], None] | None = None,
                 background: Callable[[asyncio.Task[Any]], None] | None = None):
        self.client = client
        self.where = where
        self.settings = settings
        self.rates = rates
        self.native = native
        self.limit = settings.max_message_chars
        self.native_cadence = Cadence(min_interval_s=settings.stream_interval_s, min_growth=settings.buffer_size)
        self.edit_cadence = Cadence(min_interval_s=settings.edit_interval_s)
        self._on_stream_refused = on_stream_refused
        self._background = background
        self._first_message = True  # no message of this answer yet: the acknowledgement still settles
        self.tail: list[dict[str, Any]] = []
        self.posted: list[_Posted] = []
        self.ts: str | None = None  # the message being filled
        self.filled = ""  # the text given to it
        self.stream: AsyncChatStream | None = None
        self.diverged = False
        self._prepaid: list[str] = []  # methods whose budget tokens ready() took for the coming calls
        #: The token of the call that will end the message shown before the final text (a stream's
        #: chat.stopStream, an edited message's chat.update), taken when that message was begun: no
        #: text is shown that cannot be finished without waiting for the workspace's budget.
        self._reserved: list[str] = []
        #: Streaming may be used (the workspace did not refuse it); an answer that deferred to
        #: postMessage for want of a stream start may still finish in a stream of its own.
        self.streams_allowed = native
        self._stream_final = False  # the final text opens a stream of its own (start + stop prepaid)
        #: "" until the first text; "granted" / "posted": with the workspace's stream and edit tiers spent,
        #: the first checked sentences go as a message of their own (the channel's chat.postMessage
        #: budget, only a token nobody waits for) and the rest follows as the final message.
        self._early = ""
        #: ``budget.clock()`` when the final text was handed over (``expect_final``), and how many
        #: messages it still needs: the order in which waiting answers get the budget.
        self.final_at: float | None = None
        self.parts_left = 1
        self.started_at = rates.clock()
        self._finished_before = 0  # messages completed when the final text was planned
        self._final_count = 0
        self._ack_task: asyncio.Task[None] | None = None
        self._ack_in_flight: str | None = None  # the acknowledging method whose call is on its way
        self._unreact_reserved = False  # a reactions.remove token taken with the reaction's
        #: How this question was acknowledged: STATUS, REACT, or None (not yet, or its text came first).
        self.acknowledged: str | None = None
        self._status_interrupted = False

    @property
    def cadence(self) -> Cadence:
        return self.native_cadence if self.native else self.edit_cadence

    def priority(self) -> Priority:
        """Where this answer stands in a budget's queue (read at every grant): a complete answer
        before one still being written; among complete ones the fewest messages left, then the
        earliest complete; among the others the earliest asked."""
        if self.final_at is not None:
            return COMPLETES, max(1, self.parts_left), self.final_at
        return STARTS, 0, self.started_at

    def expect_final(self, text: str) -> None:
        """The model's answer is complete: from now on this answer waits as one to finish."""
        self.parts_left = max(1, len(self._plan(neutralise(text.strip()) or "…")) - len(self.posted))
        self.final_at = self.rates.clock()

    @property
    def visible(self) -> bool:
        """Some text of this answer is on screen (a message exists)."""
        return bool(self.posted or self.ts or (self.stream is not None and self.stream.ts))

    # --- the Sink protocol -----------------------------------------------------------------
    def _next_method(self, final: bool) -> str:
        if self.native and not self.diverged:
            if self.stream is None or self.stream.ts is None:
                return "chat.postMessage" if final else "chat.startStream"
            return "chat.stopStream" if final else "chat.appendStream"
        return "chat.update" if self.ts else "chat.postMessage"

    async def ready(self, final: bool) -> bool:
        """Take the rate budget of the coming call before the writer takes its text.

        The first text opens a stream when a ``chat.startStream`` and a ``chat.stopStream`` token are
        both free now (the stop is kept for the final text), else this answer switches to edit mode
        and posts its first text only with a ``chat.update`` token to keep for the final; with neither,
        its first checked sentences are posted as a message of their own with a ``chat.postMessage``
        token of the channel that nobody waits for (limited per channel, not per workspace; never
        edited), and the rest of the answer follows as the final message with the sources and buttons;
        without that token either, nothing is shown until the final text, posted whole, the
        acknowledgement showing meanwhile. So when the workspace's streaming and editing tiers are
        spent, answers still show their first text soon and end without waiting for those tiers
        (issue 44).

        Waiting callers are served by ``priority()``: in a busy channel a complete answer is posted
        before anyone's first text, and among complete answers the one needing the fewest messages,
        then the earliest complete. An intermediate state is sent only with a token to spare
        (``False``: not now), so finals never wait behind them.
        """
        if (self.diverged or self._early == "posted") and not final:
            return False  # nothing is sent until the final text
        method = self._next_method(final)
        if method in self._prepaid:
            return True
        if final and method in self._reserved:
            self._reserved.remove(method)
            self._prepaid.append(method)
            return True
        if method == "chat.startStream":
            team = self._scope(method)
            if await self.rates.try_acquire_all((team, method), (team, "chat.stopStream")):
                self._prepaid.append(method)
                self._reserved.append("chat.stopStream")
                return True
            self._defer()
            method = self._next_method(final)
        if not final and method == "chat.postMessage":
            # A message begun in edit mode: only with the update that will finish it.
            if await self.rates.try_acquire(self.where.team, "chat.update"):
                self._reserved.append("chat.update")
            elif not self.posted and await self.rates.try_acquire(self._scope(method), method):
                self._early = "granted"  # the workspace's tiers are spent: a message of its own, never edited
                self._prepaid.append(method)
                return True
            else:
                return False
        elif not final and method != "chat.postMessage":
            if not await self.rates.try_acquire(self._scope(method), method):
                return False
            self._prepaid.append(method)
            return True
        if method == "chat.postMessage":
            await self._post_turn()
            return True
        await self.rates.acquire(self._scope(method), method, self.priority)
        self._prepaid.append(method)
        return True

    def _may_stream_final(self) -> bool:
        return (self.final_at is not None and self.streams_allowed and self.stream is None and self.ts is None
                and not self.posted)

    async def _post_turn(self) -> None:
        """Wait for this answer's turn at the channel's ``chat.postMessage`` (in ``priority()`` order).

        A complete answer with no message yet may instead take a stream start and stop that are
        free with nobody waiting for them: those are workspace tiers, so it leaves the channel's
        queue without taking a token from anyone who waits, and the next in line moves up.
        """
        method = "chat.postMessage"
        turn = asyncio.create_task(self.rates.acquire(self._scope(method), method, self.priority))
        stream_pair = ((self.where.team, "chat.startStream"), (self.where.team, "chat.stopStream"))
        try:
            poll = 0.25  # a turn granted at once (a quiet channel) costs no look at the stream budgets
            while self.streams_allowed and not turn.done():
                await asyncio.wait({turn}, timeout=poll)
                if turn.done():
                    break
                if self._may_stream_final() and await self.rates.try_acquire_all(*stream_pair):
                    self.native, self.diverged, self._stream_final = True, False, True
                    self._prepaid += ["chat.startStream", "chat.stopStream"]
                    return
                # Looked at again at least every second: the answer may complete while it waits.
                poll = min(1.0, max(0.25, *[await self.rates.eta(*key) for key in stream_pair]))
            await turn
            self._prepaid.append(method)
        finally:
            if not turn.done():
                turn.cancel()
                await asyncio.wait({turn})
                if not turn.cancelled():
                    await self._refund(method)  # granted just before the cancel

    async def _refund(self, method: str) -> None:
        await self.rates.refund(self._scope(method), method)

    def _defer(self) -> None:
        """No stream can start now without waiting: this answer is shown with postMessage + update."""
        log.info("thread %s: chat.startStream budget spent; posting and editing instead", self.where.key)
        self.native = False
        METRICS.stream_deferred.labels("slack").inc()

    async def show(self, text: str) -> bool:
        if self.diverged:
            return False
        visible = neutralise(stable_prefix(text.lstrip()))
        done = "".join(p.text for p in self.posted)
        if not visible.startswith(done):
            self.diverged = True
            return False
        rest = visible[len(done):]
        if not rest.startswith(self.filled) and self.native:
            self.diverged = True  # cannot take back streamed text; the final call repairs it
            return False
        sent = False
        while len(rest) > self.limit:
            cut = cut_point(rest, self.limit, len(self.filled) if rest.startswith(self.filled) else 0)
            await self._complete(rest[:cut], last=False)
            rest = rest[cut:]
            sent = True
        if rest and self._early == "granted":
            self._early = "posted"
            await self._complete(rest, last=False)  # the rest of the answer comes as the final message
            return True
        if rest and rest != self.filled:
            await self._fill(rest)
            sent = True
        return sent

    # --- failure -------------------------------------------------------------------------------
    async def show_failure(self, message: str) -> None:
        """Replace whatever was shown with ``message`` (or post it); retried past rate limits."""
        body = f"⚠️ {neutralise(message)}"
        if self.stream is not None and self.stream.ts:
            try:
                await self.stream.stop()  # a message still streaming cannot be edited
            except Exception as exc:  # noqa: BLE001 - it may have expired; the update below still works
                log.debug("stopping the stream before the failure message: %s", exc)
            self.ts = self.stream.ts
            self.stream = None

        async def replace() -> bool:
            if not self.ts:
                return False
            try:
                await self.call("chat.update", lambda: self.client.chat_update(
                    channel=self.where.channel, ts=self.ts, markdown_text=body))
                return True
            except SlackApiError as exc:
                if _is_rate_limited(exc):
                    raise
                log.warning("could not replace the partial answer (%s); posting the failure instead",
                            error_code(exc))
                self.ts = None
                return False

        async def post() -> None:
            await self._ensure_ready()
            await self.call("chat.postMessage", lambda: self.client.chat_postMessage(
                channel=self.where.channel, thread_ts=self.where.thread_ts, markdown_text=body))

        try:
            await show_failure(replace, post)
        finally:
            await self._release_reserved()

    async def _release_reserved(self) -> None:
        """The answer is over: a finishing token it kept and did not use goes back to the workspace."""
        while self._reserved:
            await self._refund(self._reserved.pop())

    # --- building blocks ---------------------------------------------------------------------
    async def _ensure_ready(self) -> None:
        if self._first_message:
            self._first_message = False
            await self._ack_settled()

    def _scope(self, method: str) -> str:
        if method == "chat.postMessage":
            return post_scope(self.where.team, self.where.channel)
        return self.where.team

    async def call(self, method: str, call: Callable[[], Awaitable[Any]], *, paid: bool = False) -> Any:
        """One Web API call inside the budget of ``method`` (``paid``: its token is already taken); a 429
        holds that budget for everyone and becomes ``RetryAfter``."""
        scope = self._scope(method)
        if method in self._prepaid:
            self._prepaid.remove(method)
        elif method in self._reserved and not paid:
            self._reserved.remove(method)
        elif not paid:
            await self.rates.acquire(scope, method, self.priority)
        try:
            response = await call()
        except SlackApiError as exc:
            if _is_rate_limited(exc):
                seconds = retry_after_of(exc)
                await self.rates.hold(scope, method, seconds)
                raise RetryAfter(seconds, f"{method} rate limited") from exc
            raise
        if method in ("chat.postMessage", "chat.startStream"):
            self._take_back_reaction()  # the answer's first message is shown (later calls: nothing left)
        return response

    def _message_args(self, part: str, last: bool) -> dict[str, Any]:
        if last and self.tail:
            return {"text": notification_text(part),
                    "blocks": [{"type": "markdown", "text": part}, *self.tail]}
        return {"markdown_text": part}

    async def _post(self, part: str, last: bool) -> str:
        await self._ensure_ready()
        response = await self.call("chat.postMessage", lambda: self.client.chat_postMessage(
            channel=self.where.channel, thread_ts=self.where.thread_ts, **self._message_args(part, last)))
        return str(response["ts"])

    async def _update(self, ts: str, part: str, last: bool) -> None:
        await self.call("chat.update", lambda: self.client.chat_update(
            channel=self.where.channel, ts=ts, **self._message_args(part, last)))

    async def _delete(self, ts: str) -> None:
        try:
            await self.call("chat.delete", lambda: self.client.chat_delete(channel=self.where.channel, ts=ts))
        except SlackApiError as exc:
            log.warning("could not delete a superseded message %s: %s", ts, error_code(exc))

    async def _fall_back(self, error: SlackApiError) -> None:
        code = error_code(error) or str(error)
        log.info("thread %s: streaming refused (%s); continuing with chat.update", self.where.key, code)
        self.native = self.streams_allowed = self._stream_final = False
        for held in (self._prepaid, self._reserved):
            for method in [m for m in held if m in STREAM_METHODS]:
                held.remove(method)
                await self._refund(method)
        if self.stream is not None and self.stream.ts:
            self.ts = self.stream.ts
        self.stream = None
        self.filled = "\0"  # what the refused stream shows is unknown: the next update replaces it whole
        if self._on_stream_refused is not None:
            self._on_stream_refused(code)

    async def _stream_call(self, method: str, call: Callable[[], Awaitable[Any]]) -> bool:
        """A streaming call; False (after switching to edit mode) when Slack refuses streaming."""
        try:
            await self.call(method, call)
            return True
        except SlackApiError as exc:
            await self._fall_back(exc)
            return False

    async def _fill(self, rest: str) -> None:
        """Show ``rest`` (which fits one message) in the current message."""
        if self.native:
            if self.stream is None:
                await self._ensure_ready()
                self.stream = await self.client.chat_stream(
                    channel=self.where.channel, thread_ts=self.where.thread_ts,
                    recipient_team_id=self.where.team, recipient_user_id=self.where.user,
                    buffer_size=self.settings.buffer_size)
            stream = self.stream
            method = "chat.appendStream" if stream.ts else "chat.startStream"
            delta = rest[len(self.filled):]
            self.filled = rest  # from here on the text is in the stream's buffer until sent
            # chunks=[] makes AsyncChatStream flush now: the writer already applied the buffer size.
            if await self._stream_call(method, lambda: stream.append(markdown_text=delta, chunks=[])):
                self.ts = stream.ts
                return
        if self.ts is None:
            self.ts = await self._post(rest, last=False)
        else:
            await self._update(self.ts, rest, last=False)
        self.filled = rest

    async def _complete(self, part: str, *, last: bool) -> None:
        """Make the current message hold exactly ``part`` and finish it (with the tail when ``last``)."""
        if self._stream_final and self.stream is None and self.ts is None:
            self._stream_final = False
            await self._fill(part)  # chat.startStream with the whole part; stopped with the tail below
        if self.native and self.stream is not None and self.stream.ts is not None:
            stream = self.stream
            if part.startswith(self.filled) and not self.diverged:
                delta = part[len(self.filled):]
                self.filled = part
                blocks = self.tail if last and self.tail else None
                if await self._stream_call("chat.stopStream",
                                           lambda: stream.stop(markdown_text=delta or None, blocks=blocks)):
                    self._finished(stream.ts or "", part, last)
                    return
            else:
                # Streamed text cannot be taken back: end the stream, then replace its text below.
                await self._stream_call("chat.stopStream", lambda: stream.stop())
                self.ts, self.stream = stream.ts, None
        if self.ts is None:
            ts = await self._post(part, last)
        else:
            ts = self.ts
            await self._update(ts, part, last)
        self._finished(ts, part, last)

    def _finished(self, ts: str, part: str, last: bool) -> None:
        self.parts_left -= 1
        self.posted.append(_Posted(ts=ts, text=part, final=last))
        self.ts, self.filled, self.stream = None, "", None

    def _plan(self, visible: str) -> list[str]:
        parts: list[str] = []
        pos = 0
        for posted in self.posted:
            if posted.text and visible.startswith(posted.text, pos):
                parts.append(posted.text)
                pos += len(posted.text)
            else:
                break
        rest = visible[pos:]
        keep = len(self.filled) if (self.ts and len(parts) == len(self.posted) and rest.startswith(self.filled)) else 0
        if rest or not parts:
            parts.extend(split_message(rest, self.limit, min(keep, self.limit)))
        return parts

    # --- the final text, reconciled by the reply ----------------------------------------------------
    def final_parts(self, text: str) -> list[str]:
        parts = self._plan(neutralise(text.strip()) or "…")
        self._finished_before, self._final_count = len(self.posted), len(parts)
        return parts

    @staticmethod
    def same(posted: _Posted, part: str, last: bool) -> bool:
        return posted.text == part and (posted.final or not last)

    async def edit(self, posted: _Posted, part: str, last: bool) -> None:
        await self._update(posted.ts, part, last)
        posted.text, posted.final = part, last

    async def add(self, part: str, last: bool) -> None:
        await self._complete(part, last=last)

    async def delete(self, posted: _Posted) -> None:
        await self._delete(posted.ts)
        self.posted.remove(posted)

    async def final_shown(self) -> None:
        if self._final_count <= self._finished_before and self.ts is not None:
            # The final text is shorter than what was shown: the message being filled goes.
            if self.stream is not None:
                await self._stream_call("chat.stopStream", lambda: self.stream.stop())  # type: ignore[union-attr]
            await self._delete(self.ts)
            self.ts, self.stream, self.filled = None, None, ""
        await self._release_reserved()

    # --- acknowledgement -------------------------------------------------------------------------
    async def _ack_call(self, method: str, call: Callable[[], Awaitable[Any]]) -> bool:
        """One acknowledging call whose token is taken: True when Slack shows it."""
        self._ack_in_flight = method
        try:
            await self.call(method, call, paid=True)
            return True
        except (SlackApiError, RetryAfter) as exc:
            # A courtesy: refused here (or rate limited: the bucket is held), the other kind may still go.
            log.info("thread %s: %s refused (%s)", self.where.key, method,
                     error_code(exc) if isinstance(exc, SlackApiError) else exc)
            return False
        finally:
            self._ack_in_flight = None

    def _set_status_call(self, status: str) -> Callable[[], Awaitable[Any]]:
        return lambda: self.client.assistant_threads_setStatus(
            channel_id=self.where.channel, thread_ts=self.where.thread_ts, status=status)

    def _reaction_call(self, method: str) -> Callable[[], Awaitable[Any]]:
        call = self.client.reactions_add if method == REACT else self.client.reactions_remove
        return lambda: call(channel=self.where.channel, timestamp=self.where.question_ts,
                            name=self.settings.ack_reaction)

    async def _acknowledge(self) -> None:
        """Show at once that the question was taken: the status if its budget has a token now, else
        the reaction; with neither free, whichever frees first. Text on screen acknowledges too.

        A reaction is added only when a token to take it back (reactions.remove, Tier 2) is taken with
        it: removals then never queue up behind additions (Tier 3 adds 50 a minute, Tier 2 removes 20),
        and the 👀 goes with the answer's first message instead of up to 53 s after its final one
        (issue 28). Past that rate the question waits for the status, a reaction or its first text."""
        team = self.where.team
        kinds = [m for m, on in ((STATUS, self.settings.status), (REACT, self.settings.ack_reaction)) if on]
        if not self.where.question_ts and REACT in kinds:
            kinds.remove(REACT)
        while kinds and not self.visible:
            for method in list(kinds):
                if method == STATUS:
                    if not await self.rates.try_acquire(team, STATUS):
                        continue
                    call = self._set_status_call(self.settings.status)
                else:
                    if not await self.rates.try_acquire_all(*((team, m) for m in REACT_PAIR)):
                        continue
                    self._unreact_reserved = True
                    call = self._reaction_call(REACT)
                if await self._ack_call(method, call):
                    self.acknowledged = method
                    return
                if method == REACT:
                    await self._release_unreact()
                kinds.remove(method)  # refused for this question: the other kind
                break
            else:
                etas = [max([await self.rates.eta(team, m) for m in (REACT_PAIR if m == REACT else (m,))])
                        for m in kinds]
                await asyncio.sleep(max(0.01, min(etas)))

    async def _release_unreact(self) -> None:
        if self._unreact_reserved:
            self._unreact_reserved = False
            await self.rates.refund(self.where.team, UNREACT)

    async def _ack_settled(self, timeout_s: float = 1.0) -> None:
        """Before the first message: an acknowledgement still waiting for its budget is dropped (the
        message is one), and a status on its way is awaited briefly, as one landing after the message
        would linger."""
        task = self._ack_task
        if task is None or task.done():
            return
        if self._ack_in_flight is None:
            task.cancel()
            return
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            in_flight = self._ack_in_flight
            task.cancel()
            # It may still land: a status is cleared after the answer, a reaction taken back.
            self._status_interrupted = in_flight == STATUS
            if in_flight == REACT:
                self.acknowledged = REACT

    async def _clear_status(self) -> None:
        if not await self._budgeted_call(STATUS, self._set_status_call("")):
            log.debug("thread %s: status not cleared", self.where.key)

    async def _budgeted_call(self, method: str, call: Callable[[], Awaitable[Any]], attempts: int = 3,
                             *, paid: bool = False) -> bool:
        """A call that should land eventually (clearing the status, taking the reaction back): it waits
        for its budget (unless its first token is ``paid`` already), and a 429 holds that budget for the
        Retry-After the next attempt waits out."""
        for attempt in range(attempts):
            if not (paid and attempt == 0):
                await self.rates.acquire(self.where.team, method)
            try:
                await self.call(method, call, paid=True)
                return True
            except RetryAfter:
                continue
            except SlackApiError as exc:
                log.info("thread %s: %s refused (%s)", self.where.key, method, error_code(exc))
                return False
        return False

    def _take_back_reaction(self) -> None:
        """The answer's first message is shown: the reaction has done its job, as the status has (Slack
        clears it then). Removed from its own (Tier 2, 20 a minute) budget in the background, so neither
        this turn nor any answer waits for it; starting at the first message rather than the final one,
        a burst's removals are done by about when its answers are (issue 28: up to 53 s after them)."""
        if self.acknowledged != REACT:
            return
        self.acknowledged = None
        paid, self._unreact_reserved = self._unreact_reserved, False
        in_background(self._budgeted_call(UNREACT, self._reaction_call(UNREACT), paid=paid),
                      name=f"unreact {self.where.key}", track=self._background)

    # --- what the reply asks -------------------------------------------------------------------------
    def message_ids(self) -> list[str]:
        """The ts of every message of this answer so far, streams included."""
        ids = [posted.ts for posted in self.posted]
        for ts in (self.ts, self.stream.ts if self.stream is not None else None):
            if ts and ts not in ids:
                ids.append(ts)
        return ids

    async def acknowledge(self) -> None:
        """Called as soon as the question is accepted, before its turn waits."""
        if self._ack_task is None:
            self._ack_task = asyncio.create_task(self._acknowledge(), name=f"acknowledge {self.where.key}")

    def complete(self, answer: Answer) -> None:
        self.tail = final_blocks(answer, feedback=self.settings.feedback,
                                 review=bool(self.settings.reviewers_of(self.where.team)))
        self.expect_final(answer.text)

    async def settle(self) -> None:
        await self._ack_settled()

    async def take_back(self, *, failed: bool) -> None:
        """Slack clears a status when the answer is posted; one that landed late, or one a failure
        message (possibly an edit, not a post) did not clear, is cleared here."""
        if self._status_interrupted or (failed and self.acknowledged == STATUS):
            await self._clear_status()
        self._take_back_reaction()


# --- client and budget -----------------------------------------------------------------------
def make_client(settings: SlackSettings) -> AsyncWebClient:
    """The Web API client: ``SLACK_API_URL`` as base URL, 429s and 5xx retried (bolt copies the handlers)."""
    options: dict[str, Any] = {"token": reveal(settings.bot_token) or None}
    if settings.api_url:
        options["base_url"] = settings.api_url if settings.api_url.endswith("/") else settings.api_url + "/"
    client = AsyncWebClient(**options)
    if settings.retry_429 > 0:
        client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=settings.retry_429))
    client.retry_handlers.append(AsyncServerErrorRetryHandler(max_retry_count=1))
    return client


def post_scope(team: str, channel: str) -> str:
    """The bucket scope of ``chat.postMessage``, which Slack limits per channel (the other methods: per workspace)."""
    return f"{team}:{channel}"


def make_rates(settings: SlackSettings, redis: Any = None, prefix: str = "kbbot:") -> PlatformRates:
    """The app's Slack rates: the built-in tiers with ``slack.rate_limits`` over them, in buckets every
    replica shares in ``redis`` (``{prefix}rate:slack:{scope}:{method}``), or this process's without it."""
    rates = dict(DEFAULT_RATES)
    for method, per_minute in settings.rate_limits.items():
        burst = rates[method].burst if method in rates else 1
        rates[method] = Rate(float(per_minute), burst=burst)
    store = RedisBuckets(redis, prefix=f"{prefix}rate:slack:") if redis is not None else None
    return PlatformRates(rates, store=store)
