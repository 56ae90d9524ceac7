"""Three ``kbbot serve`` processes on one Redis and one Weaviate, answering the fake Slack
(``make test-cluster``): one answer per question when Slack redelivers an event to another
replica; a replica killed mid-turn leaves its claim and thread lock behind only for their bounded
lease, after which Slack's redelivery is answered by another; the scheduled refresh runs once
per turn across the three.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from redis.asyncio import Redis
from slack_sdk.signature import SignatureVerifier

from tests.conftest import EXAMPLES, REPO
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.fakes.slack_server import FakeSlack
from tests.model_router import ModelRouter, default_reply

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900),
              pytest.mark.skipif(not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")),
                                 reason="REDIS_URL and WEAVIATE_URL are not set (make test-cluster starts them)")]

SECRET = "s" * 32
TEAM, BOT = "T0KBBOT", "UKBBOT"
REPLICAS = 3
LEASE_S = 4  # slack.claim_lease_s here; Slack's own retries come 1 and 5 minutes after a missed ack
LOCK_TTL_S = 30  # the thread lock's TTL (bot/runtime.py), renewed while its holder lives
REFRESH_EVERY_S = 20
KB_FILES = ("faq.md", "maintenance-schedule.md", "fault-codes.md")
SLOW = "What torque do the terminal screws need?"
_ts = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(folder: Path, kb: Path, collection: str, prefix: str) -> Path:
    """The repository's settings, with this test's collection, Redis prefix, source and Slack lease."""
    shutil.copytree(REPO / "config", folder)
    path = folder / "kbbot.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["store"]["collection"] = collection
    raw["redis_prefix"] = prefix
    raw["sources"] = [{"name": "kb", "path": str(kb), "interval": f"{REFRESH_EVERY_S}s"}]
    raw["slack"].update(claim_lease_s=LEASE_S, stream_interval_s=0.2, edit_interval_s=0.2)
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


class Replica:
    def __init__(self, n: int, env: dict[str, str], log: Path):
        self.n = n
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "adapters.cli", "serve"], cwd=REPO,
                                        env={**env, "KBBOT_PORT": str(self.port)}, stdout=self._out,
                                        stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._out.close()


def event_body(text: str, channel: str, event_id: str) -> str:
    ts = f"{1_900_000_000 + next(_ts)}.000100"
    event = {"type": "app_mention", "user": "U0ALICE", "text": f"<@{BOT}> {text}", "ts": ts, "channel": channel,
             "team": TEAM, "event_ts": ts}
    return json.dumps({"token": "legacy", "team_id": TEAM, "api_app_id": "AKBBOT", "type": "event_callback",
                       "event_id": event_id, "event_time": int(time.time()),
                       "authorizations": [{"team_id": TEAM, "user_id": BOT, "is_bot": True}], "event": event})


async def deliver(session: aiohttp.ClientSession, replica: Replica, body: str, retry: int = 0) -> float:
    """Posts a signed event as Slack does; returns the seconds until the replica acknowledged it."""
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
               "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
    if retry:
        headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"})
    started = time.monotonic()
    async with session.post(f"{replica.url}/slack/events", data=body.encode(), headers=headers) as response:
        assert response.status == 200, await response.text()
    return time.monotonic() - started


def answers_in(slack: FakeSlack, body: str) -> list[Any]:
    event = json.loads(body)["event"]
    return [m for m in slack.thread(event["channel"], event["ts"]) if not m.streaming and m.body.strip()]


async def wait_for(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def test_replicas_answer_once_survive_a_killed_replica_and_refresh_once(tmp_path: Path):
    kb = tmp_path / "kb"
    kb.mkdir()
    for name in KB_FILES:
        (kb / name).write_bytes((EXAMPLES / name).read_bytes())
    prefix = f"kbbot:replicas:{uuid.uuid4().hex[:8]}:"
    config = write_config(tmp_path / "config", kb, f"Replicas_{uuid.uuid4().hex[:8]}", prefix)
    slow_answers: list[float] = []

    def answer(body: dict[str, Any]) -> Script | str:
        if "terminal screws" in json.dumps(body.get("messages")) and not slow_answers:
            slow_answers.append(time.monotonic())  # the first replica's answer: it dies waiting for it
            return Script("Tighten them to the value in the manual.", first_token_delay=60)
        return default_reply("answer", body)

    router = ModelRouter()
    router.responders["answer"] = answer
    async with FakeAnthropic() as claude, FakeSlack(token="xoxb-replicas") as slack, \
            aiohttp.ClientSession() as session:
        claude.responder = router
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
               "HAYSTACK_TELEMETRY_ENABLED": "False", "KBBOT_CONFIG": str(config), "KBBOT_LOG_FORMAT": "json",
               "REDIS_URL": os.environ["REDIS_URL"], "WEAVIATE_URL": os.environ["WEAVIATE_URL"],
               "WEAVIATE_GRPC_PORT": os.environ.get("WEAVIATE_GRPC_PORT", "50051"),
               "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": claude.base_url,
               "SLACK_BOT_TOKEN": slack.token, "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": slack.base_url}
        # Indexed once before the replicas start, as `kbbot refresh` run by an operator would.
        refresh = await asyncio.create_subprocess_exec(sys.executable, "-m", "adapters.cli", "refresh", "kb", cwd=REPO,
                                                       env={**env, "KBBOT_DATA_DIR": str(tmp_path / "admin")},
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await refresh.communicate()
        assert refresh.returncode == 0, output.decode()[-2000:]

        replicas = [Replica(n, {**env, "KBBOT_DATA_DIR": str(tmp_path / f"replica{n}")}, tmp_path / f"replica{n}.log")
                    for n in range(REPLICAS)]
        redis = Redis.from_url(os.environ["REDIS_URL"])
        started = time.monotonic()
        try:
            async def healthy(replica: Replica) -> bool:
                try:
                    async with session.get(f"{replica.url}/healthz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            while not all([await healthy(r) for r in replicas]):
                for r in replicas:
                    assert r.process.poll() is None, r.log.read_text()[-3000:]
                assert time.monotonic() - started < 240, "the replicas did not become healthy"
                await asyncio.sleep(1)

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

            # 2. A replica killed mid-turn: its claim and thread lock outlive it only by their leases.
            slow = event_body(SLOW, "C0KILL", "EvKill0001")
            event = json.loads(slow)["event"]
            await deliver(session, replicas[0], slow)
            await wait_for(lambda: bool(slow_answers), 120, "the slow turn reaching the model")
            replicas[0].kill()
            killed_at = time.monotonic()
            assert await deliver(session, replicas[1], slow, retry=1) < 3
            await asyncio.sleep(1)
            assert not answers_in(slack, slow), "the claim of the dead replica's turn still held the event"
            claims = [k async for k in redis.scan_iter(f"{prefix}dedupe:slack:event:EvKill0001")]
            assert claims and 0 < await redis.pttl(claims[0]) <= LEASE_S * 1000
            await wait_for(lambda: time.monotonic() - killed_at > LEASE_S + 0.5, LEASE_S + 5, "the lease")
            assert not await redis.exists(*claims)
            assert await deliver(session, replicas[2], slow, retry=2) < 3  # Slack's next retry
            took = await wait_for(lambda: answers_in(slack, slow), LOCK_TTL_S + 20, "the redelivered answer")
            print(f"answered by another replica {time.monotonic() - killed_at:.1f} s after the kill "
                  f"({took:.1f} s after the redelivery: the dead holder's thread lock expiring)")
            assert len(answers_in(slack, slow)) == 1

            # 3. The scheduled refresh: once per turn across the replicas, however many there are.
            await wait_for(lambda: time.monotonic() - started > 2.5 * REFRESH_EVERY_S, 3 * REFRESH_EVERY_S,
                           "two refresh turns")
        finally:
            for r in replicas:
                r.stop()
            await redis.aclose()

    runs = sorted((line["ts"], r.n) for r in replicas for line in r.lines()
                  if str(line.get("message", "")).startswith("refresh source=kb trigger=schedule status="))
    assert len(runs) >= 2, runs
    moments = [time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) for ts, _ in runs]
    gaps = [b - a for a, b in zip(moments, moments[1:])]
    assert all(gap >= REFRESH_EVERY_S - 2 for gap in gaps), runs  # never two runs for one turn
    print(f"scheduled refreshes: {len(runs)} runs by replicas {[n for _, n in runs]}, {gaps} s apart")
