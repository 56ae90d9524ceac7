"""Two replicas of two workers each (``kbbot serve --workers 2``, ``make test-cluster``), and one worker killed
outright while it holds turns the model has not answered yet: each question it held is answered once, by a
worker that takes it over once its lease lapsed (the other worker of its replica, the one started in its
place, or a worker of the other replica), and the supervisor starts a new worker on the same port.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from tests.cluster.replicas import (
    NEEDS_SERVICES,
    Replica,
    answers_in,
    deliver,
    event_body,
    kb_folder,
    refresh_once,
    serve_env,
    wait_for,
    wait_healthy,
    workers_seen,
    write_config,
)
from tests.cluster.test_replicas import pending_turns
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.fakes.slack_server import FakeSlack
from tests.model_router import ModelRouter, default_reply

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600), NEEDS_SERVICES]

LEASE_S = 4
SLOW = ("What torque do the terminal screws need?", "What does fault code E07 mean exactly?",
        "How long is the standard warranty, please?", "How often should the bearings be greased, please?")


def holders(replica: Replica, events: list[str]) -> dict[str, int]:
    """event id -> the worker (of ``replica``) that received it, from its log."""
    found = {}
    for line in replica.lines():
        message = str(line.get("message", ""))
        for event in events:
            if message.startswith("slack: received") and event in message:
                found[event] = line["worker"]
    return found


async def test_a_worker_killed_holding_turns_loses_none_and_is_started_again(tmp_path: Path):
    kb = kb_folder(tmp_path / "kb", "faq.md", "maintenance-schedule.md", "fault-codes.md")
    prefix = f"kbbot:workers:{uuid.uuid4().hex[:8]}:"
    config = write_config(tmp_path / "config", kb, f"Workers_{uuid.uuid4().hex[:8]}", prefix, lease_s=LEASE_S,
                          refresh_every_s=3600, recovery_interval_s=1)
    held: list[str] = []

    def answer(body: dict[str, Any]) -> Script | str:
        messages = json.dumps(body.get("messages"))
        for question in SLOW:
            if question in messages and question not in held:
                held.append(question)  # the first answer waits: its worker is killed meanwhile
                return Script("Tighten them to the value in the manual.", first_token_delay=15)
        return default_reply("answer", body)

    router = ModelRouter()
    router.responders["answer"] = answer
    async with FakeAnthropic() as claude, FakeSlack(token="xoxb-workers") as slack, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        claude.responder = router
        env = serve_env(tmp_path, config=config, slack=slack, model_url=claude.base_url)
        await refresh_once(env, tmp_path / "admin")
        replicas = [Replica(n, {**env, "KBBOT_DATA_DIR": str(tmp_path / f"replica{n}")}, tmp_path / f"replica{n}.log",
                            workers=2) for n in range(2)]
        try:
            async with Redis.from_url(os.environ["REDIS_URL"]) as redis:
                await wait_healthy(session, replicas)
                pids = await workers_seen(replicas[0].port, 2)

                # Replica 0 takes every slow question, each over a connection of its own (either worker).
                bodies = [event_body(q, f"C0WRK{i}", f"EvWrk{i:04d}") for i, q in enumerate(SLOW)]
                for body in bodies:
                    assert await deliver(session, replicas[0], body) < 3
                await wait_for(lambda: len(held) == len(SLOW), 120, f"the turns reaching the model ({held})")
                assert await pending_turns(redis, prefix) == len(SLOW)
                taken = holders(replicas[0], [f"EvWrk{i:04d}" for i in range(len(SLOW))])
                victim = taken["EvWrk0000"]  # the worker holding the first question, and maybe others
                lost = sorted(event for event, worker in taken.items() if worker == victim)
                os.kill(pids[victim], signal.SIGKILL)
                killed_at = time.monotonic()

                again = await workers_seen(replicas[0].port, 2)
                assert again[victim] != pids[victim], "a new worker in the dead one's place"
                dead = [b for b in bodies if json.loads(b)["event_id"] in lost]
                took = await wait_for(lambda: all(answers_in(slack, b) for b in dead), LEASE_S + 90,
                                      "answers to the dead worker's questions")
                assert time.monotonic() - killed_at > LEASE_S * 0.9, "taken over only once the lease lapsed"
                print(f"worker {victim} killed holding {len(lost)} turns; answered {took:.1f} s later")
                await asyncio.sleep(2)  # time for a duplicate to show up, were there one
                assert [len(answers_in(slack, b)) for b in dead] == [1] * len(dead)
                takeovers = [line for r in replicas for line in r.lines()
                             if "taking over pending turn" in str(line.get("message"))]
                assert len(takeovers) == len(lost), takeovers
                # The survivor's turns end as they would have: every question answered once.
                await wait_for(lambda: all(answers_in(slack, b) for b in bodies), 60, "every answer")
                assert [len(answers_in(slack, b)) for b in bodies] == [1] * len(bodies)
        finally:
            for replica in replicas:
                replica.stop()
        assert [r.process.returncode for r in replicas] == [0, 0]
