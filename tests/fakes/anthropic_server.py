"""A local stand-in for the Anthropic Messages API, for tests and benchmarks.

The bot talks to Claude through the real ``anthropic`` SDK (directly and via haystack's
``AnthropicChatGenerator``). Mocking the SDK would hide exactly the failures we care about: SSE parsing,
connections cut mid-answer, 529s, retry headers, the auth header the SDK really sends. So instead this module
serves the wire format on 127.0.0.1 and the real client is pointed at it with ``ANTHROPIC_BASE_URL``.

Async tests::

    async with FakeAnthropic() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        fake.responder = lambda req: Script("hello", tokens_per_second=50)

Sync tests (CLI, ``generator.run``) cannot share the test's loop, so the server gets its own thread::

    with FakeAnthropic().run_in_thread() as fake:
        ...
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiohttp import web

from tests.fakes.local_server import LocalServer

__all__ = [
    "ERROR_MESSAGES",
    "ERROR_TYPES",
    "FakeAnthropic",
    "RecordedRequest",
    "Responder",
    "Script",
    "default_responder",
    "rate_headers",
    "tokenize",
]

JSON: TypeAlias = dict[str, Any]

#: Default ``error.type`` per status, taken from Anthropic's error docs, so a test only has to set ``status``.
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

#: Human-readable messages resembling the real ones; nothing in the SDK depends on the wording.
ERROR_MESSAGES: dict[str, str] = {
    "invalid_request_error": "Invalid request",
    "authentication_error": "invalid x-api-key",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "The requested resource could not be found.",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit",
    "api_error": "Internal server error",
    "overloaded_error": "Overloaded",
}


@dataclass
class Script:
    """How the fake answers one request.

    Every knob models a behaviour of the real service the bot must survive: slow or bursty token streams,
    long time-to-first-token, connections dropped mid-answer, empty completions and the documented error statuses.
    """

    text: str = ""
    #: Stream pacing. ``None`` sends everything as fast as possible. For non-streaming requests the same total
    #: generation time is spent before the JSON is returned, so latency benchmarks mean the same in both modes.
    tokens_per_second: float | None = None
    #: Seconds between the stream's ``message_start`` and the first text delta (the model "thinking").
    first_token_delay: float = 0.0
    #: Abort the TCP connection after this many text deltas: no ``content_block_stop``, no ``message_stop``,
    #: no terminating chunk. ``0`` cuts right after ``content_block_start``. For non-streaming requests the
    #: connection is dropped before any response is sent.
    cut_after_tokens: int | None = None
    #: Reply with ``content: []`` and, when streaming, no content block at all; the real API does this e.g. when
    #: an assistant prefill already ends the turn.
    empty: bool = False
    #: Answer with this HTTP error status (and an Anthropic error body) instead of a message.
    status: int | None = None
    #: ``error.type`` for ``status``; derived from the status when ``None``.
    error_type: str | None = None
    #: ``error.message`` for ``status``; a realistic default when ``None``.
    error_message: str | None = None
    #: ``retry-after`` header (seconds) sent with an error; 429 defaults to 1 like the real API.
    retry_after: float | None = None
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None
    #: Extra response headers, on errors and answers alike: the rate headers the real API sends
    #: (``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset``, the tokens' twins), see
    #: ``rate_headers``.
    headers: dict[str, str] = field(default_factory=dict)

    def resolved_error_type(self) -> str:
        """``error_type``, falling back to what the real API uses for ``status``."""
        if self.error_type is not None:
            return self.error_type
        return ERROR_TYPES.get(self.status or 500, "api_error")


#: Request JSON in, reply out. A plain ``str`` means ``Script(text=...)``. May be async.
Responder: TypeAlias = Callable[[JSON], "Script | str | Awaitable[Script | str]"]


@dataclass
class RecordedRequest:
    """One request as the fake saw it, so tests can assert what the model was actually given."""

    path: str
    #: Lower-cased names, so lookups do not depend on how a client spells them.
    headers: dict[str, str]
    #: Parsed body; ``None`` if it was not valid JSON.
    json: JSON | None
    received_at: float
    #: HTTP status the fake answered with (200 for streams, even ones later cut).
    status: int = 200
    #: The fake dropped the connection on purpose (``Script.cut_after_tokens``).
    cut: bool = False
    script: Script | None = None
    #: ``time.monotonic()`` when the first / last text token left the server; ``None`` if none did.
    first_token_at: float | None = None
    last_token_at: float | None = None
    #: Text tokens actually sent (a cut stream sends fewer than the script has).
    tokens_sent: list[str] = field(default_factory=list)

    @property
    def body(self) -> JSON:
        """The request JSON, or ``{}`` when it did not parse, to keep assertions short."""
        return self.json or {}

    @property
    def system(self) -> str:
        """The system prompt as plain text, whether sent as a string or as text blocks (haystack sends blocks)."""
        return _text_of(self.body.get("system"))

    @property
    def messages(self) -> list[JSON]:
        return list(self.body.get("messages") or [])

    @property
    def last_user_text(self) -> str:
        """Text of the last ``user`` turn, which is what most responders dispatch on."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def api_key(self) -> str | None:
        """The credential, from ``x-api-key`` or ``Authorization: Bearer`` (what SDK 2.14 sends)."""
        return _api_key(self.headers)


def _text_of(content: Any) -> str:
    """Flatten Anthropic ``content`` (a string or a list of blocks) to text; non-text blocks are skipped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, Mapping) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, str):
            parts.append(block)
    return "\n".join(parts)


def _api_key(headers: Mapping[str, str]) -> str | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    if key := lowered.get("x-api-key", "").strip():
        return key
    scheme, _, token = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def rate_headers(limit: int, remaining: int, reset_in_s: float = 60.0) -> dict[str, str]:
    """The request rate headers of the real API: the limit, what remains of it, and when it is full
    again (RFC 3339)."""
    from datetime import UTC, datetime, timedelta

    reset = (datetime.now(UTC) + timedelta(seconds=reset_in_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(max(0, remaining)),
            "anthropic-ratelimit-requests-reset": reset}


def default_responder(request: JSON) -> Script:
    """Answer ``answer to <last user text>`` so a test without a responder can still see its input came through."""
    for message in reversed(request.get("messages") or []):
        if message.get("role") == "user":
            return Script(text=f"answer to {_text_of(message.get('content'))}")
    return Script(text="answer")


_CJK = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u2e80-\u2fdf"  # CJK radicals
    "\u3000-\u303f"  # CJK punctuation
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u31ff"  # Bopomofo, Hangul compat, Katakana ext
    "\u3400-\u4dbf"  # CJK ext A
    "\u4e00-\u9fff"  # CJK unified
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility
    "\uff00-\uffef"  # Fullwidth forms
)
_TOKEN_RE = re.compile(rf"[{_CJK}]{{1,2}}\s*|[^\s{_CJK}]+\s*|\s+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into stream deltas roughly the size Claude sends.

    Words keep their trailing whitespace and CJK runs go out one or two characters at a time, so consumers see
    the same fragmentation (and the same chances to mis-join pieces) as in production. ``"".join`` of the result
    is always ``text``.
    """
    return _TOKEN_RE.findall(text)


def _sse(event: str, data: JSON) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class FakeAnthropic(LocalServer):
    """An aiohttp server speaking the Anthropic Messages API, scripted per request by tests.

    Reply selection, first match wins: scripts queued with :meth:`enqueue` (in order), then :attr:`responder`.
    """

    def __init__(self, responder: Responder | None = None, *, require_auth: bool = True) -> None:
        super().__init__()
        self.responder: Responder = responder or default_responder
        #: When ``False`` requests without credentials are served, for clients that cannot set a key.
        self.require_auth = require_auth
        #: Every request received, including rejected ones, in arrival order.
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Script | str] = deque()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ scripting

    def enqueue(self, *scripts: Script | str) -> None:
        """Queue one-shot replies for the next requests, for tests that care about order rather than content."""
        self._queue.extend(scripts)

    @property
    def last_request(self) -> RecordedRequest:
        if not self.requests:
            raise AssertionError("the fake Anthropic server has received no request")
        return self.requests[-1]

    # ------------------------------------------------------------------ lifecycle (async)

    # ``base_url`` (``http://127.0.0.1:<port>``, the value for ``ANTHROPIC_BASE_URL``), start, stop and
    # ``async with`` come from LocalServer; the short shutdown timeout keeps a test that stops the
    # server while a slow stream is in flight from hanging.
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._handle_messages)

    # ------------------------------------------------------------------ HTTP

    async def _handle_messages(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(
            path=request.path_qs,
            headers={name.lower(): value for name, value in request.headers.items()},
            json=body if isinstance(body, dict) else None,
            received_at=time.monotonic(),
        )
        self.requests.append(record)

        if self.require_auth and _api_key(request.headers) is None:
            return self._error(record, 401, "authentication_error", "x-api-key header is required")
        if record.json is None:
            return self._error(record, 400, "invalid_request_error", "request body is not valid JSON")
        # The real API rejects these; failing here catches a client that forgets them.
        for required in ("model", "max_tokens", "messages"):
            if record.json.get(required) is None:
                return self._error(record, 400, "invalid_request_error", f"{required}: Field required")

        script = await self._script_for(record.json)
        record.script = script
        if script.status is not None:
            retry_after = script.retry_after
            if retry_after is None and script.status == 429:
                retry_after = 1
            return self._error(
                record, script.status, script.resolved_error_type(), script.error_message, retry_after=retry_after,
                headers=script.headers,
            )

        tokens, stop_reason = self._plan(record.json, script)
        if record.stream:
            return await self._stream(request, record, script, tokens, stop_reason)
        return await self._message(request, record, script, tokens, stop_reason)

    async def _script_for(self, body: JSON) -> Script:
        if self._queue:
            reply: Any = self._queue.popleft()
        else:
            reply = self.responder(body)
            if inspect.isawaitable(reply):
                reply = await reply
        return Script(text=reply) if isinstance(reply, str) else reply

    @staticmethod
    def _plan(body: JSON, script: Script) -> tuple[list[str], str]:
        """Tokens to send and the stop reason; like the real API, output stops at ``max_tokens``."""
        tokens = [] if script.empty else tokenize(script.text)
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and 0 < max_tokens < len(tokens):
            return tokens[:max_tokens], "max_tokens"
        return tokens, script.stop_reason

    def _error(
        self,
        record: RecordedRequest,
        status: int,
        error_type: str,
        message: str | None,
        *,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        record.status = status
        request_id = self._new_id("req")
        headers = {**(headers or {}), "request-id": request_id}
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}"
        payload = {
            "type": "error",
            "error": {"type": error_type, "message": message or ERROR_MESSAGES.get(error_type, error_type)},
            "request_id": request_id,
        }
        return web.json_response(payload, status=status, headers=headers)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):04d}{uuid.uuid4().hex[:16]}"

    @staticmethod
    def _usage(body: JSON, output_tokens: int) -> JSON:
        prompt = _text_of(body.get("system")) + "".join(_text_of(m.get("content")) for m in body.get("messages", []))
        return {
            "input_tokens": max(1, len(tokenize(prompt))),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    @staticmethod
    async def _pace(start: float, index: int, script: Script) -> None:
        """Sleep until token ``index`` is due; scheduled from ``start`` so rounding does not accumulate."""
        due = start + script.first_token_delay
        if script.tokens_per_second:
            due += index / script.tokens_per_second
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _message(
        self,
        request: web.Request,
        record: RecordedRequest,
        script: Script,
        tokens: list[str],
        stop_reason: str,
    ) -> web.Response:
        # Spend the time a stream of the same script would take, so latency means the same in both modes.
        await self._pace(time.monotonic(), max(len(tokens) - 1, 0), script)
        if script.cut_after_tokens is not None:
            record.cut = True
            self._abort(request)
            return web.Response()
        if tokens:
            record.first_token_at = record.last_token_at = time.monotonic()
        record.tokens_sent = list(tokens)
        text = "".join(tokens)
        message = {
            "id": self._new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": record.body["model"],
            "content": [{"type": "text", "text": text}] if tokens else [],
            "stop_reason": stop_reason,
            "stop_sequence": script.stop_sequence,
            "usage": self._usage(record.body, len(tokens)),
        }
        return web.json_response(message, headers={**script.headers, "request-id": self._new_id("req")})

    async def _stream(
        self,
        request: web.Request,
        record: RecordedRequest,
        script: Script,
        tokens: list[str],
        stop_reason: str,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                **script.headers,
                "request-id": self._new_id("req"),
            },
        )
        await response.prepare(request)
        try:
            usage = self._usage(record.body, 1)
            await response.write(
                _sse(
                    "message_start",
                    {
                        "type": "message_start",
                        "message": {
                            "id": self._new_id("msg"),
                            "type": "message",
                            "role": "assistant",
                            "model": record.body["model"],
                            "content": [],
                            "stop_reason": None,
                            "stop_sequence": None,
                            "usage": usage,
                        },
                    },
                )
            )
            if not script.empty:
                await response.write(
                    _sse(
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    )
                )
            # The real API interleaves pings; sending one keeps clients honest about skipping unknown events.
            await response.write(_sse("ping", {"type": "ping"}))

            start = time.monotonic()
            for index, token in enumerate(tokens):
                if script.cut_after_tokens is not None and index >= script.cut_after_tokens:
                    break
                await self._pace(start, index, script)
                await response.write(
                    _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}},
                    )
                )
                now = time.monotonic()
                if record.first_token_at is None:
                    record.first_token_at = now
                record.last_token_at = now
                record.tokens_sent.append(token)

            if script.cut_after_tokens is not None:
                record.cut = True
                self._abort(request)
                return response

            if not script.empty:
                await response.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
            await response.write(
                _sse(
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": script.stop_sequence},
                        "usage": {"output_tokens": len(record.tokens_sent)},
                    },
                )
            )
            await response.write(_sse("message_stop", {"type": "message_stop"}))
            await response.write_eof()
            return response
        except ConnectionResetError:
            # The client went away mid-stream (a replica killed while it read the answer): a real API
            # stops writing too; nothing to report.
            return response

    @staticmethod
    def _abort(request: web.Request) -> None:
        """Drop the TCP connection like a crashed proxy would.

        The handler then returns normally: aiohttp's attempt to finish the response hits the closed transport,
        which it treats as a client disconnect (logged at debug level) rather than a handler error.
        """
        transport = request.transport
        if transport is not None:
            transport.abort()
