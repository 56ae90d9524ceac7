"""Three ``kbbot serve`` processes on one Redis and one Weaviate, answering the fake Slack
(``make test-cluster``): one answer per question when Slack redelivers an event to another
replica; a replica killed with acknowledged questions in flight (which Slack never resends) has
them answered by the others, once each, after their lease; the scheduled refresh runs once per
turn across the three.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from tests.cluster.replicas import (
    NEEDS_SERVICES,
    answers_in,
    deliver,
    event_body,
    kb_folder,
    refresh_once,
    refresh_runs,
    running,
    serve_env,
    wait_for,
    wait_healthy,
    write_config,
)
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.fakes.slack_server import FakeSlack
from tests.model_router import ModelRouter, default_reply

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900), NEEDS_SERVICES]

REPLICAS = 3
LEASE_S = 4  # slack.claim_lease_s here; Slack's own retries come 1 and 5 minutes after a missed ack
LOCK_TTL_S = 30  # the thread lock's TTL (bot/runtime.py), renewed while its holder lives
REFRESH_EVERY_S = 20
RECOVERY_S = 1  # recovery.interval_s here (5 by default)
KB_FILES = ("faq.md", "maintenance-schedule.md", "fault-codes.md")
#: Questions replica 0 accepts and dies holding: the first answer to each waits for the model.
KILLED = ("What torque do the terminal screws need?", "What does fault code E07 mean exactly?",
          "How long is the standard warranty, please?")


async def pending_turns(redis: Any, prefix: str) -> int:
    """Entries in the pending turns' due sets, one set per platform account (``bot.state.redis``)."""
    return sum([await redis.zcard(key) async for key in redis.scan_iter(match=f"{prefix}pending-due:*")])


async def test_replicas_answer_once_survive_a_killed_replica_and_refresh_once(tmp_path: Path):
    kb = kb_folder(tmp_path / "kb", *KB_FILES)
    prefix = f"kbbot:replicas:{uuid.uuid4().hex[:8]}:"
    config = write_config(tmp_path / "config", kb, f"Replicas_{uuid.uuid4().hex[:8]}", prefix, lease_s=LEASE_S,
                          refresh_every_s=REFRESH_EVERY_S, recovery_interval_s=RECOVERY_S)
    slow_answers: list[str] = []

    def answer(body: dict[str, Any]) -> Script | str:
        messages = json.dumps(body.get("messages"))
        for question in KILLED:
            if question in messages and question not in slow_answers:
                slow_answers.append(question)  # replica 0's answer: it dies waiting for it
                return Script("Tighten them to the value in the manual.", first_token_delay=60)
        return default_reply("answer", body)

    router = ModelRouter()
    router.responders["answer"] = answer
    async with FakeAnthropic() as claude, FakeSlack(token="xoxb-replicas") as slack, \
            aiohttp.ClientSession() as session:
        claude.responder = router
        env = serve_env(tmp_path, config=config, slack=slack, model_url=claude.base_url)
        await refresh_once(env, tmp_path / "admin")
        async with Redis.from_url(os.environ["REDIS_URL"]) as redis, running(REPLICAS, env, tmp_path) as replicas:
            await wait_healthy(session, replicas)

            # 1. Every event delivered twice, to two replicas (Slack's retry after a lost ack).
            questions = ["How often should the bearings be greased?", "What does fault code E07 mean?",
                         "How long is the standard warranty?"] * 2
            bodies = [event_body(q, f"C0REP{i}", f"EvRep{i:04d}") for i, q in enumerate(questions)]
            acks = []
            for i, body in enumerate(bodies):
                acks.append(await deliver(session, replicas[i % REPLICAS], body))
                acks.append(await deliver(session, replicas[(i + 1) % REPLICAS], body, retry=1))
            assert max(acks) < 3, acks  # Slack retries what is not acknowledged within 3 s
            await wait_for(lambda: all(answers_in(slack, b) for b in bodies), 180, "an answer to every question")
            await asyncio.sleep(2)  # time for a duplicate to show up, were there one
            assert [len(answers_in(slack, b)) for b in bodies] == [1] * len(bodies)

            # 2. A replica killed with questions it acknowledged in flight: Slack never sends them again.
            #    Each was recorded as a pending turn; another replica takes it over once its lease
            #    expired, frees the thread lock the dead turn held with it, and answers it, once.
            killed = [event_body(q, f"C0KILL{i}", f"EvKill{i:04d}") for i, q in enumerate(KILLED)]
            for body in killed:
                assert await deliver(session, replicas[0], body) < 3
            await wait_for(lambda: len(slow_answers) == len(KILLED), 120,
                           f"the turns reaching the model (reached: {slow_answers})")
            assert await pending_turns(redis, prefix) == len(KILLED), "each accepted turn is recorded"
            replicas[0].kill()
            killed_at = time.monotonic()
            took = await wait_for(lambda: all(answers_in(slack, b) for b in killed), LOCK_TTL_S + 90,
                                  "answers to the dead replica's questions, with no redelivery")
            print(f"the dead replica's {len(KILLED)} questions answered by the others {took:.1f} s after the kill")
            # The entries expire at most 4/3 of a lease after the kill; the thread locks go with them.
            assert took < LEASE_S * 4 / 3 + 10, f"answered {took:.1f} s after the kill: not within 10 s of the lease"
            assert await deliver(session, replicas[1], killed[0], retry=1) < 3  # a late retry is not answered again
            await asyncio.sleep(2)  # time for a duplicate to show up, were there one
            assert [len(answers_in(slack, b)) for b in killed] == [1] * len(KILLED)
            assert time.monotonic() - killed_at > LEASE_S, "taken over only after the lease"
            assert await pending_turns(redis, prefix) == 0, "a finished turn removes its entry"
            takeovers = [line for r in replicas[1:] for line in r.lines()
                         if "taking over pending turn" in str(line.get("message"))]
            assert len(takeovers) == len(KILLED), takeovers

            # 3. The scheduled refresh: once per turn across the replicas, however many there are.
            #    Counted from the runs the replicas logged, not from a clock started before they were up: on
            #    a loaded machine their start took ~34 s of a window that then held one turn.
            await wait_for(lambda: len(refresh_runs(replicas)) >= 2, 4 * REFRESH_EVERY_S, "two refresh turns")

    runs = refresh_runs(replicas)
    assert len(runs) >= 2, runs
    moments = [time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) for ts, _ in runs]
    gaps = [b - a for a, b in zip(moments, moments[1:])]
    assert all(gap >= REFRESH_EVERY_S - 2 for gap in gaps), runs  # never two runs for one turn
    print(f"scheduled refreshes: {len(runs)} runs by replicas {[n for _, n in runs]}, {gaps} s apart")
