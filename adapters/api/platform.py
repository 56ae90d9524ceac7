"""The HTTP API on ``kbbot serve``: questions over HTTP, answers as Server-Sent Events or in the OpenAI format.

- ``POST /v1/ask`` ``{"question", "conversation"?, "user"?}`` answers with events: ``ready``, a
  ``progress`` per pipeline stage as it starts, ``delta`` as the answer is written, then ``final``
  (answer, outcome, citations, turn id) or ``error`` (the message a chat user would see), and
  ``__close__`` last.
- ``POST /v1/chat/completions`` speaks OpenAI's chat completions (``stream`` true or false), so any
  OpenAI-compatible client or chat UI can use kbbot as a model; the answer's sources are appended to
  its text. kbbot keeps the thread's history itself, keyed by ``conversation_id`` (else ``user``):
  only the last user message is the question. ``GET /v1/models`` lists the one model.

Every request carries ``Authorization: Bearer <token>`` of a caller in ``api.tokens`` (or
``KBBOT_API_TOKEN``); the caller's spaces are what its questions search, and its name is the tenant and
channel of the rate limits. A request with an ``Idempotency-Key`` header is answered once: the same key
again (within ``api.dedupe_ttl_s``) gets 409. ``conversation`` and ``user`` ids are at most 200
characters; a refused request is one log line, and a client leaving a stream one info line. The turn
itself is the conversation service's, as on every platform: rate limits, capacity, question caps and
friendly failures apply unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from bot.conversation import Conversations
from bot.platform import NoChat
from bot.settings.api import ApiSettings, ApiToken
from bot.state import Claim, TaskSet
from bot.types import Answer, Citation, Inquiry, Outcome
from pipelines.text import link_host, restrict_links

log = logging.getLogger("kbbot.api")

CALLER = web.RequestKey("api_caller", ApiToken)
#: The longest ``conversation`` / ``user`` id: either names a thread in the history and every log line.
MAX_ID_CHARS = 200

#: One event of a turn: (name, payload); ``final`` carries the ``Answer`` itself.
Event = tuple[str, Any]


class EventReply:
    """A ``Reply`` (and ``ShowsProgress``) that queues a turn's stream as events for the response."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.streamed = False

    async def start(self) -> None:
        pass

    def progress(self, stage: str) -> None:
        self._loop.call_soon_threadsafe(self.events.put_nowait, ("progress", {"stage": stage}))

    async def push(self, delta: str) -> None:
        self.streamed = True
        await self.events.put(("delta", {"text": delta}))

    async def finish(self, answer: Answer) -> None:
        await self.events.put(("final", answer))

    async def fail(self, message: str) -> None:
        await self.events.put(("error", {"message": message}))


# What Markdown reads as markup inside a line: links and images, emphasis, code, HTML, character
# references, strikethrough, tables and escapes. A label's own characters are escaped (CommonMark lets
# any ASCII punctuation be), so a title shows as written.
_MARKDOWN_MARKUP = re.compile(r"([\\`*_\[\]<>!&|~#])")


def markdown_label(text: str, allowed_hosts: set[str]) -> str:
    """A document's title (or heading) as Markdown that shows it as written: a title is the document's
    text, and ``[QX-700 portal](https://evil.example/login)`` in it must not become a link in the bot's
    answer. A URL written out in it is kept only on the source's own host (clients link those)."""
    text, _ = restrict_links(" ".join(text.split()), allowed_hosts)
    return _MARKDOWN_MARKUP.sub(r"\\\1", text)


def markdown_url(url: str) -> str:
    """A source's URL as a link destination that nothing in it can end early."""
    return "".join(f"%{ord(ch):02X}" if ch in " ()<>\\" or ord(ch) < 0x20 else ch for ch in url)


def sources_markdown(citations: list[Citation]) -> str:
    """The sources block appended to a chat completion: one numbered line each, linked when a URL."""
    if not citations:
        return ""
    lines = []
    for c in citations:
        hosts = {host} if c.url and (host := link_host(c.url)) else set()
        label = markdown_label(c.label, hosts)
        lines.append(f"[{c.index}] [{label}]({markdown_url(c.url)})" if c.url else f"[{c.index}] {label}")
    return "\n\n**Sources**\n" + "\n".join(lines)


def _error(status: int, message: str, code: str) -> web.HTTPException:
    """An error in the OpenAI shape, which its clients read the message of."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}})
    kind = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 409: web.HTTPConflict,
            413: web.HTTPRequestEntityTooLarge}[status]
    extra = {"max_size": 0, "actual_size": 0} if status == 413 else {}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return kind(text=body, content_type="application/json", headers=headers, **extra)


def _message(refusal: web.HTTPException) -> str:
    """The message of a refusal made by ``_error`` (else its reason)."""
    try:
        return str(json.loads(refusal.text or "")["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return refusal.reason


class HttpApi(NoChat):
    """The API's routes on ``kbbot serve``'s web app; an adapter like the chat platforms'."""

    name = "api"

    def __init__(self, conversations: Conversations, settings: ApiSettings):
        self.conversations = conversations
        self.settings = settings
        self._tasks = TaskSet()

    # --- serving ------------------------------------------------------------------------------------
    def mount(self, web_app: web.Application) -> None:
        api = web.Application(middlewares=[self._authenticate])
        api.add_routes([web.post("/ask", self.ask), web.post("/chat/completions", self.chat_completions),
                        web.get("/models", self.models)])
        web_app.add_subapp("/v1", api)

    async def start(self) -> None:
        log.info("HTTP API: %d callers at /v1/ask and /v1/chat/completions", len(self.settings.callers))

    async def stop(self, timeout_s: float = 30.0) -> None:
        await self._tasks.drain(timeout_s)

    def health(self) -> dict[str, Any]:
        return {"callers": len(self.settings.callers), "turns_in_progress": len(self._tasks)}

    async def settle(self, quiet_s: float = 0.05) -> None:
        """Wait until every turn begun has ended (tests)."""
        await self._tasks.settle(quiet_s)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        caller = self.settings.caller(presented.strip()) if scheme.lower() == "bearer" and presented else None
        if caller is None:
            log.warning("API: refused %s %s from %s: no valid bearer token", request.method, request.path,
                        request.remote)
            raise _error(401, "A valid API token is required (Authorization: Bearer <token>).", "invalid_api_key")
        request[CALLER] = caller
        try:
            return await handler(request)
        except web.HTTPConflict:
            raise  # a request answered already: _claim logs it
        except web.HTTPClientError as refusal:
            log.warning("API: refused %s %s of %s from %s: %d %s", request.method, request.path, caller.name,
                        request.remote, refusal.status, _message(refusal))
            raise

    # --- one turn -----------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        limit = self.settings.max_body_kb * 1024
        too_large = _error(413, f"The request is larger than {self.settings.max_body_kb} KiB.", "request_too_large")
        if (request.content_length or 0) > limit:
            raise too_large
        raw = await request.read()  # the web app admits bodies this large (adapters.web_guard.max_body_bytes)
        if len(raw) > limit:
            raise too_large
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _error(400, "The body must be a JSON object.", "invalid_json") from None
        except RecursionError:
            raise _error(400, f"The JSON nests deeper than Python's parser goes ({sys.getrecursionlimit()} levels).",
                         "invalid_json") from None
        if not isinstance(body, dict):
            raise _error(400, "The body must be a JSON object.", "invalid_json")
        return body

    @staticmethod
    def _text(body: dict[str, Any], name: str, *, required: bool = False) -> str | None:
        value = body.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            raise _error(400, f"`{name}` must be {'a non-empty' if required else 'a'} string.", f"invalid_{name}")
        return value

    @classmethod
    def _id(cls, body: dict[str, Any], name: str) -> str | None:
        """A conversation or user id: it names a thread in every history and log line, so it is short."""
        value = cls._text(body, name)
        if value is not None and len(value) > MAX_ID_CHARS:
            raise _error(400, f"`{name}` must be at most {MAX_ID_CHARS} characters (got {len(value)}).",
                         f"invalid_{name}")
        return value

    async def _claim(self, request: web.Request) -> Claim | None:
        """The ``Idempotency-Key`` claimed for this caller (None: no key); 409 when that request was
        already answered."""
        key = request.headers.get("Idempotency-Key", "").strip()
        if not key:
            return None
        # The whole key, hashed: a key kept in part would make keys that share that part one request.
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
        claimed = await self.conversations.turns.claim([f"api:request:{request[CALLER].name}:{digest}"],
                                                 self.settings.dedupe_ttl_s)
        if claimed is None:
            log.info("API: request with Idempotency-Key sha256:%s of %s was already answered; not answering twice",
                     digest[:16], request[CALLER].name)
            raise _error(409, "A request with this Idempotency-Key was already answered.", "duplicate_request")
        return claimed

    def _inquiry(self, caller: ApiToken, question: str, conversation: str, user: str | None) -> Inquiry:
        return Inquiry(platform="api", tenant=caller.name, channel=caller.name,
                       thread_key=f"api:{caller.name}:{conversation}", user_id=user or conversation, text=question,
                       spaces=caller.spaces, private=True)  # the caller alone reads the answer

    async def _turn(self, inquiry: Inquiry, claimed: Claim | None, kind: str) -> AsyncIterator[Event]:
        """Runs the turn and yields its events as they happen; the turn finishes even if the client
        leaves (its history and records are written either way)."""
        reply = EventReply()

        async def run() -> None:
            self._tasks.track_current()
            try:
                await self.conversations.turns.answer(inquiry, reply, claimed=claimed, event_id=uuid.uuid4().hex, kind=kind)
            finally:
                reply.events.put_nowait(None)

        turn = asyncio.create_task(run(), name=f"api turn {inquiry.thread_key}")
        while (event := await reply.events.get()) is not None:
            yield event
        await turn

    @contextlib.asynccontextmanager
    async def _events(self, request: web.Request) -> AsyncIterator[EventSourceResponse]:
        """The response's event stream. A client that leaves before the answer ends is normal (its
        turn finishes and is kept all the same): one line, not a server error with a traceback."""
        async with sse_response(request, allow_all_methods=True) as events:
            try:
                yield events
            except ConnectionResetError:
                log.info("API: the client of %s %s (%s) left before the answer ended; its turn finishes without it",
                         request.method, request.path, request[CALLER].name)

    # --- /v1/ask ------------------------------------------------------------------------------------
    async def ask(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        question = self._text(body, "question", required=True)
        conversation = self._id(body, "conversation") or uuid.uuid4().hex
        inquiry = self._inquiry(request[CALLER], question or "", conversation, self._id(body, "user"))
        claimed = await self._claim(request)
        async with self._events(request) as events:
            await events.send(json.dumps({"conversation": conversation}), event="ready")
            async for name, payload in self._turn(inquiry, claimed, "ask"):
                if name == "final":
                    payload = {**payload.to_dict(), "turn_id": payload.trace.turn_id, "conversation": conversation}
                    payload.pop("trace")
                await events.send(json.dumps(payload, ensure_ascii=False), event=name)
            await events.send("{}", event="__close__")
        return events

    # --- /v1/chat/completions (OpenAI) --------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.settings.model, "object": "model", "created": 0, "owned_by": "kbbot"}]})

    @staticmethod
    def _question(body: dict[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
                or messages[-1].get("role") != "user":
            raise _error(400, "`messages` must end with a user message.", "invalid_messages")
        content = messages[-1].get("content")
        if isinstance(content, list):  # content parts: the text ones are the question
            content = "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict)
                                and p.get("type") == "text")
        if not isinstance(content, str) or not content.strip():
            raise _error(400, "The last user message has no text.", "invalid_messages")
        return content

    def _completion(self, completion_id: str, created: int, *, delta: dict[str, Any] | None = None,
                    message: dict[str, Any] | None = None, finish: str | None = None,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if delta is not None:
            choice["delta"] = delta
        if message is not None:
            choice["message"] = message
        return {"id": completion_id, "object": "chat.completion.chunk" if delta is not None else "chat.completion",
                "created": created, "model": self.settings.model, "choices": [choice], **(extra or {})}

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        question = self._question(body)
        user = self._id(body, "user")
        conversation = self._id(body, "conversation_id") or user or uuid.uuid4().hex
        inquiry = self._inquiry(request[CALLER], question, conversation, user)
        claimed = await self._claim(request)
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not body.get("stream"):
            text, extra = "", {}
            async for name, payload in self._turn(inquiry, claimed, "chat"):
                if name == "final":
                    text = payload.text + sources_markdown(payload.citations)
                    extra = {"kbbot": self._summary(payload, conversation)}
                elif name == "error":
                    text, extra = payload["message"], {"kbbot": {"outcome": Outcome.ERROR.value,
                                                                 "conversation": conversation}}
            return web.json_response(self._completion(
                completion_id, created, message={"role": "assistant", "content": text}, finish="stop", extra=extra))
        async with self._events(request) as events:
            async def send(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
                chunk = self._completion(completion_id, created, delta=delta, finish=finish, extra=extra)
                await events.send(json.dumps(chunk, ensure_ascii=False))

            await send({"role": "assistant", "content": ""})
            streamed = False
            async for name, payload in self._turn(inquiry, claimed, "chat"):
                if name == "delta":
                    streamed = True
                    await send({"content": payload["text"]})
                elif name == "final":
                    # What was streamed stays; an answer that was not streamed (cached, not found) comes whole.
                    await send({"content": ("" if streamed else payload.text) + sources_markdown(payload.citations)})
                    await send({}, "stop", kbbot=self._summary(payload, conversation))
                elif name == "error":
                    await send({"content": ("\n\n" if streamed else "") + payload["message"]})
                    await send({}, "stop", kbbot={"outcome": Outcome.ERROR.value, "conversation": conversation})
            await events.send("[DONE]")
        return events

    @staticmethod
    def _summary(answer: Answer, conversation: str) -> dict[str, Any]:
        return {"outcome": answer.outcome.value, "turn_id": answer.trace.turn_id, "conversation": conversation,
                "citations": [c.to_dict() for c in answer.citations]}
