"""The composition root: settings in, a ready store, indexer, pipeline and answerer out.

Pipeline builders get explicit values, never settings. In ``bot/`` this module reads the settings and
hands each part the section it needs: the refresh (``bot/knowledge/refresh``, ``bot/knowledge/scheduler.py``), the health
report (``bot/state/health.py``) and the insights report read theirs; adapters read their platform's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from haystack import Document

from bot.conversation import Conversations, HandledTurn, Kept, TakeOver
from bot.delivery.pending import MemoryPendingTurns, PendingTurns, replica_id
from bot.delivery.redis_pending import RedisPendingTurns
from bot.knowledge.loop.expert import ExpertReplies
from bot.knowledge.loop.expert_store import MemoryExpertStore, RedisExpertStore
from bot.knowledge.loop.followups import GapFollowUps
from bot.knowledge.loop.golden import golden_results
from bot.knowledge.loop.hook import KnowledgeLoop
from bot.knowledge.loop.recheck import ApprovalRecheck, ReviewerDesk
from bot.knowledge.refresh import Refresher, run_log
from bot.knowledge.scheduler import KnowledgeAdmin, RefreshScheduler
from bot.knowledge.status import knowledge_status
from bot.permissions import Audiences, KnownPrincipals, UnmappedNotice
from bot.settings import Settings
from bot.settings.base import reveal
from bot.state import Idempotency, MemoryIdempotency, ThreadLocks
from bot.state.cache import AnswerCache, MemoryAnswerCache, RedisAnswerCache
from bot.state.feedback import FeedbackStore, JsonlFeedback, RedisFeedback
from bot.state.history import HistoryStore, SqliteHistory
from bot.state.preferences import LEARN_SYSTEM, MemoryPreferenceStore, PreferenceStore, RedisPreferenceStore
from bot.state.redis import RedisHistory, RedisIdempotency, RedisLock, connect_redis
from bot.state.turn_log.recorder import RecordingApprovals, RecordingFeedback, TurnRecorder
from bot.state.turn_log.store import RedisTurnLog, SqliteTurnLog
from bot.turn.answering import Admission, Answerer, Approvals, Permissions, Probe, TurnLimits
from bot.turn.capacity import TurnGate
from bot.turn.limits import Limits, MemoryRateLimiter, RedisRateLimiter
from bot.turn.model_calls import Adaptation, AdaptiveModelCalls, MemoryModelCalls, RedisModelCalls
from pipelines.components.converter import FileLimits, OcrOptions
from pipelines.components.embedders import SentenceVectors, make_embedders
from pipelines.components.extractive import ExtractiveAnswerer, Similarity, embedding_similarity
from pipelines.components.judge import ALTERNATIVES as JUDGE_ALTERNATIVES
from pipelines.components.ranker import DiversityRanker, HttpReranker
from pipelines.components.throttle import ModelCallSlots, Throttled, warm_up_async
from pipelines.components.turn import TurnLedger, consult
from pipelines.errors import ServiceUnavailable
from pipelines.generators import ResponseHook, make_generator
from pipelines.indexing import Indexer, build_indexing_pipeline
from pipelines.query import (
    Decisions,
    Models,
    Prompting,
    Retrieval,
    build_query_pipeline,
    build_retrieval_pipeline,
    retrieval_inputs,
)
from pipelines.sources.kind import Capture
from pipelines.store import KnowledgeStore, open_store

log = logging.getLogger("kbbot.runtime")

#: How long ``Runtime.warm_up`` may wait for the store: Weaviate's client retries an unreachable server
#: for about a minute, and a replica must not take that long to start.
WARM_UP_S = 10.0


def make_store(settings: Settings, *, directory_name: str = "store", collection: str | None = None,
               allow_outdated: bool = False) -> KnowledgeStore:
    """The configured store; ``allow_outdated`` opens a Weaviate collection indexed with another
    keyword analysis, which is refused otherwise (only ``kbbot reindex`` needs it)."""
    if settings.store_kind == "weaviate":
        return open_store("weaviate", url=settings.store.weaviate_url,
                          collection=collection or settings.store.collection, allow_outdated=allow_outdated,
                          api_key=reveal(settings.store.weaviate_api_key) or None,
                          replication_factor=settings.weaviate.replication_factor,
                          consistency=settings.weaviate.consistency)
    return open_store("memory", directory=settings.data_dir / directory_name)


def make_ranker(settings: Settings) -> Any:
    r = settings.retrieval
    if settings.ranker.kind == "rerank_http":
        return HttpReranker(settings.ranker.url or "", top_k=r.top_k, max_chunks_per_doc=r.max_chunks_per_doc,
                            timeout_s=settings.ranker.timeout_s)
    return DiversityRanker(top_k=r.top_k, max_chunks_per_doc=r.max_chunks_per_doc)


@dataclass
class Generators:
    """What answers a turn: the answer's generator, the helper calls' (None: rules and retrieval
    scores decide), the size of the answer prompt's context that fits them, and the turn's time."""

    answer: Any
    helper: Any | None
    context_chars: int
    turn_timeout_s: float
    judge: Any | None = None  # the answerability judgement by token probabilities (kind local)


def make_generators(settings: Settings, *, temperature: float | None = None,
                    similarity: Similarity | None = None, on_response: ResponseHook | None = None) -> Generators:
    """The configured generators; ``temperature`` overrides ``generator.temperature`` (evals use 0);
    ``similarity`` lets the extractive answer pick sentences by meaning; ``on_response`` sees every
    response of a hosted model's API (its admission adapts to them).

    ``local`` starts the in-process llama.cpp server (joining the default model on first use) and
    talks to it like ``openai``, with its own, smaller prompt budget and token limits."""
    g, a = settings.generator, settings.answering
    kind = settings.generator_kind
    temperature = g.temperature if temperature is None else temperature
    if kind == "extractive":
        return Generators(ExtractiveAnswerer(similarity=similarity), None, settings.prompt.budget_chars,
                          a.turn_timeout_s)
    if kind == "local":
        from pipelines.local_model import LocalModelServer, default_model_path  # generator.kind local only

        local = g.local
        path = settings.resolve(g.model_path) if g.model_path else default_model_path()
        base_url = LocalModelServer.shared(path, n_ctx=local.n_ctx, n_threads=local.threads).start()
        answer = make_generator(kind, model=path.name, max_tokens=local.max_tokens, timeout_s=local.turn_timeout_s,
                                max_retries=0, base_url=base_url, temperature=temperature)
        helper = make_generator(kind, model=path.name, max_tokens=local.helper_max_tokens,
                                timeout_s=local.helper_timeout_s, max_retries=0, base_url=base_url,
                                temperature=temperature) if local.helpers else None
        # One token and its alternatives; the prompt is the answer's own, so its time is the answer's.
        judge = make_generator(kind, model=path.name, max_tokens=1, timeout_s=local.turn_timeout_s, max_retries=0,
                               base_url=base_url, temperature=0, logprobs=JUDGE_ALTERNATIVES) \
            if local.judge_threshold > 0 else None
        return Generators(answer, helper, local.budget_chars, local.turn_timeout_s, judge)
    answer = make_generator(kind, model=g.model, max_tokens=g.max_tokens, timeout_s=g.timeout_s,
                            max_retries=g.max_retries, base_url=g.base_url, temperature=temperature,
                            on_response=on_response)
    # Rewrite, guard, grade and reformulate: short calls to the same model.
    helper = make_generator(kind, model=g.model, max_tokens=a.helper_max_tokens, timeout_s=a.helper_timeout_s,
                            max_retries=min(g.max_retries, 1), base_url=g.base_url, temperature=temperature,
                            on_response=on_response)
    return Generators(answer, helper, settings.prompt.budget_chars, a.turn_timeout_s)


@dataclass
class Runtime:
    """Everything a process of kbbot needs. ``await start()`` connects the state services
    inside the event loop that will use them (redis.asyncio connections belong to one loop)."""

    settings: Settings
    store: KnowledgeStore
    _embedders: tuple[Any, Any] = field(init=False, repr=False)
    _history: HistoryStore | None = field(default=None, init=False, repr=False)
    _idempotency: Idempotency | None = field(default=None, init=False, repr=False)
    _approved: AnswerCache | None = field(default=None, init=False, repr=False)
    _preferences: PreferenceStore | None = field(default=None, init=False, repr=False)
    _redis: Any = field(default=None, init=False, repr=False)
    _limiter: Any = field(default=None, init=False, repr=False)
    _thread_locks: ThreadLocks = field(default_factory=ThreadLocks, init=False, repr=False)
    _turns: TurnRecorder | None = field(default=None, init=False, repr=False)
    _pending: PendingTurns | None = field(default=None, init=False, repr=False)
    #: The answerer's model generators, whose HTTP clients ``close()`` closes.
    _generators: list[Any] = field(default_factory=list, init=False, repr=False)
    #: This process among the replicas: the owner of the turns it accepts (``bot/delivery/pending.py``).
    replica: str = field(default_factory=replica_id, init=False)

    def __post_init__(self) -> None:
        if self.settings.generator_kind == "local":
            from pipelines.local_model import prepare_process  # generator.kind local only

            prepare_process()  # before the embedder loads its OpenMP runtime
        self._embedders = self._make_embedders()

    def _make_embedders(self) -> tuple[Any, Any]:
        e = self.settings.embedder
        return make_embedders(e.kind, threads=e.threads, base_url=e.base_url, model=e.model,
                              query_prefix=e.query_prefix, passage_prefix=e.passage_prefix)

    @cached_property
    def model_calls(self) -> ModelCallSlots | AdaptiveModelCalls:
        """What admits model calls: the model kbbot runs itself, a fixed number at once in this process
        (``limits.concurrent_model_calls``); a hosted one, a number adapted to its provider's limits and
        shared by the replicas in Redis once ``start()`` connected it (``bot/turn/model_calls.py``)."""
        s = self.settings
        if s.generator_kind == "local":
            return ModelCallSlots(s.limits.concurrent_model_calls)
        lim = s.limits
        # A call's place is leased briefly and renewed while it runs: a dead replica's come back in seconds.
        adaptation = Adaptation(start=lim.model_calls_start, maximum=lim.model_calls_max)
        if self._redis is not None:
            # One account's limits, whichever replica calls: the state is per kind and model.
            prefix = f"{s.redis_prefix}model:{s.generator_kind}:{s.generator.model}:"
            return AdaptiveModelCalls(RedisModelCalls(self._redis, prefix, adaptation))
        return AdaptiveModelCalls(MemoryModelCalls(adaptation))

    @property
    def text_embedder(self) -> Any:
        return self._embedders[0]

    @property
    def document_embedder(self) -> Any:
        return self._embedders[1]

    @cached_property
    def sentence_similarity(self) -> Similarity:
        """For the extractive answer: embedders of its own (the model itself is shared), so what
        indexing and retrieval embed is counted apart from answer sentences."""
        return embedding_similarity(*self._make_embedders())

    @cached_property
    def indexer(self) -> Indexer:
        i = self.settings.indexing
        pipeline = self.indexing_pipeline(document_embedder=self.document_embedder)
        return Indexer(self.store, pipeline, suffixes=i.extensions, max_file_mb=i.max_file_mb)

    def indexing_pipeline(self, *, from_documents: bool = False, document_embedder: Any = None) -> Any:
        """The indexing pipeline on this runtime's store (``from_documents``: it takes Documents, as an
        eval corpus comes, not files), with ``document_embedder`` or a document embedder of its own."""
        i = self.settings.indexing
        embedder = document_embedder if document_embedder is not None else self._make_embedders()[1]
        return build_indexing_pipeline(self.store, embedder, chunk_chars=i.chunk_chars,
                                       overlap_sentences=i.chunk_overlap_sentences, max_file_mb=i.max_file_mb,
                                       ocr=OcrOptions(i.ocr.enabled, i.ocr.dpi, i.ocr.max_pages),
                                       limits=FileLimits(i.max_inflated_mb, i.max_zip_ratio, i.max_document_chars,
                                                         i.max_document_chunks),
                                       from_documents=from_documents)

    def retrieval_pipeline(self, *, mode: str | None = None, candidates: int | None = None) -> Any:
        """Retrieval alone (embed, retrieve, keep current, rank) on this runtime's store, as configured
        unless ``mode``/``candidates`` say otherwise, with a text embedder of its own."""
        r = self.settings.retrieval
        return build_retrieval_pipeline(self.store, self._make_embedders()[0], mode=mode or r.mode,
                                        candidates=candidates or r.candidates, fusion=r.fusion, alpha=r.alpha,
                                        ranker=make_ranker(self.settings))

    async def start(self) -> None:
        """Connects Redis when ``REDIS_URL`` is set (raises ``RedisUnavailable`` with the URL)."""
        if self._history is not None:
            return
        h, a, p = self.settings.history, self.settings.approvals, self.settings.preferences
        if self.settings.redis_url:
            self._redis = await connect_redis(self.settings.redis_url)
            prefix = self.settings.redis_prefix
            self._history = RedisHistory(self._redis, prefix=prefix, max_turns=h.max_turns,
                                         max_chars=h.max_chars, ttl_days=h.ttl_days,
                                         replica_acks=self.settings.redis_replica_acks)
            self._idempotency = RedisIdempotency(self._redis, prefix, replica_acks=self.settings.redis_replica_acks)
            self._pending = RedisPendingTurns(self._redis, prefix, replica_acks=self.settings.redis_replica_acks)
            self._approved = RedisAnswerCache(self._redis, prefix, pending_ttl_s=a.pending_days * 86400,
                                             knowledge_version=self._knowledge_version)
            self._preferences = RedisPreferenceStore(self._redis, prefix, ttl_days=p.ttl_days)
            self._limiter = RedisRateLimiter(self._redis, self.limits, prefix=prefix)
        else:
            self._history = SqliteHistory(self.settings.data_dir / "history.sqlite3", max_turns=h.max_turns,
                                          max_chars=h.max_chars, ttl_days=h.ttl_days)
            self._idempotency = MemoryIdempotency()
            self._pending = MemoryPendingTurns()
            self._approved = MemoryAnswerCache(pending_ttl_s=a.pending_days * 86400,
                                              knowledge_version=self._knowledge_version)
            self._preferences = MemoryPreferenceStore(ttl_days=p.ttl_days)
            self._limiter = MemoryRateLimiter(self.limits)
        if not a.enabled:
            self._approved = None
        if self._redis is not None:
            redis, wait_s = self._redis, self.settings.answering.turn_timeout_s
            self._thread_locks.shared = lambda name: RedisLock(redis, name, ttl_s=30, prefix=prefix, wait_s=wait_s,
                                                               poll_s=0.05)
        self._turns = self._turn_recorder()
        if self._turns is not None and self._approved is not None:
            self._approved = RecordingApprovals(self._approved, self._turns)

    async def warm_up(self, timeout_s: float = WARM_UP_S) -> bool:
        """Pays a process's first turn's one-time costs before anyone waits on them (``kbbot serve`` calls
        it before it listens): the model clients made, the helper's too (it is no component of the
        pipeline), and ``Answerer.warm_up``: the first question after a start reached its answer's first
        token 0.6-0.8 s later than the next, 0.4-0.55 s with it (docs/benchmarks.md, "The first question after a start"; what remains is the
        model SDK building its response types on its first call). A store that is down or slow leaves the
        process to start cold, never unstarted: False, with a warning. Call after ``start``."""
        try:
            answerer = self.answerer
            for generator in self._generators:
                await warm_up_async(generator)
            await asyncio.wait_for(answerer.warm_up(), timeout_s)
            # The async store client of this loop (Weaviate's: ~0.45 s of TLS contexts on the event loop,
            # paid by the first burst's questions otherwise, bench.workers).
            connect = getattr(self.store, "async_collection", None)
            if connect is not None:
                await asyncio.wait_for(connect(), timeout_s)
            return True
        except Exception as exc:  # noqa: BLE001 - a cold start is slower, not broken
            log.warning("warm-up skipped (%s: %s); the first question pays for it", type(exc).__name__, exc)
            return False

    def _turn_recorder(self) -> TurnRecorder | None:
        i = self.settings.insights
        if not i.enabled:
            return None
        if self._redis is not None:
            log_ = RedisTurnLog(self._redis, self.settings.redis_prefix, retention_days=i.retention_days)
        else:
            log_ = SqliteTurnLog(self.settings.data_dir / "turns.sqlite3", retention_days=i.retention_days)
        return TurnRecorder(log_, hash_key=reveal(i.user_id_key) if i.hash_user_ids else None)

    @property
    def turns(self) -> TurnRecorder | None:
        """Turn records (None when ``insights.enabled`` is off)."""
        return self._turns

    def _knowledge_version(self) -> int:
        return self.store.knowledge_version

    @property
    def limits(self) -> Limits:
        lim = self.settings.limits
        return Limits(per_user=lim.per_user, per_channel=lim.per_channel, window_s=lim.window_s)

    async def close(self) -> None:
        # The model SDKs' HTTP clients: left open, each is closed by its finaliser, which schedules the close
        # on whatever loop runs when it is collected (another test's, a later run's) and fails there.
        for generator in self._generators:
            for client in (getattr(generator, "async_client", None), getattr(generator, "client", None)):
                closed = getattr(client, "close", None)
                if callable(closed) and inspect.isawaitable(result := closed()):
                    await result
        if self._history is not None:
            await self._history.close()
        if self._turns is not None:
            await self._turns.close()
        if self._redis is not None:
            await self._redis.aclose()
        close_async = getattr(self.store, "close_async", None)
        if close_async is not None:
            await close_async()
        self.store.close()

    @property
    def history(self) -> HistoryStore:
        if self._history is None:
            raise RuntimeError("Runtime.start() has not been awaited")
        return self._history

    @property
    def redis(self) -> Any:
        """The shared ``redis.asyncio`` client, or None on embedded defaults."""
        return self._redis

    @property
    def approved(self) -> AnswerCache | None:
        """The approved-answer cache (None when ``approvals.enabled`` is off)."""
        return self._approved

    @property
    def preferences(self) -> PreferenceStore:
        if self._preferences is None:
            raise RuntimeError("Runtime.start() has not been awaited")
        return self._preferences

    @property
    def thread_locks(self) -> ThreadLocks:
        """One turn per thread at a time (shared across replicas once Redis is connected)."""
        return self._thread_locks

    @property
    def feedback(self) -> FeedbackStore:
        """Feedback next to the other shared state: Redis when connected, else a file in the data
        directory; kept in the turn records too when they are on."""
        if self._redis is not None:
            store: FeedbackStore = RedisFeedback(self._redis, prefix=self.settings.redis_prefix)
        else:
            store = JsonlFeedback(self.settings.data_dir / "feedback.jsonl")
        return RecordingFeedback(store, self._turns) if self._turns is not None else store

    @asynccontextmanager
    async def refreshing(self) -> AsyncIterator[Refresher]:
        """A refresher for a command run outside ``serve`` (not started): its run log and lock in a Redis
        client of its own for this event loop when Redis is configured, closed afterwards."""
        redis = await connect_redis(self.settings.redis_url) if self.settings.redis_url else None
        try:
            yield self.refresher(redis)
        finally:
            if redis is not None:
                await redis.aclose()

    def refresher(self, redis: Any = None) -> Refresher:
        """A refresher on this runtime's store and indexer; its run log and lock are in ``redis`` (default:
        the runtime's connection, once started) when Redis is configured."""
        return Refresher(self.settings, self.store, self.indexer, redis=redis if redis is not None else self._redis)

    def knowledge_loop(self, desk: ReviewerDesk | None = None) -> KnowledgeLoop:
        """What runs after a refresh changed documents (``bot.knowledge.loop``), reaching reviewers through ``desk``
        (the adapters'); on a started runtime."""
        s = self.settings
        results = golden_results(self._redis, s.redis_prefix, s.data_dir)
        answerer = self.answerer
        recheck = ApprovalRecheck(self._approved, answerer.rerun, desk, self.store.is_current, audiences=self.audiences,
                                  readers=self._readers_of) if self._approved is not None else None
        return KnowledgeLoop(answerer.rerun, results, recheck=recheck, golden_file=s.resolve(s.approvals.golden_file),
                             default_space=s.sources[0].space if s.sources else "default", desk=desk,
                             knowledge_version=lambda: self.store.knowledge_version)

    def knowledge_admin(self, *, schedule: bool = True) -> KnowledgeAdmin:
        """What admin commands and the admin page run: status and refreshes, with the refresh scheduler
        when ``schedule`` and sources are configured (not started: ``serve`` starts it)."""
        refresher = self.refresher()
        scheduler = RefreshScheduler(refresher) if schedule and self.settings.sources else None
        return KnowledgeAdmin(refresher, scheduler)

    def gap_follow_ups(self) -> GapFollowUps | None:
        """Gaps answered when the knowledge arrives (``bot.knowledge.loop.followups``), on this started
        runtime; None when turns are not recorded (``insights.enabled`` off). Platforms register their
        delivery layers with ``serve``; the hook goes on a refresher's ``after_change``."""
        if self._turns is None:
            return None
        i = self.settings.insights
        return GapFollowUps(self.answerer, self._turns.log, self.history, preferences=self._preferences,
                            days=i.reanswer_days, max_per_refresh=i.reanswer_max_per_refresh)

    @cached_property
    def expert_replies(self) -> ExpertReplies:
        """Expert replies kept (``bot.knowledge.loop.expert``), on this started runtime: shared in Redis when
        it is connected; approvals through the approved-answer cache; "Add to the knowledge base" writes to
        ``insights.capture_source``."""
        if self._preferences is None:
            raise RuntimeError("Runtime.start() has not been awaited")
        s = self.settings
        ttl_s = s.approvals.pending_days * 86400
        store = RedisExpertStore(self._redis, s.redis_prefix, ttl_s) if self._redis is not None \
            else MemoryExpertStore(ttl_s)
        return ExpertReplies(store, cache=self._approved, identity=self.answerer.approvals.identity,
                             knowledge_version=self._knowledge_version,
                             turns=self._turns.log if self._turns is not None else None, capture=self._capture(),
                             audience=self.audiences.of, projected=self.answerer.projected)

    def _readers_of(self, doc_id: str) -> list[str] | None:
        record = self.store.record(doc_id)
        return list(record.readers) if record is not None else None

    def _capture(self) -> Capture | None:
        name = self.settings.insights.capture_source
        src = next((x for x in self.settings.sources if x.name == name), None) if name else None
        return src.kind.capture(src, self.settings.source_context) if src is not None else None

    def conversations(self, *, admin: KnowledgeAdmin | None = None, feedback: FeedbackStore | None = None,
                      on_turn: Callable[[HandledTurn], None] | None = None) -> Conversations:
        """The conversation service every adapter uses, on this started runtime."""
        r = self.settings.recovery
        takeover = None if self._pending is None else TakeOver(self._pending, self.replica, max_attempts=r.max_attempts,
                                                                batch=r.batch)
        kept = Kept(feedback if feedback is not None else self.feedback, self._approved, self._preferences, self._turns)
        return Conversations(self.answerer, self.idempotency, self.history, thread_locks=self._thread_locks,
                             kept=kept, admin=admin, on_turn=on_turn, takeover=takeover, expert=self.expert_replies)

    @property
    def idempotency(self) -> Idempotency:
        if self._idempotency is None:
            raise RuntimeError("Runtime.start() has not been awaited")
        return self._idempotency

    def query_pipeline(self, generators: Generators, topics: Any, *, clarify: bool | None = None,
                       mode: str | None = None) -> Any:
        """An answering pipeline on this runtime's store, with ``generators`` and a text embedder of its
        own (a Haystack component belongs to one pipeline; the model itself is shared)."""
        return self._query_pipeline(self._make_embedders()[0], generators, topics, clarify=clarify, mode=mode)

    def _query_pipeline(self, text_embedder: Any, generators: Generators, topics: Any, *, clarify: bool | None = None,
                        mode: str | None = None) -> Any:
        s, a, r = self.settings, self.settings.answering, self.settings.retrieval
        models = Models(generators.answer, generators.helper, generators.judge, SentenceVectors(*self._make_embedders()))
        decisions = Decisions(
            min_similarity=r.min_similarity, off_topic_similarity=a.off_topic_similarity,
            off_topic_similarity_zh=a.off_topic_similarity_zh, guard_min_confidence=a.guard_min_confidence,
            # Self-hosted models are often small: their "off-topic" alone does not end a turn.
            guard_weighs_retrieval=s.generator_kind in ("openai", "local"),
            # Where a model grades the passages its verdict decides; where none does, the signals do.
            evidence=a.evidence_margin if generators.helper is None else None,
            judge=s.generator.local.judge_threshold, clarify=a.clarify if clarify is None else clarify)
        return build_query_pipeline(
            self.store, text_embedder, make_ranker(s), models, topics=topics, decisions=decisions,
            prompting=Prompting(s.template("system_template"), s.template("user_template"), generators.context_chars),
            retrieval=Retrieval(mode or r.mode, r.candidates, r.fusion, r.alpha))

    @cached_property
    def answerer(self) -> Answerer:
        s = self.settings
        a = s.answering
        kind = s.generator_kind
        admission = self.model_calls if kind != "extractive" else None
        generators = make_generators(s, similarity=self.sentence_similarity,
                                     on_response=admission.observe if isinstance(admission, AdaptiveModelCalls)
                                     else None)
        model_name = generators.answer.model if kind != "extractive" else "extractive"
        self._generators = [g for g in (generators.answer, generators.helper, generators.judge) if g is not None]
        if admission is not None:  # answers and helper steps share one admission (extractive answers make none)
            throttled = lambda g: Throttled(g, admission) if g is not None else None  # noqa: E731
            generators = replace(generators, answer=throttled(generators.answer), helper=throttled(generators.helper),
                                 judge=throttled(generators.judge))
        helper = generators.helper
        topics = s.topics()
        pipeline = self._query_pipeline(self.text_embedder, generators, topics)

        async def learner(message: str) -> str | None:
            return await consult(helper, "preferences", LEARN_SYSTEM, f"<message>\n{message}\n</message>",
                                 ledger=TurnLedger(max_model_calls=1, reserved=0))

        return Answerer(pipeline, self.history, is_current=self.store.is_current, topics=topics,
                        handoff=a.handoff,
                        limits=TurnLimits(generators.turn_timeout_s, a.max_question_chars, a.max_model_calls,
                                          a.max_retries),
                        admission=Admission(self._limiter, TurnGate(s.limits.max_turns_in_flight,
                                                                    s.limits.max_queued_turns), self._thread_locks),
                        approvals=Approvals(self._approved, (model_name, s.approvals.policy_version),
                                            lambda: self.store.knowledge_version, s.approvals.uncited_days * 86400),
                        preferences=self._preferences, learner=learner if helper is not None else None,
                        turns=self._turns,
                        permissions=Permissions(self.audiences, UnmappedNotice(self.idempotency.claim),
                                                self.retrieval_probe(), KnownPrincipals(self.store),
                                                self._readers_of))

    @cached_property
    def audiences(self) -> Audiences:
        """Who sees each answer (``bot.permissions``); adapters register their platform's directory."""
        p = self.settings.permissions
        return Audiences(principals=p.principals, max_members=p.max_members)

    def retrieval_probe(self) -> Probe:
        """Retrieval alone under a filter, keeping chunks as similar as ``retrieval.min_similarity``:
        whether a direct message would find what a channel may not read."""
        pipeline = self.retrieval_pipeline(candidates=10)
        threshold = self.settings.retrieval.min_similarity
        mode = self.settings.retrieval.mode

        async def probe(question: str, filters: dict[str, Any]) -> list[Document]:
            data = retrieval_inputs(question, mode=mode, filters=filters)
            result = await asyncio.to_thread(pipeline.run, data, include_outputs_from={"current"})
            dense = result["current"]["dense_documents"]
            return [d for d in dense if (d.score or 0.0) >= threshold]

        return probe


def build_runtime(settings: Settings, *, directory_name: str = "store", collection: str | None = None) -> Runtime:
    """The runtime on the configured store (``make_store``: another directory or collection for evals)."""
    return Runtime(settings=settings, store=make_store(settings, directory_name=directory_name, collection=collection))


async def status_of(settings: Settings) -> dict[str, Any]:
    """``knowledge_status`` for ``kbbot status``, which must also report a store or Redis that cannot
    be reached: each is opened here, and a failure to open it is what the status says of it."""
    store = redis = None
    store_error = redis_error = None
    try:
        store = make_store(settings)
    except ServiceUnavailable as exc:
        store_error = str(exc)
    if settings.redis_url:
        try:
            redis = await connect_redis(settings.redis_url, retries=0)
        except ServiceUnavailable as exc:
            redis_error = str(exc)
    # Redis configured but down: no run log to read (the file is not where runs are recorded).
    runs = run_log(settings, redis) if redis is not None or not settings.redis_url else None
    try:
        return await knowledge_status(settings, store=store, runs=runs, redis=redis, store_error=store_error,
                                      redis_error=redis_error)
    finally:
        if redis is not None:
            await redis.aclose()
        if store is not None:
            store.close()
