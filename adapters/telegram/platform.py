"""The Telegram adapter: private chats (and, when enabled, group mentions) in; streamed, cited answers out.

Updates arrive through an aiogram 3 ``Dispatcher`` with one ``Router``, by long polling (any webhook is
deleted first) or, when ``TELEGRAM_WEBHOOK_URL`` is set, at that URL's path on ``kbbot serve``'s web
app, each request checked against ``TELEGRAM_WEBHOOK_SECRET``. Each question becomes an ``Inquiry``
for the conversation service (``bot/conversation.py``: turns, clicks, commands) with a
``ChatReply`` over ``TelegramMessages`` (``adapters/telegram/reply.py``: typing, drafts or edits, the final messages with
sources and 👍/👎, the rate tiers); texts, entities and buttons are built in
``adapters/telegram/text.py``, the words come from ``bot/messages.py``. Every handler passes the
delivery layer's gate first (``bot/delivery/``: tracking, the access checks this adapter registers
once, claims, take-over). A Bot API server without ``sendMessageDraft`` is remembered for an hour
(``Delivery.refused_capabilities``), so later answers edit directly.

An update is acknowledged (the webhook's 200, the next polling offset) once its handler returned: a
question's handler returns as soon as the question is accepted (recorded as pending, then claimed) and
its turn runs after, as do commands and clicks entirely, so a process killed before a question is
recorded gets it again, and no handler holds up the updates behind it.

Access is checked before anything is claimed: a stranger's messages claim nothing (they are refused
once, remembered for 30 days). An update delivered twice (webhook retry, restart during polling) is
claimed in the shared ``Idempotency`` store by bot id and update id: a question's claim is kept after
its answer (released when the turn fails), a command's is finished whatever the command does.

Admins (``telegram.admins``) can send ``/status`` (knowledge version, sources, last and next runs,
services) and ``/refresh [SOURCE]``; anyone else is politely refused.

What kbbot remembers (``bot/state/cache.py``, ``bot/state/preferences.py``):

- reviewers (``telegram.reviewers``) get "✅ Approve" under a chat's first answer (one the Answerer
  offered to the answer cache) and "↩️ Withdraw approval" under an answer served from the cache. In a
  private chat the buttons appear only when the chat's user is a reviewer; in groups whenever
  reviewers are configured, and a click by anyone else is refused. A click approves by turn id (the
  server holds the answer) and swaps the button; every click is answered with ``answerCallbackQuery``;
- after a refresh changed what an approved answer cites, its reviewer (else every reviewer) gets the
  old and the new answer with an inline keyboard "Keep approved" / "Retire" (``adapters/telegram/loop.py``,
  ``bot/knowledge/loop/recheck.py``); the buttons go once one is clicked;
- everyone has ``/prefs …``, ``/remember on|off`` and ``/forget``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiogram import Bot, Dispatcher, F, Router
from aiogram.enums import ChatType, MessageEntityType
from aiogram.exceptions import TelegramAPIError, TelegramBadRequest
from aiogram.filters import Command, CommandObject, CommandStart
from aiogram.types import CallbackQuery, InlineKeyboardMarkup, Message, Update
from aiohttp import web

from adapters.telegram.loop import KEEP_PREFIX, RETIRE_PREFIX, recheck_markup, recheck_text
from adapters.telegram.reply import (
    TelegramChat,
    TelegramMessages,
    is_not_modified,
    make_bot,
    make_rates,
    take_send_budget,
)
from adapters.telegram.session import BatchConfirmed, HandOn, TelegramWebhook, chat_of
from adapters.telegram.settings import TelegramSettings
from adapters.telegram.text import (
    APPROVE_PREFIX,
    EXPERT_APPROVE_PREFIX,
    EXPERT_CAPTURE_PREFIX,
    FEEDBACK_PREFIX,
    WITHDRAW_PREFIX,
    Rendered,
    expert_markup,
    is_review_button,
    plain_parts,
    review_row,
    user_language,
)
from adapters.workers import HANDED_PATH, Worker
from bot.conversation import AdminStatus, Conversations, ReviewStatus
from bot.delivery.gate import Access, Delivery
from bot.delivery.pending import PendingTurn
from bot.delivery.rates import PlatformRates
from bot.delivery.reply import ChatReply, RetryAfter
from bot.delivery.turns import Arrival
from bot.knowledge.loop.expert import MAX_REPLY_CHARS, ExpertReplies
from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say
from bot.platform import Reviewers
from bot.preference_commands import VERBS as PREFERENCE_VERBS
from bot.settings.base import reveal
from bot.state import Claim
from bot.state.feedback import Feedback
from bot.types import Inquiry
from pipelines.text import detect_language

log = logging.getLogger("kbbot.telegram")

UPDATES = ["message", "callback_query"]
#: How the catalogue's words name this platform's commands and settings.
NAMES = {"commands": "/status and /refresh", "admins": "telegram.admins", "reviewers": "telegram.reviewers"}


class TelegramAdapter:
    """An aiogram ``Dispatcher`` with kbbot's router; polling task or webhook route."""

    name = "telegram"

    def __init__(self, conversations: Conversations, settings: TelegramSettings, *, bot: Bot | None = None,
                 rates: PlatformRates | None = None, digest_to: str = "", worker: Worker | None = None):
        self.conversations = conversations
        self.settings = settings
        #: Under ``serve --workers``, worker 0 alone polls and hands the updates on (``adapters.workers``).
        self.worker = worker or Worker()
        self._hand_on: HandOn | None = None
        self.reviewers = Reviewers("", list(settings.reviewers))
        self.digest_to = digest_to
        self.rates = rates or make_rates(settings)
        self.bot = bot or make_bot(settings)
        self.dp = Dispatcher()
        self.dp.update.outer_middleware(self._received)
        self.username: str | None = None
        self.delivery = Delivery(conversations.turns if conversations is not None else None, self)
        self.dp.include_router(self._router())
        self.delivery.check(self._chat_allowed)
        self.delivery.check(self._user_allowed)
        self._polling: asyncio.Task[None] | None = None

    @property
    def bot_id(self) -> int:
        return self.bot.id

    @property
    def tenant(self) -> str:
        """Principals are read per bot (``bot.permissions.Audiences``)."""
        return str(self.bot_id)

    async def _received(self, handler: Callable[[Update, dict[str, Any]], Awaitable[Any]], update: Update,
                        data: dict[str, Any]) -> Any:
        """Outer middleware: every update is logged (``Delivery.received``) before a handler runs."""
        message = update.message or update.edited_message
        what = "message" if message else ("callback" if update.callback_query else (update.event_type or "update"))
        chat = chat_of(update)
        self.delivery.received(what, str(update.update_id), f"chat {'?' if chat is None else chat}")
        return await handler(update, data)

    def _router(self) -> Router:
        # An update is acknowledged once its handler returned (the webhook's 200, the next polling offset):
        # a question's handler returns once the question is accepted (recorded and claimed) and answers it
        # after; commands and clicks run entirely after, so no handler holds up the updates behind it.
        router = Router(name="kbbot")
        later = self.delivery.later
        router.message.register(later(self._on_help), CommandStart())
        router.message.register(later(self._on_help), Command("help"))
        router.message.register(later(self._on_new), Command("new"))
        router.message.register(later(self._on_admin), Command("status", "refresh"))
        router.message.register(later(self._on_prefs), Command(*PREFERENCE_VERBS))
        router.message.register(self.delivery.own_task(self._on_question), F.text)
        router.callback_query.register(later(self._on_feedback), F.data.startswith(f"{FEEDBACK_PREFIX}:"))
        router.callback_query.register(later(self._on_review), F.data.startswith(f"{APPROVE_PREFIX}:")
                                       | F.data.startswith(f"{WITHDRAW_PREFIX}:"))
        router.callback_query.register(later(self._on_recheck), F.data.startswith(f"{KEEP_PREFIX}:")
                                       | F.data.startswith(f"{RETIRE_PREFIX}:"))
        router.callback_query.register(later(self._on_expert_click), F.data.startswith(f"{EXPERT_APPROVE_PREFIX}:")
                                       | F.data.startswith(f"{EXPERT_CAPTURE_PREFIX}:"))
        return router

    # --- serving ------------------------------------------------------------------------------------
    def mount(self, web_app: web.Application) -> None:
        if self.settings.webhook_mode:
            secret, path = reveal(self.settings.webhook_secret) or None, self.settings.webhook_path
        elif not self.worker.alone:
            secret, path = self.worker.secret, HANDED_PATH
        else:
            return
        TelegramWebhook(dispatcher=self.dp, bot=self.bot, secret_token=secret,
                        handle_in_background=False).register(web_app, path=path)

    async def start(self) -> None:
        me = await self.bot.me()
        self.username = me.username
        if not self.worker.first:
            log.info("Telegram: @%s taking the updates worker 0 receives", self.username)
            return
        if self.settings.webhook_mode:
            await self.bot.set_webhook(self.settings.webhook_url or "",
                                       secret_token=reveal(self.settings.webhook_secret) or None, allowed_updates=UPDATES)
            log.info("Telegram: @%s receiving updates at %s", self.username, self.settings.webhook_path)
            return
        await self.bot.delete_webhook(drop_pending_updates=False)
        batch = BatchConfirmed()
        if not self.worker.alone:
            self._hand_on = HandOn(self.worker.port, HANDED_PATH, self.worker.secret,
                                   lambda update: self.dp.feed_update(self.bot, update), batch)
        batch.install(self.bot, None if self._hand_on is not None else self.dp)
        self._polling = asyncio.create_task(self._poller.start_polling(
            self.bot, polling_timeout=self.settings.polling_timeout_s, handle_signals=False, handle_as_tasks=True,
            close_bot_session=False, allowed_updates=UPDATES), name="telegram polling")
        log.info("Telegram: @%s long polling", self.username)

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self._polling is not None:
            if not self._polling.done():
                try:
                    await self._poller.stop_polling()
                except RuntimeError:  # polling had not started yet
                    self._polling.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):  # best effort
                await asyncio.wait_for(self._polling, timeout=5)
            self._polling = None
        if self._hand_on is not None:
            await self._hand_on.close()
        await self.drain(timeout_s)
        await self.bot.session.close()

    @property
    def _poller(self) -> Dispatcher:
        """The dispatcher that polls: this one, or worker 0's that hands the updates on."""
        return self._hand_on.dispatcher if self._hand_on is not None else self.dp

    def health(self) -> dict[str, Any]:
        body = {"mode": "webhook" if self.settings.webhook_mode else "polling", "username": self.username,
                "turns_in_progress": self.delivery.in_progress}
        if self._polling is not None and self._polling.done():  # long polling that died stops all updates
            body.update(status="down", error="polling stopped")
        return body

    async def drain(self, timeout_s: float | None = None) -> None:
        await self.delivery.drain(timeout_s)

    async def settle(self, quiet_s: float = 0.1) -> None:
        """Wait until every received update has been handled (tests)."""
        await self.delivery.settle(quiet_s)

    # --- access checks (registered once with the delivery layer's gate) ------------------------------
    def _chat_allowed(self, access: Access) -> str | None:
        """In groups, only ``telegram.allowed_chats`` (when set) are answered."""
        if access.what != "click" and not access.private and self.settings.allowed_chats \
                and access.chat not in self.settings.allowed_chats:
            return f"chat {access.chat} is not in telegram.allowed_chats"
        return None

    def _user_allowed(self, access: Access) -> str | None:
        """Questions, commands and clicks from ``telegram.allowed_users`` (everyone when it is empty)."""
        if self.settings.allowed_users and access.user not in self.settings.allowed_users:
            return f"user {access.user} is not in telegram.allowed_users"
        return None

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
                            topic=topic, reply_to=None if private else message.message_id,
                            question_id=message.message_id)

    def _access(self, message: Message, what: str) -> Access:
        return Access(what, str(message.from_user.id if message.from_user else ""), str(self.bot_id),
                      str(message.chat.id), private=message.chat.type == ChatType.PRIVATE)

    async def _admitted(self, message: Message) -> bool:
        """Whether kbbot handles ``message``: from a person, addressed to it (in groups), and past the
        access checks; a stranger is told once. Nothing is claimed before this says yes."""
        user = message.from_user
        if user is None or user.is_bot:
            return False
        if message.chat.type != ChatType.PRIVATE and (not self.settings.groups_enabled or not self._addressed(message)):
            return False
        access = self._access(message, "command" if self._command(message) else "question")
        if self.delivery.admit(access):
            return True
        if self._chat_allowed(access) is None and self._user_allowed(access) is not None:
            await self._refuse_once(message)
        return False

    def _keys(self, message: Message, update: Update | None) -> list[str]:
        keys = [f"telegram:update:{self.bot_id}:{update.update_id}"] if update is not None else []
        keys.append(f"telegram:message:{self.bot_id}:{message.chat.id}:{message.message_id}")
        return keys

    @contextlib.asynccontextmanager
    async def _command_claim(self, message: Message, update: Update | None) -> AsyncIterator[Claim | None]:
        """The claim of a command meant for kbbot (in a private chat, or addressed to it in a group) that
        passes the gate, finished however the command ends (``Delivery.claimed``); None: not for kbbot,
        refused, or a redelivery."""
        if message.chat.type != ChatType.PRIVATE and not self._command_is_ours(self._command(message) or "/") \
                or not await self._admitted(message):
            yield None
            return
        async with self.delivery.claimed(self._keys(message, update), self.settings.dedupe_ttl_s,
                                         self.settings.claim_lease_s) as claim:
            if claim is None:
                log.info("update %s was already handled; not answering twice", update.update_id if update else "?")
            yield claim

    async def _refuse_once(self, message: Message) -> None:
        user = message.from_user
        assert user is not None
        log.info("user %s is not in telegram.allowed_users", user.id)
        if await self.delivery.first_refusal(f"telegram:{self.bot_id}:{user.id}"):
            language = user_language(user.language_code, message.text or "")
            await self._say(message, say("refused", language))

    async def _say(self, message: Message, text: str) -> None:
        where = self._where(message)
        sink = TelegramMessages(self.bot, where, self.settings, self.rates, draft=False)
        for attempt in range(4):
            try:
                await sink.post(Rendered(text))
                return
            except RetryAfter as wait:
                if attempt == 3:
                    raise
                await asyncio.sleep(wait.seconds)

    # --- handlers ------------------------------------------------------------------------------------
    async def _on_help(self, message: Message, event_update: Update | None = None) -> None:
        async with self._command_claim(message, event_update) as claim:
            if claim is None:
                return
            user = message.from_user
            language = user_language(user.language_code if user else None, self._question(message))
            await self._say(message, say("help", language))

    async def _on_new(self, message: Message, event_update: Update | None = None) -> None:
        async with self._command_claim(message, event_update) as claim:
            if claim is None:
                return
            where = self._where(message)
            user = message.from_user
            language = user_language(user.language_code if user else None, self._question(message))
            if not await self.conversations.start_afresh(where.key):
                await claim.finish(answered=False)  # a redelivery may try again
                await self._say(message, say("crashed", language))
                return
            await self._say(message, say("new", language))

    async def _on_admin(self, message: Message, command: CommandObject, event_update: Update | None = None) -> None:
        """``/status`` and ``/refresh [SOURCE]``: admins only (``telegram.admins``)."""
        async with self._command_claim(message, event_update) as claim:
            if claim is None or (user := message.from_user) is None:
                return
            language = user_language(user.language_code, "")

            async def started(source: str | None) -> None:
                if command.command == "refresh":
                    await self._say(message, say("refreshing", language, what=source or say("every_source", language)))

            result = await self.conversations.admin_command(
                command.command, (command.args or "").strip() or None, user=str(user.id),
                is_admin=str(user.id) in self.settings.admins, started=started, language=language)
            text = result.text if result.status in (AdminStatus.DONE, AdminStatus.REFUSED) else say(
                f"admin_{result.status.value}", language, **NAMES)
            for part in plain_parts(text, self.settings.max_message_units):  # plain: file names keep their _ and *
                await self._say(message, part)

    async def _on_question(self, message: Message, event_update: Update | None = None) -> None:
        command = self._command(message)
        if command is not None:
            if self._command_is_ours(command):  # an unknown command: say what kbbot does
                self.delivery.background(asyncio.create_task(self._on_help(message, event_update)))
            return
        if not await self._admitted(message):
            return
        where = self._where(message)
        user = message.from_user
        # A group is one conversation: only a reply to kbbot's answer there can be an expert's reply to it.
        replied = message.reply_to_message
        replying_to = str(replied.message_id) if replied is not None and replied.from_user is not None \
            and replied.from_user.id == self.bot_id else ""
        if not where.private and await self.conversations.is_expert_reply(where.key, str(where.user_id),
                                                                          replying_to=replying_to):
            # Someone else answered in a group after kbbot could not: offered to the reviewers, not a question.
            self.delivery.background(asyncio.create_task(self._offer_expert_reply(message, where, replying_to)))
            return
        question = self._question(message)
        language = user_language(user.language_code if user else None, question)
        if detect_language(question) == "zh":
            language = "zh"
        inquiry = Inquiry(platform="telegram", tenant=str(self.bot_id), channel=str(where.chat_id),
                          thread_key=where.key, user_id=str(where.user_id), text=question,
                          spaces=self.settings.spaces_for(str(where.chat_id)), private=where.private,
                          reply_to={"chat": dataclasses.asdict(where), "language": language})
        event_id = str(event_update.update_id if event_update is not None else 0)
        kind = "private" if where.private else "group"
        accepted = await self.delivery.accept(Arrival(
            inquiry, self._keys(message, event_update), event_id, kind, target=dict(inquiry.reply_to or {}),
            ttl_s=self.settings.dedupe_ttl_s, lease_s=self.settings.claim_lease_s, crashed=say("crashed", language)))
        if accepted is None:
            log.info("update %s was already handled; not answering twice", event_id)
            return
        turn = self.delivery.answer(accepted, self._reply(where, language))
        self.delivery.background(asyncio.create_task(turn, name=f"turn {event_id}"))  # after the acknowledgement

    def _reply(self, where: TelegramChat, language: str) -> ChatReply:
        draft = where.private and self.settings.stream_mode == "draft" and not self.delivery.refused_capabilities.refused("drafts")
        # In a private chat the chat's user is the only one who could click; in groups any reviewer may.
        review = self.conversations.kept.approved is not None and (
            self.settings.is_reviewer(str(where.user_id)) if where.private else bool(self.settings.reviewers))
        return ChatReply(TelegramMessages(self.bot, where, self.settings, self.rates, draft=draft, language=language,
                                          on_drafts_unavailable=self._drafts_unavailable, review=review,
                                          background=self.delivery.background),
                         name=where.key)

    # --- expert replies (bot/knowledge/loop/expert.py) -------------------------------------------------
    def _link(self, message: Message) -> str:
        chat = message.chat
        if chat.username:
            return f"https://t.me/{chat.username}/{message.message_id}"
        if str(chat.id).startswith("-100"):  # a supergroup's private link (members only)
            return f"https://t.me/c/{str(chat.id)[4:]}/{message.message_id}"
        return f"telegram chat {chat.id}, message {message.message_id}"

    async def _offer_expert_reply(self, message: Message, where: TelegramChat, replying_to: str) -> None:
        """The reply kept, and a private message with the two buttons to each reviewer (``telegram.reviewers``:
        Telegram has no message only some members of a group see)."""
        if not self.settings.reviewers:
            log.info("chat %s: a reply by %s could be kept, but telegram.reviewers names nobody", where.chat_id,
                     where.user_id)
            return
        text = self._question(message)
        if ExpertReplies.too_long(text):  # reviewers would not see it whole: its author is told, the offer stays
            user = message.from_user
            await self._say(message, say("expert_too_long", user_language(user.language_code if user else None, text),
                                         limit=f"{MAX_REPLY_CHARS:,}"))
            return
        author = message.from_user.full_name if message.from_user else str(where.user_id)
        reply = await self.conversations.expert_reply(where.key, author=str(where.user_id), author_name=author,
                                                      text=text, link=self._link(message), replying_to=replying_to)
        if reply is None:
            return
        approve = self.conversations.kept.approved is not None
        capture = self.conversations.expert is not None and self.conversations.expert.capture_to is not None
        for reviewer in sorted(self.settings.reviewers):
            language = await self.conversations.user_language("telegram", str(self.bot_id), reviewer) or "en"
            # The whole reply as kept (``ExpertReplies.kept_text``), in as many messages as it takes; the
            # buttons under the last.
            parts = plain_parts(say("expert_offer", language, author=author,
                                    question=" ".join(reply["question"].split())[:300]) + "\n\n" + reply["text"],
                                self.settings.max_message_units)
            try:
                for i, part in enumerate(parts, 1):
                    await take_send_budget(self.rates, reviewer)
                    markup = expert_markup(reply["id"], approve=approve, capture=capture, language=language) \
                        if i == len(parts) else None
                    await self.bot.send_message(chat_id=int(reviewer), text=part, disable_web_page_preview=True,
                                                reply_markup=markup)
            except (TelegramAPIError, ValueError) as exc:  # never started the bot, say: the others may still see it
                log.warning("chat %s: reviewer %s cannot get the expert reply note (%s)", where.chat_id, reviewer, exc)

    async def _on_expert_click(self, query: CallbackQuery) -> None:
        """"Save as approved answer" / "Add to the knowledge base" on an expert reply: reviewers only."""
        prefix, _, reply_id = (query.data or "").partition(":")
        user = str(query.from_user.id)
        language = user_language(query.from_user.language_code)
        if not self._admit_click(query, reply_id) or not self._our_button(query):
            await self._answer_callback(query, None)
            return
        capture = prefix == EXPERT_CAPTURE_PREFIX
        result = await self.conversations.keep_expert_reply(reply_id, capture=capture, reviewer=user,
                                                            name=query.from_user.full_name,
                                                            is_reviewer=self.settings.is_reviewer(user))
        status = result.status.value
        key = f"expert_{status}_{'capture' if capture else 'approve'}" if status == "done" else f"expert_{status}"
        text = say(key, language, detail=result.detail, user=query.from_user.full_name, reviewers="telegram.reviewers")
        await self._answer_callback(query, text[:200], alert=status != "done")
        if status == "done" and isinstance(query.message, Message):
            for part in plain_parts(text, self.settings.max_message_units):
                await self.bot.send_message(chat_id=query.message.chat.id, text=part, disable_web_page_preview=True)

    # --- what the delivery layer asks of Telegram (bot.delivery.Platform) ----------------------------
    async def account(self) -> str:
        return f"telegram:{self.bot_id}"

    def rebuild(self, turn: PendingTurn) -> ChatReply:
        return self.reply_to(turn.target)

    def reply_to(self, target: dict[str, Any]) -> ChatReply:
        if int(target["chat"]["bot_id"]) != self.bot_id:  # a question another bot of the same Redis took
            raise ValueError(f"the chat of bot {target['chat']['bot_id']} is not this bot's ({self.bot_id})")
        return self._reply(TelegramChat(**target["chat"]), str(target.get("language") or "en"))

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        await self.bot.delete_message(chat_id=int(target["chat"]["chat_id"]), message_id=int(message_id))
        return True

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        await self.bot.edit_message_text(text=text, chat_id=int(target["chat"]["chat_id"]), message_id=int(message_id))

    def _drafts_unavailable(self) -> None:
        log.warning("this Bot API server has no sendMessageDraft; editing messages for %.0f min",
                    self.delivery.refused_capabilities.retry_s / 60)
        self.delivery.refused_capabilities.refuse("drafts")

    def _admit_click(self, query: CallbackQuery, turn_id: str) -> bool:
        message = query.message
        chat = str(message.chat.id) if message is not None else ""
        return self.delivery.admit(Access("click", str(query.from_user.id), str(self.bot_id), chat, turn_id=turn_id))

    @staticmethod
    def _our_button(query: CallbackQuery) -> bool:
        """Whether the click came from a button of the very message it names (the gate has checked that
        the turn id is one kbbot makes). Callback data is only bytes a client sends back: checked, an
        invented value never becomes a stored key."""
        message = query.message
        if not isinstance(message, Message) or message.reply_markup is None:
            return False
        return any(button.callback_data == query.data for row in message.reply_markup.inline_keyboard
                   for button in row)

    async def _on_feedback(self, query: CallbackQuery) -> None:
        _, _, rest = (query.data or "").partition(":")
        rating, _, turn_id = rest.partition(":")
        language = user_language(query.from_user.language_code if query.from_user else None)
        if not self._admit_click(query, turn_id):
            await self._answer_callback(query, None)
            return
        if rating not in ("up", "down") or not self._our_button(query):
            log.warning("ignoring a feedback click that names no turn of this message: %r", query.data)
            await self._answer_callback(query, None)
            return
        message = query.message
        item = Feedback(turn_id=turn_id, rating=rating, user_id=str(query.from_user.id), tenant=str(self.bot_id),
                        channel=str(message.chat.id) if message is not None else "",
                        message_id=str(message.message_id) if message is not None else "", platform="telegram")
        saved = await self.conversations.record_feedback(item)
        await self._answer_callback(query, say("thanks" if saved else "feedback_failed", language))

    async def _on_prefs(self, message: Message, command: CommandObject, event_update: Update | None = None) -> None:
        """``/prefs …``, ``/remember on|off``, ``/forget``: the sender's answering preferences."""
        async with self._command_claim(message, event_update) as claim:
            if claim is None or (user := message.from_user) is None:
                return
            words = [command.command.lower(), *(command.args or "").split()]
            text = await self.conversations.preference_command("telegram", str(self.bot_id), str(user.id), words,
                                                           prefix="/", language=user_language(user.language_code),
                                                           channel=str(message.chat.id))
            await self._say(message, text)

    async def _on_review(self, query: CallbackQuery) -> None:
        """A click on "✅ Approve" or "↩️ Withdraw approval": reviewers only, by turn id."""
        prefix, _, turn_id = (query.data or "").partition(":")
        approving = prefix == APPROVE_PREFIX
        user = str(query.from_user.id)
        language = user_language(query.from_user.language_code)
        if not self._admit_click(query, turn_id):
            await self._answer_callback(query, None)
            return
        review = await self.conversations.review(turn_id, approving=approving,
                                                 reviewer=self.settings.is_reviewer(user), user=user,
                                                 display_name=query.from_user.full_name,
                                                 tenant=f"telegram:{self.bot_id}")
        if review.status in (ReviewStatus.APPROVED, ReviewStatus.WITHDRAWN):
            await self._swap_review_button(query, turn_id, approved=approving, language=language)
            await self._answer_callback(query, say(f"review_{review.status.value}", language))
            return
        await self._answer_callback(query, say(f"review_{review.status.value}", language, **NAMES), alert=True)

    # --- the knowledge loop (bot/knowledge/loop): re-checked approvals, messages to reviewers ----------------------
    async def post_recheck(self, chat_id: str, request: RecheckRequest) -> bool:
        """The re-check of an approval with "Keep approved" / "Retire" to ``chat_id`` (a reviewer's user id)."""
        parts = plain_parts(recheck_text(request), self.settings.max_message_units)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                await take_send_budget(self.rates, chat_id)
                await self.bot.send_message(chat_id=int(chat_id), text=part, parse_mode=None,
                                            disable_web_page_preview=True,
                                            reply_markup=recheck_markup(request) if last else None)
        except TelegramAPIError as exc:
            log.warning("turn %s: the re-check could not be sent to %s (%s)", request.turn_id, chat_id, exc)
            return False
        return True

    async def send_note(self, to: str, text: str) -> bool:
        """Plain text (never ``parse_mode``) to a chat, one message per ``telegram.max_message_units``,
        inside the chat's and the bot's budgets."""
        try:
            for part in plain_parts(text, self.settings.max_message_units):
                await take_send_budget(self.rates, to)
                await self.bot.send_message(chat_id=int(to), text=part, parse_mode=None,
                                            disable_web_page_preview=True)
        except (TelegramAPIError, ValueError) as exc:
            log.warning("could not send to %s (%s)", to, exc)
            return False
        return True

    def owns(self, user: str) -> bool:
        return user.lstrip("-").isdigit()

    async def _on_recheck(self, query: CallbackQuery) -> None:
        """A click on "Keep approved" or "Retire" under a re-checked approval: reviewers only, by turn id."""
        prefix, _, turn_id = (query.data or "").partition(":")
        user = str(query.from_user.id)
        language = user_language(query.from_user.language_code)
        if not self._admit_click(query, turn_id) or not self._our_button(query):
            await self._answer_callback(query, None)
            return
        review = await self.conversations.decide_recheck(turn_id, keep=prefix == KEEP_PREFIX,
                                                         reviewer=self.settings.is_reviewer(user), user=user,
                                                         display_name=query.from_user.full_name)
        if review.status not in (ReviewStatus.KEPT, ReviewStatus.RETIRED):
            await self._answer_callback(query, say(f"review_{review.status.value}", language, **NAMES), alert=True)
            return
        message = query.message
        if isinstance(message, Message):
            try:
                await self.bot.edit_message_reply_markup(chat_id=message.chat.id, message_id=message.message_id,
                                                         reply_markup=None)
            except TelegramAPIError as exc:
                log.warning("turn %s: could not remove the re-check buttons (%s)", turn_id, exc)
        await self._answer_callback(query, say(f"review_{review.status.value}", language))

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
