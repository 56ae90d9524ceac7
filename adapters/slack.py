"""The Slack adapter: mentions, thread follow-ups and DMs in; streamed, cited answers out.

Events arrive through bolt's ``AsyncApp`` (Events API over HTTP, or Socket Mode) and are acknowledged
at once; the turn runs after the ack. Each event becomes an ``Inquiry`` for ``Answerer.answer`` with a
``SlackReply`` that renders the answer in the thread:

- native streaming (``chat.startStream`` / ``appendStream`` / ``stopStream`` through slack-sdk's
  ``AsyncChatStream``), paced by one ``StreamWriter`` per answer and a ``RateBudget`` shared by all
  answers of a workspace; where Slack refuses streaming, or no stream can start without waiting for
  the workspace's ``chat.startStream`` budget (many answers at once), one message posted at once and
  updated with ``chat.update``; intermediate states use spare budget only, so finals never queue
  behind them;
- the final message: the answer as Markdown, the sources as a context block numbered like the ``[n]``
  markers, and 👍/👎 feedback buttons; answers longer than one message are split at paragraph
  boundaries; ``<!channel>``, ``<!here>``, ``<!everyone>`` and user mentions written by the model are
  defused;
- a failed turn ends with the Answerer's friendly message in the thread and the status cleared.

Slack redelivers events it believes were not acknowledged; a claim on the event id (and on the
message itself) in the shared ``Idempotency`` store makes sure one question gets one answer.

Admins (``slack.admins``) have a slash command: ``/kbbot status`` (knowledge version, sources, last
and next runs, services) and ``/kbbot refresh [SOURCE]``; the command is acknowledged at once and
the result is posted to its ``response_url`` (visible to the admin only). Others are politely refused.

What kbbot remembers (``bot/cache.py``, ``bot/preferences.py``):

- reviewers (``slack.reviewers``: user ids, or team id -> user ids) see "✅ Approve" under a thread's
  first answer (one the Answerer offered to the answer cache). A click approves by turn id (the
  server holds the answer) and the message then says who approved it, with "Withdraw approval";
  answers served from the cache carry "Withdraw approval" too. Anyone else's click is refused in an
  ephemeral message (``chat.postEphemeral``) and changes nothing; so is a click on an expired turn;
- everyone has ``/kbbot prefs …``, ``/kbbot remember on|off`` and ``/kbbot forget`` (answered
  ephemerally in the ack).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_chat_stream import AsyncChatStream
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_commands import VERBS as PREFERENCE_VERBS
from adapters.memory_commands import run_command as run_preferences_command
from bot.platform_settings import SlackSettings
from bot.feedback import Feedback, FeedbackStore, MemoryFeedback
from bot.metrics import METRICS
from bot.state import Idempotency, TaskSet, ThreadTurnLock, claim_all, release_all
from bot.streaming import Cadence, Rate, RateBudget, RetryAfter, StreamWriter, cut_point, split_message
from bot.types import Answer, Citation, Inquiry, Outcome

log = logging.getLogger("kbbot.slack")

FEEDBACK_ACTION = "kbbot_feedback"
APPROVE_ACTION = "kbbot_approve"
WITHDRAW_ACTION = "kbbot_withdraw"
REVIEW_BLOCK = "kbbot_review"  # block ids of the review buttons and of the note saying who approved
REVIEW_NOTE_BLOCK = "kbbot_review_note"
SLASH_COMMAND = "/kbbot"
COMMAND_USAGE = ("Usage: `/kbbot status` or `/kbbot refresh [SOURCE]` (admins); for everyone: "
                 "`/kbbot prefs [concise|detailed|default | lang en|zh|auto | steps on|off|default]`, "
                 "`/kbbot remember on|off`, `/kbbot forget`.")
REVIEW_TEXTS: dict[str, dict[str, str]] = {
    "approve": {"en": "✅ Approve", "zh": "✅ 批准"},
    "withdraw": {"en": "Withdraw approval", "zh": "撤销批准"},
    "approved": {"en": "✅ Approved by <@{user}>: the same question now gets this answer at once.",
                 "zh": "✅ 已由 <@{user}> 批准：之后相同的问题会直接得到这个回答。"},
    "withdrawn": {"en": "Approval withdrawn by <@{user}>: the question is answered afresh again.",
                  "zh": "<@{user}> 已撤销批准：相同的问题将重新生成回答。"},
    "not_reviewer": {"en": "Sorry, only kbbot reviewers can approve answers or withdraw approvals. "
                           "Please ask whoever runs kbbot to add your user id to `slack.reviewers`.",
                     "zh": "抱歉，只有 kbbot 审核人可以批准回答或撤销批准。如需权限，请联系 kbbot 的管理员将您的用户 ID "
                           "加入 `slack.reviewers`。"},
    "expired": {"en": "This answer can no longer be approved: approval is open for a limited time after an "
                      "answer is sent, and only for the first answer of a thread. Ask again to get a new one.",
                "zh": "这个回答已无法批准：回答发送后只在有限时间内可以批准，且仅限对话中的第一个回答。请重新提问。"},
    "nothing_to_withdraw": {"en": "There is no approval of this answer to withdraw (it was already withdrawn, "
                                  "or the knowledge base changed since).",
                            "zh": "这个回答没有可撤销的批准（已被撤销，或知识库已更新）。"},
    "disabled": {"en": "Approved answers are turned off (`memory.approved_answers`).",
                 "zh": "已关闭批准回答功能（`memory.approved_answers`）。"},
    "failed": {"en": "Sorry, that could not be saved right now. Please try again.",
               "zh": "抱歉，暂时无法保存，请重试。"},
}
NOT_ADMIN = ("Sorry, `/kbbot` commands are for kbbot admins only. "
             "Please ask whoever runs kbbot to add your user id to `slack.admins`.")

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

#: Errors meaning this workspace or token cannot stream at all (remembered, so later answers edit directly).
WORKSPACE_STREAM_REFUSALS = frozenset({
    "unknown_method", "not_allowed_token_type", "method_deprecated", "missing_scope", "feature_not_enabled",
    "not_supported", "team_not_allowed", "access_denied",
})
STREAM_REFUSAL_MEMORY_S = 3600.0


# --- text ------------------------------------------------------------------------------------
_WORD_JOINER = "\u2060"  # invisible; keeps "@channel" from being read as a mention
_SPECIAL_MENTION = re.compile(r"<!(channel|here|everyone)(?:\|[^>]*)?>", re.IGNORECASE)
_GROUP_MENTION = re.compile(r"<!subteam\^[A-Za-z0-9]+(?:\|@?([^>]*))?>")
_USER_MENTION = re.compile(r"<@([UWB][A-Za-z0-9]+)(?:\|([^>]*))?>")
_BARE_MENTION = re.compile(r"(?<![\w@])@(channel|here|everyone)\b", re.IGNORECASE)
_OPEN_TAG = re.compile(r"<[^>\n]*$")
_OPEN_AT = re.compile(r"@\w*$")


def neutralise(text: str) -> str:
    """Model text with broadcast, group and user mentions made inert (still readable, never a ping)."""
    text = _SPECIAL_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1)}", text)
    text = _GROUP_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1) or 'group'}", text)
    text = _USER_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(2) or m.group(1)}", text)
    return _BARE_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1)}", text)


def stable_prefix(text: str) -> str:
    """The part of a still-growing text that later tokens cannot turn into a mention.

    Streams are append-only, so what is sent must already be final: an unclosed ``<…`` or a trailing
    ``@word`` waits for more text, and the last character is always kept for the final call (which
    then never has an empty delta).
    """
    prefix = text[:-1]
    while True:
        cut = len(prefix)
        for pattern in (_OPEN_TAG, _OPEN_AT):
            found = pattern.search(prefix)
            if found:
                cut = min(cut, found.start())
        if cut == len(prefix):
            return prefix
        prefix = prefix[:cut]


def question_text(text: str, bot_user_id: str | None) -> str:
    """The question in a Slack message: the bot's mention removed, Slack markup made plain."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    text = re.sub(r"<(https?://[^|>]+)\|([^>]+)>", r"\2 (\1)", text)
    text = re.sub(r"<(https?://[^>]+)>", r"\1", text)
    text = re.sub(r"<#[A-Z0-9]+\|([^>]*)>", r"#\1", text)
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return re.sub(r"[ \t]+", " ", text).strip()


def _mrkdwn_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def sources_block(citations: list[Citation], *, max_chars: int = 2900) -> dict[str, Any] | None:
    """The sources as one compact context block: ``[n] title`` linked when the source is a URL."""
    if not citations:
        return None
    elements: list[dict[str, Any]] = []
    current = "*Sources*"
    for c in citations:
        title = (c.title or c.source or c.doc_id).strip() or f"source {c.index}"
        if len(title) > 120:
            title = title[:119] + "…"
        title = _mrkdwn_escape(title).replace("|", "¦")
        if c.source.startswith(("http://", "https://")) and "|" not in c.source and ">" not in c.source:
            entry = f"[{c.index}] <{c.source}|{title}>"
        else:
            entry = f"[{c.index}] {title}"
        candidate = f"{current}  ·  {entry}" if current != "*Sources*" else f"{current}  {entry}"
        if len(candidate) > max_chars and len(elements) < 9:
            elements.append({"type": "mrkdwn", "text": current})
            current = entry
        else:
            current = candidate
    elements.append({"type": "mrkdwn", "text": current[:max_chars]})
    return {"type": "context", "elements": elements[:10]}


def feedback_block(turn_id: str) -> dict[str, Any]:
    """Slack's native 👍/👎 feedback buttons; each click carries the turn id."""
    def button(emoji: str, label: str, value: str) -> dict[str, Any]:
        return {"text": {"type": "plain_text", "text": emoji, "emoji": True}, "accessibility_label": label,
                "value": f"{value}:{turn_id}"}

    return {"type": "context_actions", "elements": [{
        "type": "feedback_buttons", "action_id": FEEDBACK_ACTION,
        "positive_button": button("👍", "This answer helped", "up"),
        "negative_button": button("👎", "This answer did not help", "down"),
    }]}


def review_text(key: str, language: str = "en", **values: str) -> str:
    table = REVIEW_TEXTS[key]
    return table.get(language, table["en"]).format(**values)


def review_block(turn_id: str, *, approved: bool, language: str = "en") -> dict[str, Any]:
    """"✅ Approve" (not yet approved) or "Withdraw approval"; the value is only the turn id."""
    if approved:
        button = {"type": "button", "action_id": WITHDRAW_ACTION, "value": turn_id, "style": "danger",
                  "text": {"type": "plain_text", "text": review_text("withdraw", language)}}
    else:
        button = {"type": "button", "action_id": APPROVE_ACTION, "value": turn_id, "style": "primary",
                  "text": {"type": "plain_text", "text": review_text("approve", language), "emoji": True}}
    return {"type": "actions", "block_id": REVIEW_BLOCK, "elements": [button]}


def review_note(text: str) -> dict[str, Any]:
    return {"type": "context", "block_id": REVIEW_NOTE_BLOCK, "elements": [{"type": "mrkdwn", "text": text}]}


def final_blocks(answer: Answer, *, feedback: bool, review: bool = False) -> list[dict[str, Any]]:
    """Sources, 👍/👎, and for reviewers' workspaces (``review``) "✅ Approve" under an answer that was
    offered to the cache or "Withdraw approval" under one served from it."""
    blocks = []
    sources = sources_block(answer.citations)
    if sources:
        blocks.append(sources)
    if feedback and answer.outcome is not Outcome.ERROR:
        blocks.append(feedback_block(answer.trace.turn_id))
    if review and answer.approvable:
        blocks.append(review_block(answer.trace.turn_id, approved=False))
    elif review and answer.outcome is Outcome.CACHED and answer.approved_turn_id:
        blocks.append(review_block(answer.approved_turn_id, approved=True))
    return blocks


_CONTENT_BLOCKS = ("markdown", "rich_text", "section", "header")


def reviewed_blocks(current: list[dict[str, Any]], note: str, actions: dict[str, Any],
                    answer_text: str | None = None) -> list[dict[str, Any]] | None:
    """The message's blocks with the review buttons replaced by ``note`` and ``actions``.

    A streamed message's text is not among its blocks: ``answer_text`` (what the message shows)
    then becomes a markdown block, since a ``chat.update`` with blocks replaces the whole message.
    None when the message's text is unknown (it would be lost).
    """
    kept = [b for b in current if b.get("block_id") not in (REVIEW_BLOCK, REVIEW_NOTE_BLOCK)]
    if not any(b.get("type") in _CONTENT_BLOCKS for b in kept):
        if not answer_text:
            return None
        kept.insert(0, {"type": "markdown", "text": answer_text})
    return [*kept, review_note(note), actions]


def _notification_text(markdown: str, limit: int = 300) -> str:
    flat = " ".join(markdown.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


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


def _error_code(error: SlackApiError) -> str:
    try:
        return str(error.response.get("error") or "")
    except Exception:  # noqa: BLE001 - a response without a body
        return ""


def _is_rate_limited(error: SlackApiError) -> bool:
    return getattr(error.response, "status_code", None) == 429 or _error_code(error) == "ratelimited"


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
                                    _error_code(exc))
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
            return {"text": _notification_text(part),
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
            log.warning("could not delete a superseded message %s: %s", ts, _error_code(exc))

    async def _fall_back(self, error: SlackApiError) -> None:
        code = _error_code(error) or str(error)
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


# --- the adapter -----------------------------------------------------------------------------
def make_client(settings: SlackSettings) -> AsyncWebClient:
    """The Web API client: ``SLACK_API_URL`` as base URL, 429s and 5xx retried (bolt copies the handlers)."""
    options: dict[str, Any] = {"token": settings.bot_token}
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


@dataclass
class TurnRecord:
    """What one handled event produced (for ``on_turn`` observers: tests, metrics)."""

    event_id: str
    kind: str  # mention | follow_up | dm
    inquiry: Inquiry
    answer: Answer | None
    reply: SlackReply



class SlackAdapter:
    """Bolt ``AsyncApp`` with kbbot's listeners; ``handle_http`` serves ``/slack/events``."""

    name = "slack"

    def __init__(self, answerer: Any, settings: SlackSettings, *, idempotency: Idempotency,
                 feedback: FeedbackStore | None = None, history: Any = None, client: AsyncWebClient | None = None,
                 budget: RateBudget | None = None, on_turn: Callable[[TurnRecord], None] | None = None,
                 admin: Any = None, answers: Any = None, preferences: Any = None):
        self.answerer = answerer
        self.settings = settings
        self.admin = admin  # bot.scheduler.KnowledgeAdmin: /kbbot status and refresh
        # bot.cache.AnswerCache (None: approvals are off) and bot.preferences.PreferenceStore
        self.answers = answers if answers is not None else getattr(answerer, "cache", None)
        self.preferences = preferences if preferences is not None else getattr(answerer, "preferences", None)
        self.idempotency = idempotency
        self.feedback = feedback or MemoryFeedback()
        self.history = history if history is not None else getattr(answerer, "history", None)
        self.budget = budget or make_budget(settings)
        self.on_turn = on_turn
        self.client = client or make_client(settings)
        self.app = AsyncApp(
            name="kbbot",
            client=self.client,
            signing_secret=settings.signing_secret or "",
            request_verification_enabled=not settings.socket_mode,
            process_before_response=False,  # ack first, answer after
            attaching_conversation_kwargs_enabled=False,
            logger=logging.getLogger("kbbot.slack.bolt"),
        )
        self.app.event("app_mention")(self._on_mention)
        self.app.event("message")(self._on_message)
        self.app.action(FEEDBACK_ACTION)(self._on_feedback)
        self.app.action(APPROVE_ACTION)(self._on_review)
        self.app.action(WITHDRAW_ACTION)(self._on_review)
        self.app.command(SLASH_COMMAND)(self._on_command)
        self._tasks = TaskSet()
        self._threads: dict[str, float] = {}  # thread key -> until when it counts as answered here
        self._thread_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._no_streaming: dict[str, float] = {}  # team -> until when streaming is known refused
        self._socket: Any = None

    # --- serving ------------------------------------------------------------------------------
    def mount(self, web_app: web.Application, path: str = "/slack/events") -> None:
        if not self.settings.socket_mode:
            web_app.router.add_post(path, self.handle_http)

    async def handle_http(self, request: web.Request) -> web.Response:
        response = await self.app.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(response)

    async def start(self) -> None:
        if self.settings.socket_mode:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            self._socket = AsyncSocketModeHandler(self.app, app_token=self.settings.app_token)
            await self._socket.connect_async()
            log.info("Slack: connected in Socket Mode")
        else:
            log.info("Slack: receiving events at /slack/events")

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        await self.drain(timeout_s)

    def health(self) -> dict[str, Any]:
        return {"mode": "socket" if self.settings.socket_mode else "events_api", "turns_in_progress": len(self._tasks)}

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the turns in progress (shutdown)."""
        await self._tasks.drain(timeout_s)

    async def settle(self, quiet_s: float = 0.05) -> None:
        """Wait until every acknowledged event has been handled (tests)."""
        await self._tasks.settle(quiet_s)

    def _track(self) -> None:
        self._tasks.track_current()

    # --- listeners ----------------------------------------------------------------------------
    async def _on_mention(self, body: dict[str, Any], event: dict[str, Any], context: Any,
                          client: AsyncWebClient) -> None:
        self._track()
        if event.get("bot_id") or event.get("edited") or event.get("subtype"):
            return
        thread_ts = event.get("thread_ts") or event["ts"]
        is_dm = event.get("channel_type") == "im" or str(event.get("channel", "")).startswith("D")
        await self._handle(body, event, context, client, thread_ts=thread_ts, kind="mention", is_dm=is_dm)

    async def _on_message(self, body: dict[str, Any], event: dict[str, Any], context: Any,
                          client: AsyncWebClient) -> None:
        self._track()
        # Edits (message_changed), deletions, bot posts and joins all carry a subtype.
        if event.get("subtype") not in (None, "thread_broadcast", "file_share"):
            return
        bot_user_id = context.bot_user_id
        if event.get("bot_id") or not event.get("user") or event.get("user") == bot_user_id:
            return
        if event.get("channel_type") == "im":
            if not self.settings.direct_messages:
                return
            await self._handle(body, event, context, client, thread_ts=event.get("thread_ts") or event["ts"],
                               kind="dm", is_dm=True)
            return
        thread_ts = event.get("thread_ts")
        if not thread_ts or thread_ts == event.get("ts") or not self.settings.follow_ups:
            return  # top-level channel messages are answered only when they mention kbbot
        if bot_user_id and f"<@{bot_user_id}" in (event.get("text") or ""):
            return  # this one also arrives as app_mention
        team = self._team(body, event, context)
        key = SlackThread(team, event["channel"], thread_ts, event["user"]).key
        if not await self._answered_here(key):
            return
        await self._handle(body, event, context, client, thread_ts=thread_ts, kind="follow_up", is_dm=False)

    async def _on_feedback(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        await ack()
        action = (body.get("actions") or [{}])[0]
        rating, _, turn_id = str(action.get("value") or "").partition(":")
        if rating not in ("up", "down") or not turn_id:
            log.warning("ignoring a feedback click without a turn id: %r", action.get("value"))
            return
        container = body.get("container") or {}
        item = Feedback(turn_id=turn_id, rating=rating, user_id=str((body.get("user") or {}).get("id", "")),
                        tenant=str((body.get("team") or {}).get("id", "")),
                        channel=str((body.get("channel") or {}).get("id") or container.get("channel_id") or ""),
                        message_id=str(container.get("message_ts") or ""))
        try:
            await self.feedback.record(item)
        except Exception:
            log.exception("turn %s: could not store the feedback", turn_id)
            return
        log.info("turn %s: feedback %s from %s", turn_id, rating, item.user_id)

    async def _user_language(self, team: str, user: str) -> str:
        """The language a user chose in their preferences, else English (Slack does not tell)."""
        if self.preferences is None:
            return "en"
        try:
            return (await self.preferences.load("slack", team, user)).effective().get("language") or "en"
        except Exception:  # noqa: BLE001 - only the language of a short notice depends on it
            return "en"

    async def _ephemeral(self, client: AsyncWebClient, channel: str, user: str, text: str,
                         thread_ts: str | None) -> None:
        try:
            await client.chat_postEphemeral(channel=channel, user=user, text=text,
                                            **({"thread_ts": thread_ts} if thread_ts else {}))
        except SlackApiError as exc:
            log.warning("could not tell %s in %s ephemerally: %s", user, channel, _error_code(exc))

    async def _on_review(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any],
                         client: AsyncWebClient) -> None:
        """A click on "✅ Approve" or "Withdraw approval": reviewers only, by turn id."""
        self._track()
        await ack()
        action = (body.get("actions") or [{}])[0]
        approving = action.get("action_id") == APPROVE_ACTION
        turn_id = str(action.get("value") or "")
        who = body.get("user") or {}
        user = str(who.get("id") or "")
        team = str((body.get("team") or {}).get("id") or who.get("team_id") or "")
        container = body.get("container") or {}
        message = body.get("message") or {}
        channel = str((body.get("channel") or {}).get("id") or container.get("channel_id") or "")
        ts = str(container.get("message_ts") or message.get("ts") or "")
        thread_ts = message.get("thread_ts") or container.get("thread_ts")
        language = await self._user_language(team, user)

        async def tell(key: str) -> None:
            await self._ephemeral(client, channel, user, review_text(key, language), thread_ts)

        if not turn_id:
            log.warning("ignoring a review click without a turn id")
            return
        if not self.settings.is_reviewer(team, user):
            log.info("refused %s of turn %s by %s: not in slack.reviewers", "approval" if approving else "withdrawal",
                     turn_id, user)
            await tell("not_reviewer")
            return
        if self.answers is None:
            await tell("disabled")
            return
        answer_text = None
        try:
            if approving:
                clicker = body.get("user") or {}
                approved = await self.answers.approve(turn_id, user, clicker.get("name") or clicker.get("username") or "")
                if approved is None:
                    log.info("turn %s cannot be approved (expired or never offered); click by %s", turn_id, user)
                    await tell("expired")
                    return
                answer_text = split_message(neutralise(approved.text.strip()), self.settings.max_message_chars)[-1]
            elif not await self.answers.withdraw(turn_id):
                log.info("turn %s: no approval to withdraw; click by %s", turn_id, user)
                await tell("nothing_to_withdraw")
                return
        except Exception:
            log.exception("turn %s: the %s failed", turn_id, "approval" if approving else "withdrawal")
            await tell("failed")
            return
        log.info("turn %s %s by %s", turn_id, "approved" if approving else "approval withdrawn", user)
        note = review_text("approved" if approving else "withdrawn", language, user=user)
        blocks = reviewed_blocks(list(message.get("blocks") or []), note,
                                 review_block(turn_id, approved=approving, language=language), answer_text)
        if blocks is None or not channel or not ts:
            await self._ephemeral(client, channel, user, note, thread_ts)
            return
        try:
            await self.budget.acquire(team, "chat.update")
            await client.chat_update(channel=channel, ts=ts, blocks=blocks,
                                     text=_notification_text(str(message.get("text") or note)))
        except SlackApiError as exc:
            log.warning("turn %s: could not update the reviewed message (%s)", turn_id, _error_code(exc))
            await self._ephemeral(client, channel, user, note, thread_ts)

    async def _on_command(self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any],
                          respond: Callable[..., Awaitable[Any]]) -> None:
        """``/kbbot prefs|remember|forget`` for everyone (answered in the ack, visible to the user only);
        ``/kbbot status`` and ``/kbbot refresh [SOURCE]`` for admins (the result goes to response_url)."""
        self._track()
        user = str(command.get("user_id") or "")
        verb, _, rest = " ".join(str(command.get("text") or "").split()).partition(" ")
        verb = verb.lower()
        if verb in PREFERENCE_VERBS:
            team = str(command.get("team_id") or "")
            text = await run_preferences_command(self.preferences, "slack", team, user, [verb, *rest.split()],
                                                 prefix=f"{SLASH_COMMAND} ")
            await ack(text=text)
            return
        if verb not in ("status", "refresh"):
            await ack(text=COMMAND_USAGE)
            return
        if user not in self.settings.admins:
            log.info("refused /kbbot %s from %s: not in slack.admins", verb, user)
            await ack(text=NOT_ADMIN)
            return
        if self.admin is None:
            await ack(text="Knowledge refresh is not available in this kbbot process.")
            return
        name = rest.strip() or None
        if verb == "status":
            await ack()
            try:
                text = await self.admin.status_text()
            except Exception:
                log.exception("/kbbot status failed")
                text = "Sorry, the status could not be read. The logs have the details."
        else:
            problem = self.admin.check(name)
            if problem:
                await ack(text=problem)
                return
            await ack(text=f"Refreshing {('`' + name + '`') if name else 'every source'} now; "
                           "the result follows here.")
            log.info("/kbbot refresh %s by %s", name or "(all)", user)
            try:
                text = await self.admin.refresh_text(name)
            except Exception:
                log.exception("/kbbot refresh failed")
                text = "Sorry, the refresh failed. The logs have the details."
        try:
            await respond(text=_mrkdwn_escape(text), response_type="ephemeral")
        except Exception:
            log.exception("could not post the /kbbot %s result", verb)

    # --- one turn --------------------------------------------------------------------------------
    @staticmethod
    def _team(body: dict[str, Any], event: dict[str, Any], context: Any) -> str:
        return str(event.get("team") or body.get("team_id") or getattr(context, "team_id", None) or "")

    def _allowed(self, team: str, channel: str, is_dm: bool) -> bool:
        s = self.settings
        if s.allowed_teams and team not in s.allowed_teams:
            log.debug("ignoring an event from workspace %s: not in slack.allowed_teams", team)
            return False
        if is_dm:
            return s.direct_messages
        if s.allowed_channels and channel not in s.allowed_channels:
            log.debug("ignoring an event in channel %s: not in slack.allowed_channels", channel)
            return False
        return True

    async def _answered_here(self, thread_key: str) -> bool:
        until = self._threads.get(thread_key)
        if until is not None and until > time.monotonic():
            return True
        if self.history is None:
            return False
        try:
            return bool(await self.history.load(thread_key))
        except Exception:
            log.exception("could not read the history of %s; not treating the message as a follow-up", thread_key)
            return False

    def _remember_thread(self, thread_key: str) -> None:
        now = time.monotonic()
        if len(self._threads) > 10000:
            self._threads = {k: t for k, t in self._threads.items() if t > now}
        self._threads[thread_key] = now + self.settings.thread_memory_s

    async def _claim(self, keys: list[str]) -> list[str] | None:
        return await claim_all(self.idempotency, keys, self.settings.dedupe_ttl_s)

    async def _release(self, keys: list[str]) -> None:
        await release_all(self.idempotency, keys)

    def _streaming_allowed(self, team: str) -> bool:
        if self.settings.stream_mode != "native":
            return False
        until = self._no_streaming.get(team)
        return until is None or until <= time.monotonic()

    def _stream_refused(self, team: str, code: str) -> None:
        if code in WORKSPACE_STREAM_REFUSALS:
            log.warning("workspace %s refuses streaming (%s); answering with chat.update for %.0f min",
                        team, code, STREAM_REFUSAL_MEMORY_S / 60)
            self._no_streaming[team] = time.monotonic() + STREAM_REFUSAL_MEMORY_S

    async def _handle(self, body: dict[str, Any], event: dict[str, Any], context: Any, client: AsyncWebClient,
                      *, thread_ts: str, kind: str, is_dm: bool) -> None:
        team = self._team(body, event, context)
        channel = str(event.get("channel") or "")
        user = str(event.get("user") or "")
        if not channel or not self._allowed(team, channel, is_dm):
            return
        event_id = str(body.get("event_id") or "")
        keys = [f"slack:event:{event_id}"] if event_id else []
        keys.append(f"slack:message:{team}:{channel}:{event.get('ts')}")
        claimed = await self._claim(keys)
        if claimed is None:
            log.info("event %s (%s in %s) was already handled; not answering twice", event_id, kind, channel)
            return
        where = SlackThread(team=team, channel=channel, thread_ts=thread_ts, user=user, is_dm=is_dm)
        inquiry = Inquiry(platform="slack", tenant=team, channel=channel, thread_key=where.key, user_id=user,
                          text=question_text(event.get("text") or "", context.bot_user_id),
                          spaces=self.settings.spaces_for(channel))
        reply = SlackReply(client, where, self.settings, self.budget, native=self._streaming_allowed(team),
                           on_stream_refused=lambda code: self._stream_refused(team, code))
        answer: Answer | None = None
        async with self._thread_lock(where.key):
            self._remember_thread(where.key)
            try:
                answer = await self.answerer.answer(inquiry, reply)
            except Exception:
                # The Answerer reports its own failures; reaching here is a bug, still shown to the user.
                log.exception("event %s: the turn crashed", event_id)
                await reply.fail("Something went wrong while answering. Please try again.")
        if answer is None or answer.outcome is Outcome.ERROR:
            await self._release(claimed)  # a redelivery may try again
        if answer is not None:
            log.info("event %s %s in %s -> turn %s %s", event_id, kind, where.key, answer.trace.turn_id,
                     answer.outcome.value)
        if self.on_turn is not None:
            self.on_turn(TurnRecord(event_id=event_id, kind=kind, inquiry=inquiry, answer=answer, reply=reply))

    def _thread_lock(self, key: str) -> ThreadTurnLock:
        return ThreadTurnLock(self._thread_locks, key)
