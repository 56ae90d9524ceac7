"""A local Telegram Bot API: ``/bot{token}/{method}``, multipart/form-data (or urlencoded / JSON) requests.

It keeps what a test needs to look at: every call with its timestamp and result, the messages of each
chat as they are now (text, entities, buttons, edits), the drafts shown, and a queue of updates that
``getUpdates`` long polling hands out. Knobs model what the real service does to a bot: 429 storms with
``parameters.retry_after``, "message is not modified", refusal of ``sendMessageDraft``, entity errors.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer

JSON = dict[str, Any]
#: Bot API ``sendChatAction`` actions.
CHAT_ACTIONS = {"typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
                "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note"}
#: Some of the emoji Telegram accepts as reactions (``ReactionTypeEmoji``); others are REACTION_INVALID.
REACTION_EMOJI = {"👍", "👎", "❤", "🔥", "🤔", "👀", "🙏", "👌", "✍", "🫡", "⚡", "🎉"}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Call:
    method: str
    args: JSON
    at: float
    status: int = 200
    description: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def text(self) -> str:
        return str(self.args.get("text") or "")


@dataclass
class Message:
    message_id: int
    chat_id: int
    text: str
    entities: list[JSON] = field(default_factory=list)
    reply_markup: JSON | None = None
    message_thread_id: int | None = None
    edits: int = 0
    deleted: bool = False

    def buttons(self) -> list[JSON]:
        rows = (self.reply_markup or {}).get("inline_keyboard") or []
        return [button for row in rows for button in row]


class FakeTelegram(LocalServer):
    """The fake Bot API server; ``async with FakeTelegram() as fake`` then ``fake.base_url``."""

    def __init__(self, token: str = "123456789:TEST-token_abc", username: str = "kbbot_test_bot") -> None:
        super().__init__()
        self.token = token
        self.bot_id = int(token.split(":", 1)[0])
        self.username = username
        self.calls: list[Call] = []
        self.messages: dict[int, list[Message]] = {}
        self.drafts: list[tuple[int, int, str]] = []
        #: (chat id, message id) -> the bot's reaction emoji on that message now.
        self.reactions: dict[tuple[int, int], list[str]] = {}
        self.chat_types: dict[int, str] = {}
        self.webhook: JSON | None = None
        self._updates: list[JSON] = []
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        self._new_update = asyncio.Event()
        self._storms: dict[str, list[float]] = {}
        self._draft_refusal: tuple[int, str] | None = None
        self._entity_errors: dict[str, int] = {}

    # --- test controls ---------------------------------------------------------------------------
    def push(self, update: JSON) -> JSON:
        """Queue an update for ``getUpdates`` (an ``update_id`` is assigned when missing)."""
        update = dict(update)
        update.setdefault("update_id", next(self._update_ids))
        chat = (update.get("message") or {}).get("chat")
        if chat:
            self.chat_types[int(chat["id"])] = chat.get("type", "private")
        self._updates.append(update)
        self._new_update.set()
        return update

    async def fetched(self, update: JSON, timeout_s: float = 30) -> JSON:
        """``update`` queued, once a poller confirmed it (its next ``getUpdates`` offset is past it)."""
        update = self.push(update)
        deadline = time.monotonic() + timeout_s
        while not any(c.method == "getUpdates" and int(c.args.get("offset") or 0) > update["update_id"]
                      for c in self.calls):
            assert time.monotonic() < deadline, "the update was never fetched"
            await asyncio.sleep(0.02)
        return update

    def new_update_id(self) -> int:
        return next(self._update_ids)

    def rate_limit(self, method: str, *, times: int, retry_after: float = 1) -> None:
        """The next ``times`` calls of ``method`` get 429 with ``parameters.retry_after``."""
        self._storms.setdefault(method, []).extend([retry_after] * times)

    def refuse_drafts(self, status: int = 400,
                      description: str = "Bad Request: method sendMessageDraft can be used only in private chats"
                      ) -> None:
        self._draft_refusal = (status, description)

    def reject_entities(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` that carry entities fail with "can't parse entities"."""
        self._entity_errors[method] = self._entity_errors.get(method, 0) + times

    def calls_to(self, *methods: str) -> list[Call]:
        return [c for c in self.calls if c.method in methods]

    def ok_calls(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method and c.ok]

    def chat(self, chat_id: int) -> list[Message]:
        """The chat's bot messages as they are now (deleted ones left out)."""
        return [m for m in self.messages.get(chat_id, []) if not m.deleted]

    # --- lifecycle -------------------------------------------------------------------------------
    shutdown_timeout_s = 0.2

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/bot{token}/{method}", self._handle)

    async def stop(self) -> None:
        self._new_update.set()  # wakes long polls, which then end with the server
        await super().stop()

    # --- the API ---------------------------------------------------------------------------------
    async def _args(self, request: web.Request) -> JSON:
        if request.content_type == "application/json":
            raw = await request.json()
            return {k: v for k, v in raw.items()}
        form = await request.post()
        args: JSON = {}
        for key, value in form.items():
            if isinstance(value, str):
                args[key] = value
        return args

    @staticmethod
    def _json(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await self._args(request)
        call = Call(method=method, args=args, at=time.monotonic())
        self.calls.append(call)
        if request.match_info["token"] != self.token:
            return self._error(call, 401, "Unauthorized")
        storm = self._storms.get(method)
        if storm:
            retry_after = storm.pop(0)
            return self._error(call, 429, f"Too Many Requests: retry after {retry_after:g}",
                               {"retry_after": retry_after})
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return self._error(call, 404, "Not Found: method not found")
        try:
            result = await handler(args)
        except _ApiError as exc:
            return self._error(call, exc.status, exc.description, exc.parameters)
        return web.json_response({"ok": True, "result": result})

    def _error(self, call: Call, status: int, description: str, parameters: JSON | None = None) -> web.Response:
        call.status = status
        call.description = description
        body: JSON = {"ok": False, "error_code": status, "description": description}
        if parameters:
            body["parameters"] = parameters
        return web.json_response(body, status=status)

    def _me(self) -> JSON:
        return {"id": self.bot_id, "is_bot": True, "first_name": "kbbot", "username": self.username,
                "can_join_groups": True, "can_read_all_group_messages": False, "supports_inline_queries": False}

    async def _m_getMe(self, args: JSON) -> Any:
        return self._me()

    async def _m_deleteWebhook(self, args: JSON) -> Any:
        self.webhook = None
        return True

    async def _m_setWebhook(self, args: JSON) -> Any:
        self.webhook = dict(args)
        return True

    async def _m_close(self, args: JSON) -> Any:
        return True

    async def _m_getUpdates(self, args: JSON) -> Any:
        if self.webhook is not None:
            raise _ApiError(409, "Conflict: can't use getUpdates method while webhook is active; "
                                 "use deleteWebhook to delete the webhook first")
        offset = int(args.get("offset") or 0)
        timeout = float(args.get("timeout") or 0)
        limit = int(args.get("limit") or 100)
        deadline = time.monotonic() + timeout
        while True:
            # Updates below the offset are confirmed: Telegram forgets them.
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
            if self._updates:
                return sorted(self._updates, key=lambda u: u["update_id"])[:limit]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), remaining)
            except TimeoutError:
                return []

    def _check_text(self, method: str, args: JSON) -> tuple[str, list[JSON]]:
        text = str(args.get("text") or "")
        entities = self._json(args.get("entities")) or []
        if args.get("parse_mode"):
            raise _ApiError(400, "Bad Request: this fake expects plain text with entities, not parse_mode")
        if entities and self._entity_errors.get(method):
            self._entity_errors[method] -= 1
            raise _ApiError(400, "Bad Request: can't parse entities: unsupported start tag \"b\" at byte offset 0")
        size = utf16_len(text)
        for entity in entities:
            if entity["offset"] < 0 or entity["length"] <= 0 or entity["offset"] + entity["length"] > size:
                raise _ApiError(400, f"Bad Request: can't parse entities: entity {entity} is out of the text")
        if method != "sendMessageDraft" and not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if size > 4096:
            raise _ApiError(400, "Bad Request: message is too long")
        return text, entities

    def _message_json(self, message: Message) -> JSON:
        out: JSON = {"message_id": message.message_id, "date": int(time.time()),
                     "chat": {"id": message.chat_id, "type": self.chat_types.get(message.chat_id, "private")},
                     "from": self._me(), "text": message.text}
        if message.entities:
            out["entities"] = message.entities
        if message.reply_markup:
            out["reply_markup"] = message.reply_markup
        if message.message_thread_id:
            out["message_thread_id"] = message.message_thread_id
        if message.edits:
            out["edit_date"] = int(time.time())
        return out

    async def _m_sendMessage(self, args: JSON) -> Any:
        text, entities = self._check_text("sendMessage", args)
        chat_id = int(args["chat_id"])
        thread = args.get("message_thread_id")
        message = Message(message_id=next(self._message_ids), chat_id=chat_id, text=text, entities=entities,
                          reply_markup=self._json(args.get("reply_markup")),
                          message_thread_id=int(thread) if thread else None)
        self.messages.setdefault(chat_id, []).append(message)
        return self._message_json(message)

    def _find(self, args: JSON) -> Message:
        chat_id = int(args["chat_id"])
        message_id = int(args["message_id"])
        for message in self.messages.get(chat_id, []):
            if message.message_id == message_id and not message.deleted:
                return message
        raise _ApiError(400, "Bad Request: message to edit not found")

    async def _m_editMessageText(self, args: JSON) -> Any:
        message = self._find(args)
        text, entities = self._check_text("editMessageText", args)
        markup = self._json(args.get("reply_markup"))
        if text == message.text and entities == message.entities and markup == message.reply_markup:
            raise _ApiError(400, "Bad Request: message is not modified: specified new message content and reply "
                                 "markup are exactly the same as a current content and reply markup of the message")
        message.text, message.entities, message.reply_markup = text, entities, markup
        message.edits += 1
        return self._message_json(message)

    async def _m_editMessageReplyMarkup(self, args: JSON) -> Any:
        message = self._find(args)
        markup = self._json(args.get("reply_markup"))
        if markup == message.reply_markup:
            raise _ApiError(400, "Bad Request: message is not modified: specified new message content and reply "
                                 "markup are exactly the same as a current content and reply markup of the message")
        message.reply_markup = markup
        message.edits += 1
        return self._message_json(message)

    async def _m_deleteMessage(self, args: JSON) -> Any:
        self._find(args).deleted = True
        return True

    async def _m_sendMessageDraft(self, args: JSON) -> Any:
        if self._draft_refusal is not None:
            raise _ApiError(*self._draft_refusal)
        chat_id = int(args["chat_id"])
        if self.chat_types.get(chat_id, "private") != "private":
            raise _ApiError(400, "Bad Request: method sendMessageDraft can be used only in private chats")
        if int(args.get("draft_id") or 0) == 0:
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text, _ = self._check_text("sendMessageDraft", args)
        self.drafts.append((chat_id, int(args["draft_id"]), text))
        return True

    async def _m_sendChatAction(self, args: JSON) -> Any:
        if args.get("action") not in CHAT_ACTIONS:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        int(args["chat_id"])
        return True

    async def _m_setMessageReaction(self, args: JSON) -> Any:
        """The bot's reaction on a message (a list of at most one emoji; empty takes it back)."""
        reaction = self._json(args.get("reaction")) or []
        if len(reaction) > 1:
            raise _ApiError(400, "Bad Request: REACTIONS_TOO_MANY")
        for item in reaction:
            if item.get("type") != "emoji" or item.get("emoji") not in REACTION_EMOJI:
                raise _ApiError(400, "Bad Request: REACTION_INVALID")
        key = (int(args["chat_id"]), int(args["message_id"]))
        self.reactions[key] = [item["emoji"] for item in reaction]
        return True

    async def _m_answerCallbackQuery(self, args: JSON) -> Any:
        if not args.get("callback_query_id"):
            raise _ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
        if len(str(args.get("text") or "")) > 200:
            raise _ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        return True


class _ApiError(Exception):
    def __init__(self, status: int, description: str, parameters: JSON | None = None):
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


# --- update builders -----------------------------------------------------------------------------
_message_ids = itertools.count(50_000)


def user(user_id: int = 7001, language_code: str = "en", first_name: str = "Alice") -> JSON:
    return {"id": user_id, "is_bot": False, "first_name": first_name, "language_code": language_code}


def message_update(text: str, *, chat_id: int = 7001, chat_type: str = "private", from_user: JSON | None = None,
                   entities: list[JSON] | None = None, reply_to: JSON | None = None,
                   message_thread_id: int | None = None, update_id: int | None = None) -> JSON:
    sender = from_user or user(chat_id if chat_type == "private" else 7001)
    chat: JSON = {"id": chat_id, "type": chat_type}
    if chat_type == "private":
        chat["first_name"] = sender["first_name"]
    else:
        chat["title"] = "Support"
    message: JSON = {"message_id": next(_message_ids), "date": int(time.time()), "chat": chat, "from": sender,
                     "text": text}
    if entities:
        message["entities"] = entities
    if reply_to:
        message["reply_to_message"] = reply_to
    if message_thread_id:
        message["message_thread_id"] = message_thread_id
        message["is_topic_message"] = True
    update: JSON = {"message": message}
    if update_id is not None:
        update["update_id"] = update_id
    return update


def callback_update(data: str, *, message: Message, from_user: JSON | None = None,
                    chat_type: str = "private") -> JSON:
    """A click on an inline button of ``message`` (the message as Telegram shows it now)."""
    shown: JSON = {"message_id": message.message_id, "date": int(time.time()), "text": message.text,
                   "chat": {"id": message.chat_id, "type": chat_type}}
    if message.entities:
        shown["entities"] = message.entities
    if message.reply_markup:
        shown["reply_markup"] = message.reply_markup
    return {"callback_query": {
        "id": f"cb{next(_message_ids)}", "from": from_user or user(), "chat_instance": "ci1", "data": data,
        "message": shown,
    }}
