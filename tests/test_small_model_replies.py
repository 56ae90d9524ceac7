"""What a small real model writes (Qwen2.5-Coder-1.5B through llama.cpp, and the cases of issue 14)
and how each step copes: JSON in fences or prose, full-width punctuation, numbers as strings,
【1】 / [1,2] markers and markers on a line of their own; and the guard's verdict weighed against
retrieval. The replies go through the real OpenAI client to a local fake endpoint."""

from __future__ import annotations

import pytest
from haystack import Document

from bot.turn.answering import resolve_citations
from pipelines.citations import attach_missing_markers, normalize_markers, sentence_citations
from pipelines.components.grader import RelevanceGrader
from pipelines.components.guard import ScopeCheck, TopicGuard, TopicVerdict
from pipelines.components.turn import TurnLedger, parse_confidence, parse_json_object, parse_numbers
from pipelines.generators import make_generator
from tests.fakes.openai_server import FakeOpenAI


@pytest.mark.parametrize("reply, expected", [
    ('```json\n{"on_topic": true, "confidence": 0.9}\n```', {"on_topic": True, "confidence": 0.9}),
    ('Here is my answer:\n{"relevant": [1, 2]}\nPassage 1 and 2 mention grease {sic}.', {"relevant": [1, 2]}),
    ('｛"on_topic"：false，"confidence"：0.8｝', {"on_topic": False, "confidence": 0.8}),
    ('{"query": "HL-M200 额定电流"} {"query": "second"}', {"query": "HL-M200 额定电流"}),
    ('```\n{"relevant": []}\n```\n```json\n{"relevant": [3]}\n```', {"relevant": []}),
    ("I cannot answer that.", None),
    ('{"on_topic": true, "confidence": }', None),
])
def test_json_is_found_where_models_put_it(reply: str, expected):
    assert parse_json_object(reply) == expected


def test_numbers_and_confidences_as_models_write_them():
    assert parse_numbers(["1", "3"]) == [1, 3] and parse_numbers("1, 3") == [1, 3] and parse_numbers(2) == [2]
    assert parse_numbers([1, "two"]) is None and parse_numbers(True) is None and parse_numbers("") == []
    assert parse_confidence("80%") == 0.8 and parse_confidence(80) == 0.8 and parse_confidence("0.3") == 0.3
    assert parse_confidence(None) == 1.0 and parse_confidence("sure") == 1.0


def test_markers_become_one_form_on_the_line_they_support():
    # "电机过热怎么办？" from the 1.5B model: markers on lines of their own, 【n】 and [n,m].
    raw = "电机过热怎么办？\n\n1. 检查风扇是否损坏。\n2. 清理散热片。\n[1] [2][3]\n\n降低负载【4】，并检查缺相[1,2]。"
    text = normalize_markers(raw)
    assert "2. 清理散热片。 [1][2][3]" in text and "降低负载[4]，并检查缺相[1][2]。" in text
    assert "\n[1]" not in text
    cited = dict(sentence_citations(text))
    assert cited["清理散热片。"] == [1, 2, 3] and cited["电机过热怎么办？"] == []
    sources = [Document(content=f"c{i}", meta={"doc_id": f"d{i}"}) for i in range(1, 5)]
    cleaned, citations = resolve_citations(raw, sources)
    assert [c.index for c in citations] == [1, 2, 3, 4] and "【" not in cleaned


def test_copied_source_tags_and_a_repetition_loop_are_cleaned():
    # "电机过热怎么办？" from the 1.5B model on the sample KB (make demo-local, this stop): the
    # prompt's tags copied after each paragraph, then one paragraph again and again to max_tokens.
    loop = "如果电机过热，应立即查找原因，根据上述步骤进行处理。如果无法确定原因，应立即联系服务团队。<sources id=\"1\">"
    raw = ("电机过热怎么办？<sources id=\"1\">\n\n1. 机壳表面温度超过 90 °C 即判定为过热。\n2. 轴承温度超过 95 °C 也属于异常。"
           "\n\n" + "\n\n".join([loop] * 4) + "\n\n如果电机过热")
    text = normalize_markers(raw)
    assert "<source" not in text and text.count("应立即联系服务团队") == 1
    assert "应立即联系服务团队。[1]" in text and text.endswith("如果电机过热")
    assert normalize_markers('See <source id="2" title="Fault codes">the table</source>.') == "See [2]the table."
    sources = [Document(content="机壳表面温度超过 90 °C 即判定为过热", meta={"doc_id": "d1"})]
    cleaned, citations = resolve_citations(raw, sources)
    assert [c.index for c in citations] == [1] and "<sources" not in cleaned


def _dense(score: float) -> list[Document]:
    return [Document(content="d", score=score, meta={"doc_id": "d1"})]


async def test_a_guard_that_calls_a_greasing_question_off_topic_is_overruled_by_a_strong_match():
    # Issue 14: the 1.5B model called this off-topic with confidence 0.8, though lubrication is in scope.
    async with FakeOpenAI(reply=lambda req: '```json\n{"on_topic": false, "confidence": 0.8}\n```') as fake:
        model = make_generator("local", model="m", base_url=f"{fake.base_url}/v1", max_retries=0, temperature=0)
        ledger = TurnLedger()
        guard = TopicGuard(model, defer_to_retrieval=True)
        with ledger.running():
            out = await guard.run_async(query="How often should the bearings be greased?")
        # The query goes on; the verdict is a doubt to weigh against retrieval, not an end.
        assert out == {"query": "How often should the bearings be greased?", "verdict": TopicVerdict(doubt=0.8)}
        with ledger.running():  # beside retrieval the query went on already: the verdict alone
            assert await guard.run_async(query="q", beside_retrieval=True) == {"verdict": TopicVerdict(doubt=0.8)}
    assert fake.requests[-1]["temperature"] == 0
    grader = RelevanceGrader(None, min_similarity=0.82, off_topic_similarity=0.78)
    docs = [Document(content="Regrease every 4,000 h.", meta={"doc_id": "d1"})]
    scope = ScopeCheck()
    strong = grader.run(query="How often should the bearings be greased?", documents=docs, dense_documents=_dense(0.90))
    assert scope.run(strong["grade"], out["verdict"])["documents"] == docs
    weak = grader.run(query="What's the weather in Paris tomorrow?", documents=docs, dense_documents=_dense(0.83))
    assert scope.run(weak["grade"], out["verdict"]) == {"off_topic": 0.83}
    assert "documents" in scope.run(weak["grade"])  # no doubt: the grade's own finding


def test_a_request_nothing_matches_is_off_topic_in_both_languages_even_with_a_model():
    # The 1.5B guard passed the poem request (on_topic true, confidence 0.0); retrieval decides.
    docs = [Document(content="HL-M300 额定参数表", meta={"doc_id": "d1"})]
    for model in (None, object()):
        grader = RelevanceGrader(model, min_similarity=0.82, off_topic_similarity=0.78, off_topic_similarity_zh=0.85)
        assert grader.run(query="帮我写一首关于春天的诗", documents=docs,
                          dense_documents=_dense(0.831))["grade"].outputs() == {"off_topic": 0.831}
        assert grader.run(query="What's the weather in Paris tomorrow?", documents=docs,
                          dense_documents=_dense(0.779))["grade"].outputs() == {"off_topic": 0.779}
    # A Chinese product question scores above the Chinese floor and goes on.
    grader = RelevanceGrader(None, min_similarity=0.82, off_topic_similarity=0.78, off_topic_similarity_zh=0.85)
    assert "documents" in grader.run(query="电机过热怎么办？", documents=docs,
                                     dense_documents=_dense(0.932))["grade"].outputs()


async def test_grader_reads_numbers_written_as_strings_around_prose():
    reply = '相关的段落是【1】和【3】。\n{"relevant": ["1", "3"]}'
    async with FakeOpenAI(reply=lambda req: reply) as fake:
        model = make_generator("local", model="m", base_url=f"{fake.base_url}/v1", max_retries=0)
        grader = RelevanceGrader(model, min_similarity=0.8)
        docs = [Document(content=f"passage {i}", meta={"doc_id": f"d{i}"}) for i in range(1, 4)]
        out = await grader.run_async(query="q", documents=docs, dense_documents=_dense(0.9))
    assert out["grade"].outputs()["documents"] == [docs[0], docs[2]]


def test_an_answer_the_model_left_uncited_is_credited_to_the_source_that_holds_it():
    # Recorded: the 1.5B local model on clapnq (kbbot eval --answers), no marker at all.
    answer = ('The Latin phrase "parens patriae" was used to refer to the public policy power of the state to '
              "intervene against an abusive or negligent parent, legal guardian, or informal caretaker, and to act "
              "as the parent of any child or individual who is in need of protection.")
    sources = [Document(content="Minors in the United States ... juvenile court jurisdiction.", meta={"doc_id": "a"}),
               Document(content="Parens patriae is Latin for `` parent of the nation '' . In law , it refers to the "
                                "public policy power of the state to intervene against an abusive or negligent parent "
                                ", legal guardian , or informal caretaker , and to act as the parent of any child or "
                                "individual who is in need of protection .", meta={"doc_id": "gold"})]
    text, citations = resolve_citations(answer + " It is also sung in operas.", sources)
    assert text.startswith(answer + " [2]") and text.endswith("It is also sung in operas.")
    assert [c.doc_id for c in citations] == ["gold"]
    # Sentences the model did cite are left as they are.
    assert attach_missing_markers("Parens patriae [1]. The state acts as parent.", [s.content for s in sources]) == \
        "Parens patriae [1]. The state acts as parent."
