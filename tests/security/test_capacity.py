"""A cap on load (issue 15, findings 5 and 10): turns in flight and queued are bounded process-wide
with a short "busy" reply beyond the bound, the rate limit is checked before a turn waits for anything,
model calls at once are capped, and one thread's turns do not interleave across replicas (Redis lock)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from bot.runtime import build_runtime
from bot.turn.capacity import TurnGate
from bot.turn.limits import Limits, MemoryRateLimiter
from bot.turn.model_calls import Adaptation, MemoryModelCalls
from bot.types import Inquiry, Outcome
from tests.conftest import make_settings
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"
REDIS_URL = os.environ.get("REDIS_URL")


class HeldReply(RecordingReply):
    """A reply whose turn stops at ``start`` until ``gate`` opens: a turn that is still running."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate
        self.reached_start = asyncio.Event()

    async def start(self) -> None:
        self.reached_start.set()
        await self.gate.wait()
        await super().start()


def ask(thread: str, user: str = "u1", text: str = QUESTION) -> Inquiry:
    return Inquiry("slack", "T1", "C1", f"slack:T1:C1:{thread}", user, text)


async def until(condition, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_flood_beyond_the_queue_is_told_busy_at_once_and_the_rest_is_answered(kb_runtime):
    answerer = kb_runtime.answerer
    answerer.admission.gate = TurnGate(max_in_flight=2, max_queued=3)
    answerer.admission.limiter = None
    release = asyncio.Event()
    replies = [HeldReply(release) for _ in range(10)]
    turns = [asyncio.create_task(answerer.answer(ask(f"t{i}"), reply)) for i, reply in enumerate(replies)]
    await until(lambda: sum(r.failure is not None for r in replies) == 5)
    assert answerer.admission.gate.running == 2 and answerer.admission.gate.queued == 3
    busy = [r for r in replies if r.failure is not None]
    assert all(r.failure == "I am answering many questions right now. Please ask again in a moment." for r in busy)
    assert not any(r.reached_start.is_set() for r in busy), "a refused turn did no work"
    release.set()
    answers = await asyncio.gather(*turns)
    assert sorted(a.outcome.value for a in answers) == ["answered"] * 5 + ["error"] * 5
    assert answerer.admission.gate.admitted == 0 and answerer.admission.gate.running == 0


class AcknowledgingReply(HeldReply):
    """``Acknowledges``: records when the question was acknowledged."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__(gate)
        self.acknowledged = asyncio.Event()

    async def acknowledge(self) -> None:
        self.acknowledged.set()


async def test_a_question_waiting_for_its_thread_is_acknowledged_at_once(kb_runtime):
    answerer = kb_runtime.answerer
    answerer.admission.limiter = None
    release = asyncio.Event()
    first_reply = HeldReply(release)
    first = asyncio.create_task(answerer.answer(ask("same"), first_reply))
    await first_reply.reached_start.wait()  # the thread's lock is held by the first turn
    waiting = AcknowledgingReply(asyncio.Event())
    waiting.gate.set()
    second = asyncio.create_task(answerer.answer(ask("same", text="And the HL-M300?"), waiting))
    await asyncio.wait_for(waiting.acknowledged.wait(), 5)
    assert not waiting.reached_start.is_set(), "acknowledged while its turn waits for the thread"
    release.set()
    assert (await first).outcome is Outcome.ANSWERED and (await second).outcome is Outcome.ANSWERED
    assert waiting.reached_start.is_set()


async def test_the_rate_limit_is_checked_before_the_turn_waits_for_its_thread(kb_runtime):
    answerer = kb_runtime.answerer
    answerer.admission.limiter = MemoryRateLimiter(Limits(per_user=1, per_channel=0, window_s=60))
    answerer.admission.gate = TurnGate(max_in_flight=4, max_queued=4)
    release = asyncio.Event()
    first_reply = HeldReply(release)
    first = asyncio.create_task(answerer.answer(ask("same"), first_reply))
    await first_reply.reached_start.wait()  # the thread's lock is held by the first turn
    flood = [RecordingReply() for _ in range(20)]
    refused = await asyncio.wait_for(asyncio.gather(*(answerer.answer(ask("same"), r) for r in flood)), 5)
    assert all(a.outcome is Outcome.ERROR and "faster than I can answer" in a.text for a in refused)
    assert answerer.admission.gate.admitted == 1, "refused questions never took a place in the queue"
    release.set()
    assert (await first).outcome is Outcome.ANSWERED


async def test_model_calls_at_once_are_capped_process_wide(claude):
    fake, runtime = claude
    runtime.answerer.admission.limiter = None
    # A hosted model's number adapts to its provider (tests/test_model_calls.py); held at one here.
    runtime.model_calls.state = MemoryModelCalls(Adaptation(start=1, maximum=1))
    answers = await asyncio.gather(*(runtime.answerer.answer(ask(f"m{i}"), RecordingReply()) for i in range(6)))
    assert all(a.outcome is Outcome.ANSWERED for a in answers), [a.text for a in answers]
    assert runtime.model_calls.peak == 1 and runtime.model_calls.in_use == 0
    assert len(fake.requests) >= 6


@pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test starts Redis)")
async def test_one_threads_turns_do_not_interleave_across_replicas(kb_data_dir: Path, tmp_path: Path):
    prefix = f"kbbot-test-{uuid.uuid4().hex[:8]}:"
    replicas = []
    for i in range(2):
        settings = make_settings(kb_data_dir, REDIS_URL=REDIS_URL or "")
        settings.redis_prefix = prefix
        runtime = build_runtime(settings)
        runtime.settings.data_dir = tmp_path / f"r{i}"
        await runtime.start()
        replicas.append(runtime)
    try:
        release = asyncio.Event()
        held = HeldReply(release)
        first = asyncio.create_task(replicas[0].answerer.answer(ask("shared"), held))
        await held.reached_start.wait()
        second_reply = HeldReply(asyncio.Event())
        second_reply.gate.set()
        second = asyncio.create_task(replicas[1].answerer.answer(ask("shared", text="And the HL-M300?"),
                                                                  second_reply))
        await asyncio.sleep(0.5)
        assert not second_reply.reached_start.is_set(), "the other replica waits for the thread's turn"
        release.set()
        assert (await first).outcome is Outcome.ANSWERED
        await second
        assert second_reply.reached_start.is_set()
        history = await replicas[1].history.load("slack:T1:C1:shared")
        assert [m.text for m in history if m.role.value == "user"] == [QUESTION, "And the HL-M300?"]
    finally:
        for runtime in replicas:
            keys = [k async for k in runtime.redis.scan_iter(match=f"{prefix}*")]
            if keys:
                await runtime.redis.delete(*keys)
            await runtime.close()
