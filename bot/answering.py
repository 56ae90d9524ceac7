"""One turn: an ``Inquiry`` in, a streamed, cited ``Answer`` out through the adapter's ``Reply``."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from haystack import Document, Pipeline
from haystack.dataclasses import ChatMessage, StreamingChunk

from bot.history import HistoryStore
from bot.messages import say
from bot.types import Answer, Citation, Inquiry, Outcome, Reply, Trace
from pipelines.errors import EmptyModelReply, diagnose
from pipelines.query import query_inputs
from pipelines.store import space_filter
from pipelines.text import detect_language
from pipelines.tracing import install_stage_timer, record_stages

log = logging.getLogger("kbbot.answering")

_MARKER = re.compile(r"\[(\d{1,3})\]")


def resolve_citations(text: str, sources: list[Document]) -> tuple[str, list[Citation]]:
    """Citations for the ``[n]`` markers in ``text``; markers that refer to no source are removed.

    Numbers stay those the model saw, so text already streamed and the final sources agree.
    """
    cited: dict[int, Citation] = {}

    def keep(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if not 1 <= n <= len(sources):
            return ""
        if n not in cited:
            meta = sources[n - 1].meta or {}
            cited[n] = Citation(
                index=n,
                doc_id=str(meta.get("doc_id", "")),
                version=int(meta.get("version", 0)),
                position=int(meta.get("position", 0)),
                title=str(meta.get("title") or meta.get("source") or ""),
                source=str(meta.get("source") or ""),
            )
        return match.group(0)

    cleaned = _MARKER.sub(keep, text)
    return cleaned, [cited[n] for n in sorted(cited)]


class Answerer:
    """Runs turns: history, the query pipeline with streaming, citations, history again, trace."""

    def __init__(
        self,
        pipeline: Pipeline,
        history: HistoryStore,
        *,
        mode: str = "hybrid",
        turn_timeout_s: float = 120,
        max_question_chars: int = 4000,
    ):
        self.pipeline = pipeline
        self.history = history
        self.mode = mode
        self.turn_timeout_s = turn_timeout_s
        self.max_question_chars = max_question_chars
        install_stage_timer()

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        trace = Trace()
        question = inquiry.text.strip()
        language = detect_language(question)
        if not question:
            return await self._refuse(reply, trace, say("empty_question", language))
        if len(question) > self.max_question_chars:
            return await self._refuse(
                reply, trace, say("too_long", language, length=len(question), limit=self.max_question_chars)
            )
        try:
            return await asyncio.wait_for(self._answer(inquiry, question, reply, trace), self.turn_timeout_s)
        except asyncio.TimeoutError:
            log.warning("turn %s timed out after %.0f s", trace.turn_id, self.turn_timeout_s)
            return await self._refuse(reply, trace, say("timeout", language, seconds=self.turn_timeout_s))
        except Exception as exc:  # every failure ends with a visible message, never silence
            diagnosis = diagnose(exc)
            log.error("turn %s failed: %s (%s)", trace.turn_id, diagnosis.kind, diagnosis.reason,
                      exc_info=diagnosis.kind == "internal")
            key = {"model": "model_unavailable", "model_empty": "model_empty", "store": "store_unavailable",
                   "state": "state_unavailable"}.get(diagnosis.kind, "internal")
            return await self._refuse(reply, trace, say(key, language, reason=diagnosis.reason,
                                                        turn_id=trace.turn_id))

    async def _refuse(self, reply: Reply, trace: Trace, message: str) -> Answer:
        await reply.fail(message)
        return Answer(text=message, outcome=Outcome.ERROR, trace=trace)

    async def _answer(self, inquiry: Inquiry, question: str, reply: Reply, trace: Trace) -> Answer:
        started = time.perf_counter()
        await reply.start()
        t = time.perf_counter()
        history = await self.history.load(inquiry.thread_key)
        trace.stages["history"] = (time.perf_counter() - t) * 1000
        trace.history_turns = sum(1 for m in history if m.role.value == "user")

        streamed: list[str] = []

        async def on_chunk(chunk: StreamingChunk) -> None:
            if not chunk.content:  # Anthropic streams empty chunks for start/stop events
                return
            if trace.first_token_ms is None:
                trace.first_token_ms = (time.perf_counter() - started) * 1000
            streamed.append(chunk.content)
            await reply.push(chunk.content)

        data = query_inputs(question, mode=self.mode, filters=space_filter(list(inquiry.spaces)),
                            history=history, streaming_callback=on_chunk)
        with record_stages(trace.stages):
            result: dict[str, Any] = await self.pipeline.run_async(data, include_outputs_from={"budget", "gate"})

        language = detect_language(question)
        if "not_found" in result.get("gate", {}):
            answer = Answer(text=say("not_found", language), outcome=Outcome.NOT_FOUND, trace=trace)
        else:
            replies: list[ChatMessage] = result["generate"]["replies"]
            text = (replies[0].text if replies else None) or ""
            if not text.strip():
                raise EmptyModelReply("the model returned no text")
            usage = (replies[0].meta or {}).get("usage")
            if usage:
                trace.usage = dict(usage)
            text, citations = resolve_citations(text.strip(), result["budget"]["sources"])
            answer = Answer(text=text, outcome=Outcome.ANSWERED, citations=citations, trace=trace)

        # History is written only once the answer exists: a failed turn leaves no half turn.
        t = time.perf_counter()
        await self.history.append(
            inquiry.thread_key, [ChatMessage.from_user(question), ChatMessage.from_assistant(answer.text)]
        )
        trace.stages["history"] += (time.perf_counter() - t) * 1000
        trace.stages["total"] = (time.perf_counter() - started) * 1000
        await reply.finish(answer)
        log.info("turn %s %s in %.0f ms", trace.turn_id, answer.outcome.value, trace.stages["total"])
        return answer
