"""Rate budgets shared by replicas in real Redis: together they stay inside a tier, a 429 seen by one
holds the bucket for all, a spare-only call on one yields to a waiter on another, and an outage
slows nothing down to a stop."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bot.delivery.buckets import MemoryBuckets, Rate, RedisBuckets
from bot.delivery.rates import COMPLETES, PlatformRates
from tests.private_redis import private_redis  # noqa: F401 - a fixture

needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="REDIS_URL is not set (make test starts Redis)")


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[PlatformRates, PlatformRates]]:
    """Two budgets, each on a Redis client of its own, with one prefix: two replicas of one app."""
    from bot.state.redis import connect_redis

    prefix = f"test-rate-{uuid.uuid4().hex[:8]}:"
    clients = [await connect_redis(os.environ["REDIS_URL"]) for _ in range(2)]
    rates = {"chat.update": Rate(per_minute=600, burst=3), "send": Rate(per_minute=600, burst=2),
             "bot": Rate(per_minute=600, burst=1)}
    try:
        yield PlatformRates(rates, store=RedisBuckets(clients[0], prefix)), PlatformRates(rates, store=RedisBuckets(clients[1], prefix))
    finally:
        for client in clients:
            await client.aclose()


@needs_redis
async def test_two_replicas_stay_inside_the_tier_together(replicas: tuple[PlatformRates, PlatformRates]):
    """Two replicas, six callers each, all waiting for one workspace's chat.update (10/s, burst 3):
    in any window of a second the grants of both together are at most burst + rate."""
    grants: list[float] = []

    async def caller(rates: PlatformRates) -> None:
        for _ in range(3):
            await rates.acquire("T1", "chat.update", (COMPLETES, 1, time.monotonic()))
            grants.append(time.monotonic())

    started = time.monotonic()
    await asyncio.gather(*(caller(rates) for rates in replicas for _ in range(6)))
    assert len(grants) == 36
    grants.sort()
    worst = max(sum(1 for g in grants[i:] if g < start + 1.0) for i, start in enumerate(grants))
    assert worst <= 3 + 10 + 1, f"{worst} grants within one second (the tier allows 13)"
    # 36 tokens at 10/s after a burst of 3 take 3.3 s: both replicas were served, none ran ahead.
    assert 3.0 <= time.monotonic() - started < 6.0


@needs_redis
async def test_a_429_seen_by_one_replica_holds_the_bucket_for_the_other(replicas: tuple[PlatformRates, PlatformRates]):
    one, two = replicas
    await one.hold("T1", "chat.update", 1.5)  # replica one got 429 + Retry-After: 1.5
    assert await two.try_acquire("T1", "chat.update") is False, "held for every replica"
    assert 1.0 < await two.eta("T1", "chat.update") <= 1.5
    started = time.monotonic()
    await two.acquire("T1", "chat.update")
    assert 1.2 < time.monotonic() - started < 2.5, "replica two waited out the other's Retry-After"
    assert await two.try_acquire("T1", "chat.update") is False, "no burst saved up while held"


@needs_redis
async def test_a_spare_only_call_on_one_replica_yields_to_a_waiter_on_the_other(
        replicas: tuple[PlatformRates, PlatformRates]):
    one, two = replicas
    assert await one.try_acquire("T1", "bot") is True  # the only token (burst 1, one per 0.1 s)
    waiter = asyncio.create_task(one.acquire("T1", "bot"))  # a final text waits on replica one
    await asyncio.sleep(0.02)
    deadline = time.monotonic() + 0.3
    while not waiter.done() and time.monotonic() < deadline:
        assert await two.try_acquire("T1", "bot") is False, "replica two's intermediate state took the waited token"
        await asyncio.sleep(0.01)
    await waiter
    await asyncio.sleep(0.15)
    assert await two.try_acquire("T1", "bot") is True, "with nobody waiting, spare tokens go"


@needs_redis
async def test_several_buckets_are_taken_all_or_none_across_replicas(replicas: tuple[PlatformRates, PlatformRates]):
    one, two = replicas
    assert await one.try_acquire_all(("chat1", "send"), ("all", "bot")) is True
    assert await two.try_acquire_all(("chat1", "send"), ("all", "bot")) is False, "the bot-wide bucket is empty"
    assert await two.bucket("chat1", "send").tokens() == pytest.approx(1.0, abs=0.1), "the chat's token stayed"
    await two.refund("all", "bot")
    assert await two.try_acquire_all(("chat1", "send"), ("all", "bot")) is True, "the refund is everyone's"


@needs_redis
async def test_a_full_bucket_leaves_no_key_behind():
    from bot.state.redis import connect_redis

    client = await connect_redis(os.environ["REDIS_URL"])
    prefix = f"test-rate-{uuid.uuid4().hex[:8]}:"
    try:
        rates = PlatformRates({"m": Rate(per_minute=6000, burst=2)}, store=RedisBuckets(client, prefix))
        await rates.acquire("s", "m")
        assert 0 < await client.pttl(f"{prefix}s:m") <= 1100, "expires once it would be full again"
    finally:
        await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def bucket_stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Callable[[], Any]]]:
    """Each test on both stores: (its name, a maker of handles on the same buckets, as each replica holds)."""
    if request.param == "memory":
        shared = MemoryBuckets()
        yield "memory", lambda: shared
        return
    if not os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is not set")
    from bot.state.redis import connect_redis

    client = await connect_redis(os.environ["REDIS_URL"])
    prefix = f"test-rate-{uuid.uuid4().hex[:8]}:"
    try:
        yield "redis", lambda: RedisBuckets(client, prefix)
    finally:
        await client.aclose()


async def test_both_stores_count_the_same(bucket_stores: tuple[str, Callable[[], Any]]):
    """The burst, then the rate; a hold: nothing, then one at once; a refund: one more."""
    _, make = bucket_stores
    buckets = make()
    rate = Rate(per_minute=60, burst=2)
    assert [await buckets.take([("k", rate)]) for _ in range(2)] == [0.0, 0.0]
    assert await buckets.take([("k", rate)]) == pytest.approx(1.0, abs=0.05)
    await buckets.give_back("k", rate)
    assert await buckets.take([("k", rate)]) == 0.0
    await buckets.hold("k", rate, 0.3)
    assert (await buckets.peek("k", rate))[1] == pytest.approx(0.3 + 1.0, abs=0.05), "held, then the refill"


async def test_redis_out_of_reach_falls_back_to_this_processes_buckets(private_redis, caplog):  # noqa: F811
    """Redis stops: the budget goes on with local buckets at the full rate (logged once) rather than
    stop the answers; when Redis is back the replicas share its buckets again."""
    from bot.state.redis import connect_redis

    client = await connect_redis(private_redis.url, retries=0, socket_timeout=0.5, connect_timeout=0.5)
    store = RedisBuckets(client, "test-rate:", outage_retry_s=0.2)
    rates = PlatformRates({"chat.update": Rate(per_minute=600, burst=2)}, store=store)
    try:
        assert await rates.try_acquire("T1", "chat.update")
        private_redis.stop()
        with caplog.at_level(logging.WARNING, logger="kbbot.rate"):
            started = time.monotonic()
            waits = [await rates.acquire("T1", "chat.update") for _ in range(4)]
        assert time.monotonic() - started < 2.0, "an outage slows nothing down to a stop"
        assert waits[:2] == [0.0, 0.0] and waits[2] > 0.05, "the local bucket still keeps the rate"
        assert sum("Redis out of reach" in r.getMessage() for r in caplog.records) == 1
        await rates.hold("T1", "chat.update", 0.5)  # a 429 during the outage still holds (locally)
        assert await rates.try_acquire("T1", "chat.update") is False
        private_redis.start()
        await asyncio.sleep(0.3)
        with caplog.at_level(logging.WARNING, logger="kbbot.rate"):
            assert await rates.try_acquire("T1", "chat.update") is True, "Redis' bucket is full again"
        assert any("Redis is back" in r.getMessage() for r in caplog.records)
        assert await client.exists("test-rate:T1:chat.update") == 1, "the shared bucket is used again"
    finally:
        await client.aclose()



@needs_redis
async def test_kbbot_serve_gives_both_adapters_budgets_in_redis(kb_data_dir, tmp_path):
    """What ``kbbot serve`` builds on a runtime with Redis: Slack's budget keyed by app, Telegram's by bot."""
    from adapters.platforms import build_platforms
    from bot.runtime import build_runtime
    from tests.conftest import make_settings

    settings = make_settings(kb_data_dir, REDIS_URL=os.environ["REDIS_URL"], SLACK_BOT_TOKEN="xoxb-test",
                             SLACK_SIGNING_SECRET="a-signing-secret", TELEGRAM_BOT_TOKEN="123456789:TEST-token_abc")
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path
    await runtime.start()
    try:
        platforms = build_platforms(runtime, runtime.conversations())
        slack, telegram = platforms["slack"], platforms["telegram"]
        prefix = settings.redis_prefix
        assert isinstance(slack.rates.store, RedisBuckets) and slack.rates.store.prefix == f"{prefix}rate:slack:"
        assert isinstance(telegram.rates.store, RedisBuckets)
        assert telegram.rates.store.prefix == f"{prefix}rate:telegram:123456789:"
        await telegram.bot.session.close()  # never started: only its HTTP session to close
    finally:
        await runtime.close()


async def test_a_spare_only_call_leaves_the_reserve_to_the_calls_that_must_go(bucket_stores: tuple[str, Callable[[], Any]]):
    """Typing renewals and intermediate edits (spare) stop at the reserve; a first acknowledgement or text
    (a take that waits its turn) still finds a token at once."""
    _, make = bucket_stores
    buckets = make()
    rate = Rate(per_minute=0.01, burst=3, reserve=2)  # no refill within the test
    assert await buckets.take([("bot", rate)], spare=True) == 0.0
    assert await buckets.take([("bot", rate)], spare=True) > 0, "two left: the reserve"
    assert [await buckets.take([("bot", rate)]) for _ in range(2)] == [0.0, 0.0]
    assert await buckets.take([("bot", rate)]) > 0


async def test_every_free_token_goes_to_the_waiters_in_one_take(bucket_stores: tuple[str, Callable[[], Any]]):
    """A dispatcher with a queue takes what is free at once (one round trip, not one per waiter), and
    when that is fewer than it wants, a spare-only call elsewhere yields to it."""
    store, make = bucket_stores
    buckets, other = make(), make()
    rate = Rate(per_minute=60, burst=3)
    taken, wait = await buckets.take_some("bot", rate, 5)
    assert (taken, wait) == (3, pytest.approx(1.0, abs=0.05))
    await buckets.give_back("bot", rate)
    if store == "redis":  # another replica's spare-only call yields to the waiters left
        assert await other.take([("bot", rate)], spare=True) > 0
    assert await buckets.take_some("bot", rate, 2) == (1, pytest.approx(1.0, abs=0.05))
