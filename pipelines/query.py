"""The query pipeline, declared in one place so it reads like the diagram in DESIGN.md:

    embed -> retrieve (BM25 + vectors, fused) -> current -> rank -> gate -+-> budget -> prompt -> generate
                                                                   +-> not_found (no generation)
"""

from __future__ import annotations

from typing import Any

from haystack import Pipeline
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

from pipelines.components.budget import ContextBudget
from pipelines.components.extractive import ExtractiveAnswerer
from pipelines.components.gate import RelevanceGate
from pipelines.components.retrievers import CurrentKnowledge
from pipelines.store import KnowledgeStore


def build_retrieval_pipeline(
    store: KnowledgeStore,
    text_embedder: Any | None,
    *,
    mode: str = "hybrid",
    candidates: int = 30,
    fusion: str = "dbsf",
    ranker: Any | None = None,
) -> Pipeline:
    """Retrieval alone (embed -> retrieve -> current [-> rank]), for evaluation and the full pipeline."""
    pipe = Pipeline()
    if mode != "bm25":
        if text_embedder is None:
            raise ValueError(f"{mode} retrieval needs a text embedder")
        pipe.add_component("embed", text_embedder)
    pipe.add_component("retrieve", store.retriever(mode=mode, candidates=candidates, fusion=fusion))
    pipe.add_component("current", CurrentKnowledge(store))
    if mode != "bm25":
        pipe.connect("embed.embedding", "retrieve.query_embedding")
    pipe.connect("retrieve.documents", "current.documents")
    pipe.connect("retrieve.dense_documents", "current.dense_documents")
    if ranker is not None:
        pipe.add_component("rank", ranker)
        pipe.connect("current.documents", "rank.documents")
        pipe.connect("current.dense_documents", "rank.dense_documents")
    return pipe


def build_query_pipeline(
    store: KnowledgeStore,
    text_embedder: Any,
    ranker: Any,
    generator: Any,
    *,
    system_template: str,
    user_template: str,
    mode: str = "hybrid",
    candidates: int = 30,
    fusion: str = "dbsf",
    budget_chars: int = 12000,
    min_similarity: float = 0.8,
) -> Pipeline:
    """The answering pipeline. ``generator`` is a chat generator (``messages`` in, ``replies``
    out) or an ``ExtractiveAnswerer`` (question and sources in)."""
    pipe = build_retrieval_pipeline(store, text_embedder, mode=mode, candidates=candidates, fusion=fusion,
                                    ranker=ranker)
    pipe.add_component("gate", RelevanceGate(min_similarity=min_similarity))
    pipe.add_component("budget", ContextBudget(budget_chars=budget_chars))
    pipe.add_component("generate", generator)

    pipe.connect("rank.documents", "gate.documents")
    if mode != "bm25":
        pipe.connect("current.dense_documents", "gate.dense_documents")
    pipe.connect("gate.documents", "budget.documents")
    if isinstance(generator, ExtractiveAnswerer):
        pipe.connect("budget.question", "generate.question")
        pipe.connect("budget.sources", "generate.sources")
    else:
        prompt = ChatPromptBuilder(
            template=[ChatMessage.from_system(system_template), ChatMessage.from_user(user_template)],
            required_variables=["sources_block", "history_block", "facts_block", "question", "language_name"],
        )
        pipe.add_component("prompt", prompt)
        for name in ("sources_block", "history_block", "facts_block", "question", "language_name"):
            pipe.connect(f"budget.{name}", f"prompt.{name}")
        pipe.connect("prompt.prompt", "generate.messages")
    return pipe


def query_inputs(question: str, *, mode: str = "hybrid", filters: dict[str, Any] | None = None,
                 history: list[ChatMessage] | None = None, facts: list[str] | None = None,
                 streaming_callback: Any = None, generate: bool = True) -> dict[str, Any]:
    """The per-run data of the pipelines above, in one place."""
    data: dict[str, Any] = {"retrieve": {"query": question, "filters": filters}}
    if mode != "bm25":
        data["embed"] = {"text": question}
    data["rank"] = {"query": question}
    if generate:
        data["budget"] = {"question": question, "history": history or [], "facts": facts or []}
        if streaming_callback is not None:
            data["generate"] = {"streaming_callback": streaming_callback}
    return data
