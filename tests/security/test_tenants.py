"""Tenants kept apart in the approved-answer cache (issue 15, finding 4): one workspace's approval is
not served to another workspace or platform, an approval is bound to its tenant, withdrawing an old
approval does not delete a newer one, an approval after a refresh is refused instead of silently never
matching, and an answer shaped by one user's preferences is not offered for approval."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

from bot.state.cache import CacheKey, MemoryAnswerCache, RedisAnswerCache
from bot.state.preferences import Preferences, apply_command
from bot.types import Answer, Citation, Inquiry, Outcome
from tests.replies import RecordingReply

REDIS_URL = os.environ.get("REDIS_URL")


@pytest.fixture(params=["memory", "redis"])
async def cache_kind(request) -> AsyncIterator[tuple[type, dict]]:
    """(cache class, constructor arguments) of each kind; Redis under a prefix of its own."""
    if request.param == "memory":
        yield MemoryAnswerCache, {}
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test starts Redis)")
    from bot.state.redis import connect_redis

    client = await connect_redis(REDIS_URL)
    prefix = f"test-sec-{uuid.uuid4().hex[:8]}:"
    yield RedisAnswerCache, {"redis": client, "prefix": prefix}
    keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def answer(text: str) -> Answer:
    return Answer(text=text, outcome=Outcome.ANSWERED,
                  citations=[Citation(1, "kb/warranty.md", 3, 0, "Warranty", "kb/warranty.md")])


def key(tenant: str, version: int = 5) -> CacheKey:
    return CacheKey.of("How long is the warranty?", ["default"], version, "m", "1", tenant=tenant)


async def test_one_workspaces_approval_is_not_served_to_another_or_to_telegram(cache_kind):
    cls, options = cache_kind
    cache = cls(**options)
    await cache.offer("t1-turn", key("slack:T1"), answer("T1's reviewed answer [1]."))
    assert await cache.approve("t1-turn", "U_T1_REVIEWER", tenant="slack:T1")
    assert (await cache.lookup(key("slack:T1"))).text == "T1's reviewed answer [1]."
    assert await cache.lookup(key("slack:T2")) is None
    assert await cache.lookup(key("telegram:12345")) is None


async def test_an_approval_from_another_tenant_is_refused(cache_kind):
    cls, options = cache_kind
    cache = cls(**options)
    await cache.offer("t1-turn", key("slack:T1"), answer("T1's answer [1]."))
    assert await cache.approve("t1-turn", "U_T2_REVIEWER", tenant="slack:T2") is None
    assert await cache.lookup(key("slack:T1")) is None


async def test_withdrawing_an_old_approval_keeps_the_newer_one(cache_kind):
    cls, options = cache_kind
    cache = cls(**options)
    await cache.offer("turn-a", key("slack:T1"), answer("first wording [1]."))
    await cache.offer("turn-b", key("slack:T1"), answer("better wording [1]."))
    assert await cache.approve("turn-a", "R", tenant="slack:T1")
    assert await cache.approve("turn-b", "R", tenant="slack:T1")  # replaces A's approval
    assert not await cache.withdraw("turn-a"), "A's approval was already replaced: nothing of A's to withdraw"
    assert (await cache.lookup(key("slack:T1"))).text == "better wording [1].", "B's approval stays"
    assert await cache.withdraw("turn-b") and await cache.lookup(key("slack:T1")) is None


async def test_an_approval_after_a_refresh_is_refused_not_silently_lost(cache_kind):
    cls, options = cache_kind
    version = {"now": 5}
    cache = cls(**options, knowledge_version=lambda: version["now"])
    await cache.offer("turn-1", key("slack:T1", 5), answer("old knowledge [1]."))
    version["now"] = 6  # a refresh published new knowledge before the reviewer clicked
    assert await cache.approve("turn-1", "R", tenant="slack:T1") is None, "the reviewer hears it expired"
    await cache.offer("turn-2", key("slack:T1", 6), answer("new knowledge [1]."))
    assert await cache.approve("turn-2", "R", tenant="slack:T1")
    assert (await cache.lookup(key("slack:T1", 6))).text == "new knowledge [1]."


def inquiry(text: str, thread: str, *, platform: str = "slack", tenant: str = "T1", user: str = "u1") -> Inquiry:
    return Inquiry(platform=platform, tenant=tenant, channel="C1", thread_key=f"{platform}:{tenant}:{thread}",
                   user_id=user, text=text)


async def test_in_a_turn_the_cache_is_per_tenant_and_preference_shaped_answers_are_not_offered(kb_runtime):
    runtime = kb_runtime
    question = "How long is the standard warranty?"
    first = await runtime.answerer.answer(inquiry(question, "a"), RecordingReply())
    assert first.approvable and await runtime.approved.approve(first.trace.turn_id, "R", tenant="slack:T1")
    same_team = await runtime.answerer.answer(inquiry(question, "b"), RecordingReply())
    assert same_team.outcome is Outcome.CACHED
    other_team = await runtime.answerer.answer(inquiry(question, "c", tenant="T2"), RecordingReply())
    telegram = await runtime.answerer.answer(inquiry(question, "d", platform="telegram", tenant="42"),
                                             RecordingReply())
    assert other_team.outcome is Outcome.ANSWERED and telegram.outcome is Outcome.ANSWERED

    concise, _ = apply_command(Preferences(), ["prefs", "concise"])
    await runtime.preferences.save("slack", "T3", "u9", concise)
    shaped = await runtime.answerer.answer(inquiry(question, "e", tenant="T3", user="u9"), RecordingReply())
    assert shaped.outcome is Outcome.ANSWERED and not shaped.approvable
    assert await runtime.approved.approve(shaped.trace.turn_id, "R", tenant="slack:T3") is None
