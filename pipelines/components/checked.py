"""The answer's generator behind the sentence gate: what it writes reaches the stream, and the
answer, one checked sentence at a time (``pipelines.grounding``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage, ComponentInfo, StreamingChunk
from haystack.dataclasses.streaming_chunk import StreamingCallbackT

from pipelines.components.extractive import HEADINGS, ExtractiveAnswerer
from pipelines.components.throttle import warm_up_async
from pipelines.components.turn import current_ledger
from pipelines.grounding import SentenceEmbedder, SentenceGate, SupportCheck
from pipelines.text import link_host


def source_url(doc: Document) -> str:
    """A chunk's source when it is a web address (a page or a wiki page), else ""."""
    source = str((doc.meta or {}).get("source") or "")
    return source if source.startswith(("http://", "https://")) else ""


def allowed_hosts(sources: Collection[Document]) -> set[str]:
    """The hosts an answer may link to: those of its sources' pages."""
    return {h for d in sources if (h := link_host(source_url(d)))}


_JUDGES: ThreadPoolExecutor | None = None
_JUDGES_LOCK = threading.Lock()


def _judges() -> ThreadPoolExecutor:
    """The threads that judge sentences by meaning for async turns: two, as the embedding model uses the
    machine's cores itself; made on first use."""
    global _JUDGES
    with _JUDGES_LOCK:
        if _JUDGES is None:
            _JUDGES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kbbot-gate")
        return _JUDGES


class CheckedAnswer:
    """Runs ``generator`` with its stream passed through a ``SentenceGate`` over the ``sources`` the answer
    may cite (``CheckedChatAnswer``: a chat generator, ``messages`` in; ``CheckedExtractiveAnswer``: an
    ``ExtractiveAnswerer``, ``question`` in; ``checked`` picks one).

    Outputs ``replies`` (the text shown: the checked sentences; the gate's counts in the reply's
    ``meta["check"]``), or ``not_found`` when not one of its sentences is supported (the number of
    sentences left out); and ``draft``, the generator's own text (what evaluations compare).
    """

    def __init__(self, generator: Any, *, embedder: SentenceEmbedder | None = None,
                 trusted: Collection[str] = tuple(HEADINGS.values())):
        self.generator = generator
        self.embedder = embedder
        self.trusted = tuple(trusted)

    def warm_up(self) -> None:
        if hasattr(self.generator, "warm_up"):
            self.generator.warm_up()

    async def warm_up_async(self) -> None:
        await warm_up_async(self.generator)

    def _gate(self, sources: list[Document]) -> SentenceGate:
        check = SupportCheck([d.content or "" for d in sources], self.embedder)
        return SentenceGate(check, allowed_hosts=allowed_hosts(sources), trusted=self.trusted)

    @staticmethod
    def _chunk(text: str) -> StreamingChunk:
        return StreamingChunk(content=text, component_info=ComponentInfo(type="CheckedAnswer", name="generate"))

    def _result(self, gate: SentenceGate, result: dict[str, Any]) -> dict[str, Any]:
        replies: list[ChatMessage] = result.get("replies") or []
        draft = (replies[0].text if replies else None) or ""
        stats = gate.stats
        counts = {"shown": stats.shown, "left_out": stats.left_out, "repeated": stats.repeated,
                  "markers_added": stats.markers_added, "links_removed": len(stats.links_removed)}
        current_ledger().note("check", **counts)
        if not stats.shown:
            # Nothing the sources hold: the turn ends "not in the knowledge base", not with an empty answer.
            return {"not_found": float(stats.left_out), "draft": draft} if draft.strip() else \
                {"replies": replies, "draft": draft}
        meta = {**(replies[0].meta or {}), "check": counts, "links_removed": list(stats.links_removed)}
        return {"replies": [ChatMessage.from_assistant(gate.text.strip(), meta=meta)], "draft": draft}

    def _checked(self, inputs: dict[str, Any], sources: list[Document], streaming_callback: StreamingCallbackT | None
                 ) -> dict[str, Any]:
        gate = self._gate(sources)

        def gated(chunk: StreamingChunk) -> None:
            shown = gate.feed(chunk.content or "")
            if shown and streaming_callback is not None:
                streaming_callback(self._chunk(shown))

        result = self.generator.run(**inputs, streaming_callback=gated)
        rest = gate.close()
        if rest and streaming_callback is not None:
            streaming_callback(self._chunk(rest))
        return self._result(gate, result)

    async def _checked_async(self, inputs: dict[str, Any], sources: list[Document],
                             streaming_callback: StreamingCallbackT | None) -> dict[str, Any]:
        gate = self._gate(sources)

        async def emit(text: str) -> None:
            if text and streaming_callback is not None:
                shown = streaming_callback(self._chunk(text))
                if asyncio.iscoroutine(shown):
                    await shown

        async def judged(judge: Callable[[], str], final: bool = False) -> str:
            # A sentence in another language than a source is judged by the embedding model (~40 ms, a
            # source's sentences the first time ~0.3 s): on the event loop that would stall every other
            # turn's stream, acknowledgement and event meanwhile, so it goes to the gate's own threads
            # (not the default pool, where it would queue behind other turns' retrieval). The words
            # alone decide in microseconds and stay on the loop.
            if not gate.may_embed(final):
                return judge()
            return await asyncio.get_running_loop().run_in_executor(_judges(), judge)

        async def gated(chunk: StreamingChunk) -> None:
            if gate.add(chunk.content or ""):
                await emit(await judged(gate.release))

        result = await self.generator.run_async(**inputs, streaming_callback=gated)
        await emit(await judged(gate.close, final=True))
        return self._result(gate, result)


@component
class CheckedChatAnswer(CheckedAnswer):
    """A chat generator's answer, checked: it runs once the prompt's ``messages`` arrive (a judgement
    that the sources do not answer sends none, and nothing is written)."""

    @component.output_types(replies=list[ChatMessage], not_found=float, draft=str)
    def run(self, messages: list[ChatMessage], sources: list[Document],
            streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        current_ledger().spent("answer")
        return self._checked({"messages": messages}, sources, streaming_callback)

    @component.output_types(replies=list[ChatMessage], not_found=float, draft=str)
    async def run_async(self, messages: list[ChatMessage], sources: list[Document],
                        streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        current_ledger().spent("answer")
        return await self._checked_async({"messages": messages}, sources, streaming_callback)


@component
class CheckedExtractiveAnswer(CheckedAnswer):
    """The extractive answer, checked (its sentences are the sources' own, so the check shows that
    nothing else reaches the user, links included)."""

    @component.output_types(replies=list[ChatMessage], not_found=float, draft=str)
    def run(self, question: str, sources: list[Document], streaming_callback: StreamingCallbackT | None = None
            ) -> dict[str, Any]:
        return self._checked({"question": question, "sources": sources}, sources, streaming_callback)

    @component.output_types(replies=list[ChatMessage], not_found=float, draft=str)
    async def run_async(self, question: str, sources: list[Document],
                        streaming_callback: StreamingCallbackT | None = None) -> dict[str, Any]:
        return await self._checked_async({"question": question, "sources": sources}, sources, streaming_callback)


def checked(generator: Any, *, embedder: SentenceEmbedder | None = None) -> CheckedAnswer:
    """``generator`` behind the sentence gate, with the inputs its kind takes."""
    kind = CheckedExtractiveAnswer if isinstance(generator, ExtractiveAnswerer) else CheckedChatAnswer
    return kind(generator, embedder=embedder)
