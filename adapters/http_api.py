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
again (within ``api.dedupe_ttl_s``) gets 409. The turn itself is the conversation service's, as on
every platform: rate limits, capacity, question caps and friendly failures apply unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp_sse import sse_response

from bot.api_settings import ApiSettings, ApiToken
from bot.conversation import Conversations
from bot.state import Claim, TaskSet
from bot.types import Answer, Citation, Inquiry, Outcome

log = logging.getLogger("kbbot.api")

CALLER = web.RequestKey("api_caller", ApiToken)

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


def sources_markdown(citations: list[Citation]) -> str:
    """The sources block appended to a chat completion: one numbered line each, linked when a URL."""
    if not citations:
        return ""
    lines = [f"[{c.index}] [{c.label}]({c.url})" if c.url else f"[{c.index}] {c.label}" for c in citations]
    return "\n\n**Sources**\n" + "\n".join(lines)


def _error(status: int, message: str, code: str) -> web.HTTPException:
    """An error in the OpenAI shape, which its clients read the message of."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}})
    kind = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 409: web.HTTPConflict,
            413: web.HTTPRequestEntityTooLarge}[status]
    extra = {"max_size": 0, "actual_size": 0} if status == 413 else {}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return kind(text=body, content_type="application/json", headers=headers, **extra)


class HttpApi:
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
        return await handler(request)

    # --- one turn -----------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if len(raw) > self.settings.max_body_kb * 1024:
            raise _error(413, f"The request is larger than {self.settings.max_body_kb} KiB.", "request_too_large")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _error(400, "The body must be a JSON object.", "invalid_json") from None
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

    async def _claim(self, request: web.Request) -> Claim | None:
        """The ``Idempotency-Key`` claimed for this caller (None: no key); 409 when that request was
        already answered."""
        key = request.headers.get("Idempotency-Key", "").strip()
        if not key:
            return None
        claimed = await self.conversations.claim([f"api:request:{request[CALLER].name}:{key[:200]}"],
                                                 self.settings.dedupe_ttl_s)
        if claimed is None:
            log.info("API: request %s of %s was already answered; not answering twice", key, request[CALLER].name)
            raise _error(409, "A request with this Idempotency-Key was already answered.", "duplicate_request")
        return claimed

    def _inquiry(self, caller: ApiToken, question: str, conversation: str, user: str | None) -> Inquiry:
        return Inquiry(platform="api", tenant=caller.name, channel=caller.name,
                       thread_key=f"api:{caller.name}:{conversation}", user_id=user or conversation, text=question,
                       spaces=caller.spaces)

    async def _turn(self, inquiry: Inquiry, claimed: Claim | None, kind: str) -> AsyncIterator[Event]:
        """Runs the turn and yields its events as they happen; the turn finishes even if the client
        leaves (its history and records are written either way)."""
        reply = EventReply()

        async def run() -> None:
            self._tasks.track_current()
            try:
                await self.conversations.answer(inquiry, reply, claimed=claimed, event_id=uuid.uuid4().hex, kind=kind)
            finally:
                reply.events.put_nowait(None)

        turn = asyncio.create_task(run(), name=f"api turn {inquiry.thread_key}")
        while (event := await reply.events.get()) is not None:
            yield event
        await turn

    # --- /v1/ask ------------------------------------------------------------------------------------
    async def ask(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        question = self._text(body, "question", required=True)
        conversation = self._text(body, "conversation") or uuid.uuid4().hex
        inquiry = self._inquiry(request[CALLER], question or "", conversation, self._text(body, "user"))
        claimed = await self._claim(request)
        async with sse_response(request, allow_all_methods=True) as events:
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
        user = self._text(body, "user")
        conversation = self._text(body, "conversation_id") or user or uuid.uuid4().hex
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
        async with sse_response(request, allow_all_methods=True) as events:
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
