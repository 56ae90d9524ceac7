"""The parts of a turn that need no model: its ledger, parsing, facts, topics, rules of rewrite and clarify."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.dataclasses import ChatMessage

from bot.settings import SettingsError
from pipelines.components.clarify import ModelClarifier
from pipelines.components.facts import table_facts
from pipelines.components.grader import RelevanceGrader
from pipelines.components.rewrite import QueryRewriter
from pipelines.components.turn import TurnLedger, current_ledger, parse_json_object
from pipelines.text import identifiers, neutralize_tags
from pipelines.topics import Topics
from tests.conftest import REPO, make_settings

TOPICS = Topics.from_mapping({"in_scope": ["motors"], "products": [{"name": "HL-M200", "aliases": ["M200"]},
                                                                    "HL-M300", "HL-D50"]})


def test_the_ledger_caps_calls_and_keeps_one_for_the_answer():
    ledger = TurnLedger.start(max_model_calls=3)
    assert ledger.take("guard") and ledger.take("grade")
    assert not ledger.take("reformulate")  # the third call is the answer's
    assert ledger.steps == [{"step": "reformulate", "skipped": "model-call cap reached"}]
    ledger.spent("answer")  # the answer's own call is counted, never refused
    assert ledger.calls == ["guard", "grade", "answer"]
    late = TurnLedger.start(max_model_calls=8, timeout_s=0.5)
    assert not late.take("guard") and late.steps[0]["skipped"] == "turn time almost up"


@component
class _SyncSpender:  # no run_async: Haystack runs it in a worker thread
    @component.output_types(text=str)
    def run(self, text: str) -> dict[str, Any]:
        current_ledger().take("sync")
        return {"text": text}


@component
class _AsyncSpender:
    @component.output_types(text=str)
    def run(self, text: str) -> dict[str, Any]:
        raise AssertionError("run_async is used")

    @component.output_types(text=str)
    async def run_async(self, text: str) -> dict[str, Any]:
        await asyncio.sleep(0.01)  # the other turn runs meanwhile
        current_ledger().take("async")
        return {"text": text}


async def test_every_component_of_a_run_spends_from_its_own_turns_ledger_and_no_other():
    pipe = Pipeline()
    pipe.add_component("a", _SyncSpender())
    pipe.add_component("b", _AsyncSpender())
    pipe.add_component("c", _SyncSpender())
    pipe.connect("a.text", "b.text")
    pipe.connect("a.text", "c.text")  # b and c: two branches, run concurrently

    async def turn(ledger: TurnLedger) -> None:
        with ledger.running():
            await pipe.run_async({"a": {"text": "q"}})

    first, second = TurnLedger(max_model_calls=4, reserved=0), TurnLedger(max_model_calls=2, reserved=0)
    await asyncio.gather(turn(first), turn(second))
    assert sorted(first.calls) == ["async", "sync", "sync"]
    assert len(second.calls) == 2 and second.steps[0]["skipped"] == "model-call cap reached"
    assert current_ledger().calls == []  # outside a turn: a fresh ledger, none of theirs


@pytest.mark.parametrize("reply, expected", [
    ('{"relevant": [1, 3]}', {"relevant": [1, 3]}),
    ('Sure! ```json\n{"on_topic": false, "confidence": 0.9}\n```', {"on_topic": False, "confidence": 0.9}),
    ("relevant: 1, 3", None), ('{"relevant": [1,', None), ("[1, 2]", None), ("", None), (None, None),
])
def test_model_json_is_found_in_prose_or_fences_or_refused(reply, expected):
    assert parse_json_object(reply) == expected


def test_table_rows_become_entity_attribute_value_facts():
    spec = "| Parameter | 5.5 kW | 7.5 kW |\n|---|---|---|\n| Rated current | 10.8 A | 14.4 A |\n"
    assert table_facts(spec, "HL-M200") == [["HL-M200 5.5 kW", "Rated current", "10.8 A"],
                                            ["HL-M200 7.5 kW", "Rated current", "14.4 A"]]
    codes = "| Code 代码 | Cause 原因 | Remedy |\n|---|---|---|\n| E-004 | Heatsink too hot | Clean it |\n| E-005 | - | |\n"
    assert table_facts(codes, "HL-D50") == [["E-004", "Cause 原因", "Heatsink too hot"], ["E-004", "Remedy", "Clean it"]]
    two = "| 参数 | 数值 |\n|---|---|\n| 防护等级 | IP55 |\n"
    assert table_facts(two, "HL-M300") == [["HL-M300", "防护等级", "IP55"]]
    assert table_facts("no | table here\n| lonely |\n", "x") == []


def test_identifiers_and_tags():
    assert identifiers("HL-D50 shows E-007 on HL-M200-7R5, not E-007 again") == ["HL-D50", "E-007", "HL-M200-7R5"]
    assert neutralize_tags("</source></sources><facts> <b>ok</b>") == "‹/source>‹/sources>‹facts> <b>ok</b>"


def test_rules_rewrite_joins_a_clarification_and_searches_follow_ups_with_the_previous_question():
    rewrite = QueryRewriter(None, TOPICS)
    assert rewrite.run(question="What is E-004?", history=[])["query"] == "What is E-004?"
    clarified = [ChatMessage.from_user("What is the rated current?"),
                 ChatMessage.from_assistant("Which one do you mean: HL-M200, HL-M300?", meta={"outcome": "clarify"})]
    assert rewrite.run(question="M200", history=clarified)["query"] == "What is the rated current? M200"
    asked = [ChatMessage.from_user("What does E-004 on the HL-D50 mean?"), ChatMessage.from_assistant("Overheat [1].")]
    assert rewrite.run(question="How do I fix it?", history=asked)["query"] == \
        "How do I fix it? What does E-004 on the HL-D50 mean?"
    assert rewrite.run(question="And E-005?", history=asked)["query"] == "And E-005?"
    small_talk = [ChatMessage.from_user("How are you?"), ChatMessage.from_assistant("Fine.")]
    assert rewrite.run(question="How do I reset it?", history=small_talk)["query"] == \
        "How do I reset it?"


def _doc(title: str) -> Document:
    return Document(content="Rated current: 15.2 A at 400 V. 额定电流 15.2 A。", meta={"title": title})


def test_clarify_only_when_the_best_document_is_about_one_model_and_another_model_fits():
    topics = Topics.from_mapping({"products": [{"name": "HL-M200", "aliases": ["M200"], "kind": "motor"},
                                               {"name": "HL-M300", "kind": "motor"}, {"name": "HL-D50", "kind": "drive"}]})
    clarify = ModelClarifier(topics)
    m200, d50 = _doc("HL-M200 Technical Specifications"), _doc("HL-D50 变频器技术规格")
    schedule = _doc("Maintenance schedule for HL-M200 and HL-M300")
    # HL-M300 was not retrieved, but is a motor like HL-M200: it fits too.
    assert clarify.run(query="rated current?", documents=[m200, schedule, d50]) == {
        "clarify": ["HL-M200", "HL-D50", "HL-M300"]}
    assert "documents" in clarify.run(query="rated current?", documents=[schedule, m200, d50])
    assert "documents" in clarify.run(query="rated current?", documents=[m200, m200])
    assert "documents" in ModelClarifier(topics, enabled=False).run(query="rated current?", documents=[m200, d50])
    # A request about no product at all is never asked which model it means (issue 14: a poem).
    for request in ("帮我写一首关于春天的诗", "Write me a poem about spring"):
        assert "documents" in clarify.run(query=request, question=request, documents=[m200, schedule, d50])


def test_a_question_naming_a_model_keeps_to_it():
    clarify = ModelClarifier(TOPICS)
    m200, m300 = _doc("HL-M200 Technical Specifications"), _doc("HL-M300 电机技术规格")
    schedule = _doc("Maintenance schedule for HL-M200 and HL-M300")
    out = clarify.run(query="rated current of the HL-M300?", documents=[m200, schedule, m300])
    assert out["documents"] == [m300, schedule] and out["query"] == "rated current of the HL-M300?"
    out = clarify.run(query="rated current?", question="M200 and HL-M300", documents=[m200, schedule, m300])
    assert out["documents"] == [m200, m300, schedule]
    assert clarify.run(query="HL-D50 carrier frequency?", documents=[m200, m300]) == {"not_found": 0.0}


def test_without_a_model_the_grader_sorts_by_similarity():
    grader = RelevanceGrader(None, min_similarity=0.8, off_topic_similarity=0.78)
    docs = [Document(content="a", score=1.0)]

    def dense(score: float) -> list[Document]:
        return [Document(content="a", score=score)]

    def graded(score: float) -> dict[str, Any]:
        return grader.run(query="q", documents=docs, dense_documents=dense(score))["grade"].outputs()

    assert graded(0.79) == {"not_found": 0.79}
    assert graded(0.70) == {"off_topic": 0.70}
    assert graded(0.85)["documents"] == docs
    with pytest.raises(ValueError):
        RelevanceGrader(None, min_similarity=0.8, off_topic_similarity=0.9)


def test_topics_file_problems_are_clear_settings_errors(tmp_path):
    settings = make_settings(tmp_path)
    assert [p.name for p in settings.topics().products] == ["HL-M200", "HL-M300", "HL-D50"]
    (tmp_path / "topics.yaml").write_text("in_scope: motors\n", encoding="utf-8")
    settings.answering.topics = str(tmp_path / "topics.yaml")
    with pytest.raises(SettingsError, match="in_scope must be a list of non-empty strings"):
        settings.topics()
    (tmp_path / "topics.yaml").write_text("products:\n  - aliases: [x]\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"products\[0\] needs a name"):
        settings.topics()
    settings.answering.topics = str(tmp_path / "missing.yaml")
    with pytest.raises(SettingsError, match="cannot read the topics file"):
        settings.topics()


def test_threshold_settings_are_checked(tmp_path):
    config = tmp_path / "kbbot.yaml"
    config.write_text((REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8")
                      .replace("off_topic_similarity: 0.78", "off_topic_similarity: 0.95"), encoding="utf-8")
    from adapters.platforms import load_settings

    with pytest.raises(SettingsError, match="off_topic_similarity must be between 0 and retrieval.min_similarity"):
        load_settings(config, env={"KBBOT_DATA_DIR": str(tmp_path)})


def test_csv_files_become_one_markdown_table_and_bad_ones_say_why():
    from pipelines.components.converter import ConversionError, convert_csv

    table = convert_csv(b"Code;Name;Default\nP02.01;Acceleration time;10.0 s\n")
    assert table == "| Code | Name | Default |\n|---|---|---|\n| P02.01 | Acceleration time | 10.0 s |\n"
    assert table_facts(table, "x") == [["P02.01", "Name", "Acceleration time"], ["P02.01", "Default", "10.0 s"]]
    with pytest.raises(ConversionError, match="no rows under its header"):
        convert_csv(b"Code,Name\n")
    with pytest.raises(ConversionError, match="rows must all have the header's 2 columns"):
        convert_csv(b"Code,Name\nP1,a,extra\n")


def test_a_parameter_table_with_codes_is_keyed_by_code_not_by_header():
    table = "| Parameter | Function | Default |\n|---|---|---|\n| P02.01 | Acceleration time | 10.0 s |\n"
    assert table_facts(table, "HL-D50")[0] == ["P02.01", "Function", "Acceleration time"]
