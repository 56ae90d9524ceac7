"""A local stand-in for an OpenAI-compatible chat endpoint (Ollama, vLLM, DashScope) and for a
text-embeddings-inference style ``/rerank`` endpoint, served on 127.0.0.1 for the real clients."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer


class FakeOpenAI(LocalServer):
    """``POST /v1/chat/completions`` (JSON or SSE stream) and ``POST /rerank``.

    ``reply(request_json) -> str`` chooses the answer; ``rerank(query, texts) -> scores``
    scores passages. Every request body is kept in ``requests``.
    """

    def __init__(self, reply: Callable[[dict[str, Any]], str] | None = None,
                 rerank: Callable[[str, list[str]], list[float]] | None = None,
                 alternatives: Callable[[dict[str, Any]], dict[str, float]] | None = None):
        super().__init__()
        self.reply = reply or (lambda req: "ok")
        self.rerank = rerank or (lambda query, texts: [float(len(t)) for t in texts])
        # For a request asking for ``logprobs``: the first token's alternatives, token -> probability
        # (llama.cpp's server answers in OpenAI's shape, ``top_logprobs`` best first).
        self.alternatives = alternatives or (lambda req: {})
        self.requests: list[dict[str, Any]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/rerank", self._rerank)

    def _logprobs(self, body: dict[str, Any]) -> dict[str, Any]:
        import math

        ranked = sorted(self.alternatives(body).items(), key=lambda kv: -kv[1])[: int(body.get("top_logprobs") or 1)]
        entries = [{"token": t, "logprob": math.log(p) if p > 0 else -100.0, "bytes": list(t.encode())}
                   for t, p in ranked]
        if not entries:
            return {"content": []}
        return {"content": [{**entries[0], "top_logprobs": entries}]}

    async def _rerank(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        scores = self.rerank(body["query"], body["texts"])
        ranked = sorted(({"index": i, "score": s} for i, s in enumerate(scores)), key=lambda r: -r["score"])
        return web.json_response(ranked)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        text = self.reply(body)
        created = int(time.time())
        base = {"id": "chatcmpl-fake", "created": created, "model": body.get("model", "fake")}
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}
            if body.get("logprobs"):
                choice["logprobs"] = self._logprobs(body)
            return web.json_response({
                **base, "object": "chat.completion", "choices": [choice],
                "usage": {"prompt_tokens": 10, "completion_tokens": len(text.split()), "total_tokens": 10},
            })
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = [w + " " for w in text.split(" ")] if text else []
        if pieces:
            pieces[-1] = pieces[-1][:-1]
        for i, piece in enumerate(pieces):
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            chunk = {**base, "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {**base, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await response.write(f"data: {json.dumps(end)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
