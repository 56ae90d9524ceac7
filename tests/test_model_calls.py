"""Model calls at once (issue 28, item 5): a hosted model's number adapts to its provider's 429s and rate
headers and is shared by replicas in Redis; the model kbbot runs itself keeps its fixed cap.

The turns run through the real runtime, the Anthropic SDK and its haystack generator against the fake
Anthropic server, which answers 429 with ``retry-after`` and the real API's rate headers."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.runtime import Runtime, build_runtime
from bot.turn.model_calls import (
    Adaptation,
    AdaptiveModelCalls,
    MemoryModelCalls,
    RedisModelCalls,
    Signal,
    read_signal,
)
from bot.types import Inquiry, Outcome
from pipelines.components.throttle import ModelCallSlots
from tests.conftest import make_settings
from tests.fakes.anthropic_server import FakeAnthropic, Script, rate_headers
from tests.model_router import AnswerView, ModelRouter, quoting
from tests.private_redis import private_redis  # noqa: F401 - a fixture
from tests.replies import RecordingReply

REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="REDIS_URL is not set (make test starts Redis)")
QUESTION = "How often should the bearings be greased?"


def ask(thread: str) -> Inquiry:
    return Inquiry("slack", "T1", "C1", f"slack:T1:C1:{thread}", f"u-{thread}", QUESTION)


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the adaptation, on a clock of the test's own ---------------------------------------------------
async def test_a_429_halves_the_calls_running_and_holds_new_ones_for_its_retry_after():
    clock = Clock()
    state = MemoryModelCalls(Adaptation(start=8, maximum=8), clock)
    for i in range(6):
        assert await state.start(f"c{i}") == 0
    limit = await state.observe(read_signal(429, {"retry-after": "2"}))
    assert limit == 3, "half of the 6 running when the provider refused, not half of an allowance unused"
    assert await state.observe(read_signal(429, {"retry-after": "2"})) == 3, "the same burst cuts once"
    assert await state.start("late") == pytest.approx(2.0), "nothing starts before the retry-after"
    clock.now += 2.0
    assert await state.start("late") == -1.0, "then only below the new limit: 6 still run"
    for i in range(4):
        await state.finish(f"c{i}")
    assert await state.start("late") == 0


async def test_answers_bring_the_limit_back_one_call_per_round_up_to_the_maximum():
    state = MemoryModelCalls(Adaptation(start=4, maximum=6), Clock())
    await state.start("a")
    assert await state.observe(Signal(429)) == 1
    limits = [await state.observe(Signal(200)) for _ in range(30)]
    assert limits[0] == 2 and limits[1] == 2.5, "1 / limit per answer: one more call per round of calls"
    assert limits == sorted(limits) and limits[-1] == 6


async def test_the_requests_the_provider_says_remain_bound_the_calls_until_its_window_resets():
    clock = Clock()
    state = MemoryModelCalls(Adaptation(start=8, maximum=8), clock)
    signal = read_signal(200, rate_headers(limit=50, remaining=2, reset_in_s=30), now=clock_wall())
    assert signal.remaining == 2 and 28 <= (signal.reset_in_s or 0) <= 31
    await state.observe(signal)
    assert await state.start("a") == 0 and await state.start("b") == 0
    wait = await state.start("c")
    assert 28 <= wait <= 31, "the provider's window is spent: wait for its reset"
    clock.now += wait
    assert await state.start("c") == 0, "a new window: the remaining count is the provider's again"


def clock_wall() -> float:
    import time

    return time.time()


def test_openai_rate_headers_are_read_too():
    signal = read_signal(429, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m30s",
                               "retry-after-ms": "1500"})
    assert signal == Signal(429, 1.5, 0, 90.0) and signal.refused


# --- through the runtime, the SDK and the fake Anthropic server ----------------------------------------
async def runtime_on(kb_data_dir: Path, tmp_path: Path, name: str, redis_prefix: str = "kbbot:", **env: str) -> Runtime:
    settings = make_settings(kb_data_dir, ANTHROPIC_API_KEY="sk-test", **env)
    settings.redis_prefix = redis_prefix
    settings.generator.max_retries = 1  # the SDK retries a 429 after its retry-after, as in production
    settings.generator.timeout_s = 30
    settings.generator.max_tokens = 8192
    settings.limits.per_user = settings.limits.per_channel = 0
    settings.limits.model_calls_start = settings.limits.model_calls_max = 4
    settings.approvals.enabled = False
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path / name
    await runtime.start()
    return runtime


@pytest.fixture
async def claude_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AnswerView]:
    async with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        yield AnswerView(server, ModelRouter())


@needs_redis
async def test_two_replicas_share_the_calls_at_once_back_off_together_on_a_429_and_recover(
        kb_data_dir: Path, tmp_path: Path, claude_server: AnswerView):
    fake = claude_server
    redis_prefix = f"kbbot-test-{uuid.uuid4().hex[:8]}:"
    replicas = []
    for i in range(2):
        replicas.append(await runtime_on(kb_data_dir, tmp_path, f"r{i}", redis_prefix, REDIS_URL=REDIS_URL or ""))
    first, second = replicas
    try:
        assert isinstance(first.model_calls, AdaptiveModelCalls)
        release = asyncio.Event()
        held = 0
        answer = quoting(1)

        async def held_answers(body: dict[str, Any]) -> str:
            nonlocal held
            if held < 3:  # the first three answers stay in flight until the test lets them go
                held += 1
                await release.wait()
            return answer(body)

        fake.responder = held_answers
        running = [asyncio.create_task(first.answerer.answer(ask(f"held{i}"), RecordingReply())) for i in range(3)]
        await until(lambda: len(fake.requests) == 3)
        snapshot = await second.model_calls.state.snapshot()
        assert (snapshot.limit, snapshot.in_flight) == (4, 3), "the other replica counts the first one's calls"

        # The other replica's next call is refused by the provider: 4 were running, so 2 at once from
        # now on, for both replicas; its retry (after the retry-after) goes through, its next call waits.
        fake.router.enqueue("guard", Script(status=429, retry_after=0.2, headers=rate_headers(50, 40)))
        late = asyncio.create_task(second.answerer.answer(ask("late"), RecordingReply()))
        # Its guard and grade calls go out together (the guard's runs beside retrieval and the grade).
        await until(lambda: fake.router.kinds.count("guard") == 5 and second.model_calls.waiting == 1)
        assert fake.router.kinds.count("grade") == 3 and len(fake.requests) == 3, \
            "its grading waits: 3 calls run where 2 are allowed now"
        snapshot = await first.model_calls.state.snapshot()
        assert 2 <= snapshot.limit < 3, snapshot
        assert snapshot.remaining is not None and snapshot.remaining <= 40, "the rate headers were read"

        release.set()
        answers = await asyncio.gather(*running, late)
        assert [a.outcome for a in answers] == [Outcome.ANSWERED] * 4, [a.text for a in answers]
        for i in range(3):  # answers bring the limit back up, one call per round of calls
            assert (await second.answerer.answer(ask(f"after{i}"), RecordingReply())).outcome is Outcome.ANSWERED
        snapshot = await first.model_calls.state.snapshot()
        assert (snapshot.limit, snapshot.in_flight) == (4, 0), snapshot
        assert second.model_calls.refusals == 1 and first.model_calls.refusals == 0
    finally:
        release.set()
        for runtime in replicas:
            keys = [k async for k in runtime.redis.scan_iter(match=f"{redis_prefix}*")]
            if keys:
                await runtime.redis.delete(*keys)
            await runtime.close()


async def test_without_redis_a_hosted_model_adapts_in_this_process(kb_data_dir: Path, tmp_path: Path,
                                                                    claude_server: AnswerView):
    runtime = await runtime_on(kb_data_dir, tmp_path, "alone")
    try:
        assert isinstance(runtime.model_calls, AdaptiveModelCalls)
        assert isinstance(runtime.model_calls.state, MemoryModelCalls)
        claude_server.router.enqueue("guard", Script(status=429, retry_after=0.1))
        answer = await runtime.answerer.answer(ask("one"), RecordingReply())
        assert answer.outcome is Outcome.ANSWERED, answer.text
        snapshot = await runtime.model_calls.state.snapshot()
        assert snapshot.limit < 4 and snapshot.in_flight == 0 and runtime.model_calls.refusals == 1
    finally:
        await runtime.close()


async def test_the_model_kbbot_runs_itself_keeps_its_fixed_cap(kb_data_dir: Path, tmp_path: Path):
    settings = make_settings(kb_data_dir)
    # Set after the load's check for the optional llama.cpp extra: the admission needs no model loaded.
    settings.generator.kind = "local"
    settings.limits.concurrent_model_calls = 3
    runtime = build_runtime(settings)
    try:
        assert settings.generator_kind == "local"
        slots = runtime.model_calls
        assert isinstance(slots, ModelCallSlots) and slots.limit == 3
    finally:
        runtime.store.close()


async def test_redis_out_of_reach_the_model_calls_go_on_with_this_processes_count(private_redis):  # noqa: F811
    """Redis stops: calls are admitted by a state of this process (a 429 still teaches it) rather than
    fail; when Redis is back the replicas share its state again."""
    from bot.state.redis import connect_redis

    client = await connect_redis(private_redis.url, retries=0, socket_timeout=0.5, connect_timeout=0.5)
    state = RedisModelCalls(client, "test-model:", Adaptation(start=4, maximum=4), outage_retry_s=0.2)
    try:
        assert await state.start("a") == 0 and (await state.snapshot()).in_flight == 1
        private_redis.stop()
        assert await state.start("b") == 0, "admitted by this process meanwhile"
        assert await state.observe(Signal(429, 0.5)) == 1.0, "one call ran here when the provider refused"
        assert await state.start("c") > 0, "held for the retry-after, locally"
        await state.finish("b")
        private_redis.start()
        await asyncio.sleep(0.3)
        assert await state.start("d") == 0
        snapshot = await state.snapshot()  # the restarted Redis kept nothing: its state starts again
        assert (snapshot.limit, snapshot.in_flight) == (4, 1), "Redis' state again, not this process's"
        assert await client.exists("test-model:calls") == 1
    finally:
        await client.aclose()


@needs_redis
async def test_a_call_holds_its_place_while_it_runs_and_a_dead_replicas_places_come_back_within_the_lease():
    """Places are leased briefly and renewed while their calls run: a live call keeps its place however
    long it runs; a replica killed mid-call (its renewals stop) frees its places after one lease, not a
    turn's time (with the limit brought down to its calls by 429s, the survivors waited that long)."""
    from bot.state.redis import connect_redis

    assert REDIS_URL
    client = await connect_redis(REDIS_URL)
    prefix = f"kbbot-test-{uuid.uuid4().hex[:8]}:model:"
    adaptation = Adaptation(start=1, minimum=1, maximum=1, lease_s=0.6)
    alive, dying, waiting = (AdaptiveModelCalls(RedisModelCalls(client, prefix, adaptation)) for _ in range(3))
    try:
        running = await alive.enter()
        blocked = asyncio.create_task(waiting.enter())
        await asyncio.sleep(3 * adaptation.lease_s)  # five renewals
        assert not blocked.done(), "a running call keeps its place past its lease"
        await alive.leave(running)
        await asyncio.wait_for(blocked, 2)
        await waiting.leave(blocked.result())

        await dying.enter()
        assert dying._renewer is not None
        dying._renewer.cancel()  # killed: nothing renews its call, nothing lets it go
        started = asyncio.get_running_loop().time()
        taken = await asyncio.wait_for(waiting.enter(), 5)
        assert asyncio.get_running_loop().time() - started < adaptation.lease_s + 0.5
        await waiting.leave(taken)
    finally:
        await client.delete(f"{prefix}state", f"{prefix}calls")
        await client.aclose()


async def test_renewing_keeps_only_the_calls_still_in_flight():
    clock = Clock()
    state = MemoryModelCalls(Adaptation(start=2, maximum=2, lease_s=10), clock=clock)
    assert await state.start("a") == 0 and await state.start("b") == 0
    await state.finish("b")
    clock.now += 8
    await state.renew(["a", "b"])
    clock.now += 8
    snapshot = await state.snapshot()
    assert snapshot.in_flight == 1, "a renewed, b let go before stays let go"
    clock.now += 3
    assert (await state.snapshot()).in_flight == 0
