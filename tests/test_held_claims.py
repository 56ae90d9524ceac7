"""An event's claims while its turn runs (``bot.state.Claim`` on a lease): a short renewed lease, kept
for the dedupe TTL after an answer, released after a failure, and free again soon after the
holder dies (its renewal stops), in process and in Redis alike."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from bot.state import Idempotency, MemoryIdempotency, take_claim
from bot.state.redis import RedisIdempotency

REDIS_URL = os.environ.get("REDIS_URL")
LEASE = 0.6


@pytest.fixture(params=["memory", "redis"])
async def idempotency(request: pytest.FixtureRequest) -> AsyncIterator[Idempotency]:
    if request.param == "memory":
        yield MemoryIdempotency()
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    client = Redis.from_url(REDIS_URL)
    yield RedisIdempotency(client, f"kbbot:test:{uuid.uuid4().hex[:8]}:")
    await client.aclose()


async def test_a_running_turn_keeps_its_claims_beyond_the_lease(idempotency: Idempotency):
    held = await take_claim(idempotency, ["event:1", "message:1"], ttl_s=60, lease_s=LEASE)
    assert held is not None and held.keys == ("event:1", "message:1") and held.held
    await asyncio.sleep(LEASE * 2.5)  # renewed meanwhile
    assert await take_claim(idempotency, ["event:1"], ttl_s=60, lease_s=LEASE) is None
    await held.finish(answered=True)
    await asyncio.sleep(LEASE * 1.5)  # kept for the dedupe TTL now, with no renewal running
    assert not await idempotency.claim("event:1", 60) and not await idempotency.claim("message:1", 60)


async def test_a_failed_turn_releases_its_claims_for_a_redelivery(idempotency: Idempotency):
    held = await take_claim(idempotency, ["event:2"], ttl_s=60, lease_s=LEASE)
    assert held is not None
    await held.finish(answered=False)
    again = await take_claim(idempotency, ["event:2"], ttl_s=60, lease_s=LEASE)
    assert again is not None and again.keys == ("event:2",)
    await again.finish(answered=True)


async def test_a_dead_holder_frees_the_event_within_the_lease(idempotency: Idempotency):
    held = await take_claim(idempotency, ["event:3"], ttl_s=3600, lease_s=LEASE)
    assert held is not None and held._renewal is not None
    held._renewal.cancel()  # the process died: nobody renews, nobody finishes
    assert not await idempotency.claim("event:3", 60)
    await asyncio.sleep(LEASE * 1.3)
    assert await idempotency.claim("event:3", 60)


async def test_extend_does_not_revive_an_expired_claim(idempotency: Idempotency):
    assert await idempotency.claim("event:4", 0.2)
    await asyncio.sleep(0.35)
    assert not await idempotency.extend("event:4", 60)
    assert await idempotency.claim("event:4", 60)
