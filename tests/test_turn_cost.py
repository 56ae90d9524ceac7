"""What keeps a turn's CPU down (docs/benchmarks.md, "Turn cost"), each kept honest: retrieved chunks are
Passages that Haystack's input copies share instead of copying, and the prompt's templates are
compiled once. Each test fails if the saving is undone or changes what a turn produces."""

from __future__ import annotations

import copy
import inspect
from dataclasses import replace
from typing import Any

import pytest
from haystack import Document
from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

from bot.types import Inquiry, Outcome
from pipelines.components.prompt import compiled_chat_prompt_builder
from pipelines.components.retrievers import DenseCandidates
from pipelines.components.shared import Passage, passages
from tests.replies import RecordingReply


def test_a_passage_is_a_value_shared_by_copies_and_changed_only_by_replace():
    passage = passages([Document(content="Grease every 4,000 h.", meta={"doc_id": "a.md"}, score=0.5)])[0]
    assert isinstance(passage, Passage) and copy.deepcopy(passage) is passage
    assert copy.deepcopy({"documents": [passage]})["documents"][0] is passage
    with pytest.raises(AttributeError, match=r"dataclasses.replace\(passage, score=...\)"):
        passage.score = 0.9
    rescored = replace(passage, score=0.9)
    assert isinstance(rescored, Passage) and rescored.score == 0.9 and passage.score == 0.5
    assert rescored.id == passage.id and rescored.content == passage.content
    assert passages([passage])[0] is passage  # already a Passage: kept as it is


def _spy(component: Any, seen: list[dict[str, Any]]) -> None:
    """Records what ``component.run`` is given and returns (the run_async of the components spied
    here calls ``self.run``; Haystack calls ``run`` in a thread for the others)."""
    real = component.run
    signature = inspect.signature(real)

    def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = real(*args, **kwargs)
        seen.append({"in": signature.bind(*args, **kwargs).arguments, "out": out})
        return out

    component.run = run


async def test_a_turn_hands_the_retrieved_passages_on_without_copying_or_changing_them(claude):
    fake, runtime = claude
    pipeline = runtime.answerer.pipeline
    retrieved: list[dict[str, Any]] = []
    ranked: list[dict[str, Any]] = []
    _spy(pipeline.get_component("retrieve"), retrieved)
    _spy(pipeline.get_component("rank"), ranked)
    fake.enqueue("Grease the HL-M200 bearings every 4,000 operating hours [1].")
    question = "How often should the HL-M200 bearings be greased?"
    answer = await runtime.answerer.answer(Inquiry("test", "t", "c", "test:cost", "u", question), RecordingReply())
    assert answer.outcome is Outcome.ANSWERED and answer.citations

    out = retrieved[0]["out"]
    assert out["documents"] and all(type(d) is Passage for d in out["documents"])
    assert isinstance(out["dense_documents"], DenseCandidates)
    assert all(type(d) is Passage for d in out["dense_documents"])
    before = [d.to_dict(flatten=False) for d in out["documents"]]
    # `current` keeps the same objects, and Haystack's copies of rank's inputs are those objects too.
    given = ranked[0]["in"]["documents"]
    assert given and all(any(g is d for d in out["documents"]) for g in given)
    # Nothing in the turn changed a passage in place (meta included: assignment alone would raise).
    assert [d.to_dict(flatten=False) for d in out["documents"]] == before


def test_the_prompt_builder_renders_as_haystacks_and_compiles_each_template_once():
    template = [ChatMessage.from_system("You answer from {{ sources }}."),
                ChatMessage.from_user("{{ question }}")]
    plain = ChatPromptBuilder(template=template, required_variables=["sources", "question"])
    compiled = compiled_chat_prompt_builder(template=template, required_variables=["sources", "question"])
    for sources, question in (("[1] manual", "How often?"), ("[1] guide", "电机过热怎么办？"), ("", "x")):
        assert compiled.run(sources=sources, question=question) == plain.run(sources=sources, question=question)
    cache = compiled._env.from_string.cache_info()
    assert (cache.misses, cache.hits) == (2, 4)  # two templates compiled once, then reused
