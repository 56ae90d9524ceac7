"""The Claude path: the real anthropic SDK (through anthropic-haystack) against a local fake of the
Messages API, streaming over SSE."""

from __future__ import annotations

from pathlib import Path

from bot.types import Inquiry, Outcome
from tests.fakes.anthropic_server import Script
from tests.replies import RecordingReply


def inquiry(text: str, thread: str = "t1") -> Inquiry:
    return Inquiry(platform="test", tenant="t", channel="c", thread_key=f"test:{thread}", user_id="u", text=text)


async def test_streams_a_cited_answer_in_the_question_language(claude):
    fake, runtime = claude
    # What the overheating guide's opening says, cited: the sentence gate shows only what a cited source holds.
    fake.responder = lambda req: Script(
        "正常运行时机壳表面温度一般在 60–80 °C 之间 [1]。机壳表面温度超过 90 °C 即判定为过热 [1]。"
        "电机内置 PTC 热敏电阻（150 °C）[1]。轴承部位温度超过 95 °C 也属于异常 [1]。", tokens_per_second=200)
    reply = RecordingReply()
    answer = await runtime.answerer.answer(inquiry("电机过热怎么办？"), reply)

    assert answer.outcome is Outcome.ANSWERED
    assert len(reply.deltas) > 3 and reply.streamed == answer.text  # streamed, then the same final text
    assert reply.final is answer
    assert [c.index for c in answer.citations] == [1]
    assert Path(answer.citations[0].doc_id).name == "overheating-zh.md"
    assert answer.trace.first_token_ms is not None

    request = fake.last_request
    assert request.stream
    assert "answer ONLY from the" in request.system and "Chinese" in request.system
    user = request.last_user_text
    assert user.count("<source id=") >= 4 and "电机过热" in user
    assert "Question: 电机过热怎么办？" in user
    assert "(this is the first message of the conversation)" in user


async def test_history_reaches_the_model_on_the_next_turn(claude):
    fake, runtime = claude
    fake.enqueue(Script("E-004 means drive overheat [1]."), Script("Clean the heatsink [1]."))
    await runtime.answerer.answer(inquiry("What does fault E-004 mean?", "hist"), RecordingReply())
    answer = await runtime.answerer.answer(inquiry("How do I fix it?", "hist"), RecordingReply())
    assert answer.trace.history_turns == 1
    assert "User: What does fault E-004 mean?" in fake.last_request.last_user_text
    assert "kbbot: E-004 means drive overheat [1]." in fake.last_request.last_user_text


async def test_empty_model_reply_is_an_error_not_an_empty_message(claude):
    fake, runtime = claude
    fake.responder = lambda req: Script("", empty=True)
    reply = RecordingReply()
    answer = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "empty"), reply)
    assert answer.outcome is Outcome.ERROR
    assert reply.final is None
    assert reply.failure == "The language model returned an empty answer. Please try again."
    assert await runtime.history.load("test:empty") == []  # no half turn in history


async def test_stream_cut_mid_answer_fails_visibly_and_the_next_turn_works(claude):
    fake, runtime = claude
    # Cut in the second sentence: the first, complete and checked, was shown; the unfinished one never is.
    fake.enqueue(Script("Grease HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease [1]. "
                        "Regrease HL-M300 bearings every", cut_after_tokens=20))
    reply = RecordingReply()
    answer = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "cut"), reply)
    assert answer.outcome is Outcome.ERROR
    assert reply.deltas  # part of the answer was shown before the cut
    assert "HL-M300" not in reply.streamed
    assert reply.failure.startswith("The language model is not answering right now (connection lost)")
    assert await runtime.history.load("test:cut") == []

    fake.enqueue(Script("Every 4,000 operating hours [1]."))
    again = RecordingReply()
    answer = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "cut"), again)
    assert answer.outcome is Outcome.ANSWERED and again.final is answer


async def test_overloaded_model_is_reported_plainly(claude):
    fake, runtime = claude
    fake.responder = lambda req: Script("", status=529)
    reply = RecordingReply()
    answer = await runtime.answerer.answer(inquiry("What does fault E-004 mean?", "busy"), reply)
    assert answer.outcome is Outcome.ERROR
    assert reply.failure == "The language model is not answering right now (overloaded). Please try again in a minute."


async def test_invented_source_numbers_are_removed(claude):
    fake, runtime = claude
    fake.responder = lambda req: Script("Warranty is 24 months [1][42].")
    answer = await runtime.answerer.answer(inquiry("How long is the warranty?", "inv"), RecordingReply())
    assert answer.text == "Warranty is 24 months [1]."
    assert [c.index for c in answer.citations] == [1]


async def test_off_scope_question_never_reaches_the_model(claude):
    fake, runtime = claude
    answer = await runtime.answerer.answer(inquiry("What's the weather in Paris tomorrow?", "w"), RecordingReply())
    # Nothing in the knowledge base comes close (best cosine 0.779): off-topic whatever a model says.
    assert answer.outcome is Outcome.OFF_TOPIC
    assert fake.requests == []


async def test_closing_the_runtime_closes_the_model_clients(kb_data_dir, tmp_path, monkeypatch):
    """Left open, the SDK's client is closed by its finaliser, which schedules the close on whatever event
    loop runs when it is collected and fails there ("Task exception was never retrieved")."""
    from bot.runtime import build_runtime
    from tests.conftest import make_settings
    from tests.fakes.anthropic_server import FakeAnthropic

    async with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        runtime = build_runtime(make_settings(kb_data_dir, ANTHROPIC_API_KEY="sk-test"))
        runtime.settings.data_dir = tmp_path
        await runtime.start()
        answer = await runtime.answerer.answer(inquiry("How often should the bearings be greased?"), RecordingReply())
        assert answer.outcome is not Outcome.ERROR
        clients = [g.async_client for g in runtime._generators if g.async_client is not None]
        assert clients and not any(c.is_closed() for c in clients)
        await runtime.close()
        assert all(c.is_closed() for c in clients)
