"""``WeaviateHybridRetriever``: BM25, vector or hybrid retrieval on the chunk collection, fused by Weaviate.

Why relative-score fusion, and the hit rates of each choice: docs/evaluation.md, "How the Weaviate
schema and fusion were chosen".
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from haystack import Document, component
from weaviate.classes.query import HybridFusion, MetadataQuery

from pipelines.analysis import analyze
from pipelines.components.embedders import QueryVector
from pipelines.fusion import AUTO_ALPHA, LANGUAGES, MODES, DenseCandidates, as_list, check_alpha, check_choice, retrieved
from pipelines.weaviate_store.connection import WeaviateUnavailable
from pipelines.weaviate_store.integration import to_document, weaviate_filters
from pipelines.weaviate_store.options import (
    DEFAULT_ALPHA,
    DEFAULT_FUSION,
    DEFAULT_QUERY_TIMEOUT_S,
    FUSION_ALIASES,
    FUSIONS,
)
from pipelines.weaviate_store.schema import QUERY_PROPERTIES
from pipelines.weaviate_store.scores import PROBE_ALPHA, dense_of, hybrid_with_dense, merge_dense, reweighed
from pipelines.weaviate_store.store import WeaviateKnowledgeStore

log = logging.getLogger("kbbot.weaviate")

#: Weaviate's server-side fusion for each of ``FUSIONS``.
HYBRID_FUSIONS = {"ranked": HybridFusion.RANKED, "relative_score": HybridFusion.RELATIVE_SCORE}


@component
class WeaviateHybridRetriever:
    """BM25, vector or hybrid retrieval straight on the chunk collection, fusion done by Weaviate.

    ``documents``: one hybrid query (BM25 over ``search_text`` and the vector, fused server-side
    with ``fusion`` and ``alpha``; with ``alpha`` "auto" sent at ``PROBE_ALPHA`` and re-weighed per
    question from the results' explanations), or one BM25 query, with ``filters`` applied in the
    query. ``dense_documents``: the vector candidates with their raw cosine as ``score`` and
    ``meta.similarity`` (what the relevance gate reads and the ranker's language slots use); empty
    in ``bm25`` mode. Where they come from:

    * hybrid, relative-score fusion, chunks in one language (``store.chunk_languages()``): from the
      hybrid query itself, which is asked to explain its scores; the vector side's "original
      score" there is the cosine. One query, no more. The best cosine (what the gate compares
      with its threshold) is a near-vector query's best: the nearest chunk gets at least ``alpha``
      of the fused score, so it is among the ``k`` results (on all 307 clapnq questions, with and
      without answer: bench ``retrieval`` checks it on its questions);
    * otherwise (two languages, ranked fusion, vector mode, no query text): one near-vector query
      per language (one unfiltered query for a single language), sent with the hybrid or BM25
      query: a Chinese question's best English chunks, and vice versa, are candidates even when
      the other language fills the hybrid list (see ``components/ranker.py``).

    Should no hybrid result explain its vector side (another server version's wording), the
    near-vector queries are sent after it, and a warning logged once.

    Measured (clapnq, 1,369 chunks, p50, vectors precomputed, against a bare
    ``collection.query.hybrid``; bench ``retrieval``): x1.07 on a quiet machine, up to x1.12 under
    load, where the hybrid plus per-language queries took x1.25-1.35. Most of what is left is the
    thread that bounds the wait (the same query without it: x1.01); ``run_async`` needs none.
    No answer within ``timeout_s`` raises WeaviateUnavailable.
    """

    @classmethod
    def of(cls, store: WeaviateKnowledgeStore, *, mode: str, candidates: int, fusion: str | None = None,
           alpha: float | str | None = None) -> WeaviateHybridRetriever:
        """The retriever of ``store``; ``fusion`` also takes the in-memory store's ``rrf`` (Weaviate's
        ``ranked``). None: the store's own fusion and ``alpha``. ``dbsf`` is refused: Weaviate has no
        distribution-based fusion."""
        if fusion == "dbsf":
            raise ValueError("fusion 'dbsf' (distribution-based score fusion) is the embedded store's; "
                             "Weaviate fuses 'relative_score' or 'rrf'")
        chosen = FUSION_ALIASES.get(fusion, fusion) if fusion else store.fusion
        return cls(store, mode=mode, candidates=candidates, fusion=chosen, alpha=store.alpha if alpha is None else alpha)

    def __init__(self, store: WeaviateKnowledgeStore, mode: str = "hybrid", candidates: int = 30,
                 fusion: str = DEFAULT_FUSION, alpha: float | str = DEFAULT_ALPHA,
                 query_properties: tuple[str, ...] = QUERY_PROPERTIES, parallel: bool = True,
                 timeout_s: float = DEFAULT_QUERY_TIMEOUT_S):
        check_choice("retrieval mode", mode, MODES)
        check_choice("fusion", fusion, FUSIONS)
        self.store = store
        self.mode = mode
        self.candidates = candidates
        self.fusion = fusion
        self.alpha = check_alpha(alpha)
        # "auto" is re-weighed per question from the results' explanations (relative score fusion only).
        self.auto = self.alpha == AUTO_ALPHA and mode == "hybrid" and fusion == "relative_score"
        self.query_properties = list(query_properties)
        self.parallel = parallel
        self.timeout_s = timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._warned = False

    def _plan(self, query: str, query_embedding: list[float] | None,
              languages: tuple[str, ...]) -> tuple[bool, bool, bool]:
        """(run the keyword/hybrid query, dense candidates from its explanations, run vector queries).
        ``query`` is the analysed query: a question of stop words only has no keyword side."""
        if self.mode in ("hybrid", "vector") and query_embedding is None:
            raise ValueError(f"{self.mode} retrieval needs a query embedding")
        keyword = self.mode in ("hybrid", "bm25") and bool(query.strip())
        explained = (keyword and self.mode == "hybrid" and self.fusion == "relative_score"
                     and (self.auto or float(self.alpha) > 0) and len(languages) <= 1)
        return keyword, explained, self.mode in ("hybrid", "vector") and not explained

    def keyword_query(self, query: str, query_embedding: list[float] | None, where: Any, k: int,
                      explained: bool = False) -> dict[str, Any]:
        """The arguments of the BM25 or hybrid query this retriever sends (``explained``: with the
        scores explained, to read the dense candidates from); benchmarks send it bare."""
        kwargs: dict[str, Any] = {"query": query, "query_properties": self.query_properties, "filters": where,
                                  "limit": k,
                                  "return_metadata": MetadataQuery(score=True, explain_score=explained or self.auto)}
        if self.mode == "hybrid":
            alpha = PROBE_ALPHA if self.alpha == AUTO_ALPHA else self.alpha
            kwargs.update(vector=query_embedding, alpha=alpha, fusion_type=HYBRID_FUSIONS[self.fusion])
        return kwargs

    @staticmethod
    def _vector_calls(query_embedding: list[float], filters: dict[str, Any] | None, languages: tuple[str, ...],
                      k: int) -> list[dict[str, Any]]:
        # One language (or none known): no language filter needed, the results are the same.
        per_language: tuple[str | None, ...] = languages if len(languages) > 1 else (None,)
        return [{"near_vector": query_embedding, "filters": weaviate_filters(filters, language=lang), "limit": k,
                 "return_metadata": MetadataQuery(distance=True)} for lang in per_language]

    def _from_explanations(self, keyword: list[Any] | None, k: int) -> dict[str, Any] | None:
        """The results of an explained hybrid query, the dense candidates read from its explanations;
        None (after a warning, once) when they explain no vector score: then near-vector queries follow."""
        found = hybrid_with_dense(keyword or [], reweigh=self.auto)
        if found is not None:
            return retrieved(found[0][:k], found[1])
        self._unexplained("sending near-vector queries for the similarities instead (one more round trip per query)")
        return None

    def _unexplained(self, instead: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("Weaviate hybrid results do not explain their scores; %s", instead)

    def _documents(self, keyword: list[Any], dense: list[Document]) -> list[Document]:
        """The keyword/hybrid results in final order: as Weaviate fused them, or re-weighed for this
        question when ``alpha`` is "auto" (as sent, after a warning, when they explain no scores)."""
        if self.auto and keyword:
            if (documents := reweighed(keyword, dense)) is not None:
                return documents
            self._unexplained(f"alpha auto keeps the equal weights ({PROBE_ALPHA}) it was sent with")
        return [to_document(o, score=o.metadata.score) for o in keyword]

    def _finish(self, keyword: list[Any] | None, per_language: list[list[Any]], k: int) -> dict[str, Any]:
        dense = merge_dense([dense_of(objs) for objs in per_language])
        if keyword is None:  # vector mode, or hybrid without query text
            return retrieved(dense[:k], dense)
        return retrieved(self._documents(keyword, dense)[:k], dense)

    def _too_slow(self) -> WeaviateUnavailable:
        # The client retries an unavailable server for about a minute; a question should not wait that long.
        return WeaviateUnavailable(f"cannot reach Weaviate at {self.store.shown_url}: no answer within {self.timeout_s:g} s")

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1 + len(LANGUAGES), thread_name_prefix="kb-retrieve")
        return self._executor

    def _call(self, calls: list[tuple[Any, dict[str, Any]]], deadline: float) -> list[Any]:
        """The calls' results, sent together (``parallel``) and bounded by ``deadline``."""
        with self.store.guard():
            if not self.parallel:
                return [search(**kwargs) for search, kwargs in calls]
            futures = [self._pool().submit(search, **kwargs) for search, kwargs in calls]
            if len(futures) == 1:  # the usual case; lighter than wait()
                try:
                    return [futures[0].result(timeout=max(0.0, deadline - time.monotonic()))]
                except FutureTimeout:
                    raise self._too_slow() from None
            if wait(futures, timeout=max(0.0, deadline - time.monotonic())).not_done:
                raise self._too_slow()
            return [f.result() for f in futures]

    def _begin(self, query: str, query_embedding: list[float] | QueryVector | None,
               top_k: int | None) -> tuple[int, str, list[float] | None, float]:
        """What ``run`` and ``run_async`` start from: k, the query as the terms ``search_text``
        holds (see QUERY_PROPERTIES), the vector as a list, and the deadline."""
        return (top_k or self.candidates, " ".join(analyze(query)), as_list(query_embedding),
                time.monotonic() + self.timeout_s)

    def _searches(self, collection: Any, query: str, query_embedding: list[float] | None,
                  filters: dict[str, Any] | None, languages: tuple[str, ...], k: int,
                  plan: tuple[bool, bool, bool]) -> list[tuple[Any, dict[str, Any]]]:
        """A question's searches as (method of ``collection``, arguments): the sync and the async
        client have the same query methods, so ``run`` calls them and ``run_async`` awaits them."""
        run_keyword, explained, run_vector = plan
        searches: list[tuple[Any, dict[str, Any]]] = []
        if run_keyword:
            search = collection.query.hybrid if self.mode == "hybrid" else collection.query.bm25
            searches.append((search, self.keyword_query(query, query_embedding, weaviate_filters(filters), k,
                                                        explained)))
        if run_vector:
            searches += self._near_vector(collection, query_embedding, filters, languages, k)
        return searches

    def _near_vector(self, collection: Any, query_embedding: list[float] | None, filters: dict[str, Any] | None,
                     languages: tuple[str, ...], k: int) -> list[tuple[Any, dict[str, Any]]]:
        assert query_embedding is not None
        return [(collection.query.near_vector, kwargs)
                for kwargs in self._vector_calls(query_embedding, filters, languages, k)]

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    def run(self, query: str, query_embedding: list[float] | QueryVector | None = None,
            filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        k, query, query_embedding, deadline = self._begin(query, query_embedding, top_k)
        languages = self.store.cached_languages()
        if languages is None:
            languages = self._call([(self.store.chunk_languages, {})], deadline)[0]
        plan = self._plan(query, query_embedding, languages)
        run_keyword, explained, _ = plan
        collection = self.store.collection
        searches = self._searches(collection, query, query_embedding, filters, languages, k, plan)
        results = [r.objects for r in self._call(searches, deadline)]
        keyword = results.pop(0) if run_keyword else ([] if self.mode == "bm25" else None)
        if explained:  # the dense candidates come from the explanations, else from near-vector queries
            if (answer := self._from_explanations(keyword, k)) is not None:
                return answer
            searches = self._near_vector(collection, query_embedding, filters, languages, k)
            results = [r.objects for r in self._call(searches, deadline)]
        return self._finish(keyword, results, k)

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    async def run_async(self, query: str, query_embedding: list[float] | QueryVector | None = None,
                        filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        k, query, query_embedding, deadline = self._begin(query, query_embedding, top_k)
        languages = self.store.cached_languages()
        if languages is None:
            languages = (await self._gather([asyncio.to_thread(self.store.chunk_languages)], deadline))[0]
        plan = self._plan(query, query_embedding, languages)
        run_keyword, explained, _ = plan
        collection = await self.store.async_collection()
        searches = self._searches(collection, query, query_embedding, filters, languages, k, plan)
        results = [r.objects for r in await self._gather([call(**kw) for call, kw in searches], deadline)]
        keyword = results.pop(0) if run_keyword else ([] if self.mode == "bm25" else None)
        if explained:
            if (answer := self._from_explanations(keyword, k)) is not None:
                return answer
            searches = self._near_vector(collection, query_embedding, filters, languages, k)
            results = [r.objects for r in await self._gather([call(**kw) for call, kw in searches], deadline)]
        return self._finish(keyword, results, k)

    async def _gather(self, calls: list[Any], deadline: float) -> list[Any]:
        """The awaitables' results, bounded by ``deadline``; one is awaited in place (no task)."""
        with self.store.guard():
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    if len(calls) == 1:
                        return [await calls[0]]
                    return list(await asyncio.gather(*calls))
            except TimeoutError:
                raise self._too_slow() from None
