"""The language model failing every way the real API does: each turn ends with a clear message,
nothing half-written stays in the thread's history, and the next turn of the same thread is answered."""

from __future__ import annotations

import pytest

from bot.types import Inquiry, Outcome
from tests.fakes.anthropic_server import Script
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"
GOOD = "Regrease HL-M200 bearings every 4,000 operating hours [1]."

FAULTS = {
    "429 rate limited": (Script("", status=429, retry_after=0),
                         "The language model is not answering right now (rate limited). Please try again in a minute."),
    "529 overloaded": (Script("", status=529),
                       "The language model is not answering right now (overloaded). Please try again in a minute."),
    "timeout": (Script(GOOD, first_token_delay=3.0),
                "The language model is not answering right now (timed out). Please try again in a minute."),
    "stream cut halfway": (Script(GOOD, cut_after_tokens=4),
                           "The language model is not answering right now (connection lost). Please try again in a minute."),
    "empty answer": (Script("", empty=True), "The language model returned an empty answer. Please try again."),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_model_fault_ends_plainly_and_the_next_turn_is_answered(claude, fault):
    fake, runtime = claude
    runtime.settings.generator.timeout_s = 1  # read before the answerer is built: the timeout fault takes 1 s
    script, message = FAULTS[fault]
    thread = f"test:model-{fault.split()[0]}"
    ask = Inquiry("test", "t", "c", thread, "u", QUESTION)
    fake.enqueue(script)
    reply = RecordingReply()
    failed = await runtime.answerer.answer(ask, reply)
    assert failed.outcome is Outcome.ERROR
    assert reply.failure == message and reply.final is None
    assert await runtime.history.load(thread) == []  # no half turn

    fake.enqueue(Script(GOOD))
    again = RecordingReply()
    answer = await runtime.answerer.answer(ask, again)
    assert answer.outcome is Outcome.ANSWERED and again.final is answer
    assert answer.text == GOOD and answer.trace.history_turns == 0
    assert len(await runtime.history.load(thread)) == 2
