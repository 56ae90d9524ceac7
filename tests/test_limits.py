"""Per-user and per-channel rate limits: checked before any work, a breach answered with one clear
line, shared across replicas through Redis."""

from __future__ import annotations

import os
import uuid

import pytest

from bot.metrics import METRICS
from bot.turn.limits import Limits, MemoryRateLimiter, RedisRateLimiter, Refusal, refusal_message
from bot.types import Inquiry, Outcome
from tests.replies import RecordingReply

QUESTION = "How often should the bearings be greased?"


def ask(user: str = "u1", channel: str = "c1", text: str = QUESTION, tenant: str = "t") -> Inquiry:
    return Inquiry("test", tenant, channel, f"test:{channel}:{user}", user, text)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_windows_slide_and_refusals_do_not_count():
    clock = Clock()
    limiter = MemoryRateLimiter(Limits(per_user=2, per_channel=3, window_s=60), clock=clock)
    assert await limiter.check(ask()) is None
    clock.now += 10
    assert await limiter.check(ask()) is None
    refusal = await limiter.check(ask())
    assert refusal == Refusal("user", 2, 60, 50.0)
    assert await limiter.check(ask(user="u2")) is None  # the channel's third
    assert (await limiter.check(ask(user="u3"))).scope == "channel"
    assert await limiter.check(ask(user="u3", channel="c2")) is None  # another channel
    clock.now += 50.5  # the first question left the window
    assert await limiter.check(ask()) is None
    assert (await limiter.check(ask())).scope == "user"


async def test_zero_turns_a_limit_off():
    limiter = MemoryRateLimiter(Limits(per_user=0, per_channel=0, window_s=60))
    for _ in range(50):
        assert await limiter.check(ask()) is None


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="REDIS_URL is not set (make test starts Redis)")
async def test_redis_windows_are_shared_by_replicas():
    from bot.state.redis import connect_redis

    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    one, two = await connect_redis(os.environ["REDIS_URL"]), await connect_redis(os.environ["REDIS_URL"])
    try:
        limits = Limits(per_user=3, per_channel=4, window_s=2)
        a, b = RedisRateLimiter(one, limits, prefix=prefix), RedisRateLimiter(two, limits, prefix=prefix)
        assert await a.check(ask()) is None
        assert await b.check(ask()) is None
        assert await a.check(ask()) is None
        refusal = await b.check(ask())
        assert refusal is not None and refusal.scope == "user" and 0 < refusal.retry_after_s <= 2
        assert await b.check(ask(user="u2")) is None
        assert (await a.check(ask(user="u3"))).scope == "channel"
        assert 0 < await one.pttl(f"{prefix}limit:user:test:t:u1") <= 2000
        import asyncio

        await asyncio.sleep(2.1)
        assert await a.check(ask()) is None
    finally:
        await one.delete(*[k async for k in one.scan_iter(f"{prefix}*")])
        await one.aclose()
        await two.aclose()


async def test_redis_down_admits_the_question():
    class Broken:
        def register_script(self, script: str):
            async def run(**kwargs):
                raise ConnectionError("redis is down")
            return run

    assert await RedisRateLimiter(Broken(), Limits()).check(ask()) is None


async def test_a_refused_question_costs_nothing_but_one_clear_line(kb_runtime, monkeypatch):
    answerer = kb_runtime.answerer
    monkeypatch.setattr(answerer.admission, "limiter", MemoryRateLimiter(Limits(per_user=1, per_channel=2, window_s=60)))
    first = await answerer.answer(ask(), RecordingReply())
    assert first.outcome is Outcome.ANSWERED

    async def no_work(*args, **kwargs):
        raise AssertionError("a refused question must not reach the pipeline")

    monkeypatch.setattr(answerer.pipeline, "run_async", no_work)
    before = METRICS.value("kbbot_rate_limit_refusals_total", scope="user")
    history_before = await kb_runtime.history.load(ask().thread_key)
    reply = RecordingReply()
    refused = await answerer.answer(ask(), reply)
    assert refused.outcome is Outcome.ERROR
    assert reply.failure.startswith("You are asking faster than I can answer (1 questions per minute)")
    assert not reply.started and reply.final is None
    assert await kb_runtime.history.load(ask().thread_key) == history_before
    assert refused.trace.steps == [{"step": "rate_limited", "scope": "user"}]
    assert METRICS.value("kbbot_rate_limit_refusals_total", scope="user") == before + 1
    assert METRICS.value("kbbot_turns_total", platform="test", outcome="rate_limited") >= 1

    # Chinese question, channel limit.
    monkeypatch.undo()
    monkeypatch.setattr(answerer.admission, "limiter", MemoryRateLimiter(Limits(per_user=5, per_channel=1, window_s=3600)))
    assert (await answerer.answer(ask(user="a", channel="zh"), RecordingReply())).outcome is not Outcome.ERROR
    reply = RecordingReply()
    await answerer.answer(ask(user="b", channel="zh", text="电机过热怎么办？"), reply)
    assert reply.failure.startswith("此会话提问过于频繁（每小时最多 1 个问题）")


def test_the_messages_say_when_to_ask_again():
    assert refusal_message(Refusal("user", 20, 60, 0.2), "en").endswith("Please wait 1 s and ask again.")
    assert "(6 questions per 2 hours)" in refusal_message(Refusal("channel", 6, 7200, 10), "en")
    assert "请等待 10 秒后再问" in refusal_message(Refusal("user", 6, 90, 9.5), "zh")


def test_settings_have_a_limits_section(tmp_path):
    from adapters.platforms import load_settings
    from bot.settings import SettingsError
    from tests.conftest import REPO, make_settings

    settings = make_settings(tmp_path)
    assert (settings.limits.per_user, settings.limits.per_channel, settings.limits.window_s) == (20, 120, 60)
    bad = tmp_path / "bad.yaml"
    text = (REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8")
    bad.write_text(text.replace("  per_user: 20 ", "  per_user: -1 "), encoding="utf-8")
    with pytest.raises(SettingsError, match="limits.per_user"):
        load_settings(bad, env={"KBBOT_DATA_DIR": str(tmp_path)})
