"""Redis restarted in the middle of a turn (a private server; the shared one is left alone)."""

from __future__ import annotations

import pytest

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from tests.conftest import make_settings
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.model_router import AnswerView, ModelRouter
from tests.private_redis import private_redis  # noqa: F401 - fixture
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"
GOOD = "Regrease HL-M200 bearings every 4,000 operating hours [1]."


@pytest.fixture
async def redis_claude(kb_data_dir, private_redis, monkeypatch):  # noqa: F811
    async with FakeAnthropic() as server:
        fake = AnswerView(server, ModelRouter())
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        settings = make_settings(kb_data_dir, ANTHROPIC_API_KEY="sk-test", REDIS_URL=private_redis.url)
        settings.generator.max_retries = 0
        runtime = build_runtime(settings)
        await runtime.start()
        try:
            yield fake, runtime, private_redis
        finally:
            await runtime.close()


async def test_redis_restarted_while_the_model_streams_loses_nothing(redis_claude):
    fake, runtime, redis = redis_claude
    thread = "test:redis-restart"
    ask = Inquiry("test", "t", "c", thread, "u", QUESTION)
    assert (await runtime.answerer.answer(ask, RecordingReply())).outcome is Outcome.ANSWERED

    def restart_then_answer(body):
        redis.restart()  # every connection of the pool dies; the server comes back empty (no persistence)
        return Script(GOOD, tokens_per_second=200)

    fake.responder = restart_then_answer
    reply = RecordingReply()
    answer = await runtime.answerer.answer(ask, reply)
    # The history was read before the restart; the append after it reconnects (bounded retry).
    assert answer.outcome is Outcome.ANSWERED and reply.final is answer and answer.text == GOOD
    history = await runtime.history.load(thread)
    assert [m.text for m in history] == [QUESTION, GOOD]  # the turn made during the restart is kept

    fake.responder = None
    fake.enqueue(Script(GOOD))
    next_turn = await runtime.answerer.answer(ask, RecordingReply())
    assert next_turn.outcome is Outcome.ANSWERED and next_turn.trace.history_turns == 1


async def test_redis_down_for_the_end_of_a_turn_is_one_clear_message_then_service_resumes(redis_claude):
    fake, runtime, redis = redis_claude
    thread = "test:redis-down"
    ask = Inquiry("test", "t", "c", thread, "u", QUESTION)

    def stop_then_answer(body):
        redis.stop()
        return Script(GOOD)

    fake.responder = stop_then_answer
    reply = RecordingReply()
    failed = await runtime.answerer.answer(ask, reply)
    assert failed.outcome is Outcome.ERROR and reply.final is None
    assert reply.failure.startswith("kbbot cannot reach its conversation store right now (")

    redis.start()
    fake.responder = None
    fake.enqueue(Script(GOOD))
    again = RecordingReply()
    answer = await runtime.answerer.answer(ask, again)
    assert answer.outcome is Outcome.ANSWERED and again.final is answer
    assert [m.text for m in await runtime.history.load(thread)] == [QUESTION, GOOD]
