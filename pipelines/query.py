"""The query pipeline, declared in one place so it reads like the diagram in docs/architecture.md:

    rewrite -> fork -+-> guard -+-> search         (the guard decides first)
                     |          +-> off_topic -> end
                     |          +-> verdict -> scope
                     +-> search                    (beside_retrieval: retrieval and the guard at once)

    search -> embed -> retrieve -> current -> rank -> grade -> scope -+-> clarify -+-> answerable -+-> facts -> fit
      ^                                                              |            |               |
      +------------- reformulate <- retry (bounded) <----------------+-> end      +-> end         +-> end

    fit -> prompt -> judge -+-> generate (checked) -> end
                            +-> end

    extractive (no model): answerable -> rest -> fit -> generate (checked) -> end

Every ending output goes to ``end``, whose one output ``turn`` is a ``TurnEnd`` (``off_topic``,
``not_found``, ``clarify`` or ``answered``, with what the answer needs).

The guard's verdict is an edge (``guard.verdict`` -> ``scope.verdict``). With the run input
``beside_retrieval`` (the Answerer sets it while the process has a core to spare) ``fork`` sends the
query to the guard and to ``search`` at once: Haystack's ``run_async`` runs the two branches
concurrently, so the guard's model call goes on beside retrieval and the grade's, and ``scope`` routes
the grade once the verdict is in (an off-topic question still ends off-topic, its retrieval and grade
spent for nothing; an on-topic one no longer waits out the guard's round trip). Otherwise the guard
decides first and passes the query on.

``search`` (a BranchJoiner) is the loop's entry: the rewritten query first, then each
reformulation. The turn's model calls, time and trace are not inputs: they are the running turn's
``TurnLedger`` (``pipelines.components.turn``). A run takes flat inputs, each reaching every component
with that input (``question``, ``history``, ``filters``, ``spaces``, ``preferences``,
``streaming_callback``, ``beside_retrieval``); the result's ``end.turn`` says how the turn ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from haystack import Pipeline
from haystack.components.joiners import BranchJoiner
from haystack.dataclasses import ChatMessage

from pipelines.components.answerability import EvidenceCheck
from pipelines.components.checked import checked
from pipelines.components.clarify import ModelClarifier
from pipelines.components.end import EndOfTurn, TurnEnd
from pipelines.components.extractive import ExtractiveAnswerer
from pipelines.components.facts import FactLookup
from pipelines.components.fit import PromptFit
from pipelines.components.grader import RelevanceGrader
from pipelines.components.guard import GuardFork, ScopeCheck, TopicGuard
from pipelines.components.judge import AnswerabilityJudge
from pipelines.components.prompt import compiled_chat_prompt_builder
from pipelines.components.reformulate import QueryReformulator
from pipelines.components.rest import DocumentRest
from pipelines.components.retrievers import DEFAULT_ALPHA, CurrentKnowledge, retriever_for
from pipelines.components.rewrite import QueryRewriter
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
    context_chars: int = 12000
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
    pipe.add_component("fork", GuardFork())
    pipe.add_component("guard", TopicGuard(helper, topics, decisions.guard_min_confidence,
                                           defer_to_retrieval=decisions.guard_weighs_retrieval))
    pipe.add_component("search", BranchJoiner(str))
    _add_retrieval(pipe, store, text_embedder, mode=mode, candidates=retrieval.candidates, fusion=retrieval.fusion,
                   alpha=retrieval.alpha, ranker=ranker)
    pipe.add_component("grade", RelevanceGrader(helper, min_similarity=decisions.min_similarity,
                                                off_topic_similarity=decisions.off_topic_similarity,
                                                off_topic_similarity_zh=decisions.off_topic_similarity_zh))
    pipe.add_component("scope", ScopeCheck())
    pipe.add_component("reformulate", QueryReformulator(helper))
    pipe.add_component("clarify", ModelClarifier(topics, enabled=decisions.clarify))
    pipe.add_component("answerable", EvidenceCheck(decisions.evidence))
    pipe.add_component("facts", FactLookup(store, max_facts=prompting.max_facts))
    pipe.add_component("fit", PromptFit(context_chars=prompting.context_chars))
    pipe.add_component("generate", checked(models.answer, embedder=models.embedder))
    pipe.add_component("end", EndOfTurn())

    pipe.connect("rewrite.query", "fork.query")
    pipe.connect("fork.guard", "guard.query")
    pipe.connect("fork.ahead", "search.value")
    pipe.connect("guard.query", "search.value")
    pipe.connect("guard.verdict", "scope.verdict")
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
    pipe.connect("grade.grade", "scope.grade")
    pipe.connect("scope.retry", "reformulate.query")
    pipe.connect("reformulate.query", "search.value")
    pipe.connect("scope.documents", "clarify.documents")
    pipe.connect("scope.query", "clarify.query")
    pipe.connect("clarify.query", "answerable.query")
    pipe.connect("clarify.documents", "answerable.documents")
    pipe.connect("answerable.query", "facts.query")
    extractive = isinstance(models.answer, ExtractiveAnswerer)
    if extractive:
        # Source sentences only: the answer reads the rest of its first documents that retrieval found.
        pipe.add_component("rest", DocumentRest())
        pipe.connect("answerable.documents", "rest.documents")
        pipe.connect("current.documents", "rest.candidates")
        pipe.connect("answerable.query", "rest.query")
        pipe.connect("rest.documents", "fit.documents")
    else:
        pipe.connect("answerable.documents", "fit.documents")
    pipe.connect("facts.facts", "fit.facts")
    pipe.connect("fit.sources", "generate.sources")
    for ending in ("guard.off_topic", "scope.off_topic"):
        pipe.connect(ending, "end.off_topic")
    for ending in ("scope.not_found", "reformulate.not_found", "clarify.not_found", "answerable.not_found",
                   "generate.not_found"):
        pipe.connect(ending, "end.not_found")
    pipe.connect("clarify.clarify", "end.clarify")
    pipe.connect("fit.sources", "end.sources")
    pipe.connect("generate.replies", "end.replies")
    pipe.connect("generate.draft", "end.draft")
    if extractive:
        pipe.connect("answerable.query", "generate.question")
        return pipe
    prompt = compiled_chat_prompt_builder(
        template=[ChatMessage.from_system(prompting.system_template), ChatMessage.from_user(prompting.user_template)],
        required_variables=list(PROMPT_VARIABLES),
    )
    pipe.add_component("prompt", prompt)
    for name in PROMPT_VARIABLES:
        pipe.connect(f"fit.{name}", f"prompt.{name}")
    if models.judge is None:
        pipe.connect("prompt.prompt", "generate.messages")
        return pipe
    pipe.add_component("judge", AnswerabilityJudge(models.judge, threshold=decisions.judge))
    pipe.connect("prompt.prompt", "judge.messages")
    pipe.connect("judge.messages", "generate.messages")
    pipe.connect("judge.not_found", "end.not_found")
    return pipe


def turn_end(result: dict[str, Any]) -> TurnEnd:
    """How a run of ``build_query_pipeline`` ended."""
    return result["end"]["turn"]


def retrieval_inputs(query: str, *, mode: str = "hybrid", filters: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-run data of ``build_retrieval_pipeline``."""
    data: dict[str, Any] = {"retrieve": {"query": query, "filters": filters}}
    if mode != "bm25":
        data["embed"] = {"text": query}
    data["rank"] = {"query": query}
    return data
