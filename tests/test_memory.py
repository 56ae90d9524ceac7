"""Approved answers and user preferences: the stores (in-process and real Redis) and the turn."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from bot.state.cache import CacheKey, MemoryAnswerCache, RedisAnswerCache, cached_label, wants_fresh
from bot.state.preferences import (
    MemoryPreferenceStore,
    PreferenceError,
    Preferences,
    RedisPreferenceStore,
    apply_command,
    may_state_preferences,
    parse_learned,
)
from bot.types import Answer, Citation, Inquiry, Outcome
from tests.replies import RecordingReply

REDIS_URL = os.environ.get("REDIS_URL")


@pytest.fixture(params=["memory", "redis"])
async def stores(request):
    """(answer cache, preference store) of each kind; Redis ones under a prefix of their own."""
    if request.param == "memory":
        yield MemoryAnswerCache(), MemoryPreferenceStore(ttl_days=30)
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test starts Redis)")
    from bot.state.redis import connect_redis

    client = await connect_redis(REDIS_URL)
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    yield RedisAnswerCache(client, prefix), RedisPreferenceStore(client, prefix, ttl_days=30)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def _answer(text: str = "24 months [1].") -> Answer:
    return Answer(text=text, outcome=Outcome.ANSWERED,
                  citations=[Citation(1, "kb/warranty.md", 3, 0, "Warranty", "kb/warranty.md")])


async def test_an_offered_answer_is_served_once_approved_and_only_for_its_key(stores):
    cache, _ = stores
    key = CacheKey.of("  How long is the WARRANTY? ", ["default"], 5, "claude-sonnet-5-5", "1")
    assert key == CacheKey.of("how long is the warranty?", ("default",), 5, "claude-sonnet-5-5", "1")
    await cache.offer("turn-1", key, _answer())
    assert await cache.lookup(key) is None  # offered, not approved
    approved = await cache.approve("turn-1", "U_REVIEWER", "Rita Chen")
    assert approved.approved_by == "U_REVIEWER" and approved.text == "24 months [1]."
    hit = await cache.lookup(key)
    assert hit.to_answer().approved_by == "Rita Chen", "the reviewer's name is kept with the approval"
    assert cached_label(hit.to_answer(), "zh").startswith("✅ 这是经审核确认过的回答（由 Rita Chen 于 ")
    assert hit.to_answer().outcome is Outcome.CACHED and hit.to_answer().citations[0].version == 3
    for other in (CacheKey.of("How long is the warranty", ["default"], 5, "claude-sonnet-5-5", "1"),  # no "?"
                  CacheKey.of("How long is the warranty?", ["drives"], 5, "claude-sonnet-5-5", "1"),
                  CacheKey.of("How long is the warranty?", ["default"], 5, "other-model", "1"),
                  CacheKey.of("How long is the warranty?", ["default"], 5, "claude-sonnet-5-5", "2")):
        assert await cache.lookup(other) is None
    assert await cache.approve("turn-unknown", "U_REVIEWER") is None  # the server holds the answers


async def test_an_approval_outlives_a_new_knowledge_version_until_held_then_kept_or_retired(stores):
    cache, _ = stores
    old = CacheKey.of("q?", ["drives"], 1, "m", "1", tenant="slack:T1")
    await cache.offer("t-old", old, _answer(), "Q?")
    await cache.approve("t-old", "R")
    new = CacheKey.of("q?", ["drives"], 2, "m", "1", tenant="slack:T1")
    # Whether its cited documents are current is the Answerer's check; the store keeps the approval.
    assert (await cache.lookup(new)).text == "24 months [1]."
    [entry] = await cache.entries()
    assert entry.spaces == ["drives"] and entry.tenant == "slack:T1" and entry.held is None
    assert (entry.question, entry.asked) == ("q?", "Q?"), "a re-check asks it as it was written"
    recheck = {"text": "36 months [1].", "outcome": "answered", "knowledge_version": 2, "at": 1.0,
               "citations": [Citation(1, "kb/warranty.md", 4, 0, "Warranty", "kb/warranty.md").to_dict()]}
    assert await cache.hold("t-old", recheck) and not await cache.hold("t-unknown", recheck)
    assert await cache.lookup(new) is None, "held for a reviewer: not served"
    assert (await cache.entries())[0].held["text"] == "36 months [1]."
    kept = await cache.keep("t-old", "R2", "Rita")
    assert kept.text == "36 months [1]." and kept.knowledge_version == 2 and kept.approved_by == "R2"
    hit = await cache.lookup(new)
    assert hit.text == "36 months [1]." and hit.citations[0]["version"] == 4 and hit.held is None
    assert hit.asked == "Q?"
    assert await cache.keep("t-old", "R2") is None, "nothing held any more"
    assert not await cache.retire("t-old"), "a decision taken stands"
    # Held again with a re-check that no longer answers: it cannot be kept, only retired.
    await cache.hold("t-old", {**recheck, "outcome": "not_found"})
    assert await cache.keep("t-old", "R2") is None and await cache.lookup(new) is None
    assert await cache.retire("t-old") and await cache.entries() == []
    assert not await cache.withdraw("t-old") and not await cache.retire("t-old")


async def test_preferences_are_per_user_and_forget_clears_them(stores):
    _, prefs = stores
    mine, _ = apply_command(Preferences(), ["prefs", "concise"])
    mine, _ = apply_command(mine, ["prefs", "steps", "on"])
    await prefs.save("slack", "T1", "U1", mine)
    assert (await prefs.load("slack", "T1", "U1")).effective() == {"style": "concise", "step_numbers": True}
    assert (await prefs.load("slack", "T1", "U2")).effective() == {}  # another user
    assert (await prefs.load("slack", "T2", "U1")).effective() == {}  # another workspace
    forgotten, _ = apply_command(await prefs.load("slack", "T1", "U1"), ["forget"])
    await prefs.save("slack", "T1", "U1", forgotten)
    assert (await prefs.load("slack", "T1", "U1")) == Preferences()


def test_preference_commands_and_learning_rules():
    prefs, said = apply_command(Preferences(), ["prefs", "lang", "zh"])
    assert prefs.language == "zh" and "language: zh" in said
    assert "Answer in Chinese" in prefs.prompt_note()
    prefs, _ = apply_command(prefs, ["remember", "on"])
    prefs.learned = {"style": "detailed", "language": "en"}
    assert prefs.effective() == {"style": "detailed", "language": "zh"}  # set beats learned
    prefs, _ = apply_command(prefs, ["remember", "off"])
    assert not prefs.remember and prefs.learned == {}
    for bad in (["prefs", "loud"], ["remember", "maybe"], ["dance"], []):
        with pytest.raises(PreferenceError, match="usage"):
            apply_command(Preferences(), bad)
    assert may_state_preferences("Please keep it short from now on") and may_state_preferences("以后请用中文回答")
    assert not may_state_preferences("What does E-004 mean?")
    assert parse_learned('{"style": "concise", "language": "fr", "step_numbers": "yes"}') == {"style": "concise"}
    assert parse_learned("no idea") == {}
    assert wants_fresh("!fresh  How long?") == (True, "How long?") and wants_fresh("How long?") == (False, "How long?")


# --- in a turn -------------------------------------------------------------------------------------
def inquiry(text: str, thread: str, user: str = "u1") -> Inquiry:
    return Inquiry(platform="test", tenant="t", channel="c", thread_key=f"test:{thread}", user_id=user, text=text)


async def test_an_approved_first_question_is_served_from_cache_and_follow_ups_never_are(kb_runtime):
    runtime = kb_runtime
    first = await runtime.answerer.answer(inquiry("How long is the standard warranty?", "c1"), RecordingReply())
    assert first.outcome is Outcome.ANSWERED
    assert await runtime.approved.approve(first.trace.turn_id, "reviewer")

    reply = RecordingReply()
    again = await runtime.answerer.answer(inquiry("how long is the standard warranty?  ", "c2"), reply)
    assert again.outcome is Outcome.CACHED and reply.final is again and not reply.deltas
    assert again.text.startswith("✅ Previously approved answer")
    assert [c.doc_id for c in again.citations] == [c.doc_id for c in first.citations]
    assert "retrieve" not in again.trace.stages

    fresh = await runtime.answerer.answer(inquiry("!fresh How long is the standard warranty?", "c3"), RecordingReply())
    assert fresh.outcome is Outcome.ANSWERED and fresh.trace.query == "How long is the standard warranty?"

    await runtime.answerer.answer(inquiry("What does fault E-004 mean?", "c4"), RecordingReply())
    follow = await runtime.answerer.answer(inquiry("How long is the standard warranty?", "c4"), RecordingReply())
    assert follow.outcome is Outcome.ANSWERED  # a later turn of a thread is not served from cache
    assert await runtime.approved.approve(follow.trace.turn_id, "reviewer") is None  # nor offered


async def test_an_approval_is_served_across_knowledge_versions_until_a_document_it_cites_changes(kb_runtime,
                                                                                                  monkeypatch):
    runtime = kb_runtime
    first = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "v1"), RecordingReply())
    await runtime.approved.approve(first.trace.turn_id, "reviewer")
    assert (await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "v2"),
                                          RecordingReply())).outcome is Outcome.CACHED
    version = runtime.store.knowledge_version
    monkeypatch.setattr(type(runtime.store), "knowledge_version", property(lambda self: version + 1))
    again = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "v3"), RecordingReply())
    assert again.outcome is Outcome.CACHED, "a new knowledge version alone retires nothing"
    changed = first.citations[0].doc_id
    current = runtime.store.is_current
    monkeypatch.setattr(runtime.answerer, "is_current", lambda doc_id, v: doc_id != changed and current(doc_id, v))
    after = await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "v4"), RecordingReply())
    assert after.outcome is Outcome.ANSWERED, "a changed cited document is never served in its old form"


async def test_preferences_reach_the_system_prompt_of_that_user_only(claude):
    fake, runtime = claude
    prefs, _ = apply_command(Preferences(), ["prefs", "concise"])
    await runtime.preferences.save("test", "t", "u1", prefs)
    fake.enqueue("Every 4,000 hours [1].", "Every 4,000 hours [1].")
    await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "p1", user="u1"),
                                  RecordingReply())
    assert "Keep answers short" in fake.last_request.system
    await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "p2", user="u2"),
                                  RecordingReply())
    assert "Keep answers short" not in fake.last_request.system


async def test_preferences_are_learned_only_after_opt_in_and_in_the_background(claude):
    fake, runtime = claude
    fake.router.responders["preferences"] = lambda body: json.dumps({"style": "detailed", "language": None,
                                                                     "step_numbers": True})
    fake.enqueue(*["Grease every 4,000 hours [1]."] * 3)
    said = "Please always answer in detail with numbered steps: how often should the bearings be greased?"
    await runtime.answerer.answer(inquiry(said, "l1"), RecordingReply())
    await _settle(runtime)
    assert "preferences" not in fake.router.kinds  # no consent, no learning call
    assert (await runtime.preferences.load("test", "t", "u1")).learned == {}

    prefs, _ = apply_command(Preferences(), ["remember", "on"])
    await runtime.preferences.save("test", "t", "u1", prefs)
    await runtime.answerer.answer(inquiry(said, "l2"), RecordingReply())
    await _settle(runtime)
    assert (await runtime.preferences.load("test", "t", "u1")).learned == {"style": "detailed", "step_numbers": True}
    await runtime.answerer.answer(inquiry("How often should the bearings be greased?", "l3"), RecordingReply())
    assert "Give detailed answers" in fake.last_request.system and "numbered steps" in fake.last_request.system

    off, _ = apply_command(await runtime.preferences.load("test", "t", "u1"), ["remember", "off"])
    await runtime.preferences.save("test", "t", "u1", off)
    assert (await runtime.preferences.load("test", "t", "u1")) == Preferences()


async def _settle(runtime) -> None:
    import asyncio

    await asyncio.gather(*runtime.answerer._background)
