"""The Telegram adapter: private chats (and, when enabled, group mentions) in; streamed, cited answers out.

Updates arrive through an aiogram 3 ``Dispatcher`` with one ``Router``, by long polling (any webhook is
deleted first) or, when ``TELEGRAM_WEBHOOK_URL`` is set, at that URL's path on ``kbbot serve``'s web
app, each request checked against ``TELEGRAM_WEBHOOK_SECRET``. Each question becomes an ``Inquiry``
for ``Answerer.answer`` with a ``TelegramReply`` (``adapters/telegram_reply.py``: typing, drafts or
edits, the final messages with sources and 👍/👎, the rate budget); texts, entities and buttons are
built in ``adapters/telegram_text.py``. A Bot API server without ``sendMessageDraft`` is remembered
for an hour, so later answers edit directly.

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
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiogram import Bot, Dispatcher, F, Router
from aiogram.enums import ChatType, MessageEntityType
from aiogram.exceptions import TelegramAPIError, TelegramBadRequest
from aiogram.filters import Command, CommandObject, CommandStart
from aiogram.types import CallbackQuery, InlineKeyboardMarkup, Message, Update
from aiohttp import web

from adapters.memory_commands import VERBS as PREFERENCE_VERBS
from adapters.memory_commands import run_command as run_preferences_command
from adapters.telegram_reply import (
    BOT_SEND,
    DEFAULT_BOT_RATE,
    DEFAULT_CHAT_RATE,
    TelegramChat,
    TelegramReply,
    TelegramSink,
    is_not_modified,
    make_bot,
)
from adapters.telegram_text import (
    APPROVE_PREFIX,
    FEEDBACK_PREFIX,
    WITHDRAW_PREFIX,
    Rendered,
    is_review_button,
    plain_parts,
    review_row,
    text_for,
    user_language,
)
from bot.feedback import Feedback, FeedbackStore, MemoryFeedback
from bot.platform_settings import TelegramSettings
from bot.state import Idempotency, TaskSet, ThreadLocks, claim_all, release_all
from bot.streaming import RateBudget, RetryAfter
from bot.types import Answer, Inquiry, Outcome
from pipelines.text import detect_language

log = logging.getLogger("kbbot.telegram")

#: What ``bot.types.Trace`` makes turn ids of: uuid4 hex.
TURN_ID = re.compile(r"[0-9a-f]{32}")

DRAFT_REFUSAL_MEMORY_S = 3600.0
REFUSAL_MEMORY_S = 30 * 86400.0
UPDATES = ["message", "callback_query"]


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
        self._thread_locks: ThreadLocks = getattr(answerer, "thread_locks", None) or ThreadLocks()
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
            async with self._thread_locks.hold(where.key):  # not in the middle of a turn of this chat
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
        try:  # the Answerer runs one turn per thread at a time (its thread locks)
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

    def _click_allowed(self, query: CallbackQuery) -> bool:
        """A button click by someone ``telegram.allowed_users`` admits (everyone when it is empty)."""
        allowed = self.settings.allowed_users
        if allowed and str(query.from_user.id) not in allowed:
            log.info("ignoring a click by %s: not in telegram.allowed_users", query.from_user.id)
            return False
        return True

    @staticmethod
    def _our_button(query: CallbackQuery, turn_id: str) -> bool:
        """Whether the click names a turn id kbbot made (a uuid4 hex) on a button of the very message it
        came from. Callback data is only bytes a client sends back: checked, an invented turn id never
        becomes a stored key."""
        message = query.message
        if not TURN_ID.fullmatch(turn_id) or not isinstance(message, Message) or message.reply_markup is None:
            return False
        return any(button.callback_data == query.data for row in message.reply_markup.inline_keyboard
                   for button in row)

    async def _on_feedback(self, query: CallbackQuery) -> None:
        self._track()
        _, _, rest = (query.data or "").partition(":")
        rating, _, turn_id = rest.partition(":")
        language = user_language(query.from_user.language_code if query.from_user else None)
        if not self._click_allowed(query):
            await self._answer_callback(query, None)
            return
        if rating not in ("up", "down") or not self._our_button(query, turn_id):
            log.warning("ignoring a feedback click that names no turn of this message: %r", query.data)
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
                                             prefix="/", language=user_language(user.language_code),
                                             turns=getattr(self.answerer, "turns", None))
        await self._say(message, text)

    async def _on_review(self, query: CallbackQuery) -> None:
        """A click on "✅ Approve" or "↩️ Withdraw approval": reviewers only, by turn id."""
        self._track()
        prefix, _, turn_id = (query.data or "").partition(":")
        approving = prefix == APPROVE_PREFIX
        user = str(query.from_user.id)
        language = user_language(query.from_user.language_code)
        if not turn_id or not self._click_allowed(query):
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
                if await self.answers.approve(turn_id, user, query.from_user.full_name,
                                              tenant=f"telegram:{self.bot_id}") is None:
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
                if not any(is_review_button(b) for b in row)]
        rows.append(review_row(turn_id, approved=approved, language=language))
        try:
            await self.bot.edit_message_reply_markup(chat_id=message.chat.id, message_id=message.message_id,
                                                     reply_markup=InlineKeyboardMarkup(inline_keyboard=rows))
        except TelegramBadRequest as exc:
            if not is_not_modified(exc):
                log.warning("turn %s: could not update the buttons (%s)", turn_id, exc.message)
        except TelegramAPIError as exc:
            log.warning("turn %s: could not update the buttons (%s)", turn_id, exc)

    async def _answer_callback(self, query: CallbackQuery, text: str | None, *, alert: bool = False) -> None:
        try:
            await self.bot.answer_callback_query(callback_query_id=query.id, text=text, show_alert=alert or None)
        except TelegramAPIError as exc:
            log.warning("could not answer callback query %s: %s", query.id, exc)
