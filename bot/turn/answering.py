"""One turn: an ``Inquiry`` in, a streamed, cited ``Answer`` out through the adapter's ``Reply``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from haystack import Document, Pipeline
from haystack.dataclasses import ChatMessage, StreamingChunk

from bot.logs import turn_id as current_turn
from bot.messages import say
from bot.metrics import METRICS
from bot.permissions import CITED_META, Audience, Audiences, UnmappedNotice, audience_meta, cited_in, visible_history
from bot.state import LockNotAcquired, ThreadLocks
from bot.state.cache import AnswerCache, ApprovedAnswer, CacheKey, audience_record, cached_label, tenant_of, wants_fresh
from bot.state.history import HistoryStore
from bot.state.preferences import Preferences, PreferenceStore, may_state_preferences, parse_learned
from bot.state.turn_log.recorder import TurnRecorder
from bot.state.turn_log.records import ranked_chunks
from bot.turn.capacity import TurnGate, process_cores
from bot.turn.limits import RateLimiter, refusal_message
from bot.types import Acknowledges, Answer, Citation, Inquiry, Outcome, Reply, ShowsProgress, Trace
from pipelines.citations import attach_missing_markers, normalize_markers
from pipelines.components.turn import TurnLedger
from pipelines.errors import EmptyModelReply, ErrorKind, diagnose
from pipelines.filters import and_filters, space_filter
from pipelines.query import turn_end
from pipelines.text import detect_language, link_host, restrict_links
from pipelines.topics import Topics
from pipelines.tracing import install_stage_timer, record_stages

log = logging.getLogger("kbbot.answering")

_MARKER = re.compile(r"\[(\d{1,3})\]")
#: What a user reads (``bot.messages``) when a turn failed because of each kind of dependency.
FAILURE_MESSAGES = {ErrorKind.MODEL: "model_unavailable", ErrorKind.MODEL_EMPTY: "model_empty",
                    ErrorKind.STORE: "store_unavailable", ErrorKind.STATE: "state_unavailable"}


def resolve_citations(text: str, sources: list[Document]) -> tuple[str, list[Citation]]:
    """Citations for the ``[n]`` markers in ``text``; markers that refer to no source are removed.

    Numbers stay those the model saw, so text already streamed and the final sources agree. Marker
    forms small models write (``【1】``, ``[1,2]``, a line of bare markers) become ``[1][2]`` on the
    line they support first, and a sentence the model left uncited gets the marker of the source
    that holds it (``attach_missing_markers``).
    """
    text = attach_missing_markers(normalize_markers(text), [d.content or "" for d in sources])
    cited: dict[int, Citation] = {}

    def keep(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if not 1 <= n <= len(sources):
            return ""
        if n not in cited:
            cited[n] = Citation.of_chunk(n, sources[n - 1].meta or {})
        return match.group(0)

    cleaned = _MARKER.sub(keep, text)
    return cleaned, [cited[n] for n in sorted(cited)]


def _party(inquiry: Inquiry) -> str:
    """Whose turn it is, for the gate's fair share: the workspace (or bot) on its platform."""
    return f"{inquiry.platform}:{inquiry.tenant}"


@dataclass(frozen=True)
class TurnLimits:
    """What one turn may take (``answering.*``): its time, its question's length, its model calls (the
    answer's included) and retrieval's retries."""

    timeout_s: float = 120
    max_question_chars: int = 4000
    max_model_calls: int = 8
    max_retries: int = 2


@dataclass
class Admission:
    """What a question passes before its turn runs, in this order: the rate limits (``bot.turn.limits``),
    the process's capacity of turns running and queued (``bot.turn.capacity``), and its thread's lock (one
    turn per thread at a time, across replicas with Redis)."""

    limiter: RateLimiter | None = None
    gate: TurnGate | None = None
    thread_locks: ThreadLocks = field(default_factory=ThreadLocks)


@dataclass
class Approvals:
    """The approved-answer cache and what its keys hold besides the question and the spaces."""

    cache: AnswerCache | None = None
    identity: tuple[str, str] = ("extractive", "1")  # (model, policy version)
    knowledge_version: Callable[[], int] | None = None
    #: How long an approval citing no document (an expert's reply) is served: nothing it cites can change,
    #: so no refresh re-checks it (``approvals.uncited_days``).
    uncited_s: float = 30 * 86400


#: Retrieval alone for a question under a filter: the chunks relevant enough to answer from.
Probe = Callable[[str, dict[str, Any]], Awaitable[list[Document]]]


@dataclass
class Permissions:
    """The access rule of a turn (``bot.permissions``): who will see it (``audiences``; None: public
    documents only), the once-only note to askers who cannot be mapped, and the retrieval ``probe`` that
    tells a channel's asker a direct message would find more."""

    audiences: Audiences | None = None
    notice: UnmappedNotice | None = None
    probe: Probe | None = None
    #: Every principal the documents name (``bot.permissions.KnownPrincipals``): the filter sends no other.
    known: Callable[[], frozenset[str]] | None = None
    #: A document's readers now (``doc_id`` -> its record's ``readers``; None: no such document).
    readers: Callable[[str], list[str] | None] | None = None

    async def known_principals(self) -> frozenset[str] | None:
        return await asyncio.to_thread(self.known) if self.known is not None else None

    async def readable(self, doc_ids: Collection[str], audience: Audience) -> dict[str, bool]:
        """Whether ``audience`` may read each document, as its permissions are now (a revoked one: no)."""
        if self.readers is None:
            return dict.fromkeys(doc_ids, True)
        readers = await asyncio.to_thread(lambda: {d: self.readers(d) for d in doc_ids})
        return {d: r is not None and audience.admits({"readers": r}) for d, r in readers.items()}

    async def all_readable(self, answer: Answer, audience: Audience) -> bool:
        """Whether ``audience`` may read every document ``answer`` cites, as their permissions are now:
        an approved answer outlives a refresh that only changed who may read what, so a hit is checked
        again rather than trusted to the key it was kept under."""
        return all((await self.readable({c.doc_id for c in answer.citations}, audience)).values())

    async def history(self, messages: list[ChatMessage], audience: Audience) -> list[ChatMessage]:
        """The thread's history this audience may be shown (``visible_history``): what it was written for,
        and answers citing only what the audience may read now, so that a conversation does not bring
        back a page a refresh has since withdrawn from its asker."""
        if self.readers is None:
            return visible_history(messages, audience)
        readable = await self.readable(cited_in(messages), audience)
        return visible_history(messages, audience, readable.__getitem__)


class Answerer:
    """Runs turns: history, the query pipeline with streaming, outcome, citations checked against
    the current knowledge (regenerated once if a cited document changed meanwhile), history, trace."""

    def __init__(
        self,
        pipeline: Pipeline,
        history: HistoryStore,
        *,
        is_current: Callable[[str, int], bool] | None = None,
        topics: Topics | None = None,
        handoff: dict[str, str] | None = None,
        limits: TurnLimits | None = None,
        admission: Admission | None = None,
        approvals: Approvals | None = None,
        preferences: PreferenceStore | None = None,
        learner: Callable[[str], Awaitable[str | None]] | None = None,
        turns: TurnRecorder | None = None,
        permissions: Permissions | None = None,
    ):
        self.pipeline = pipeline
        self.history = history
        self.is_current = is_current
        self.topics = topics or Topics()
        self.handoff = handoff or {}
        self.limits = limits or TurnLimits()
        self.admission = admission or Admission()
        self.approvals = approvals or Approvals()
        self.preferences = preferences
        self.learner = learner  # one helper model call: system prompt in, reply out
        self.turns = turns  # turn records for the report and the admin page (bot.knowledge.insights)
        self.permissions = permissions or Permissions()
        self._background: set[asyncio.Task[None]] = set()
        install_stage_timer()

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        """One turn; the rate limits are checked first, so a refused question costs nothing else, then
        the process' capacity (a full queue answers "busy" at once), then the thread's lock."""
        trace = Trace()
        token = current_turn.set(trace.turn_id)  # every log line of the turn carries its id
        METRICS.in_progress.inc()
        try:
            refusal = await self.admission.limiter.check(inquiry) if self.admission.limiter is not None else None
            if refusal is not None:
                log.info("turn %s refused: %s rate limit (%d per %g s)", trace.turn_id, refusal.scope,
                         refusal.limit, refusal.window_s)
                METRICS.limit_refusals.labels(refusal.scope).inc()
                trace.steps = [{"step": "rate_limited", "scope": refusal.scope}]
                language = detect_language(wants_fresh(inquiry.text.strip())[1])
                answer = await self._refuse(reply, trace, refusal_message(refusal, language))
                METRICS.observe_turn(inquiry.platform, "rate_limited", trace)
            elif self.admission.gate is not None and not self.admission.gate.admit(_party(inquiry)):
                log.warning("turn %s refused: %d turns admitted (%d running, %d queued): busy", trace.turn_id,
                            self.admission.gate.admitted, self.admission.gate.running, self.admission.gate.queued)
                METRICS.limit_refusals.labels("busy").inc()
                trace.steps = [{"step": "busy"}]
                language = detect_language(wants_fresh(inquiry.text.strip())[1])
                answer = await self._refuse(reply, trace, say("busy", language))
                METRICS.observe_turn(inquiry.platform, "busy", trace)
            else:
                try:
                    answer = await self._turn(inquiry, reply, trace)
                finally:
                    if self.admission.gate is not None:
                        self.admission.gate.leave(_party(inquiry))
                METRICS.observe_turn(inquiry.platform, answer.outcome.value, answer.trace)
            if self.turns is not None:
                await self.turns.keep(inquiry, answer)
            return answer
        finally:
            METRICS.in_progress.dec()
            current_turn.reset(token)

    async def _turn(self, inquiry: Inquiry, reply: Reply, trace: Trace) -> Answer:
        fresh, question = wants_fresh(inquiry.text.strip())
        language = detect_language(question)
        if isinstance(inquiry.spaces, str) or not inquiry.spaces:
            # An adapter's settings gave this conversation no space: searching all of them would leak.
            log.error("turn %s refused: no knowledge space for %s", trace.turn_id, inquiry.thread_key)
            return await self._refuse(reply, trace, say("internal", language, turn_id=trace.turn_id))
        if not question:
            return await self._refuse(reply, trace, say("empty_question", language))
        if len(question) > self.limits.max_question_chars:
            return await self._refuse(
                reply, trace, say("too_long", language, length=len(question), limit=self.limits.max_question_chars)
            )
        if isinstance(reply, Acknowledges):
            await reply.acknowledge()  # a question queued behind others is still seen to be taken
        try:
            async with self.admission.thread_locks.hold(inquiry.thread_key), self._running(inquiry):
                return await asyncio.wait_for(self._answer(inquiry, question, reply, trace, fresh),
                                              self.limits.timeout_s)
        except LockNotAcquired:  # another replica kept the thread's lock past the wait
            log.warning("turn %s: the thread %s stayed locked elsewhere", trace.turn_id, inquiry.thread_key)
            return await self._refuse(reply, trace, say("busy", language))
        except TimeoutError:
            log.warning("turn %s timed out after %.0f s", trace.turn_id, self.limits.timeout_s)
            return await self._refuse(reply, trace, say("timeout", language, seconds=self.limits.timeout_s))
        except Exception as exc:  # every failure ends with a visible message, never silence
            diagnosis = diagnose(exc)
            log.error("turn %s failed: %s (%s)", trace.turn_id, diagnosis.kind.value, diagnosis.detail,
                      exc_info=diagnosis.kind is ErrorKind.INTERNAL)
            key = FAILURE_MESSAGES.get(diagnosis.kind, "internal")
            return await self._refuse(reply, trace, say(key, language, reason=diagnosis.reason,
                                                        turn_id=trace.turn_id))

    async def warm_up(self) -> None:
        """The first turn's one-time costs, paid before a question waits on them: every component of the
        pipeline warmed (``warm_up_async``: models loaded, the answer model's client made) and one retrieval
        of public documents by the permission probe, whose pipeline shares the embedding model and the
        store (the model's first inference, the keyword index built, the store's connection opened).
        Nothing is shown, kept or asked of a model. Errors propagate."""
        await self.pipeline.warm_up_async()
        if self.permissions.probe is not None:
            known = await self.permissions.known_principals()
            await self.permissions.probe("warm-up", Audience.public().filter(known))

    def _running(self, inquiry: Inquiry) -> contextlib.AbstractAsyncContextManager[None]:
        gate = self.admission.gate
        return gate.slot(_party(inquiry)) if gate is not None else contextlib.nullcontext()

    async def _refuse(self, reply: Reply, trace: Trace, message: str) -> Answer:
        await reply.fail(message)
        return Answer(text=message, outcome=Outcome.ERROR, trace=trace)

    async def audience(self, inquiry: Inquiry) -> Audience:
        """Who will see the answer to ``inquiry`` (``bot.permissions``)."""
        if self.permissions.audiences is None:
            return Audience.public(private=inquiry.private)
        return await self.permissions.audiences.of(inquiry, await self.permissions.known_principals())

    async def _run(self, question: str, inquiry: Inquiry, history: list[ChatMessage], ledger: TurnLedger,
                   on_chunk: Any, preferences: str = "", audience: Audience | None = None, *,
                   beside_retrieval: bool = False) -> dict[str, Any]:
        """One run of the query pipeline, spending from and noting in ``ledger``; ``beside_retrieval``: the
        guard's model call runs beside retrieval and the grade (``pipelines.query``)."""
        spaces = list(inquiry.spaces)
        # The permission filter is part of the store's query, never applied to its results afterwards.
        known = await self.permissions.known_principals()
        filters = and_filters(space_filter(spaces), (audience or Audience.public()).filter(known))
        # Flat inputs: Haystack gives each to every component that takes it (``pipelines.query``).
        data = {"question": question, "history": history, "filters": filters, "spaces": spaces or None,
                "preferences": preferences, "streaming_callback": on_chunk, "beside_retrieval": beside_retrieval}
        with ledger.running():
            return await self.pipeline.run_async(data, include_outputs_from={"rank"})

    def _outcome(self, result: dict[str, Any], question: str, trace: Trace) -> Answer:
        language = detect_language(question)
        end = turn_end(result)
        ended = end.outcome
        if ended == "off_topic":
            text = say("off_topic", language, subjects=self.topics.scope_summary() or "our products")
            return Answer(text=text, outcome=Outcome.OFF_TOPIC, trace=trace)
        if ended == "not_found":
            text = say("not_found", language)
            line = self.handoff.get(language) or self.handoff.get("en")
            return Answer(text=f"{text}\n\n{line}" if line else text, outcome=Outcome.NOT_FOUND, trace=trace)
        if ended == "clarify":
            text = say("clarify", language, candidates=", ".join(end.candidates))
            return Answer(text=text, outcome=Outcome.CLARIFY, trace=trace)
        replies = end.replies
        text = (replies[0].text if replies else None) or ""
        if not text.strip():
            raise EmptyModelReply("the model returned no text")
        usage = (replies[0].meta or {}).get("usage")
        if usage:
            trace.usage = dict(usage)
        # The text is what the sentence gate let through, as it was streamed: every sentence supported
        # by what it cites, links only to the sources' hosts (pipelines/grounding.py).
        meta = replies[0].meta or {}
        trace.left_out = int((meta.get("check") or {}).get("left_out") or 0)
        if removed := meta.get("links_removed"):
            log.warning("turn %s: removed %d links to hosts none of the sources is on: %s", trace.turn_id,
                        len(removed), ", ".join(sorted({link_host(u) or u for u in removed})))
        text, citations = resolve_citations(text.strip(), end.sources)
        return Answer(text=text, outcome=Outcome.ANSWERED, citations=citations, trace=trace)

    async def rerun(self, question: str, inquiry: Inquiry, audience: Audience | None = None) -> Answer:
        """``question`` answered again in ``inquiry``'s spaces, shown to nobody and kept nowhere: no reply,
        history, answer cache or turn record (a gap asked again after a refresh, an approval re-checked, a
        golden replay). The same pipeline and checks as a turn (answerability, each sentence's support),
        as a thread's first question. Built only from what ``audience`` may read (default: public
        documents, ``bot.permissions``), so nothing said later reaches readers a turn would not. An answer
        citing a document that changed meanwhile is not one: it comes back ``not_found``. Errors propagate."""
        if isinstance(inquiry.spaces, str) or not inquiry.spaces:
            raise ValueError("a question is only answered again within the spaces it was asked in")
        trace = Trace()
        ledger = TurnLedger.start(max_model_calls=self.limits.max_model_calls, timeout_s=self.limits.timeout_s,
                                  max_retries=self.limits.max_retries)

        async def run() -> Answer:
            result = await self._run(question, inquiry, [], ledger, None, audience=audience)
            answer = self._outcome(result, question, trace)
            trace.steps = list(ledger.steps)
            trace.ranked = ranked_chunks(result.get("rank", {}).get("documents"))
            trace.model_calls = len(ledger.calls)
            return answer

        with record_stages(trace.stages, None):
            answer = await asyncio.wait_for(run(), self.limits.timeout_s)
        if await self._stale(answer):
            answer = Answer(text=answer.text, outcome=Outcome.NOT_FOUND, trace=trace)
        return answer

    def _core_to_spare(self) -> bool:
        """Whether this turn may run its guard's model call beside retrieval and the grade: while no more
        turns run than the process has cores to use (its affinity mask and container quota, not the
        host's count). Beyond that the turns wait for CPU, not for the model, and side by side they only
        contend: at 50 questions together the overlap made first texts later
        (docs/benchmarks.md, "The guard beside retrieval"), while alone it saves a question the guard's round trip."""
        gate = self.admission.gate
        return gate is None or gate.running <= process_cores()

    async def _stale(self, answer: Answer) -> list[Citation]:
        """Cited chunks whose document was revoked or replaced since retrieval."""
        if self.is_current is None or not answer.citations:
            return []
        checks = await asyncio.to_thread(lambda: [self.is_current(c.doc_id, c.version) for c in answer.citations])
        return [c for c, ok in zip(answer.citations, checks) if not ok]

    async def _cache_key(self, inquiry: Inquiry, question: str, audience: Audience) -> CacheKey | None:
        if self.approvals.cache is None or self.approvals.knowledge_version is None:
            return None
        version = await asyncio.to_thread(self.approvals.knowledge_version)
        return CacheKey.of(question, inquiry.spaces, version, *self.approvals.identity, tenant=tenant_of(inquiry),
                           audience=await self.readers_key(audience))

    async def readers_key(self, audience: Audience) -> str:
        """What answers kept for ``audience`` (approved ones) go under: its key narrowed to the principals
        some document names (``Audience.projected``); the knowledge version beside it in a ``CacheKey``
        retires it when those change."""
        return (await self.projected(audience)).key

    async def projected(self, audience: Audience) -> Audience:
        known = await self.permissions.known_principals()
        return audience.projected(known) if known is not None else audience

    async def _servable(self, hit: ApprovedAnswer, audience: Audience, turn_id: str) -> bool:
        """Whether an approved answer may be served to ``audience`` now; why not is logged."""
        answer = hit.to_answer()
        if await self._stale(answer):
            # A cited document changed since the approval: never served in its old form (the
            # re-check after the refresh asks a reviewer; meanwhile the question is answered afresh).
            why = "cites changed documents"
        elif not await self.permissions.all_readable(answer, audience):
            why = "cites documents this audience may no longer read"
        elif hit.readers is not None and not audience.admits({"readers": hit.readers}):
            why = "was said where this audience is not"
        elif not hit.citations and time.time() - hit.approved_at > self.approvals.uncited_s:
            why = "cites nothing and is older than approvals.uncited_days"
        else:
            return True
        log.info("turn %s: the approved answer of turn %s %s; answering afresh", turn_id, hit.turn_id, why)
        return False

    async def _elsewhere(self, inquiry: Inquiry, question: str, audience: Audience) -> bool:
        """For a question not found where others see the answer: whether the asker's own access (a direct
        message) has relevant chunks this audience may not read."""
        alone = audience.alone()
        if alone is None or self.permissions.probe is None:
            return False
        known = await self.permissions.known_principals()
        found = await self.permissions.probe(question, and_filters(space_filter(list(inquiry.spaces)),
                                                                   alone.filter(known)))
        return any(not audience.admits(d.meta or {}) for d in found)

    async def _permission_notes(self, inquiry: Inquiry, question: str, answer: Answer, audience: Audience) -> None:
        language = detect_language(question)
        if answer.outcome is Outcome.NOT_FOUND and await self._elsewhere(inquiry, question, audience):
            answer.text = f"{answer.text}\n\n{say('ask_in_dm', language)}"
            answer.trace.steps.append({"step": "permissions", "ask_in_dm": True})
        # Told where only the asker reads it, and only where identities are mapped at all (nothing
        # configured: everyone reads public documents, and nobody needs telling).
        notice, audiences = self.permissions.notice, self.permissions.audiences
        if (not audience.mapped and audience.private and notice is not None and audiences is not None
                and audiences.maps(inquiry.platform) and await notice.first_time(inquiry)):
            answer.text = f"{answer.text}\n\n{say('unmapped_identity', language)}"

    def _learn_later(self, inquiry: Inquiry, question: str, prefs: Preferences) -> None:
        """Background: explicit answering preferences in the message, for a user who opted in."""
        if self.preferences is None or self.learner is None or not prefs.remember:
            return
        if not may_state_preferences(question):
            return

        async def learn() -> None:
            try:
                learned = parse_learned(await self.learner(question))
                if learned:
                    current = await self.preferences.load(inquiry.platform, inquiry.tenant, inquiry.user_id)
                    if current.remember:  # consent may have been withdrawn meanwhile
                        current.learned.update(learned)
                        await self.preferences.save(inquiry.platform, inquiry.tenant, inquiry.user_id, current)
                        log.info("learned preferences %s for user %s", sorted(learned), inquiry.user_id)
            except Exception as exc:  # noqa: BLE001 - learning is best effort and never blocks a turn
                log.warning("preference learning failed for user %s: %s", inquiry.user_id, type(exc).__name__)

        task = asyncio.create_task(learn())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _answer(self, inquiry: Inquiry, question: str, reply: Reply, trace: Trace, fresh: bool) -> Answer:
        started = time.perf_counter()
        await reply.start()
        audience = await self.audience(inquiry)
        t = time.perf_counter()
        # Only what was written for this same audience, citing what it may still read: an earlier answer
        # for other readers, or from a page withdrawn since, may hold what this one may not read.
        history = await self.permissions.history(await self.history.load(inquiry.thread_key), audience)
        trace.stages["history"] = (time.perf_counter() - t) * 1000
        trace.history_turns = sum(1 for m in history if m.role.value == "user")
        # Only a thread's first question is standalone for sure: later ones may lean on history
        # ("and the second one?"), so they are neither served from nor offered to the cache.
        key = await self._cache_key(inquiry, question, audience) if not history else None
        if key is not None and not fresh:
            hit = await self.approvals.cache.lookup(key)
            if hit is not None and await self._servable(hit, audience, trace.turn_id):
                answer = hit.to_answer()
                answer.trace = trace
                # The link filter of a written answer: only links to its sources' hosts (none for an
                # expert's reply), whatever was approved.
                answer.text, _ = restrict_links(answer.text, {
                    h for c in answer.citations if c.source.startswith(("http://", "https://"))
                    and (h := link_host(c.source))})
                answer.text = f"{cached_label(answer, detect_language(question))}\n\n{answer.text}"
                return await self._conclude(inquiry, question, answer, reply, started, audience)

        prefs = Preferences()
        if self.preferences is not None:
            prefs = await self.preferences.load(inquiry.platform, inquiry.tenant, inquiry.user_id)

        async def on_chunk(chunk: StreamingChunk) -> None:
            if not chunk.content:  # Anthropic streams empty chunks for start/stop events
                return
            if trace.first_token_ms is None:
                trace.first_token_ms = (time.perf_counter() - started) * 1000
            await reply.push(chunk.content)

        note = prefs.prompt_note()
        ledger = TurnLedger.start(max_model_calls=self.limits.max_model_calls, timeout_s=self.limits.timeout_s,
                                  max_retries=self.limits.max_retries)
        with record_stages(trace.stages, reply.progress if isinstance(reply, ShowsProgress) else None):
            result = await self._run(question, inquiry, history, ledger, on_chunk, note, audience,
                                     beside_retrieval=self._core_to_spare())
        answer = self._outcome(result, question, trace)
        calls = len(ledger.calls)
        steps = list(ledger.steps)

        stale = await self._stale(answer)
        if stale:
            # A cited document changed while the answer was written: answer again, once, on what is
            # current now (quietly: the final message replaces what was streamed), within the turn's caps.
            log.warning("turn %s: cited %s changed during generation; regenerating", trace.turn_id,
                        ", ".join(sorted({c.doc_id for c in stale})))
            trace.regenerated = True
            again = TurnLedger(max_model_calls=max(self.limits.max_model_calls - calls, 1), deadline=ledger.deadline,
                               retries_left=0)
            result = await self._run(question, inquiry, history, again, None, note, audience)
            answer = self._outcome(result, question, trace)
            calls += len(again.calls)
            steps += [{"step": "regenerate"}, *again.steps]
            if await self._stale(answer):
                answer.text = f"{answer.text}\n\n{say('stale_notice', detect_language(question))}"

        trace.ranked = ranked_chunks(result.get("rank", {}).get("documents"))
        trace.query = next((s["query"] for s in steps if s.get("step") == "rewrite" and "query" in s), question)
        trace.steps = steps
        trace.model_calls = calls
        # An answer shaped by one user's preferences is not everyone's answer: it is not offered.
        if key is not None and answer.outcome is Outcome.ANSWERED and not trace.regenerated and not note:
            await self.approvals.cache.offer(trace.turn_id, key, answer, question,  # a reviewer may approve it
                                             audience=audience_record(await self.projected(audience)))
            answer.approvable = True
        self._learn_later(inquiry, question, prefs)
        await self._permission_notes(inquiry, question, answer, audience)
        return await self._conclude(inquiry, question, answer, reply, started, audience)

    async def _conclude(self, inquiry: Inquiry, question: str, answer: Answer, reply: Reply, started: float,
                        audience: Audience) -> Answer:
        trace = answer.trace
        # History is written only once the answer exists: a failed turn leaves no half turn.
        t = time.perf_counter()
        await self.history.append(inquiry.thread_key, [
            ChatMessage.from_user(question, meta=audience_meta(audience)),
            ChatMessage.from_assistant(answer.text, meta={"outcome": answer.outcome.value, **audience_meta(audience),
                                                          CITED_META: sorted({c.doc_id for c in answer.citations})}),
        ])
        trace.stages["history"] = trace.stages.get("history", 0.0) + (time.perf_counter() - t) * 1000
        trace.stages["total"] = (time.perf_counter() - started) * 1000
        await reply.finish(answer)
        log.info("turn %s %s in %.0f ms", trace.turn_id, answer.outcome.value, trace.stages["total"])
        return answer
