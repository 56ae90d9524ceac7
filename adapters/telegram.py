"""The Telegram adapter: private chats (and, when enabled, group mentions) in; streamed, cited answers out.

Updates arrive through an aiogram 3 ``Dispatcher`` with one ``Router``, by long polling (any webhook is
deleted first) or, when ``TELEGRAM_WEBHOOK_URL`` is set, at that URL's path on ``kbbot serve``'s web
app, each request checked against ``TELEGRAM_WEBHOOK_SECRET``. Each question becomes an ``Inquiry``
for ``Answerer.answer`` with a ``TelegramReply``:

- a typing action while retrieving;
- private chats: ``sendMessageDraft`` previews (one non-zero draft id per answer), paced by a
  ``StreamWriter``, then the final answer with ``sendMessage``; groups, ``stream_mode: edit``, or a
  chat that refuses drafts: one message sent and edited with ``editMessageText`` (``edit_interval_s``
  apart, "message is not modified" ignored), ``TelegramRetryAfter`` turned into ``RetryAfter`` so the
  writer sleeps it out and then sends the latest text;
- model Markdown converted to plain text + entities (``telegramify_markdown``), never ``parse_mode``;
  plain text when Telegram still cannot parse the entities; split at paragraph boundaries into
  messages of at most ``max_message_units`` UTF-16 units; sources ``[n] title`` (linked when the
  source is a URL) and 👍/👎 buttons carrying the turn id on the last message;
- a failed turn ends with the Answerer's friendly message in the chat.

An update delivered twice (webhook retry, restart during polling) is claimed in the shared
``Idempotency`` store by bot id and update id, and released when the turn fails.

Admins (``telegram.admins``) can send ``/status`` (knowledge version, sources, last and next runs,
services) and ``/refresh [SOURCE]``; anyone else is politely refused.

What kbbot remembers (``bot/cache.py``, ``bot/preferences.py``):

- reviewers (``telegram.reviewers``) get "✅ Approve" under a chat's first answer (one the Answerer
  offered to the answer cache) and "↩️ Withdraw approval" under an answer served from the cache. In a
  private chat the buttons appear only when the chat's user is a reviewer; in groups whenever
  reviewers are configured, and a click by anyone else is refused. A click approves by turn id (the
  server holds the answer) and swaps the button; every click is answered with ``answerCallbackQuery``;
- everyone has ``/prefs …``, ``/remember on|off`` and ``/forget``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import telegramify_markdown
from aiogram import Bot, Dispatcher, F, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.enums import ChatAction, ChatType, MessageEntityType
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNotFound,
    TelegramRetryAfter,
)
from aiogram.filters import Command, CommandObject, CommandStart
from aiogram.types import (
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    Update,
)
from aiohttp import web

from adapters.memory_commands import VERBS as PREFERENCE_VERBS
from adapters.memory_commands import run_command as run_preferences_command
from bot.platform_settings import TelegramSettings
from bot.feedback import Feedback, FeedbackStore, MemoryFeedback
from bot.state import Idempotency, TaskSet, ThreadTurnLock, claim_all, release_all
from bot.streaming import Cadence, Rate, RateBudget, RetryAfter, StreamWriter, cut_point
from bot.types import Answer, Citation, Inquiry, Outcome
from pipelines.text import detect_language

log = logging.getLogger("kbbot.telegram")

FEEDBACK_PREFIX = "kbfb"
APPROVE_PREFIX = "kbap"  # callback data: "kbap:{turn_id}" approves, "kbwd:{turn_id}" withdraws
WITHDRAW_PREFIX = "kbwd"
#: Messages and edits per chat: Telegram allows about one a second per chat, with short bursts.
DEFAULT_CHAT_RATE = Rate(per_minute=60, burst=5)
#: Telegram's bot-wide limit (about 30 messages a second across all chats), shared by every answer.
BOT_SEND = "bot-send"
DEFAULT_BOT_RATE = Rate(per_minute=20 * 60, burst=10)  # any 1-s window: at most 10 saved + 20 = 30
DRAFT_REFUSAL_MEMORY_S = 3600.0
REFUSAL_MEMORY_S = 30 * 86400.0
UPDATES = ["message", "callback_query"]

TEXTS: dict[str, dict[str, str]] = {
    "help": {
        "en": ("Hi! I am kbbot. I answer questions from the company knowledge base: products and models, "
               "fault codes, installation, maintenance, spare parts and warranty. Every answer lists its "
               "sources; when the knowledge base does not cover a question I say so instead of guessing.\n\n"
               "Ask in English or Chinese, e.g. “What does fault E-004 mean?”. I remember this "
               "conversation for follow-up questions; /new starts a fresh one. "
               "Rate answers with 👍 / 👎.\n\n"
               "How I answer you: /prefs concise|detailed|default, /prefs lang en|zh|auto, "
               "/prefs steps on|off|default (/prefs alone shows them). /remember on lets me pick up "
               "preferences you state in your messages (/remember off stops that); /forget clears them all."),
        "zh": ("你好！我是 kbbot，根据公司知识库回答问题：产品与型号、故障代码、安装、维护保养、备件和保修。"
               "每个回答都会列出来源；知识库中没有的内容我会直接说明，不会猜测。\n\n"
               "可以用中文或英文提问，例如“故障代码 E-004 是什么意思？”。我会记住本次对话以便追问；"
               "发送 /new 开始新的对话。可以用 👍 / 👎 评价回答。\n\n"
               "回答方式：/prefs concise|detailed|default（简洁/详细/默认）、/prefs lang en|zh|auto、"
               "/prefs steps on|off|default（单独发送 /prefs 查看当前设置）。/remember on 允许我从您的消息中记下"
               "您明确提出的偏好（/remember off 停止）；/forget 全部清除。"),
    },
    "new": {
        "en": "Started a new conversation: earlier questions are forgotten.",
        "zh": "已开始新的对话，之前的问题不再作为上下文。",
    },
    "refused": {
        "en": "Sorry, you are not on the list of people kbbot may answer. Please ask your administrator for access.",
        "zh": "抱歉，您不在 kbbot 的可用用户名单中，请联系管理员开通权限。",
    },
    "sources": {"en": "Sources", "zh": "来源"},
    "thanks": {"en": "Thanks for the feedback!", "zh": "感谢您的反馈！"},
    "not_admin": {"en": "Sorry, /status and /refresh are for kbbot admins only. Please ask whoever runs kbbot "
                        "to add your user id to telegram.admins.",
                  "zh": "抱歉，/status 和 /refresh 仅供 kbbot 管理员使用。如需权限，请联系 kbbot 的管理员将您的用户 ID "
                        "加入 telegram.admins。"},
    "no_admin": {"en": "Knowledge refresh is not available in this kbbot process.",
                 "zh": "此 kbbot 进程不支持知识库刷新。"},
    "refreshing": {"en": "Refreshing {what} now; the result follows.", "zh": "正在刷新 {what}，完成后会发送结果。"},
    "admin_failed": {"en": "Sorry, that failed. The logs have the details.", "zh": "抱歉，操作失败，详情见日志。"},
    "feedback_failed": {"en": "Sorry, the feedback could not be saved.", "zh": "抱歉，反馈未能保存。"},
    "approve": {"en": "✅ Approve", "zh": "✅ 批准"},
    "withdraw": {"en": "↩️ Withdraw approval", "zh": "↩️ 撤销批准"},
    "approved": {"en": "✅ Approved: the same question now gets this answer at once.",
                 "zh": "✅ 已批准：之后相同的问题会直接得到这个回答。"},
    "withdrawn": {"en": "Approval withdrawn: the question is answered afresh again.",
                  "zh": "已撤销批准：相同的问题将重新生成回答。"},
    "not_reviewer": {"en": "Sorry, only kbbot reviewers can approve answers or withdraw approvals.",
                     "zh": "抱歉，只有 kbbot 审核人可以批准回答或撤销批准。"},
    "expired": {"en": "This answer can no longer be approved (approval is open for a limited time, and only "
                      "for a conversation's first answer). Ask again to get a new one.",
                "zh": "这个回答已无法批准（仅在有限时间内、且仅对对话中的第一个回答开放）。请重新提问。"},
    "nothing_to_withdraw": {"en": "There is no approval of this answer to withdraw.",
                            "zh": "这个回答没有可撤销的批准。"},
    "approvals_off": {"en": "Approved answers are turned off.", "zh": "已关闭批准回答功能。"},
    "review_failed": {"en": "Sorry, that could not be saved right now. Please try again.",
                      "zh": "抱歉，暂时无法保存，请重试。"},
    "crashed": {"en": "Something went wrong while answering. Please try again.",
                "zh": "回答时出现错误，请重试。"},
}


def text_for(key: str, language: str) -> str:
    table = TEXTS[key]
    return table.get(language, table["en"])


def user_language(language_code: str | None, text: str = "") -> str:
    if (language_code or "").lower().startswith("zh"):
        return "zh"
    return detect_language(text) if text.strip() else "en"


# --- formatting --------------------------------------------------------------------------------
def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class Rendered:
    """One message as Telegram gets it: plain text and entities (dicts with UTF-16 offsets)."""

    text: str
    entities: tuple[dict[str, Any], ...] = ()

    @property
    def units(self) -> int:
        return utf16_len(self.text)

    def aiogram_entities(self) -> list[MessageEntity] | None:
        return [MessageEntity(**e) for e in self.entities] or None

    def joined(self, other: Rendered, separator: str = "\n\n") -> Rendered:
        shift = utf16_len(self.text + separator)
        moved = tuple({**e, "offset": e["offset"] + shift} for e in other.entities)
        return Rendered(self.text + separator + other.text, self.entities + moved)


def render(markdown: str) -> Rendered:
    """Model Markdown as plain text + entities; partial markup (``**Refu``) stays literal."""
    text, entities = telegramify_markdown.convert(markdown)
    return Rendered(text, tuple({k: v for k, v in e.to_dict().items() if v is not None} for e in entities))


def _paragraphs(markdown: str) -> list[str]:
    """Paragraphs of ``markdown``; a fenced code block with blank lines stays one paragraph."""
    out: list[str] = []
    for piece in re.split(r"\n[ \t]*\n", markdown):
        if out and out[-1].count("```") % 2 == 1:
            out[-1] += "\n\n" + piece
        elif piece.strip():
            out.append(piece)
    return out


def _hard_split(paragraph: str, limit: int) -> list[str]:
    """A paragraph too long for one message, cut at lines, sentences or spaces."""
    pieces: list[str] = []
    rest = paragraph
    while rest and render(rest).units > limit:
        chars = min(len(rest), limit)
        while True:
            cut = cut_point(rest, chars)
            if render(rest[:cut]).units <= limit or chars < 16:
                break
            chars = int(chars * 0.9)
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest.strip():
        pieces.append(rest)
    return pieces


def render_parts(markdown: str, limit: int = 4096) -> list[Rendered]:
    """``markdown`` rendered as messages of at most ``limit`` UTF-16 units, split at paragraphs."""
    markdown = markdown.strip()
    if not markdown:
        return []
    whole = render(markdown)
    if whole.units <= limit:
        return [whole]
    parts: list[Rendered] = []
    current = ""
    for paragraph in _paragraphs(markdown):
        candidate = f"{current}\n\n{paragraph}" if current else paragraph
        if render(candidate).units <= limit:
            current = candidate
            continue
        if current:
            parts.append(render(current))
        current = ""
        if render(paragraph).units <= limit:
            current = paragraph
        else:
            pieces = _hard_split(paragraph, limit)
            parts.extend(render(p) for p in pieces[:-1])
            current = pieces[-1] if pieces else ""
    if current:
        parts.append(render(current))
    return parts


def plain_parts(text: str, limit: int = 4096) -> list[str]:
    """Plain text in messages of at most ``limit`` UTF-16 units, cut at line ends (long lines hard)."""
    parts: list[str] = []
    current = ""
    for line in text.splitlines():
        while utf16_len(line) > limit:
            cut = limit
            while utf16_len(line[:cut]) > limit:
                cut -= 1
            parts.extend([current] if current else [])
            current = ""
            parts.append(line[:cut])
            line = line[cut:]
        candidate = f"{current}\n{line}" if current else line
        if utf16_len(candidate) > limit:
            parts.append(current)
            candidate = line
        current = candidate
    if current.strip():
        parts.append(current)
    return parts


def sources_rendered(citations: list[Citation], language: str = "en") -> Rendered | None:
    """``Sources`` then one line per citation: ``[n] title``, the title linked when the source is a URL."""
    if not citations:
        return None
    heading = text_for("sources", language)
    text = heading
    entities: list[dict[str, Any]] = [{"type": "bold", "offset": 0, "length": utf16_len(heading)}]
    for c in citations:
        title = " ".join((c.title or c.source or c.doc_id or f"source {c.index}").split())
        if len(title) > 120:
            title = title[:119] + "…"
        line_start = utf16_len(text + "\n")
        label = f"[{c.index}] "
        text += f"\n{label}{title}"
        if c.source.startswith(("http://", "https://")):
            entities.append({"type": "text_link", "offset": line_start + utf16_len(label),
                             "length": utf16_len(title), "url": c.source})
    return Rendered(text, tuple(entities))


def final_parts(answer_markdown: str, citations: list[Citation], limit: int, language: str) -> list[Rendered]:
    parts = render_parts(answer_markdown, limit) or [Rendered("…")]
    sources = sources_rendered(citations, language)
    if sources is not None:
        if sources.units > limit:
            sources = Rendered(sources.text[: limit - 1] + "…", ())
        combined = parts[-1].joined(sources)
        if combined.units <= limit:
            parts[-1] = combined
        else:
            parts.append(sources)
    return parts


def feedback_markup(turn_id: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(inline_keyboard=[feedback_row(turn_id)])


def feedback_row(turn_id: str) -> list[InlineKeyboardButton]:
    return [InlineKeyboardButton(text="👍", callback_data=f"{FEEDBACK_PREFIX}:up:{turn_id}"),
            InlineKeyboardButton(text="👎", callback_data=f"{FEEDBACK_PREFIX}:down:{turn_id}")]


def review_row(turn_id: str, *, approved: bool, language: str = "en") -> list[InlineKeyboardButton]:
    """"✅ Approve" or "↩️ Withdraw approval"; the callback data names only the turn."""
    if approved:
        return [InlineKeyboardButton(text=text_for("withdraw", language), callback_data=f"{WITHDRAW_PREFIX}:{turn_id}")]
    return [InlineKeyboardButton(text=text_for("approve", language), callback_data=f"{APPROVE_PREFIX}:{turn_id}")]


def answer_markup(answer: Answer, *, feedback: bool, review: bool, language: str = "en") -> InlineKeyboardMarkup | None:
    """👍/👎, and for reviewers "✅ Approve" (an answer offered to the cache) or "↩️ Withdraw approval"
    (an answer served from it)."""
    rows: list[list[InlineKeyboardButton]] = []
    if answer.outcome is Outcome.ERROR:
        return None
    if feedback:
        rows.append(feedback_row(answer.trace.turn_id))
    if review and answer.approvable:
        rows.append(review_row(answer.trace.turn_id, approved=False, language=language))
    elif review and answer.outcome is Outcome.CACHED and answer.approved_turn_id:
        rows.append(review_row(answer.approved_turn_id, approved=True, language=language))
    return InlineKeyboardMarkup(inline_keyboard=rows) if rows else None


def _is_review_button(button: InlineKeyboardButton) -> bool:
    return (button.callback_data or "").startswith((f"{APPROVE_PREFIX}:", f"{WITHDRAW_PREFIX}:"))


# --- where an answer goes ----------------------------------------------------------------------
@dataclass(frozen=True)
class TelegramChat:
    bot_id: int
    chat_id: int
    user_id: int
    private: bool
    topic: int | None = None  # message_thread_id of a forum topic
    reply_to: int | None = None  # the question's message id (groups: answers are replies)

    @property
    def key(self) -> str:
        base = f"telegram:{self.bot_id}:{self.chat_id}"
        return f"{base}:{self.topic}" if self.topic else base


@dataclass
class _Posted:
    message_id: int
    shown: Rendered
    markup: InlineKeyboardMarkup | None = None


def _is_not_modified(error: TelegramBadRequest) -> bool:
    return "message is not modified" in error.message


def _is_entity_error(error: TelegramBadRequest) -> bool:
    return "can't parse entities" in error.message or "can't find end" in error.message


class TelegramSink:
    """Puts one answer's text into a chat; called by that answer's ``StreamWriter`` only.

    ``posted`` are the messages already sent for this answer. Drafting, the message being filled is a
    draft and ``posted`` holds only completed parts; editing, the last posted message is the one being
    filled. The final call reconciles every posted message with the final parts.
    """

    def __init__(self, bot: Bot, where: TelegramChat, settings: TelegramSettings, budget: RateBudget, *,
                 draft: bool, on_draft_refused: Callable[[bool], None] | None = None):
        self.bot = bot
        self.where = where
        self.settings = settings
        self.budget = budget
        self.limit = settings.max_message_units
        self.draft = draft
        self.draft_id = random.randint(1, 2**31 - 1)
        self.on_draft_refused = on_draft_refused
        self.posted: list[_Posted] = []
        self.drafted: Rendered | None = None
        self.citations: list[Citation] = []
        self.markup: InlineKeyboardMarkup | None = None
        self.language = "en"
        self.calls = 0
        self._prepaid = False  # ready() took the budget of the next call
        self.on_first_text: Callable[[], None] | None = None

    # --- the Sink protocol -----------------------------------------------------------------------
    async def ready(self, final: bool) -> bool:
        """The first text and the final text wait for the budget (in ``_call``); an intermediate
        state goes only with budget to spare in this chat and bot-wide, so it never delays another
        answer's first or final text."""
        if final or self._prepaid or not (self.posted or self.drafted):
            return True
        self._prepaid = self.budget.try_acquire_all((str(self.where.chat_id), "send"), ("bot", BOT_SEND))
        return self._prepaid

    async def send(self, text: str, final: bool) -> bool:
        if final:
            await self._send_final(text)
            return True
        parts = render_parts(text, self.limit)
        if not parts:
            return False
        if self.draft:
            for i, part in enumerate(parts[:-1]):
                if i >= len(self.posted):
                    await self._post(part)
            current = parts[-1]
            if current == self.drafted:
                return False
            if await self._send_draft(current):
                self.drafted = current
                return True
        sent = False
        for i, part in enumerate(parts):
            if i < len(self.posted) - 1:
                continue  # completed messages are repaired by the final call only
            if i < len(self.posted):
                if self.posted[i].shown != part:
                    await self._edit(self.posted[i], part)
                    sent = True
            else:
                await self._post(part)
                sent = True
        return sent

    async def _send_final(self, markdown: str) -> None:
        parts = final_parts(markdown, self.citations, self.limit, self.language)
        for i, part in enumerate(parts):
            markup = self.markup if i == len(parts) - 1 else None
            if i < len(self.posted):
                posted = self.posted[i]
                if posted.shown != part or _markup_key(posted.markup) != _markup_key(markup):
                    await self._edit(posted, part, markup)
            else:
                await self._post(part, markup)
        while len(self.posted) > len(parts):  # the final text is shorter than what was shown
            extra = self.posted[-1]
            try:
                await self._call("deleteMessage", lambda: self.bot.delete_message(
                    chat_id=self.where.chat_id, message_id=extra.message_id))
            except TelegramBadRequest as exc:
                log.warning("could not delete a superseded message %s: %s", extra.message_id, exc.message)
            self.posted.pop()

    # --- failure -----------------------------------------------------------------------------------
    async def show_failure(self, message: str, *, attempts: int = 4) -> None:
        """Show ``message`` in the chat: in the message being filled, else as a new message."""
        body = Rendered(f"⚠️ {message}")
        for attempt in range(attempts):
            try:
                if self.posted and not self.draft:
                    try:
                        await self._edit(self.posted[-1], body, None)
                        return
                    except TelegramBadRequest as exc:
                        log.warning("could not replace the partial answer (%s); sending the failure", exc.message)
                await self._post(body)
                return
            except RetryAfter as wait:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(wait.seconds)

    # --- building blocks ---------------------------------------------------------------------------
    async def _call(self, method: str, call: Callable[[], Awaitable[Any]], *, budgeted: bool = True) -> Any:
        scope = str(self.where.chat_id)
        if budgeted and self._prepaid:
            self._prepaid = False
        elif budgeted:
            await self.budget.acquire(scope, "send")
            await self.budget.acquire("bot", BOT_SEND)
        self.calls += 1
        try:
            return await call()
        except TelegramRetryAfter as exc:
            if budgeted:
                self.budget.hold(scope, "send", exc.retry_after)
            raise RetryAfter(exc.retry_after, f"{method} flood control") from exc

    async def _with_plain_fallback(self, method: str, part: Rendered,
                                   call: Callable[[list[MessageEntity] | None], Awaitable[Any]]) -> Any:
        try:
            return await self._call(method, lambda: call(part.aiogram_entities()))
        except TelegramBadRequest as exc:
            if not part.entities or not _is_entity_error(exc):
                raise
            log.warning("chat %s: Telegram could not parse the entities (%s); sending plain text",
                        self.where.chat_id, exc.message)
            return await self._call(method, lambda: call(None))

    def _shown_text(self) -> None:
        if self.on_first_text is not None:
            hook, self.on_first_text = self.on_first_text, None
            hook()

    async def _post(self, part: Rendered, markup: InlineKeyboardMarkup | None = None) -> None:
        first = not self.posted
        reply_to = self.where.reply_to if first else None

        def call(entities: list[MessageEntity] | None) -> Awaitable[Message]:
            return self.bot.send_message(
                chat_id=self.where.chat_id, text=part.text, entities=entities, parse_mode=None,
                message_thread_id=self.where.topic, reply_markup=markup, link_preview_options=None,
                reply_parameters=None if reply_to is None else _reply_parameters(reply_to))

        sent: Message = await self._with_plain_fallback("sendMessage", part, call)
        self.posted.append(_Posted(sent.message_id, part, markup))
        self._shown_text()

    async def _edit(self, posted: _Posted, part: Rendered, markup: InlineKeyboardMarkup | None = None) -> None:
        def call(entities: list[MessageEntity] | None) -> Awaitable[Any]:
            return self.bot.edit_message_text(
                chat_id=self.where.chat_id, message_id=posted.message_id, text=part.text, entities=entities,
                parse_mode=None, reply_markup=markup)

        try:
            await self._with_plain_fallback("editMessageText", part, call)
        except TelegramBadRequest as exc:
            if not _is_not_modified(exc):
                raise
        posted.shown, posted.markup = part, markup

    async def _send_draft(self, part: Rendered) -> bool:
        """One draft preview; False (after switching to edits) when the chat refuses drafts."""
        def call(entities: list[MessageEntity] | None) -> Awaitable[Any]:
            return self.bot.send_message_draft(chat_id=self.where.chat_id, draft_id=self.draft_id,
                                               message_thread_id=self.where.topic, text=part.text,
                                               entities=entities, parse_mode=None)

        try:
            await self._with_plain_fallback("sendMessageDraft", part, call)
        except (TelegramBadRequest, TelegramNotFound) as exc:
            method_missing = isinstance(exc, TelegramNotFound) or "not found" in exc.message.lower()
            log.info("chat %s: drafts refused (%s); editing a message instead", self.where.chat_id, exc.message)
            self.draft = False
            self.drafted = None
            if self.on_draft_refused is not None:
                self.on_draft_refused(method_missing)
            return False
        self._shown_text()
        return True


def _markup_key(markup: InlineKeyboardMarkup | None) -> Any:
    return None if markup is None else markup.model_dump_json()


def _reply_parameters(message_id: int) -> Any:
    from aiogram.types import ReplyParameters

    return ReplyParameters(message_id=message_id, allow_sending_without_reply=True)


class TelegramReply:
    """``Reply`` for one Telegram answer: typing while retrieving, drafts or edits, the final messages."""

    TYPING_EVERY_S = 4.5  # a chat action shows for about 5 s

    def __init__(self, bot: Bot, where: TelegramChat, settings: TelegramSettings, budget: RateBudget, *,
                 draft: bool, language: str = "en", on_drafts_unavailable: Callable[[], None] | None = None,
                 review: bool = False):
        self.bot = bot
        self.language = language
        self.review = review  # show the approve / withdraw button (someone here may use it)
        self.where = where
        self.settings = settings
        self.edit_cadence = Cadence(min_interval_s=settings.edit_interval_s)
        self.draft_cadence = Cadence(min_interval_s=settings.draft_interval_s)
        self._on_drafts_unavailable = on_drafts_unavailable
        self.sink = TelegramSink(bot, where, settings, budget, draft=draft, on_draft_refused=self._drafts_refused)
        self.sink.language = language
        self.sink.on_first_text = self._stop_typing
        self.writer = StreamWriter(self.sink, self.draft_cadence if draft else self.edit_cadence, name=where.key)
        self._typing: asyncio.Task[None] | None = None
        self.failed: str | None = None

    def _drafts_refused(self, method_missing: bool) -> None:
        self.writer.cadence = self.edit_cadence
        if method_missing and self._on_drafts_unavailable is not None:
            self._on_drafts_unavailable()

    async def _keep_typing(self) -> None:
        while True:
            try:
                await self.bot.send_chat_action(chat_id=self.where.chat_id, action=ChatAction.TYPING,
                                                message_thread_id=self.where.topic)
            except TelegramRetryAfter as exc:
                await asyncio.sleep(exc.retry_after)
                continue
            except TelegramAPIError as exc:  # a courtesy: the answer comes anyway
                log.debug("chat %s: typing action failed: %s", self.where.chat_id, exc)
                return
            await asyncio.sleep(self.TYPING_EVERY_S)

    def _stop_typing(self) -> None:
        if self._typing is not None:
            self._typing.cancel()
            self._typing = None

    # --- Reply ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._typing = asyncio.create_task(self._keep_typing(), name=f"typing {self.where.key}")

    async def push(self, delta: str) -> None:
        self.writer.push(delta)

    async def finish(self, answer: Answer) -> None:
        self.sink.citations = list(answer.citations)
        self.sink.markup = answer_markup(answer, feedback=self.settings.feedback, review=self.review,
                                         language=self.language)
        try:
            await self.writer.finish(answer.text)
        finally:
            self._stop_typing()

    async def fail(self, message: str) -> None:
        self.failed = message
        self._stop_typing()
        await self.writer.close()
        try:
            await self.sink.show_failure(message)
        except Exception:
            log.exception("chat %s: could not show the failure message", self.where.chat_id)


# --- the adapter -----------------------------------------------------------------------------------
def make_bot(settings: TelegramSettings) -> Bot:
    """The aiogram ``Bot``; ``TELEGRAM_API_URL`` points it at another Bot API server."""
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.api_url)) if settings.api_url else None
    return Bot(settings.token or "", session=session)


@dataclass
class TurnRecord:
    """What one handled update produced (for ``on_turn`` observers: tests, metrics)."""

    update_id: int
    kind: str  # private | group
    inquiry: Inquiry
    answer: Answer | None
    reply: TelegramReply


class TelegramAdapter:
    """An aiogram ``Dispatcher`` with kbbot's router; polling task or webhook route."""

    name = "telegram"

    def __init__(self, answerer: Any, settings: TelegramSettings, *, idempotency: Idempotency,
                 feedback: FeedbackStore | None = None, history: Any = None, bot: Bot | None = None,
                 budget: RateBudget | None = None, on_turn: Callable[[TurnRecord], None] | None = None,
                 admin: Any = None, answers: Any = None, preferences: Any = None):
        self.answerer = answerer
        self.settings = settings
        self.admin = admin  # bot.scheduler.KnowledgeAdmin: /status and /refresh
        # bot.cache.AnswerCache (None: approvals are off) and bot.preferences.PreferenceStore
        self.answers = answers if answers is not None else getattr(answerer, "cache", None)
        self.preferences = preferences if preferences is not None else getattr(answerer, "preferences", None)
        self.idempotency = idempotency
        self.feedback = feedback or MemoryFeedback()
        self.history = history if history is not None else getattr(answerer, "history", None)
        self.budget = budget or RateBudget(rates={BOT_SEND: DEFAULT_BOT_RATE}, default=DEFAULT_CHAT_RATE)
        self.on_turn = on_turn
        self.bot = bot or make_bot(settings)
        self.dp = Dispatcher()
        self.dp.include_router(self._router())
        self.username: str | None = None
        self._tasks = TaskSet()
        self._thread_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._no_drafts_until = 0.0
        self._polling: asyncio.Task[None] | None = None

    @property
    def bot_id(self) -> int:
        return self.bot.id

    def _router(self) -> Router:
        router = Router(name="kbbot")
        router.message.register(self._on_help, CommandStart())
        router.message.register(self._on_help, Command("help"))
        router.message.register(self._on_new, Command("new"))
        router.message.register(self._on_admin, Command("status", "refresh"))
        router.message.register(self._on_prefs, Command(*PREFERENCE_VERBS))
        router.message.register(self._on_question, F.text)
        router.callback_query.register(self._on_feedback, F.data.startswith(f"{FEEDBACK_PREFIX}:"))
        router.callback_query.register(self._on_review, F.data.startswith(f"{APPROVE_PREFIX}:")
                                       | F.data.startswith(f"{WITHDRAW_PREFIX}:"))
        return router

    # --- serving ------------------------------------------------------------------------------------
    def mount(self, web_app: web.Application) -> None:
        if not self.settings.webhook_mode:
            return
        from aiogram.webhook.aiohttp_server import SimpleRequestHandler

        SimpleRequestHandler(dispatcher=self.dp, bot=self.bot, secret_token=self.settings.webhook_secret,
                             handle_in_background=True).register(web_app, path=self.settings.webhook_path)

    async def start(self) -> None:
        me = await self.bot.me()
        self.username = me.username
        if self.settings.webhook_mode:
            await self.bot.set_webhook(self.settings.webhook_url or "", secret_token=self.settings.webhook_secret,
                                       allowed_updates=UPDATES)
            log.info("Telegram: @%s receiving updates at %s", self.username, self.settings.webhook_path)
            return
        await self.bot.delete_webhook(drop_pending_updates=False)
        self._polling = asyncio.create_task(self.dp.start_polling(
            self.bot, polling_timeout=self.settings.polling_timeout_s, handle_signals=False,
            close_bot_session=False, allowed_updates=UPDATES), name="telegram polling")
        log.info("Telegram: @%s long polling", self.username)

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self._polling is not None:
            if not self._polling.done():
                try:
                    await self.dp.stop_polling()
                except RuntimeError:  # polling had not started yet
                    self._polling.cancel()
            try:
                await asyncio.wait_for(self._polling, timeout=5)
            except (asyncio.CancelledError, asyncio.TimeoutError, Exception):  # noqa: BLE001 - best effort
                pass
            self._polling = None
        await self.drain(timeout_s)
        await self.bot.session.close()

    def health(self) -> dict[str, Any]:
        return {"mode": "webhook" if self.settings.webhook_mode else "polling", "username": self.username,
                "turns_in_progress": len(self._tasks)}

    async def drain(self, timeout_s: float | None = None) -> None:
        await self._tasks.drain(timeout_s)

    async def settle(self, quiet_s: float = 0.1) -> None:
        """Wait until every received update has been handled (tests)."""
        await self._tasks.settle(quiet_s)

    def _track(self) -> None:
        self._tasks.track_current()

    # --- who and where ---------------------------------------------------------------------------------
    def _addressed(self, message: Message) -> bool:
        """In a group: the message mentions the bot, replies to it, or is a command."""
        reply = message.reply_to_message
        if reply is not None and reply.from_user is not None and reply.from_user.id == self.bot_id:
            return True
        text = message.text or message.caption or ""
        for entity in message.entities or message.caption_entities or []:
            if entity.type == MessageEntityType.MENTION and self.username:
                if entity.extract_from(text).lower() == f"@{self.username.lower()}":
                    return True
            elif entity.type == MessageEntityType.TEXT_MENTION and entity.user and entity.user.id == self.bot_id:
                return True
            elif entity.type == MessageEntityType.BOT_COMMAND and entity.offset == 0:
                return self._command_is_ours(entity.extract_from(text))
        return False

    def _command_is_ours(self, command: str) -> bool:
        """``/cmd`` or ``/cmd@our_username`` (in groups, ``/cmd@other_bot`` is for another bot)."""
        _, at, target = command.partition("@")
        return not at or (self.username or "").lower() == target.lower()

    def _command(self, message: Message) -> str | None:
        """The bot command that starts ``message``, if any."""
        text = message.text or ""
        for entity in message.entities or []:
            if entity.type == MessageEntityType.BOT_COMMAND and entity.offset == 0:
                return entity.extract_from(text)
        return None

    def _question(self, message: Message) -> str:
        text = message.text or message.caption or ""
        if self.username:
            text = re.sub(rf"@{re.escape(self.username)}\b", " ", text, flags=re.IGNORECASE)
        return re.sub(r"[ \t]+", " ", text).strip()

    def _where(self, message: Message) -> TelegramChat:
        private = message.chat.type == ChatType.PRIVATE
        topic = message.message_thread_id if message.is_topic_message else None
        return TelegramChat(bot_id=self.bot_id, chat_id=message.chat.id,
                            user_id=message.from_user.id if message.from_user else 0, private=private,
                            topic=topic, reply_to=None if private else message.message_id)

    async def _gate(self, message: Message, update: Update | None) -> list[str] | None:
        """Claims for an update kbbot should handle, or ``None`` (ignored, refused or a duplicate)."""
        user = message.from_user
        if user is None or user.is_bot:
            return None
        s = self.settings
        if message.chat.type != ChatType.PRIVATE:
            if not s.groups_enabled or not self._addressed(message):
                return None
            if s.allowed_chats and str(message.chat.id) not in s.allowed_chats:
                log.info("ignoring a message in chat %s: not in telegram.allowed_chats", message.chat.id)
                return None
        keys = [f"telegram:update:{self.bot_id}:{update.update_id}"] if update is not None else []
        keys.append(f"telegram:message:{self.bot_id}:{message.chat.id}:{message.message_id}")
        claimed = await self._claim(keys)
        if claimed is None:
            log.info("update %s was already handled; not answering twice",
                     update.update_id if update is not None else "?")
            return None
        if s.allowed_users and str(user.id) not in s.allowed_users:
            await self._refuse_once(message)
            return None
        return claimed

    async def _refuse_once(self, message: Message) -> None:
        user = message.from_user
        assert user is not None
        log.info("user %s is not in telegram.allowed_users", user.id)
        try:
            first = await self.idempotency.claim(f"telegram:refused:{self.bot_id}:{user.id}", REFUSAL_MEMORY_S)
        except Exception:
            log.exception("the idempotency store failed; not repeating the refusal")
            return
        if first:
            language = user_language(user.language_code, message.text or "")
            await self._say(message, text_for("refused", language))

    async def _claim(self, keys: list[str]) -> list[str] | None:
        return await claim_all(self.idempotency, keys, self.settings.dedupe_ttl_s)

    async def _release(self, keys: list[str]) -> None:
        await release_all(self.idempotency, keys)

    async def _say(self, message: Message, text: str) -> None:
        where = self._where(message)
        sink = TelegramSink(self.bot, where, self.settings, self.budget, draft=False)
        for attempt in range(4):
            try:
                await sink._post(Rendered(text))
                return
            except RetryAfter as wait:
                if attempt == 3:
                    raise
                await asyncio.sleep(wait.seconds)

    # --- handlers ------------------------------------------------------------------------------------
    async def _on_help(self, message: Message, event_update: Update | None = None) -> None:
        self._track()
        if message.chat.type != ChatType.PRIVATE and not self._command_is_ours(self._command(message) or "/"):
            return
        if await self._gate(message, event_update) is None:
            return
        user = message.from_user
        language = user_language(user.language_code if user else None, self._question(message))
        await self._say(message, text_for("help", language))

    async def _on_new(self, message: Message, event_update: Update | None = None) -> None:
        self._track()
        claimed = await self._gate(message, event_update)
        if claimed is None:
            return
        where = self._where(message)
        user = message.from_user
        language = user_language(user.language_code if user else None, self._question(message))
        try:
            async with ThreadTurnLock(self._thread_locks, where.key):
                if self.history is not None:
                    await self.history.clear(where.key)
        except Exception:
            log.exception("could not clear the history of %s", where.key)
            await self._release(claimed)
            await self._say(message, text_for("crashed", language))
            return
        await self._say(message, text_for("new", language))

    async def _command_sender(self, message: Message, event_update: Update | None) -> Any:
        """The sender of a command meant for kbbot (in a private chat, or addressed to it in a group)
        that passes the access gate; None otherwise."""
        self._track()
        if message.chat.type != ChatType.PRIVATE and not self._command_is_ours(self._command(message) or "/"):
            return None
        if await self._gate(message, event_update) is None:
            return None
        return message.from_user

    async def _on_admin(self, message: Message, command: CommandObject, event_update: Update | None = None) -> None:
        """``/status`` and ``/refresh [SOURCE]``: admins only (``telegram.admins``)."""
        user = await self._command_sender(message, event_update)
        if user is None:
            return
        language = user_language(user.language_code, "")
        if str(user.id) not in self.settings.admins:
            log.info("refused /%s from %s: not in telegram.admins", command.command, user.id)
            await self._say(message, text_for("not_admin", language))
            return
        if self.admin is None:
            await self._say(message, text_for("no_admin", language))
            return
        name = (command.args or "").strip() or None
        try:
            if command.command == "status":
                text = await self.admin.status_text()
            else:
                problem = self.admin.check(name)
                if problem:
                    await self._say(message, problem)
                    return
                await self._say(message, text_for("refreshing", language).format(what=name or "every source"))
                log.info("/refresh %s by %s", name or "(all)", user.id)
                text = await self.admin.refresh_text(name)
        except Exception:
            log.exception("/%s failed", command.command)
            text = text_for("admin_failed", language)
        for part in plain_parts(text, self.settings.max_message_units):  # plain: file names keep their _ and *
            await self._say(message, part)

    async def _on_question(self, message: Message, event_update: Update | None = None) -> None:
        self._track()
        command = self._command(message)
        if command is not None:
            if self._command_is_ours(command):
                await self._on_help(message, event_update)  # an unknown command: say what kbbot does
            return
        claimed = await self._gate(message, event_update)
        if claimed is None:
            return
        where = self._where(message)
        user = message.from_user
        question = self._question(message)
        language = user_language(user.language_code if user else None, question)
        if detect_language(question) == "zh":
            language = "zh"
        draft = where.private and self.settings.stream_mode == "draft" and time.monotonic() >= self._no_drafts_until
        inquiry = Inquiry(platform="telegram", tenant=str(self.bot_id), channel=str(where.chat_id),
                          thread_key=where.key, user_id=str(where.user_id), text=question,
                          spaces=self.settings.spaces_for(str(where.chat_id)))
        # In a private chat the chat's user is the only one who could click; in groups any reviewer may.
        review = self.answers is not None and (
            self.settings.is_reviewer(str(where.user_id)) if where.private else bool(self.settings.reviewers))
        reply = TelegramReply(self.bot, where, self.settings, self.budget, draft=draft, language=language,
                              on_drafts_unavailable=self._drafts_unavailable, review=review)
        answer: Answer | None = None
        async with ThreadTurnLock(self._thread_locks, where.key):
            try:
                answer = await self.answerer.answer(inquiry, reply)
            except Exception:
                log.exception("update %s: the turn crashed", event_update.update_id if event_update else "?")
                await reply.fail(text_for("crashed", language))
        if answer is None or answer.outcome is Outcome.ERROR:
            await self._release(claimed)
        update_id = event_update.update_id if event_update is not None else 0
        if answer is not None:
            log.info("update %s in %s -> turn %s %s", update_id, where.key, answer.trace.turn_id,
                     answer.outcome.value)
        if self.on_turn is not None:
            self.on_turn(TurnRecord(update_id=update_id, kind="private" if where.private else "group",
                                    inquiry=inquiry, answer=answer, reply=reply))

    def _drafts_unavailable(self) -> None:
        log.warning("this Bot API server has no sendMessageDraft; editing messages for %.0f min",
                    DRAFT_REFUSAL_MEMORY_S / 60)
        self._no_drafts_until = time.monotonic() + DRAFT_REFUSAL_MEMORY_S

    async def _on_feedback(self, query: CallbackQuery) -> None:
        self._track()
        _, _, rest = (query.data or "").partition(":")
        rating, _, turn_id = rest.partition(":")
        language = user_language(query.from_user.language_code if query.from_user else None)
        if rating not in ("up", "down") or not turn_id:
            log.warning("ignoring a feedback click without a turn id: %r", query.data)
            await self._answer_callback(query, None)
            return
        message = query.message
        item = Feedback(turn_id=turn_id, rating=rating, user_id=str(query.from_user.id), tenant=str(self.bot_id),
                        channel=str(message.chat.id) if message is not None else "",
                        message_id=str(message.message_id) if message is not None else "", platform="telegram")
        try:
            await self.feedback.record(item)
        except Exception:
            log.exception("turn %s: could not store the feedback", turn_id)
            await self._answer_callback(query, text_for("feedback_failed", language))
            return
        log.info("turn %s: feedback %s from %s", turn_id, rating, item.user_id)
        await self._answer_callback(query, text_for("thanks", language))

    async def _on_prefs(self, message: Message, command: CommandObject, event_update: Update | None = None) -> None:
        """``/prefs …``, ``/remember on|off``, ``/forget``: the sender's answering preferences."""
        user = await self._command_sender(message, event_update)
        if user is None:
            return
        words = [command.command.lower(), *(command.args or "").split()]
        text = await run_preferences_command(self.preferences, "telegram", str(self.bot_id), str(user.id), words,
                                             prefix="/", language=user_language(user.language_code))
        await self._say(message, text)

    async def _on_review(self, query: CallbackQuery) -> None:
        """A click on "✅ Approve" or "↩️ Withdraw approval": reviewers only, by turn id."""
        self._track()
        prefix, _, turn_id = (query.data or "").partition(":")
        approving = prefix == APPROVE_PREFIX
        user = str(query.from_user.id)
        language = user_language(query.from_user.language_code)
        if not turn_id:
            await self._answer_callback(query, None)
            return
        if not self.settings.is_reviewer(user):
            log.info("refused %s of turn %s by %s: not in telegram.reviewers",
                     "approval" if approving else "withdrawal", turn_id, user)
            await self._answer_callback(query, text_for("not_reviewer", language), alert=True)
            return
        if self.answers is None:
            await self._answer_callback(query, text_for("approvals_off", language), alert=True)
            return
        try:
            if approving:
                if await self.answers.approve(turn_id, user, query.from_user.full_name) is None:
                    log.info("turn %s cannot be approved (expired or never offered); click by %s", turn_id, user)
                    await self._answer_callback(query, text_for("expired", language), alert=True)
                    return
            elif not await self.answers.withdraw(turn_id):
                log.info("turn %s: no approval to withdraw; click by %s", turn_id, user)
                await self._answer_callback(query, text_for("nothing_to_withdraw", language), alert=True)
                return
        except Exception:
            log.exception("turn %s: the %s failed", turn_id, "approval" if approving else "withdrawal")
            await self._answer_callback(query, text_for("review_failed", language), alert=True)
            return
        log.info("turn %s %s by %s", turn_id, "approved" if approving else "approval withdrawn", user)
        await self._swap_review_button(query, turn_id, approved=approving, language=language)
        await self._answer_callback(query, text_for("approved" if approving else "withdrawn", language))

    async def _swap_review_button(self, query: CallbackQuery, turn_id: str, *, approved: bool, language: str) -> None:
        message = query.message
        if not isinstance(message, Message):  # too old: Telegram no longer shows it to the bot
            return
        rows = [row for row in (message.reply_markup.inline_keyboard if message.reply_markup else [])
                if not any(_is_review_button(b) for b in row)]
        rows.append(review_row(turn_id, approved=approved, language=language))
        try:
            await self.bot.edit_message_reply_markup(chat_id=message.chat.id, message_id=message.message_id,
                                                     reply_markup=InlineKeyboardMarkup(inline_keyboard=rows))
        except TelegramBadRequest as exc:
            if not _is_not_modified(exc):
                log.warning("turn %s: could not update the buttons (%s)", turn_id, exc.message)
        except TelegramAPIError as exc:
            log.warning("turn %s: could not update the buttons (%s)", turn_id, exc)

    async def _answer_callback(self, query: CallbackQuery, text: str | None, *, alert: bool = False) -> None:
        try:
            await self.bot.answer_callback_query(callback_query_id=query.id, text=text, show_alert=alert or None)
        except TelegramAPIError as exc:
            log.warning("could not answer callback query %s: %s", query.id, exc)
