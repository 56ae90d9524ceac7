"""Redis primary killed while turns run: a replica and three Sentinels take over (``make test-cluster``).

What is guaranteed: a turn's history and an event's dedupe claim are acknowledged by the replica
(WAIT) before the turn goes on, and Sentinel promotes the replica holding the most of the
primary's stream, so nothing written before the kill is lost: every thread keeps every turn once,
and a redelivered event stays claimed across the failover.
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import pytest
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from tests.cluster.services import services, services_up
from tests.cluster.test_weaviate_cluster import QUESTIONS
from tests.conftest import make_settings
from tests.replies import RecordingReply

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

CONVERSATIONS = 4
TURNS = 8


@pytest.fixture(scope="module")
def sentinels():
    with services_up("redis-ha") as env:
        yield env


def addresses(env: dict[str, str]) -> list[tuple[str, int]]:
    return [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in env["REDIS_SENTINELS"].split(",")]


async def test_turns_go_on_through_a_failover_with_history_and_dedupe_intact(
        sentinels, kb_data_dir: Path, tmp_path: Path):
    settings = make_settings(kb_data_dir, **sentinels)
    assert settings.redis_url.startswith("redis+sentinel://") and settings.redis_replica_acks == 1
    settings.redis_prefix = f"kbbot:ha:{time.monotonic_ns()}:"
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path
    await runtime.start()
    watcher = Sentinel(addresses(sentinels), socket_timeout=1)
    master = sentinels["REDIS_MASTER_NAME"]
    primary_before = await watcher.discover_master(master)

    answered: collections.Counter[str] = collections.Counter()
    outcomes: list[tuple[str, Outcome, str | None, float]] = []
    warmed_up = asyncio.Event()
    done_turns = 0

    async def conversation(c: int) -> None:
        nonlocal done_turns
        for turn in range(TURNS):
            event = f"ha:{c}:{turn}"
            # Every event arrives twice, the way Slack redelivers one it thinks was missed; the
            # second delivery of an event claimed before the failover comes after it.
            for _delivery in range(2):
                if not await runtime.idempotency.claim(event, 600):
                    continue
                answered[event] += 1
                reply = RecordingReply()
                started = time.monotonic()
                answer = await runtime.answerer.answer(
                    Inquiry("test", "t", f"c{c}", f"test:ha:{c}", f"u{c}", QUESTIONS[turn % len(QUESTIONS)]), reply)
                outcomes.append((event, answer.outcome, reply.failure, time.monotonic() - started))
            done_turns += 1
            if done_turns >= CONVERSATIONS * 2:
                warmed_up.set()

    async def primary_now() -> tuple[str, int] | None:
        try:
            return await watcher.discover_master(master)
        except MasterNotFoundError:  # mid-failover: no Sentinel vouches for a primary yet
            return None

    async def kill_primary() -> tuple[float, float]:
        await warmed_up.wait()
        killed_at = time.monotonic()
        await asyncio.to_thread(services, "redis-ha", "kill", "primary")
        while await primary_now() in (primary_before, None):
            await asyncio.sleep(0.1)
        return killed_at, time.monotonic() - killed_at

    try:
        *_, (killed_at, failover_s) = await asyncio.gather(*(conversation(c) for c in range(CONVERSATIONS)),
                                                           kill_primary())
        print(f"Sentinels promoted the replica {failover_s:.1f} s after the primary was killed")
        assert await watcher.discover_master(master) != primary_before

        failed = [o for o in outcomes if o[1] is Outcome.ERROR or o[2]]
        assert failed == [], failed
        assert len(outcomes) == CONVERSATIONS * TURNS
        assert set(answered.values()) == {1} and len(answered) == CONVERSATIONS * TURNS
        slowest = max(o[3] for o in outcomes)
        print(f"slowest turn across the failover: {slowest:.1f} s")

        for c in range(CONVERSATIONS):  # every turn of every thread, once, in order
            history = await runtime.history.load(f"test:ha:{c}")
            questions = [m.text for m in history if m.is_from("user")]
            assert questions == [QUESTIONS[t % len(QUESTIONS)] for t in range(TURNS)]
            assert len(history) == min(2 * TURNS, 2 * settings.history.max_turns)

        # A redelivery after the failover of any event: still claimed, so not answered again.
        for event in answered:
            assert not await runtime.idempotency.claim(event, 600)

        # The old primary comes back as a replica of the new one, and writes are acknowledged again.
        await asyncio.to_thread(services, "redis-ha", "start")
        primary = watcher.master_for(master, socket_timeout=2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (await primary.info("replication")).get("connected_slaves") == 1:
                break
            await asyncio.sleep(0.2)
        assert (await primary.info("replication")).get("connected_slaves") == 1
        await primary.set(f"{settings.redis_prefix}probe", 1)
        assert await primary.wait(1, 2000) == 1
        await primary.aclose()
    finally:
        await runtime.close()
