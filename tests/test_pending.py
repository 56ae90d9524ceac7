"""Pending turns (``bot/delivery/pending.py``): a question a replica accepted is answered by another when the first
dies holding it, once, in process and in Redis alike. Two ``Conversations`` on one store play two
replicas; "killing" one cancels its turn's task with nothing more written, as SIGKILL leaves it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.conversation import Conversations
from bot.delivery.gate import Delivery
from bot.delivery.pending import MemoryPendingTurns, PendingTurn, PendingTurns
from bot.delivery.redis_pending import RedisPendingTurns
from bot.delivery.turns import CRASHED, Arrival, TakeOver
from bot.state import Idempotency, MemoryIdempotency, ThreadLocks
from bot.state.history import SqliteHistory
from bot.state.redis import RedisIdempotency, RedisLock
from bot.types import Answer, Inquiry, Outcome, Reply
from tests.kill import die_at, died, disarmed  # noqa: F401  (disarmed is a fixture)
from tests.replies import RecordingReply, Stuck

REDIS_URL = os.environ.get("REDIS_URL")
LEASE = 0.6
EXPIRED = LEASE * 1.6  # an entry outlives its claims' lease by a third
QUESTION = "How often should the bearings be greased?"


@dataclasses.dataclass
class Stores:
    pending: PendingTurns
    idempotency: Idempotency
    #: The same pending turns seen from another event loop (another process, as far as the test goes).
    elsewhere: Callable[[], AbstractAsyncContextManager[PendingTurns]]
    #: Redis (None: in process): where replicas' thread locks are shared.
    redis: Redis | None = None
    prefix: str = ""


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    if request.param == "memory":
        pending = MemoryPendingTurns()

        @contextlib.asynccontextmanager
        async def same() -> AsyncIterator[PendingTurns]:
            yield pending  # thread-safe: one process's store
        yield Stores(pending, MemoryIdempotency(), same)
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    client = Redis.from_url(REDIS_URL)
    prefix = f"kbbot:test:{uuid.uuid4().hex[:8]}:"

    @contextlib.asynccontextmanager
    async def connected() -> AsyncIterator[PendingTurns]:
        async with Redis.from_url(REDIS_URL) as other:
            yield RedisPendingTurns(other, prefix)
    yield Stores(RedisPendingTurns(client, prefix), RedisIdempotency(client, prefix), connected, client, prefix)
    await client.aclose()


def pending_turn(n: int = 1, *, platform: str = "slack", lease_s: float = LEASE) -> PendingTurn:
    inquiry = Inquiry(platform, "T1", "C1", f"{platform}:T1:C1:{n}", "U1", f"question {n} 问题",
                      received_at=1000.0 + n, spaces=("default", "drives"))
    return PendingTurn(id=f"{platform}:message:{n}", inquiry=inquiry, target={"channel": "C1", "n": n},
                       claim_keys=[f"{platform}:event:{n}", f"{platform}:message:{n}"], event_id=f"Ev{n}",
                       kind="mention", crashed="Something went wrong.", lease_s=lease_s, dedupe_ttl_s=60,
                       account=account(platform))


def account(platform: str = "slack") -> str:
    """The platform account of these tests' turns (a bot of that platform)."""
    return f"{platform}:B1"


# --- the store ---------------------------------------------------------------------------------------
async def test_an_entry_is_its_owners_until_its_lease_expires_then_one_other_takes_it(stores: Stores):
    store = stores.pending
    turn = pending_turn()
    await store.add(turn, "A")
    assert await store.renew(turn, "A", ["m1", "m2"])
    assert not await store.renew(turn, "B"), "only the owner renews"
    assert await store.take_expired("B", [account("slack")], 10) == []
    await asyncio.sleep(EXPIRED)

    taken = await asyncio.gather(store.take_expired("B", [account("slack")], 10), store.take_expired("C", [account("slack")], 10))
    assert sorted(len(t) for t in taken) == [0, 1], "two replicas never take the same entry"
    [got] = taken[0] or taken[1]
    new_owner = "B" if taken[0] else "C"
    # The whole turn, rebuilt, with the owner its lease presents from now on.
    assert got == dataclasses.replace(turn, attempts=2, messages=["m1", "m2"], owner=new_owner)
    assert not await store.renew(turn, "A"), "the old owner learns it lost the turn"
    assert not await store.remove(turn, "A")
    assert await store.take_expired("A", [account("slack")], 10) == [], "taken on a new lease"
    assert await store.remove(turn, new_owner)
    await asyncio.sleep(EXPIRED)
    assert await store.take_expired("A", [account("slack")], 10) == []


async def test_a_replica_takes_only_the_platforms_it_serves(stores: Stores):
    await stores.pending.add(pending_turn(1, platform="telegram"), "A")
    await stores.pending.add(pending_turn(2, platform="slack"), "A")
    await asyncio.sleep(EXPIRED)
    assert [t.platform for t in await stores.pending.take_expired("B", [account("slack")], 10)] == ["slack"]
    assert [t.platform for t in await stores.pending.take_expired("B", [account("telegram")], 10)] == ["telegram"]


# --- replicas ----------------------------------------------------------------------------------------
class Posting(RecordingReply):
    """A reply that has posted messages (ids ``m1``…) as it was written, as the platforms' do."""

    def __init__(self) -> None:
        super().__init__()
        self.posted: list[str] = []

    async def push(self, delta: str) -> None:
        await super().push(delta)
        self.posted.append(f"m{len(self.posted) + 1}")


    def message_ids(self) -> list[str]:
        return list(self.posted)


class Platform:
    """A ``bot.delivery.Platform``: the replies it rebuilt and the half-written messages it retired."""

    name = "slack"

    def __init__(self) -> None:
        self.resumed: list[tuple[PendingTurn, Posting]] = []
        self.retired: list[str] = []

    async def account(self) -> str:
        return account("slack")

    def rebuild(self, turn: PendingTurn) -> Reply:
        reply = Posting()
        self.resumed.append((turn, reply))
        return reply

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        self.retired.append(message_id)
        return True

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        raise AssertionError("every message is deleted")


class Answers:
    """An Answerer that answers at once, through the reply as the real one does (or fails, showing why)."""

    def __init__(self, outcome: Outcome = Outcome.ANSWERED):
        self.outcome = outcome
        self.calls = 0

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        self.calls += 1
        await reply.start()
        if self.outcome is Outcome.ERROR:
            await reply.fail("Please ask a question.")
            return Answer("Please ask a question.", Outcome.ERROR)
        await reply.push("Every 2,000 hours.")
        answer = Answer("Every 2,000 operating hours.", Outcome.ANSWERED)
        await reply.finish(answer)
        return answer


def replica(tmp: Path, stores: Stores, name: str, answerer: Any = None, *, pending: PendingTurns | None = None,
            max_attempts: int = 3) -> tuple[Conversations, Platform]:
    platform = Platform()
    takeover = TakeOver(pending or stores.pending, name, max_attempts=max_attempts)
    conversations = Conversations(answerer or Answers(), stores.idempotency, SqliteHistory(tmp / f"{name}.sqlite3"),
                                  takeover=takeover)
    conversations.turns.serve(Delivery(conversations.turns, platform))
    return conversations, platform


async def accept(conversations: Conversations, n: int, reply: Reply, text: str = QUESTION) -> asyncio.Task[Answer | None]:
    """What an adapter does with an event: accept it (recorded, claimed), acknowledge it, then answer it
    (in the handler's task)."""
    keys = [f"slack:event:{n}", f"slack:message:{n}"]
    inquiry = Inquiry("slack", "T1", "C1", f"slack:T1:C1:{n}", "U1", text)
    accepted = await conversations.turns.accept(
        Arrival(inquiry, keys, f"Ev{n}", "mention", target={"n": n}, ttl_s=60, lease_s=LEASE, crashed=CRASHED), account())
    assert accepted is not None
    return asyncio.create_task(conversations.turns.answer(inquiry, reply, claimed=accepted, event_id=f"Ev{n}",
                                                          kind="mention", crashed=CRASHED))


async def recover(conversations: Conversations) -> int:
    taken = await conversations.turns.recover()
    await conversations.turns.recovering.settle(0.05)
    return taken


async def test_a_turn_whose_replica_died_is_answered_by_another_once(tmp_path: Path, stores: Stores):
    stuck = Stuck()
    a, _ = replica(tmp_path, stores, "A", stuck)
    b, platform = replica(tmp_path, stores, "B")
    handler = await accept(a, 1, reply := Posting())
    await stuck.writing.wait()
    await asyncio.sleep(0.4)  # the lease records the posted message
    handler.cancel()  # SIGKILL: no more writes, no renewals, nothing removed
    await asyncio.gather(handler, return_exceptions=True)

    assert await recover(b) == 0, "taken over only once the lease expired"
    await asyncio.sleep(EXPIRED)
    assert await recover(b) == 1
    [(turn, resumed)] = platform.resumed
    assert (turn.event_id, turn.attempts, turn.inquiry.text) == ("Ev1", 2, QUESTION)
    assert platform.retired == reply.posted == ["m1"], "the half-written message is handed to the adapter"
    assert resumed.final is not None and resumed.final.outcome is Outcome.ANSWERED and reply.final is None
    assert await b.turns.claim(["slack:event:1"], 60) is None, "a redelivery is not answered again"
    await asyncio.sleep(EXPIRED)
    assert await recover(b) == 0 and await stores.pending.take_expired("C", [account("slack")], 10) == [], "entry removed"


async def test_a_slow_owner_that_cannot_renew_stops_before_another_takes_over(tmp_path: Path, stores: Stores):
    stuck = Stuck()
    a, _ = replica(tmp_path, stores, "A", stuck, pending=(cut_off := Partitionable(stores.pending)))
    b, platform = replica(tmp_path, stores, "B")
    handler = await accept(a, 2, reply := Posting())
    await stuck.writing.wait()
    cut_off.partitioned = True  # A alone loses the store: its renewals hang, B's calls go through
    while await recover(b) == 0:
        await asyncio.sleep(0.05)
    taken_at = time.monotonic()
    assert await handler is None, "A gave the turn up"
    assert stuck.cancelled_at is not None and stuck.cancelled_at < taken_at, "A stopped before B took over"
    [(_, resumed)] = platform.resumed
    assert resumed.final is not None and reply.final is None and reply.failure is None


async def test_an_owner_whose_event_loop_stalled_while_another_took_over_does_not_post_its_answer(
        tmp_path: Path, stores: Stores):
    stuck = Stuck(block_s=EXPIRED + 0.6)  # a blocking call: not even the lease's renewals run meanwhile
    a, _ = replica(tmp_path, stores, "A", stuck)
    b, platform = replica(tmp_path, stores, "B")
    taken: list[PendingTurn] = []

    async def take_over() -> None:  # B, in another process, while A's event loop is stuck
        await asyncio.sleep(EXPIRED + 0.1)
        async with stores.elsewhere() as pending:
            taken.extend(await pending.take_expired("B", [account("slack")], 10))

    elsewhere = threading.Thread(target=asyncio.run, args=(take_over(),))
    handler = await accept(a, 3, reply := Posting())
    elsewhere.start()
    assert await handler is None
    elsewhere.join()
    assert len(taken) == 1 and reply.final is None and reply.failure is None, \
        "the final message asked the store first, which said B has the turn"
    await b.turns.resume(taken[0])
    [(_, resumed)] = platform.resumed
    assert resumed.final is not None and resumed.final.outcome is Outcome.ANSWERED


async def test_a_turn_one_replica_took_over_twice_is_answered_by_its_later_take_over_only(tmp_path: Path,
                                                                                          stores: Stores):
    """B takes A's turn over, and that turn stalls past its lease (a loaded machine); B's own next recovery
    takes the turn again. The two take-overs are fenced from each other as two replicas' are: the stalled
    one takes back what it posted and shows nothing more, the later one answers (seen in CI: both
    answered, fenced by B's id alone, and the stalled one's message stayed beside the answer)."""
    stuck = Stuck()
    a, _ = replica(tmp_path, stores, "A", stuck)
    handler = await accept(a, 8, from_a := Posting())
    await stuck.writing.wait()
    await asyncio.sleep(0.4)  # the lease records A's message
    await buried(handler)  # SIGKILL
    b, platform = replica(tmp_path, stores, "B", Stuck(block_s=EXPIRED + 0.6))
    await asyncio.sleep(EXPIRED)
    taken: list[PendingTurn] = []

    async def take_again() -> None:  # B's next recovery round, while its first take-over holds the loop
        await asyncio.sleep(EXPIRED + 0.1)
        async with stores.elsewhere() as pending:  # under B's own id: whatever B presents, it is not
            taken.extend(await pending.take_expired("B", [account("slack")], 10))  # its first take-over's

    elsewhere = threading.Thread(target=asyncio.run, args=(take_again(),))
    elsewhere.start()
    assert await recover(b) == 1
    elsewhere.join()
    [(_, first)] = platform.resumed
    assert len(taken) == 1 and taken[0].attempts == 3 and taken[0].messages == []
    assert first.final is None and first.failure is None, "the stalled take-over was fenced off"
    assert from_a.posted == first.posted == ["m1"]
    assert platform.retired == ["m1", "m1"], "A's message by the first take-over, its own when it lost the turn"
    await b.turns.resume(taken[0])
    [_, (_, later)] = platform.resumed
    assert later.final is not None and later.final.outcome is Outcome.ANSWERED
    assert platform.retired == ["m1", "m1"], "nothing else to retire"


async def test_an_owner_whose_event_loop_stalled_but_kept_its_turn_answers_it(tmp_path: Path, stores: Stores):
    a, _ = replica(tmp_path, stores, "A", Stuck(block_s=EXPIRED))
    b, _ = replica(tmp_path, stores, "B")
    handler = await accept(a, 7, reply := Posting())
    answer = await handler
    assert answer is not None and reply.final is not None, "nobody took the turn: A's answer stands"
    assert await recover(b) == 0


async def test_a_question_that_keeps_killing_replicas_is_given_up_with_a_message(tmp_path: Path, stores: Stores):
    stuck = Stuck()
    a, _ = replica(tmp_path, stores, "A", stuck)
    handler = await accept(a, 4, Posting())
    await stuck.writing.wait()
    handler.cancel()
    b, b_platform = replica(tmp_path, stores, "B", stuck := Stuck(), max_attempts=2)
    await asyncio.sleep(EXPIRED)
    assert await b.turns.recover() == 1  # attempt 2: dies too
    await stuck.writing.wait()
    for task in list(b.turns.recovering._tasks):
        task.cancel()
    c, c_platform = replica(tmp_path, stores, "C", max_attempts=2)
    await asyncio.sleep(EXPIRED)
    assert await recover(c) == 1  # attempt 3 of at most 2
    [(turn, told)] = c_platform.resumed
    assert turn.attempts == 3 and told.failure == "Something went wrong while answering. Please try again."
    assert told.final is None and not told.deltas, "not answered a third time"
    await asyncio.sleep(EXPIRED)
    assert await recover(c) == 0
    assert await c.turns.claim(["slack:message:4"], 60) is None


async def test_a_turn_that_failed_is_over_and_a_turn_left_behind_after_its_answer_is_dropped(tmp_path: Path,
                                                                                             stores: Stores):
    a, _ = replica(tmp_path, stores, "A", Answers(Outcome.ERROR))
    b, platform = replica(tmp_path, stores, "B")
    failed = Posting()
    answer = await (await accept(a, 5, failed, text="   "))
    assert answer is not None and answer.outcome is Outcome.ERROR and failed.failure
    # The user saw the Answerer's message: not retried. A replica that died after keeping an answered
    # turn's claims but before removing its entry leaves an entry the recovery drops unanswered.
    left = pending_turn(6)
    assert await stores.idempotency.claim(left.claim_keys[0], 60)
    await stores.pending.add(left, "A")
    await asyncio.sleep(EXPIRED)
    assert await recover(b) == 1 and platform.resumed == []
    await asyncio.sleep(EXPIRED)
    assert await recover(b) == 0


class Partitionable:
    """One replica's view of the shared store, which it may lose: then every renewal hangs."""

    def __init__(self, store: PendingTurns):
        self.store = store
        self.partitioned = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def renew(self, *args: Any) -> bool:
        if self.partitioned:
            await asyncio.sleep(3600)
        return await self.store.renew(*args)


# --- kill points (issue #28): a replica dies at one exact step of a turn, another takes over -----------
class UnderThreadLock:
    """An Answerer that answers holding its thread's lock, as ``bot.turn.answering.Answerer`` does
    (``Admission.thread_locks``): across replicas a lock in Redis of 30 s, renewed while held, waited
    for as long as a turn may take (``bot.runtime``)."""

    def __init__(self, stores: Stores, answerer: Any = None):
        assert stores.redis is not None
        redis, prefix = stores.redis, stores.prefix
        self.locks = ThreadLocks(lambda name: RedisLock(redis, name, ttl_s=30, prefix=prefix, wait_s=120, poll_s=0.05))
        self.answerer = answerer or Answers()

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        async with self.locks.hold(inquiry.thread_key):
            return await self.answerer.answer(inquiry, reply)


async def take_over(conversations: Conversations) -> None:
    """Recovery rounds until the dead replica's entry expired and was taken (no sleep guesses the
    moment), then the turn taken over, answered within 10 s of that: not another lease, nor a lock's TTL."""
    while await conversations.turns.recover() == 0:
        await asyncio.sleep(0.05)
    async with asyncio.timeout(10):
        await conversations.turns.recovering.settle(0.05)


async def buried(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.kill_point
async def test_killed_holding_the_thread_lock_the_turn_is_taken_over_without_waiting_out_the_lock(
        tmp_path: Path, stores: Stores):
    if stores.redis is None:
        pytest.skip("one process's thread locks die with it; only Redis keeps a dead replica's lock")
    killed = die_at("thread locked")
    a, _ = replica(tmp_path, stores, "A", UnderThreadLock(stores))
    b, platform = replica(tmp_path, stores, "B", UnderThreadLock(stores))
    handler = await accept(a, 11, Posting())
    await died(killed)
    try:
        await take_over(b)
    finally:
        await buried(handler, *b.turns.recovering._tasks)
    [(turn, resumed)] = platform.resumed
    assert turn.attempts == 2 and resumed.final is not None and resumed.final.outcome is Outcome.ANSWERED
    assert not await RedisLock(stores.redis, "thread:slack:T1:C1:11", prefix=stores.prefix).locked(), "released"


@pytest.mark.kill_point
async def test_killed_after_posting_its_final_answer_the_question_is_not_answered_again(tmp_path: Path,
                                                                                       stores: Stores, caplog):
    caplog.set_level(logging.INFO, logger="kbbot.conversation")
    killed = die_at("final posted")
    answers = Answers()
    a, _ = replica(tmp_path, stores, "A", answers)
    b, platform = replica(tmp_path, stores, "B", answers)
    handler = await accept(a, 12, reply := Posting())
    await died(killed)
    assert reply.final is not None, "A's answer was shown"
    try:
        await take_over(b)
    finally:
        await buried(handler)
    assert answers.calls == 1, "the question was answered once: not run again by the replica taking over"
    [(turn, resumed)] = platform.resumed  # A's answer shown again in place of A's messages, not a second one
    assert turn.attempts == 2 and platform.retired == reply.posted == ["m1"] and resumed.deltas == []
    assert resumed.final is not None and resumed.final.trace.turn_id == reply.final.trace.turn_id
    assert resumed.final.text == reply.final.text
    assert await b.turns.claim(["slack:event:12"], 60) is None, "a redelivery is not answered again"
    # The question's outcome line comes from B (A died before writing it): every question answered has one.
    [line] = [r.getMessage() for r in caplog.records if " -> turn " in r.getMessage()]
    assert line.endswith(f"-> turn {reply.final.trace.turn_id} (its recorded final shown again) answered")


@pytest.mark.kill_point
async def test_killed_before_posting_its_final_answer_the_question_is_answered_once(tmp_path: Path, stores: Stores):
    killed = die_at("final recorded")
    answers = Answers()
    a, _ = replica(tmp_path, stores, "A", answers)
    b, platform = replica(tmp_path, stores, "B", answers)
    handler = await accept(a, 13, reply := Posting())
    await died(killed)
    assert reply.final is None, "A died before its answer was shown"
    try:
        await take_over(b)
    finally:
        await buried(handler)
    [(turn, resumed)] = platform.resumed
    assert answers.calls == 1 and platform.retired == reply.posted == ["m1"]
    assert resumed.final is not None and resumed.final.text == "Every 2,000 operating hours."
    assert await b.turns.claim(["slack:event:13"], 60) is None, "a redelivery is not answered again"
