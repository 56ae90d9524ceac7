"""The query pipeline, declared in one place so it reads like the diagram in DESIGN.md:

    rewrite -> guard -+-> off_topic (no retrieval)
                      +-> search -> embed -> retrieve -> current -> rank -> grade -+-> clarify -+-> facts -> budget -> prompt -> generate
                            ^                                                     |            +-> clarify (ask which model)
                            |                                                     +-> retry -> reformulate --+ (bounded loop)
                            +-----------------------------------------------------------------------------------+
                                                                                  +-> not_found / off_topic (no model: by score)

``search`` (a BranchJoiner) is the loop's entry: the rewritten query first, then each
reformulation. A ``TurnBudget`` given per run caps the model calls and time of the turn and
collects the trace of every step.
"""

from __future__ import annotations

from typing import Any

from haystack import Pipeline
from haystack.components.joiners import BranchJoiner
from haystack.dataclasses import ChatMessage

from pipelines.components.budget import ContextBudget
from pipelines.components.clarify import ModelClarifier
from pipelines.components.extractive import ExtractiveAnswerer
from pipelines.components.facts import FactLookup
from pipelines.components.grader import RelevanceGrader
from pipelines.components.guard import TopicGuard
from pipelines.components.prompt import compiled_chat_prompt_builder
from pipelines.components.reformulate import QueryReformulator
from pipelines.components.retrievers import DEFAULT_ALPHA, CurrentKnowledge, retriever_for
from pipelines.components.rewrite import QueryRewriter
from pipelines.components.turn import TurnBudget
from pipelines.store import KnowledgeStore
from pipelines.topics import Topics

PROMPT_VARIABLES = ("sources_block", "history_block", "facts_block", "question", "language_name", "preferences_block")


def _add_retrieval(pipe: Pipeline, store: KnowledgeStore, text_embedder: Any | None, *, mode: str,
                   candidates: int, fusion: str, alpha: float | str, ranker: Any | None) -> None:
    if mode != "bm25":
        if text_embedder is None:
            raise ValueError(f"{mode} retrieval needs a text embedder")
        pipe.add_component("embed", text_embedder)
    pipe.add_component("retrieve", retriever_for(store, mode=mode, candidates=candidates, fusion=fusion, alpha=alpha))
    pipe.add_component("current", CurrentKnowledge(store))
    if mode != "bm25":
        pipe.connect("embed.embedding", "retrieve.query_embedding")
    pipe.connect("retrieve.documents", "current.documents")
    pipe.connect("retrieve.dense_documents", "current.dense_documents")
    if ranker is not None:
        pipe.add_component("rank", ranker)
        pipe.connect("current.documents", "rank.documents")
        pipe.connect("current.dense_documents", "rank.dense_documents")


def build_retrieval_pipeline(
    store: KnowledgeStore,
    text_embedder: Any | None,
    *,
    mode: str = "hybrid",
    candidates: int = 30,
    fusion: str = "relative_score",
    alpha: float | str = DEFAULT_ALPHA,
    ranker: Any | None = None,
) -> Pipeline:
    """Retrieval alone (embed -> retrieve -> current [-> rank]), for evaluation."""
    pipe = Pipeline()
    _add_retrieval(pipe, store, text_embedder, mode=mode, candidates=candidates, fusion=fusion, alpha=alpha,
                   ranker=ranker)
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
    fusion: str = "relative_score",
    alpha: float | str = DEFAULT_ALPHA,
    budget_chars: int = 12000,
    min_similarity: float = 0.8,
    helper_generator: Any | None = None,
    topics: Topics | None = None,
    guard_min_confidence: float = 0.7,
    guard_weighs_retrieval: bool = False,
    off_topic_similarity: float = 0.0,
    off_topic_similarity_zh: float | None = None,
    clarify: bool = True,
    max_facts: int = 40,
) -> Pipeline:
    """The answering pipeline.

    ``generator`` writes the answer: a chat generator (``messages`` in, ``replies`` out) or an
    ``ExtractiveAnswerer``. ``helper_generator`` (a chat generator with a small ``max_tokens``, or
    None) serves rewrite, guard, grade and reformulate; without it those steps fall back to rules
    and retrieval scores (``min_similarity`` for not_found, ``off_topic_similarity`` and, for Chinese
    questions, ``off_topic_similarity_zh`` for off_topic). ``guard_weighs_retrieval``: the guard
    model's "off-topic" is checked against retrieval before it ends the turn (for small models).
    """
    topics = topics or Topics()
    pipe = Pipeline(max_runs_per_component=10)
    pipe.add_component("rewrite", QueryRewriter(helper_generator, topics))
    pipe.add_component("guard", TopicGuard(helper_generator, topics, guard_min_confidence,
                                           defer_to_retrieval=guard_weighs_retrieval))
    pipe.add_component("search", BranchJoiner(str))
    _add_retrieval(pipe, store, text_embedder, mode=mode, candidates=candidates, fusion=fusion, alpha=alpha,
                   ranker=ranker)
    pipe.add_component("grade", RelevanceGrader(helper_generator, min_similarity=min_similarity,
                                                off_topic_similarity=off_topic_similarity,
                                                off_topic_similarity_zh=off_topic_similarity_zh))
    pipe.add_component("reformulate", QueryReformulator(helper_generator))
    pipe.add_component("clarify", ModelClarifier(topics, enabled=clarify))
    pipe.add_component("facts", FactLookup(store, max_facts=max_facts))
    pipe.add_component("budget", ContextBudget(budget_chars=budget_chars))
    pipe.add_component("generate", generator)

    pipe.connect("rewrite.query", "guard.query")
    pipe.connect("guard.query", "search.value")
    if mode != "bm25":
        pipe.connect("search.value", "embed.text")
    pipe.connect("search.value", "retrieve.query")
    pipe.connect("search.value", "rank.query")
    pipe.connect("search.value", "grade.query")
    pipe.connect("rank.documents", "grade.documents")
    if mode != "bm25":
        pipe.connect("current.dense_documents", "grade.dense_documents")
    pipe.connect("grade.retry", "reformulate.query")
    pipe.connect("reformulate.query", "search.value")
    pipe.connect("grade.documents", "clarify.documents")
    pipe.connect("grade.query", "clarify.query")
    pipe.connect("clarify.query", "facts.query")
    pipe.connect("clarify.documents", "budget.documents")
    pipe.connect("facts.facts", "budget.facts")
    if isinstance(generator, ExtractiveAnswerer):
        pipe.connect("clarify.query", "generate.question")
        pipe.connect("budget.sources", "generate.sources")
    else:
        prompt = compiled_chat_prompt_builder(
            template=[ChatMessage.from_system(system_template), ChatMessage.from_user(user_template)],
            required_variables=list(PROMPT_VARIABLES),
        )
        pipe.add_component("prompt", prompt)
        for name in PROMPT_VARIABLES:
            pipe.connect(f"budget.{name}", f"prompt.{name}")
        pipe.connect("prompt.prompt", "generate.messages")
    return pipe


# Components whose outputs end a turn or explain it; the Answerer reads them.
OUTCOME_COMPONENTS = {"rewrite", "guard", "grade", "reformulate", "clarify", "budget", "facts"}


def turn_outcome(result: dict[str, Any]) -> str:
    """How a run of ``build_query_pipeline`` ended (run with ``include_outputs_from=OUTCOME_COMPONENTS``):
    ``off_topic``, ``not_found``, ``clarify`` or ``answered`` (``generate`` ran)."""
    if any("off_topic" in result.get(name, {}) for name in ("guard", "grade")):
        return "off_topic"
    if any("not_found" in result.get(name, {}) for name in ("grade", "reformulate", "clarify")):
        return "not_found"
    if "clarify" in result.get("clarify", {}):
        return "clarify"
    return "answered"


def query_inputs(question: str, *, budget: TurnBudget | None = None, filters: dict[str, Any] | None = None,
                 spaces: list[str] | None = None, history: list[ChatMessage] | None = None,
                 preferences: str = "", streaming_callback: Any = None) -> dict[str, Any]:
    """The per-run data of ``build_query_pipeline``, in one place."""
    budget = budget or TurnBudget()
    data: dict[str, Any] = {
        "rewrite": {"question": question, "history": history or [], "budget": budget},
        "guard": {"budget": budget},
        "retrieve": {"filters": filters},
        "grade": {"budget": budget},
        "reformulate": {"question": question, "budget": budget},
        "clarify": {"question": question},
        "facts": {"spaces": spaces},
        "budget": {"question": question, "history": history or [], "preferences": preferences},
    }
    if streaming_callback is not None:
        data["generate"] = {"streaming_callback": streaming_callback}
    return data


def retrieval_inputs(query: str, *, mode: str = "hybrid", filters: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-run data of ``build_retrieval_pipeline``."""
    data: dict[str, Any] = {"retrieve": {"query": query, "filters": filters}}
    if mode != "bm25":
        data["embed"] = {"text": query}
    data["rank"] = {"query": query}
    return data
