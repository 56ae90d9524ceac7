"""Telegram replies: one answer shown in its chat, paced and within the chat's and the bot's rate budget.

``TelegramMessages`` is one answer's messages (``bot.delivery.reply.AnswerMessages``); the adapter gives
``Answerer.answer`` a ``ChatReply`` over them, which paces, reconciles and shows failures the same way on
every platform. What Telegram does:

- the question acknowledged on receipt: "typing…" (renewed with spare budget until the first text) and,
  when ``ack_reaction`` is set, a reaction on the question, taken back with the answer;
- private chats: ``sendMessageDraft`` previews (one non-zero draft id per answer), paced by a
  ``StreamWriter``, then the final answer with ``sendMessage``; groups, ``stream_mode: edit``, or a
  chat that refuses drafts: one message sent and edited with ``editMessageText`` (``edit_interval_s``
  apart, "message is not modified" ignored), ``TelegramRetryAfter`` turned into ``RetryAfter`` so the
  writer sleeps it out and then sends the latest text;
- the text as ``adapters.telegram.text`` renders it (plain text + entities, never ``parse_mode``),
  plain text when Telegram still cannot parse the entities; the sources and the buttons on the last
  message; the final call reconciles every message already sent with the final parts;
- a failed turn ends with the Answerer's friendly message in the chat.

The final reconciliation is the reply's (``bot.delivery.reply.reconcile`` over ``final_parts``, ``same``,
``edit``, ``add``, ``delete``); the failure's retries past rate limits are ``bot.delivery.reply.show_failure``.

Every send and edit takes a token from its chat's bucket and from the bot-wide one (``BOT_SEND``),
shared by all answers; intermediate states go only with budget to spare in both. Also here: the
aiogram ``Bot`` (``make_bot``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.enums import ChatAction
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNotFound,
    TelegramRetryAfter,
)
from aiogram.types import InlineKeyboardMarkup, Message, MessageEntity, ReactionTypeEmoji, ReplyParameters
from aiogram.utils.token import extract_bot_id

from adapters.telegram.settings import TelegramSettings
from adapters.telegram.text import Rendered, answer_markup, final_parts, render_parts
from bot.delivery.buckets import RedisBuckets
from bot.delivery.rates import COMPLETES, STARTS, PlatformRates, Priority, Rate
from bot.delivery.reply import Cadence, RetryAfter, in_background, show_failure
from bot.settings.base import reveal
from bot.types import Answer, Citation

log = logging.getLogger("kbbot.telegram")

#: Messages and edits per chat: Telegram allows about one a second per chat, with short bursts.
DEFAULT_CHAT_RATE = Rate(per_minute=60, burst=5)
#: Telegram's bot-wide limit (about 30 messages a second across all chats), shared by every answer.
#: Any 1-s window: at most 3 saved + 27 = 30. A small burst and the rate near the limit: 50 new chats at
#: once are acknowledged in 1.7 s (with 10 saved + 20 a second: 2.0 s). Typing renewals and intermediate
#: edits take spare tokens only and leave 2 of the 3 for the next first acknowledgement or text.
BOT_SEND = "bot-send"
DEFAULT_BOT_RATE = Rate(per_minute=27 * 60, burst=3, reserve=2)


# --- where an answer goes ----------------------------------------------------------------------
@dataclass(frozen=True)
class TelegramChat:
    bot_id: int
    chat_id: int
    user_id: int
    private: bool
    topic: int | None = None  # message_thread_id of a forum topic
    reply_to: int | None = None  # the question's message id (groups: answers are replies)
    question_id: int | None = None  # the question's message id (what an acknowledging reaction goes on)

    @property
    def key(self) -> str:
        base = f"telegram:{self.bot_id}:{self.chat_id}"
        return f"{base}:{self.topic}" if self.topic else base


@dataclass
class _Posted:
    message_id: int
    shown: Rendered
    markup: InlineKeyboardMarkup | None = None


def is_not_modified(error: TelegramBadRequest) -> bool:
    return "message is not modified" in error.message


def _is_entity_error(error: TelegramBadRequest) -> bool:
    return "can't parse entities" in error.message or "can't find end" in error.message


def _markup_key(markup: InlineKeyboardMarkup | None) -> Any:
    return None if markup is None else markup.model_dump_json()


def _reply_parameters(message_id: int) -> Any:
    return ReplyParameters(message_id=message_id, allow_sending_without_reply=True)


class TelegramMessages:
    """One Telegram answer's messages (``bot.delivery.reply.AnswerMessages``), driven by its ``ChatReply``.

    ``posted`` are the messages already sent for this answer. Drafting, the message being filled is a
    draft and ``posted`` holds only completed parts; editing, the last posted message is the one being
    filled. The reply reconciles every posted message with the final parts (``final_parts``).

    The acknowledgement: "typing…" as soon as the question is taken, before its turn waits for the
    chat's lock or a free slot, and the ``ack_reaction`` on the question when one is set. Both are
    calls with the chat's and the bot's budget: the first typing waits its turn like a first text; a
    chat action shows for about 5 s, so it is renewed until the first text, but only with budget to
    spare (a renewal never delays anyone's text). The reaction is taken back once the answer is shown,
    in the background and after everything that completes an answer.
    """

    platform = "telegram"
    TYPING_EVERY_S = 4.5  # a chat action shows for about 5 s

    def __init__(self, bot: Bot, where: TelegramChat, settings: TelegramSettings, rates: PlatformRates, *,
                 draft: bool, language: str = "en", on_drafts_unavailable: Callable[[], None] | None = None,
                 review: bool = False, background: Callable[[asyncio.Task[Any]], None] | None = None):
        self.bot = bot
        self.where = where
        self.settings = settings
        self.rates = rates
        self.limit = settings.max_message_units
        self.draft = draft
        self.draft_id = random.randint(1, 2**31 - 1)
        self.edit_cadence = Cadence(min_interval_s=settings.edit_interval_s)
        self.draft_cadence = Cadence(min_interval_s=settings.draft_interval_s)
        self._on_drafts_unavailable = on_drafts_unavailable
        self.posted: list[_Posted] = []
        self.drafted: Rendered | None = None
        self.citations: list[Citation] = []
        self.markup: InlineKeyboardMarkup | None = None
        self.language = language
        self.review = review  # show the approve / withdraw button (someone here may use it)
        self.calls = 0
        self._prepaid = False  # ready() took the budget of the next call
        self._background = background
        self._typing: asyncio.Task[None] | None = None
        self._first_pending = False  # its first "typing" waits for the budget: a first text takes its place
        self._taken_at = rates.clock()
        #: A question's first sign of life (its "typing", or a first text standing in for it) goes before
        #: every text and edit, in the order the questions were taken.
        self._first_place: Priority = (COMPLETES, 0, self._taken_at)
        #: The reaction put on the question (taken back with the answer), if any.
        self.reacted: str | None = None

    @property
    def cadence(self) -> Cadence:
        return self.draft_cadence if self.draft else self.edit_cadence

    # --- the text --------------------------------------------------------------------------------
    async def ready(self, final: bool) -> bool:
        """The first text and the final text wait for the budget (in ``_call``); an intermediate
        state goes only with budget to spare in this chat and bot-wide, so it never delays another
        answer's first or final text."""
        if final or self._prepaid or not (self.posted or self.drafted):
            return True
        self._prepaid = await self.rates.try_acquire_all(*send_budgets(self.where.chat_id))
        return self._prepaid

    async def show(self, text: str) -> bool:
        parts = render_parts(text, self.limit)
        if not parts:
            return False
        if self.draft:
            for i, part in enumerate(parts[:-1]):
                if i >= len(self.posted):
                    await self.post(part)
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
                await self.post(part)
                sent = True
        return sent

    # --- the final text, reconciled by the reply --------------------------------------------------------
    def final_parts(self, text: str) -> list[Rendered]:
        return final_parts(text, self.citations, self.limit, self.language)

    def _markup(self, last: bool) -> InlineKeyboardMarkup | None:
        return self.markup if last else None

    def same(self, posted: _Posted, part: Rendered, last: bool) -> bool:
        return posted.shown == part and _markup_key(posted.markup) == _markup_key(self._markup(last))

    async def edit(self, posted: _Posted, part: Rendered, last: bool) -> None:
        await self._edit(posted, part, self._markup(last))

    async def add(self, part: Rendered, last: bool) -> None:
        await self.post(part, self._markup(last))

    async def delete(self, posted: _Posted) -> None:
        try:
            await self._call("deleteMessage", lambda: self.bot.delete_message(
                chat_id=self.where.chat_id, message_id=posted.message_id))
        except TelegramBadRequest as exc:
            log.warning("could not delete a superseded message %s: %s", posted.message_id, exc.message)
        self.posted.remove(posted)

    async def final_shown(self) -> None:
        pass

    # --- failure -----------------------------------------------------------------------------------
    async def show_failure(self, message: str) -> None:
        """Show ``message`` in the chat: in the message being filled, else as a new message."""
        body = Rendered(f"⚠️ {message}")

        async def replace() -> bool:
            if not self.posted or self.draft:
                return False
            try:
                await self._edit(self.posted[-1], body, None)
                return True
            except TelegramBadRequest as exc:
                log.warning("could not replace the partial answer (%s); sending the failure", exc.message)
                return False

        await show_failure(replace, lambda: self.post(body))

    # --- building blocks ---------------------------------------------------------------------------
    def _stand_in(self) -> Priority | None:
        """The first text while the question's first "typing" still waits for the bot's budget (a burst
        of new chats): the text is the acknowledgement, so the typing is not sent, and the text takes the
        typing's place in the line instead of coming after every other chat's (issue 44)."""
        if not (self._first_pending and not self.posted and self.drafted is None):
            return None
        self._first_pending = False
        self._stop_typing()
        return self._first_place

    async def _call(self, method: str, call: Callable[[], Awaitable[Any]], *, budgeted: bool = True,
                    priority: Priority | None = None) -> Any:
        scope = str(self.where.chat_id)
        if budgeted and self._prepaid:
            self._prepaid = False
        elif budgeted:
            await take_send_budget(self.rates, scope, priority)
        self.calls += 1
        try:
            return await call()
        except TelegramRetryAfter as exc:
            if budgeted:
                await self.rates.hold(scope, "send", exc.retry_after)
            raise RetryAfter(exc.retry_after, f"{method} flood control") from exc

    async def _with_plain_fallback(self, method: str, part: Rendered,
                                   call: Callable[[list[MessageEntity] | None], Awaitable[Any]],
                                   priority: Priority | None = None) -> Any:
        try:
            return await self._call(method, lambda: call(part.aiogram_entities()), priority=priority)
        except TelegramBadRequest as exc:
            if not part.entities or not _is_entity_error(exc):
                raise
            log.warning("chat %s: Telegram could not parse the entities (%s); sending plain text",
                        self.where.chat_id, exc.message)
            return await self._call(method, lambda: call(None))

    async def post(self, part: Rendered, markup: InlineKeyboardMarkup | None = None) -> None:
        """Sends ``part`` as a new message (the first one replies to the question)."""
        first = not self.posted
        reply_to = self.where.reply_to if first else None
        priority = self._stand_in()

        def call(entities: list[MessageEntity] | None) -> Awaitable[Message]:
            return self.bot.send_message(
                chat_id=self.where.chat_id, text=part.text, entities=entities, parse_mode=None,
                message_thread_id=self.where.topic, reply_markup=markup, link_preview_options=None,
                reply_parameters=None if reply_to is None else _reply_parameters(reply_to))

        sent: Message = await self._with_plain_fallback("sendMessage", part, call, priority)
        self.posted.append(_Posted(sent.message_id, part, markup))
        self._stop_typing()  # text on screen: typing has done its job

    async def _edit(self, posted: _Posted, part: Rendered, markup: InlineKeyboardMarkup | None = None) -> None:
        def call(entities: list[MessageEntity] | None) -> Awaitable[Any]:
            return self.bot.edit_message_text(
                chat_id=self.where.chat_id, message_id=posted.message_id, text=part.text, entities=entities,
                parse_mode=None, reply_markup=markup)

        try:
            await self._with_plain_fallback("editMessageText", part, call)
        except TelegramBadRequest as exc:
            if not is_not_modified(exc):
                raise
        posted.shown, posted.markup = part, markup

    async def _send_draft(self, part: Rendered) -> bool:
        """One draft preview; False (after switching to edits) when the chat refuses drafts."""
        def call(entities: list[MessageEntity] | None) -> Awaitable[Any]:
            return self.bot.send_message_draft(chat_id=self.where.chat_id, draft_id=self.draft_id,
                                               message_thread_id=self.where.topic, text=part.text,
                                               entities=entities, parse_mode=None)

        try:
            await self._with_plain_fallback("sendMessageDraft", part, call, self._stand_in())
        except (TelegramBadRequest, TelegramNotFound) as exc:
            method_missing = isinstance(exc, TelegramNotFound) or "not found" in exc.message.lower()
            log.info("chat %s: drafts refused (%s); editing a message instead", self.where.chat_id, exc.message)
            self.draft = False
            self.drafted = None
            if method_missing and self._on_drafts_unavailable is not None:
                self._on_drafts_unavailable()
            return False
        self._stop_typing()  # text on screen: typing has done its job
        return True

    async def _courtesy(self, what: str, call: Callable[[], Awaitable[Any]], *,
                        priority: Priority | None = None) -> bool | None:
        """One acknowledging call inside the chat's and the bot's budget, waiting in ``priority`` order
        (None: only with budget to spare). True when Telegram took it, False when it refused it (not
        worth trying again), None when it was not made (no spare budget, or flood control: the chat's
        bucket is then held for everyone)."""
        if priority is None:
            if not await self.rates.try_acquire_all(*send_budgets(self.where.chat_id)):
                return None
        else:
            await take_send_budget(self.rates, self.where.chat_id, priority)
        try:
            await call()
            return True
        except TelegramRetryAfter as exc:
            await self.rates.hold(str(self.where.chat_id), "send", exc.retry_after)
            return None
        except TelegramAPIError as exc:  # a courtesy: the answer comes anyway
            log.info("chat %s: %s refused: %s", self.where.chat_id, what, exc)
            return False

    async def _acknowledge(self) -> None:
        """Typing at once, the reaction after it, then typing renewed until the first text."""
        typing = lambda: self.bot.send_chat_action(  # noqa: E731
            chat_id=self.where.chat_id, action=ChatAction.TYPING, message_thread_id=self.where.topic)
        # One call makes the question seen: it goes before the texts of questions already seen (a
        # burst of new chats meets the bot's 30 a second), as the shortest job first.
        try:
            shown = await self._courtesy("typing", typing, priority=self._first_place)
        finally:
            self._first_pending = False
        emoji = self.settings.ack_reaction
        if emoji and self.where.question_id is not None:
            self.reacted = emoji  # set first: a reaction landing as this task is cancelled is taken back too
            if not await self._courtesy("reaction", self._reaction_call([ReactionTypeEmoji(emoji=emoji)]),
                                        priority=(STARTS, 0, self._taken_at)):
                self.reacted = None
        while shown is not False:
            await asyncio.sleep(self.TYPING_EVERY_S if shown else 1.0)
            shown = await self._courtesy("typing", typing)

    def _reaction_call(self, reaction: list[Any]) -> Callable[[], Awaitable[Any]]:
        assert self.where.question_id is not None
        return lambda: self.bot.set_message_reaction(chat_id=self.where.chat_id,
                                                     message_id=self.where.question_id, reaction=reaction)

    async def _take_back_reaction(self) -> None:
        """The answer is shown: the reaction has done its job (a refused removal leaves it, logged)."""
        if self.reacted is None:
            return
        self.reacted = None
        for _ in range(3):
            if await self._courtesy("reaction removal", self._reaction_call([]),
                                    priority=(STARTS, 0, self._taken_at)) is not None:
                return

    def _stop_typing(self) -> None:
        if self._typing is not None:
            self._typing.cancel()
            self._typing = None

    # --- what the reply asks ----------------------------------------------------------------------------
    def message_ids(self) -> list[str]:
        """The ids of the messages sent for this answer so far (drafts have none)."""
        return [str(posted.message_id) for posted in self.posted]

    async def acknowledge(self) -> None:
        """Called as soon as the question is accepted, before its turn waits: the first "typing" is put
        in line for the budget, ahead of texts and edits, and the turn's work goes on meanwhile. (Turns
        used to wait up to 2 s for every first "typing" of the bot to go out, so that their work on the
        event loop would not delay those calls: 50 questions' first text came 1.6 s later for it, and
        without the wait the acknowledgements still land within 2 s, ``bench.streaming``.)"""
        if self._typing is None and not (self.posted or self.drafted):
            self._first_pending = True
            self._typing = asyncio.create_task(self._acknowledge(), name=f"acknowledge {self.where.key}")

    def complete(self, answer: Answer) -> None:
        self.citations = list(answer.citations)
        self.markup = answer_markup(answer, feedback=self.settings.feedback, review=self.review,
                                    language=self.language)

    async def settle(self) -> None:
        self._stop_typing()

    async def take_back(self, *, failed: bool) -> None:
        self._stop_typing()
        if self.reacted is not None:
            in_background(self._take_back_reaction(), name=f"unreact {self.where.key}", track=self._background)


def send_budgets(chat: int | str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The ``(scope, method)`` buckets one message or edit to ``chat`` spends: the chat's and the bot's."""
    return (str(chat), "send"), ("bot", BOT_SEND)


async def take_send_budget(rates: PlatformRates, chat: int | str, priority: Priority | None = None) -> None:
    """One send's tokens (``send_budgets``), waiting for each in turn (in ``priority`` order)."""
    for scope, method in send_budgets(chat):
        await rates.acquire(scope, method, priority)


def make_rates(settings: TelegramSettings, redis: Any = None, prefix: str = "kbbot:") -> PlatformRates:
    """Every chat's budget and the bot-wide one, in buckets every replica of this bot shares in ``redis``
    (``{prefix}rate:telegram:{bot id}:{scope}:{method}``), or this process's without it."""
    store = None
    if redis is not None:
        bot_id = extract_bot_id(reveal(settings.token)) if settings.token is not None else 0
        store = RedisBuckets(redis, prefix=f"{prefix}rate:telegram:{bot_id}:")
    return PlatformRates(rates={BOT_SEND: DEFAULT_BOT_RATE}, default=DEFAULT_CHAT_RATE, store=store)


def make_bot(settings: TelegramSettings) -> Bot:
    """The aiogram ``Bot``; ``TELEGRAM_API_URL`` points it at another Bot API server."""
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.api_url)) if settings.api_url else None
    return Bot(reveal(settings.token), session=session)
