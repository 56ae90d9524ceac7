"""The query pipeline, declared in one place so it reads like the diagram in docs/architecture.md:

    rewrite -> guard -+-> off_topic (the scope, no answer; with a core to spare decided at grade, retrieval beside it)
                      +-> search -> embed -> retrieve -> current -> rank -> grade -+-> clarify -+-> answerable -+
                            ^                                                     |            |               |
                            +------------- reformulate <- retry (bounded) <-------+-> not_found |               +-> not_found
                                                                                               +-> "which model?"
        answerable -+-> facts -> budget -> prompt -> judge -+-> generate (checked)
                                                            +-> not_found

In a turn (``run_async``) with a core to spare (``TurnBudget.overlap_helpers``) the guard's model call
runs beside retrieval and the grade: the query goes on to ``search`` at once and the grade's result waits
for the verdict, so an off-topic question still ends off-topic (its retrieval and grade spent for nothing)
and an on-topic one no longer waits out the guard's round trip. Otherwise the guard decides first.

``search`` (a BranchJoiner) is the loop's entry: the rewritten query first, then each
reformulation. A ``TurnBudget`` given per run caps the model calls and time of the turn and
collects the trace of every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from haystack import Pipeline
from haystack.components.joiners import BranchJoiner
from haystack.dataclasses import ChatMessage

from pipelines.components.answerability import EvidenceCheck
from pipelines.components.budget import ContextBudget
from pipelines.components.checked import checked
from pipelines.components.clarify import ModelClarifier
from pipelines.components.extractive import ExtractiveAnswerer
from pipelines.components.facts import FactLookup
from pipelines.components.grader import RelevanceGrader
from pipelines.components.guard import TopicGuard
from pipelines.components.judge import AnswerabilityJudge
from pipelines.components.prompt import compiled_chat_prompt_builder
from pipelines.components.reformulate import QueryReformulator
from pipelines.components.retrievers import DEFAULT_ALPHA, CurrentKnowledge, retriever_for
from pipelines.components.rewrite import QueryRewriter
from pipelines.components.turn import TurnBudget
from pipelines.grounding import SentenceEmbedder
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


@dataclass(frozen=True)
class Retrieval:
    """How chunks are found: ``mode`` (hybrid, bm25, vector), how many ``candidates`` each list
    gives, the ``fusion`` of the lists and the vectors' weight ``alpha`` (a number, or "auto")."""

    mode: str = "hybrid"
    candidates: int = 30
    fusion: str = "relative_score"
    alpha: float | str = DEFAULT_ALPHA


@dataclass(frozen=True)
class Models:
    """What a turn may call: ``answer`` writes the answer (a chat generator, ``messages`` in, or an
    ``ExtractiveAnswerer``); ``helper`` (a chat generator with a small ``max_tokens``, or None: rules
    and retrieval scores decide) serves rewrite, guard, grade and reformulate; ``judge`` (a chat
    generator returning token log-probabilities, or None) judges answerability before the answer is
    written; ``embedder`` (query and passage sentence vectors, or None) lets the sentence gate
    accept paraphrases and translations."""

    answer: Any
    helper: Any | None = None
    judge: Any | None = None
    embedder: SentenceEmbedder | None = None


@dataclass(frozen=True)
class Decisions:
    """When a turn ends without an answer, and what it asks first.

    ``min_similarity``: the best dense similarity below which nothing is relevant (no model call);
    ``off_topic_similarity`` (``off_topic_similarity_zh`` for Chinese questions): below it, off-topic;
    ``guard_min_confidence``: how sure the guard model must be; ``guard_weighs_retrieval``: its
    "off-topic" is checked against retrieval first (small models); ``evidence``: the margin below
    which the kept passages are judged not to answer (``components/answerability.py``; None: no such
    decision, a model grades them); ``judge``: the model's P(yes) below which they are judged not to;
    ``clarify``: ask "which model?" when the passages are about several.
    """

    min_similarity: float = 0.8
    off_topic_similarity: float = 0.0
    off_topic_similarity_zh: float | None = None
    guard_min_confidence: float = 0.7
    guard_weighs_retrieval: bool = False
    evidence: float | None = None
    judge: float = 0.5
    clarify: bool = True


@dataclass(frozen=True)
class Prompting:
    """The answer prompt: its two templates, the context's size in characters, facts at most."""

    system_template: str = ""
    user_template: str = ""
    budget_chars: int = 12000
    max_facts: int = 40


def build_query_pipeline(store: KnowledgeStore, text_embedder: Any, ranker: Any, models: Models, *,
                         prompting: Prompting = Prompting(), retrieval: Retrieval = Retrieval(),
                         decisions: Decisions = Decisions(), topics: Topics | None = None) -> Pipeline:
    """The answering pipeline (the module docstring's graph). Before the answer is written, the kept
    passages must pass the answerability decision (``answerable``: signals of the knowledge base;
    ``judge``: the model's yes/no, when ``models.judge``); the answer itself reaches the stream one
    checked sentence at a time (``generate`` is a ``CheckedAnswer`` around ``models.answer``)."""
    topics = topics or Topics()
    mode = retrieval.mode
    helper = models.helper
    pipe = Pipeline(max_runs_per_component=10)
    pipe.add_component("rewrite", QueryRewriter(helper, topics))
    pipe.add_component("guard", TopicGuard(helper, topics, decisions.guard_min_confidence,
                                           defer_to_retrieval=decisions.guard_weighs_retrieval))
    pipe.add_component("search", BranchJoiner(str))
    _add_retrieval(pipe, store, text_embedder, mode=mode, candidates=retrieval.candidates, fusion=retrieval.fusion,
                   alpha=retrieval.alpha, ranker=ranker)
    pipe.add_component("grade", RelevanceGrader(helper, min_similarity=decisions.min_similarity,
                                                off_topic_similarity=decisions.off_topic_similarity,
                                                off_topic_similarity_zh=decisions.off_topic_similarity_zh))
    pipe.add_component("reformulate", QueryReformulator(helper))
    pipe.add_component("clarify", ModelClarifier(topics, enabled=decisions.clarify))
    pipe.add_component("answerable", EvidenceCheck(decisions.evidence))
    pipe.add_component("facts", FactLookup(store, max_facts=prompting.max_facts))
    pipe.add_component("budget", ContextBudget(budget_chars=prompting.budget_chars))
    pipe.add_component("generate", checked(models.answer, embedder=models.embedder))

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
        pipe.connect("current.dense_documents", "answerable.dense_documents")
    pipe.connect("current.documents", "answerable.candidates")
    pipe.connect("grade.retry", "reformulate.query")
    pipe.connect("reformulate.query", "search.value")
    pipe.connect("grade.documents", "clarify.documents")
    pipe.connect("grade.query", "clarify.query")
    pipe.connect("clarify.query", "answerable.query")
    pipe.connect("clarify.documents", "answerable.documents")
    pipe.connect("answerable.query", "facts.query")
    pipe.connect("answerable.documents", "budget.documents")
    pipe.connect("facts.facts", "budget.facts")
    pipe.connect("budget.sources", "generate.sources")
    if isinstance(models.answer, ExtractiveAnswerer):
        pipe.connect("answerable.query", "generate.question")
        return pipe
    prompt = compiled_chat_prompt_builder(
        template=[ChatMessage.from_system(prompting.system_template), ChatMessage.from_user(prompting.user_template)],
        required_variables=list(PROMPT_VARIABLES),
    )
    pipe.add_component("prompt", prompt)
    for name in PROMPT_VARIABLES:
        pipe.connect(f"budget.{name}", f"prompt.{name}")
    if models.judge is None:
        pipe.connect("prompt.prompt", "generate.messages")
        return pipe
    pipe.add_component("judge", AnswerabilityJudge(models.judge, threshold=decisions.judge))
    pipe.connect("prompt.prompt", "judge.messages")
    pipe.connect("judge.messages", "generate.messages")
    return pipe


# Components whose outputs end a turn or explain it; the Answerer reads them.
OUTCOME_COMPONENTS = {"rewrite", "guard", "grade", "reformulate", "clarify", "answerable", "judge", "budget", "facts",
                      "generate"}


def turn_outcome(result: dict[str, Any]) -> str:
    """How a run of ``build_query_pipeline`` ended (run with ``include_outputs_from=OUTCOME_COMPONENTS``):
    ``off_topic``, ``not_found``, ``clarify`` or ``answered`` (``generate`` ran)."""
    if any("off_topic" in result.get(name, {}) for name in ("guard", "grade")):
        return "off_topic"
    if any("not_found" in result.get(name, {}) for name in ("grade", "reformulate", "clarify", "answerable", "judge",
                                                            "generate")):
        return "not_found"
    if "clarify" in result.get("clarify", {}):
        return "clarify"
    return "answered"


def query_inputs(pipeline: Pipeline, question: str, *, budget: TurnBudget | None = None,
                 filters: dict[str, Any] | None = None, spaces: list[str] | None = None,
                 history: list[ChatMessage] | None = None, preferences: str = "",
                 streaming_callback: Any = None) -> dict[str, Any]:
    """The per-run data of ``pipeline`` (``build_query_pipeline``), in one place: only for the
    components it has (an extractive pipeline has no prompt and no judge)."""
    budget = budget or TurnBudget()
    data: dict[str, Any] = {
        "rewrite": {"question": question, "history": history or [], "budget": budget},
        "guard": {"budget": budget},
        "retrieve": {"filters": filters},
        "grade": {"budget": budget},
        "reformulate": {"question": question, "budget": budget},
        "clarify": {"question": question},
        "answerable": {"budget": budget},
        "facts": {"spaces": spaces, "filters": filters},
        "budget": {"question": question, "history": history or [], "preferences": preferences},
        "judge": {"budget": budget},
        "generate": {"budget": budget},
    }
    if streaming_callback is not None:
        data["generate"]["streaming_callback"] = streaming_callback
    return {name: inputs for name, inputs in data.items() if name in pipeline.graph.nodes}


def retrieval_inputs(query: str, *, mode: str = "hybrid", filters: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-run data of ``build_retrieval_pipeline``."""
    data: dict[str, Any] = {"retrieve": {"query": query, "filters": filters}}
    if mode != "bm25":
        data["embed"] = {"text": query}
    data["rank"] = {"query": query}
    return data
