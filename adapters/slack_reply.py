"""Slack replies: one answer rendered in its thread, paced and within the workspace's rate budget.

``SlackReply`` is the ``Reply`` the adapter gives ``Answerer.answer`` for one event; its ``SlackSink``
puts the text into Slack messages:

- native streaming (``chat.startStream`` / ``appendStream`` / ``stopStream`` through slack-sdk's
  ``AsyncChatStream``), paced by one ``StreamWriter`` per answer and a ``RateBudget`` shared by all
  answers of a workspace; where Slack refuses streaming, or no stream can start without waiting for
  the workspace's ``chat.startStream`` budget (many answers at once), one message posted at once and
  updated with ``chat.update``; intermediate states use spare budget only, so finals never queue
  behind them;
- the final message: the answer as Markdown with the blocks of ``adapters.slack_text`` (sources,
  👍/👎, review buttons) on the last one; answers longer than one message are split at paragraph
  boundaries;
- a failed turn ends with the Answerer's friendly message in the thread and the status cleared.

Also here: the Web API client (``make_client``: ``SLACK_API_URL``, 429s and 5xx retried), the
per-method rates (``DEFAULT_RATES``, ``make_budget``) and the reading of Slack API errors.
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

from adapters.slack_text import final_blocks, neutralise, notification_text, stable_prefix
from bot.metrics import METRICS
from bot.platform_settings import SlackSettings
from bot.settings_base import reveal
from bot.streaming import Cadence, Rate, RateBudget, RetryAfter, StreamWriter, cut_point, split_message
from bot.types import Answer

log = logging.getLogger("kbbot.slack")

#: Calls per minute per workspace (chat.postMessage: per channel) and the burst allowed. Slack's tiers:
#: appendStream Tier 4 (100+/min), update Tier 3 (50+/min), stopStream Tier 2 (20+/min); postMessage
#: about 1 per second per channel. The status and delete rates are not documented: Tier 3 assumed.
#: startStream's is not documented either; it gets stopStream's, since every stream started must be
#: stopped. Streams start only with a token free at once: the other answers post and edit instead.
DEFAULT_RATES: dict[str, Rate] = {
    "chat.startStream": Rate(20, burst=10),
    "chat.appendStream": Rate(100, burst=10),
    "chat.stopStream": Rate(20, burst=10),
    "chat.update": Rate(50, burst=5),
    "chat.postMessage": Rate(60, burst=5),
    "chat.delete": Rate(50, burst=5),
    "assistant.threads.setStatus": Rate(50, burst=10),
}


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

    @property
    def key(self) -> str:
        return f"slack:{self.team}:{self.channel}:{self.thread_ts}"


@dataclass
class _Posted:
    ts: str
    text: str
    final: bool = False


class SlackSink:
    """Puts one answer's text into Slack messages; called by that answer's ``StreamWriter`` only.

    Intermediate calls get the whole text so far and show its stable prefix (native: appended to a
    stream; edit: the message replaced). The final call reconciles everything already shown with the
    final text, splits it into messages of at most ``max_message_chars`` and adds sources and buttons
    to the last one.
    """

    def __init__(self, client: AsyncWebClient, where: SlackThread, settings: SlackSettings, budget: RateBudget,
                 *, native: bool = True, on_fallback: Callable[[str], None] | None = None,
                 on_defer: Callable[[], None] | None = None,
                 before_first_message: Callable[[], Awaitable[None]] | None = None):
        self.client = client
        self.where = where
        self.settings = settings
        self.budget = budget
        self.native = native
        self.limit = settings.max_message_chars
        self.on_fallback = on_fallback
        self.on_defer = on_defer
        self.before_first_message = before_first_message
        self.tail: list[dict[str, Any]] = []
        self.posted: list[_Posted] = []
        self.ts: str | None = None  # the message being filled
        self.shown = ""  # the text given to it
        self.stream: AsyncChatStream | None = None
        self.diverged = False
        self.fallback_reason: str | None = None
        self._prepaid: str | None = None  # a budget token taken by ready() for this method

    # --- the Sink protocol -----------------------------------------------------------------
    def _next_method(self, final: bool) -> str:
        if self.native and not self.diverged:
            if self.stream is None or self.stream.ts is None:
                return "chat.postMessage" if final else "chat.startStream"
            return "chat.stopStream" if final else "chat.appendStream"
        return "chat.update" if self.ts else "chat.postMessage"

    async def ready(self, final: bool) -> bool:
        """Take the rate budget of the coming call before the writer takes its text.

        The first text never queues behind other answers: it opens a stream when a
        ``chat.startStream`` token is free now, else this answer switches to edit mode and posts
        (``chat.postMessage`` is limited per channel, not per workspace). An intermediate state is
        sent only with a token to spare (``False``: not now), so finals never wait behind them.
        """
        if self.diverged and not final:
            return False  # nothing is sent until the final text
        method = self._next_method(final)
        if self._prepaid == method:
            return True
        if method == "chat.startStream":
            if self.budget.try_acquire(self._scope(method), method):
                self._prepaid = method
                return True
            self._defer()
            method = self._next_method(final)
        elif not final and method != "chat.postMessage":
            if not self.budget.try_acquire(self._scope(method), method):
                return False
            self._prepaid = method
            return True
        await self.budget.acquire(self._scope(method), method)
        self._prepaid = method
        return True

    def _defer(self) -> None:
        """No stream can start now without waiting: this answer is shown with postMessage + update."""
        log.info("thread %s: chat.startStream budget spent; posting and editing instead", self.where.key)
        self.native = False
        self.fallback_reason = "stream_budget"
        METRICS.stream_deferred.labels("slack").inc()
        if self.on_defer is not None:
            self.on_defer()

    async def send(self, text: str, final: bool) -> bool:
        if final:
            await self._send_final(neutralise(text.strip()) or "…")
            return True
        if self.diverged:
            return False
        visible = neutralise(stable_prefix(text.lstrip()))
        done = "".join(p.text for p in self.posted)
        if not visible.startswith(done):
            self.diverged = True
            return False
        rest = visible[len(done):]
        if not rest.startswith(self.shown) and self.native:
            self.diverged = True  # cannot take back streamed text; the final call repairs it
            return False
        sent = False
        while len(rest) > self.limit:
            cut = cut_point(rest, self.limit, len(self.shown) if rest.startswith(self.shown) else 0)
            await self._complete(rest[:cut], last=False)
            rest = rest[cut:]
            sent = True
        if rest and rest != self.shown:
            await self._fill(rest)
            sent = True
        return sent

    # --- failure -------------------------------------------------------------------------------
    async def show_failure(self, message: str, *, attempts: int = 4) -> None:
        """Replace whatever was shown with ``message`` (or post it); retried past rate limits."""
        body = f"⚠️ {neutralise(message)}"
        if self.stream is not None and self.stream.ts:
            try:
                await self.stream.stop()  # a message still streaming cannot be edited
            except Exception as exc:  # noqa: BLE001 - it may have expired; the update below still works
                log.debug("stopping the stream before the failure message: %s", exc)
            self.ts = self.stream.ts
            self.stream = None
        for attempt in range(attempts):
            try:
                if self.ts:
                    try:
                        await self._api("chat.update", lambda: self.client.chat_update(
                            channel=self.where.channel, ts=self.ts, markdown_text=body))
                        return
                    except SlackApiError as exc:
                        if _is_rate_limited(exc):
                            raise
                        log.warning("could not replace the partial answer (%s); posting the failure instead",
                                    error_code(exc))
                        self.ts = None
                await self._ensure_ready()
                await self._api("chat.postMessage", lambda: self.client.chat_postMessage(
                    channel=self.where.channel, thread_ts=self.where.thread_ts, markdown_text=body))
                return
            except RetryAfter as wait:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(wait.seconds)

    # --- building blocks ---------------------------------------------------------------------
    async def _ensure_ready(self) -> None:
        if self.before_first_message is not None:
            ready, self.before_first_message = self.before_first_message, None
            await ready()

    def _scope(self, method: str) -> str:
        if method == "chat.postMessage":
            return f"{self.where.team}:{self.where.channel}"
        return self.where.team

    async def _api(self, method: str, call: Callable[[], Awaitable[Any]], *, paid: bool = False) -> Any:
        scope = self._scope(method)
        if self._prepaid == method:
            self._prepaid = None
        elif not paid:
            await self.budget.acquire(scope, method)
        try:
            return await call()
        except SlackApiError as exc:
            if _is_rate_limited(exc):
                seconds = retry_after_of(exc)
                self.budget.hold(scope, method, seconds)
                raise RetryAfter(seconds, f"{method} rate limited") from exc
            raise

    def _message_args(self, part: str, last: bool) -> dict[str, Any]:
        if last and self.tail:
            return {"text": notification_text(part),
                    "blocks": [{"type": "markdown", "text": part}, *self.tail]}
        return {"markdown_text": part}

    async def _post(self, part: str, last: bool) -> str:
        await self._ensure_ready()
        response = await self._api("chat.postMessage", lambda: self.client.chat_postMessage(
            channel=self.where.channel, thread_ts=self.where.thread_ts, **self._message_args(part, last)))
        return str(response["ts"])

    async def _update(self, ts: str, part: str, last: bool) -> None:
        await self._api("chat.update", lambda: self.client.chat_update(
            channel=self.where.channel, ts=ts, **self._message_args(part, last)))

    async def _delete(self, ts: str) -> None:
        try:
            await self._api("chat.delete", lambda: self.client.chat_delete(channel=self.where.channel, ts=ts))
        except SlackApiError as exc:
            log.warning("could not delete a superseded message %s: %s", ts, error_code(exc))

    async def _fall_back(self, error: SlackApiError) -> None:
        code = error_code(error) or str(error)
        log.info("thread %s: streaming refused (%s); continuing with chat.update", self.where.key, code)
        self.native = False
        self.fallback_reason = code
        if self.stream is not None and self.stream.ts:
            self.ts = self.stream.ts
        self.stream = None
        self.shown = "\0"  # what the refused stream shows is unknown: the next update replaces it whole
        if self.on_fallback is not None:
            self.on_fallback(code)

    async def _stream_call(self, method: str, call: Callable[[], Awaitable[Any]]) -> bool:
        """A streaming call; False (after switching to edit mode) when Slack refuses streaming."""
        try:
            await self._api(method, call)
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
            delta = rest[len(self.shown):]
            self.shown = rest  # from here on the text is in the stream's buffer until sent
            # chunks=[] makes AsyncChatStream flush now: the writer already applied the buffer size.
            if await self._stream_call(method, lambda: stream.append(markdown_text=delta, chunks=[])):
                self.ts = stream.ts
                return
        if self.ts is None:
            self.ts = await self._post(rest, last=False)
        else:
            await self._update(self.ts, rest, last=False)
        self.shown = rest

    async def _complete(self, part: str, *, last: bool) -> None:
        """Make the current message hold exactly ``part`` and finish it (with the tail when ``last``)."""
        if self.native and self.stream is not None and self.stream.ts is not None:
            stream = self.stream
            if part.startswith(self.shown) and not self.diverged:
                delta = part[len(self.shown):]
                self.shown = part
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
        self.posted.append(_Posted(ts=ts, text=part, final=last))
        self.ts, self.shown, self.stream = None, "", None

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
        keep = len(self.shown) if (self.ts and len(parts) == len(self.posted) and rest.startswith(self.shown)) else 0
        if rest or not parts:
            parts.extend(split_message(rest, self.limit, min(keep, self.limit)))
        return parts

    async def _send_final(self, visible: str) -> None:
        parts = self._plan(visible)
        # Messages already finished: keep, rewrite or remove them.
        for i, posted in enumerate(list(self.posted)):
            if i >= len(parts):
                await self._delete(posted.ts)
                self.posted.remove(posted)
                continue
            last = i == len(parts) - 1
            if posted.text == parts[i] and (posted.final or not last):
                continue
            await self._update(posted.ts, parts[i], last)
            posted.text, posted.final = parts[i], last
        if len(parts) <= len(self.posted):
            if self.ts is not None:  # the final text is shorter than what was shown
                if self.stream is not None:
                    await self._stream_call("chat.stopStream", lambda: self.stream.stop())  # type: ignore[union-attr]
                await self._delete(self.ts)
                self.ts, self.stream, self.shown = None, None, ""
            return
        for i in range(len(self.posted), len(parts)):
            await self._complete(parts[i], last=i == len(parts) - 1)


class SlackReply:
    """``Reply`` for one Slack answer: status while searching, a paced stream, the final message."""

    def __init__(self, client: AsyncWebClient, where: SlackThread, settings: SlackSettings, budget: RateBudget,
                 *, native: bool = True, on_stream_refused: Callable[[str], None] | None = None):
        self.client = client
        self.where = where
        self.settings = settings
        self.budget = budget
        self.native_cadence = Cadence(min_interval_s=settings.stream_interval_s, min_growth=settings.buffer_size)
        self.edit_cadence = Cadence(min_interval_s=settings.edit_interval_s)
        self._on_stream_refused = on_stream_refused
        self.sink = SlackSink(client, where, settings, budget, native=native, on_fallback=self._fell_back,
                              on_defer=self._deferred, before_first_message=self._status_settled)
        self.writer = StreamWriter(self.sink, self.native_cadence if native else self.edit_cadence,
                                   name=where.key)
        self._status_task: asyncio.Task[None] | None = None
        self._status_interrupted = False
        self.failed: str | None = None

    def _deferred(self) -> None:
        self.writer.cadence = self.edit_cadence

    def _fell_back(self, code: str) -> None:
        self.writer.cadence = self.edit_cadence
        if self._on_stream_refused is not None:
            self._on_stream_refused(code)

    # --- status ------------------------------------------------------------------------------
    async def _set_status(self, status: str, *, spare_only: bool = False) -> None:
        method = "assistant.threads.setStatus"
        if spare_only and not self.budget.try_acquire(self.where.team, method):
            # A courtesy: when the workspace's budget is spent, the answer itself comes first.
            log.debug("thread %s: no budget to spare for the status", self.where.key)
            return
        try:
            await self.sink._api(method, lambda: self.client.assistant_threads_setStatus(
                channel_id=self.where.channel, thread_ts=self.where.thread_ts, status=status), paid=spare_only)
        except (SlackApiError, RetryAfter) as exc:
            # The status is a courtesy: a workspace without it still gets the answer.
            log.debug("thread %s: status not set (%s)", self.where.key, exc)

    async def _status_settled(self, timeout_s: float = 1.0) -> None:
        """Before the first message: a status landing after it would linger, so wait for it (briefly)."""
        task = self._status_task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            self._status_interrupted = True

    async def _clear_status(self) -> None:
        await self._set_status("")

    # --- Reply ----------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.settings.status:
            self._status_task = asyncio.create_task(self._set_status(self.settings.status, spare_only=True))

    async def push(self, delta: str) -> None:
        self.writer.push(delta)

    async def finish(self, answer: Answer) -> None:
        self.sink.tail = final_blocks(answer, feedback=self.settings.feedback,
                                      review=bool(self.settings.reviewers_of(self.where.team)))
        await self.writer.finish(answer.text)
        if self._status_interrupted:
            await self._clear_status()

    async def fail(self, message: str) -> None:
        self.failed = message
        await self.writer.close()
        await self._status_settled()
        try:
            await self.sink.show_failure(message)
        except Exception:
            log.exception("thread %s: could not show the failure message", self.where.key)
        if self._status_task is not None:
            await self._clear_status()


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


def make_budget(settings: SlackSettings) -> RateBudget:
    rates = dict(DEFAULT_RATES)
    for method, per_minute in settings.rate_limits.items():
        burst = rates[method].burst if method in rates else 1
        rates[method] = Rate(float(per_minute), burst=burst)
    return RateBudget(rates)
