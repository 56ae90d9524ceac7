"""Several ``kbbot serve`` processes on one Redis and one Weaviate, fed signed Slack events, for the
replica tests (``tests/cluster/test_replicas.py``) and the load run (``bench/load.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from slack_sdk.signature import SignatureVerifier

from tests.conftest import EXAMPLES, REPO
from tests.fakes.slack_server import FakeSlack
from tests.ports import free_port

#: The cluster tests' marker: they run replicas on the shared Redis and Weaviate.
NEEDS_SERVICES = pytest.mark.skipif(not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")),
                                    reason="REDIS_URL and WEAVIATE_URL are not set (make test-cluster starts them)")

SECRET = "s" * 32
TEAM, BOT = "T0KBBOT", "UKBBOT"
_ts = itertools.count(1)


def kb_folder(folder: Path, *names: str) -> Path:
    """``folder`` holding these files of examples/kb: a source of this run's own."""
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes((EXAMPLES / name).read_bytes())
    return folder


def write_config(folder: Path, kb: Path, collection: str, prefix: str, *, lease_s: float,
                 refresh_every_s: int, recovery_interval_s: float | None = None) -> Path:
    """The repository's settings, with this run's collection, Redis prefix, source, Slack lease and
    (if given) how often each replica looks for the turns of a replica that died."""
    shutil.copytree(REPO / "config", folder)
    path = folder / "kbbot.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["store"]["collection"] = collection
    raw["redis_prefix"] = prefix
    raw["sources"] = [{"name": "kb", "path": str(kb), "interval": f"{refresh_every_s}s"}]
    raw["slack"].update(claim_lease_s=lease_s, stream_interval_s=0.2, edit_interval_s=0.2)
    if recovery_interval_s is not None:
        raw["recovery"]["interval_s"] = recovery_interval_s
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


class Replica:
    """A ``kbbot serve`` on a port of its own; with ``workers``, ``serve --workers`` (``adapters.workers``)."""

    def __init__(self, n: int, env: dict[str, str], log: Path, workers: int | None = None):
        self.n = n
        self.command = [sys.executable, "-m", "adapters.cli", "serve", *(["--workers", str(workers)] if workers else [])]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out = log.open("w")
        self._env = {**env, "KBBOT_PORT": str(self.port)}
        #: Passed its health check since it last started: what a load balancer's readiness check sends to.
        self.ready = False
        self.process = subprocess.Popen(self.command, cwd=REPO, env=self._env,
                                        stdout=self._out, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def restart(self) -> None:
        """A new process in the old one's place (same port, data directory and log)."""
        self._out.close()
        self._out = self.log.open("a")
        self.ready = False
        self.process = subprocess.Popen(self.command, cwd=REPO, env=self._env,
                                        stdout=self._out, stderr=subprocess.STDOUT)

    def rss_mb(self) -> float | None:
        """Peak resident memory (VmHWM) of the live process, in MB."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def kill(self) -> None:
        self.ready = False
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


def event_body(text: str, channel: str, event_id: str, user: str = "U0ALICE", team: str = TEAM) -> str:
    ts = f"{1_900_000_000 + next(_ts)}.000100"
    event = {"type": "app_mention", "user": user, "text": f"<@{BOT}> {text}", "ts": ts, "channel": channel,
             "team": team, "event_ts": ts}
    return json.dumps({"token": "legacy", "team_id": team, "api_app_id": "AKBBOT", "type": "event_callback",
                       "event_id": event_id, "event_time": int(time.time()),
                       "authorizations": [{"team_id": team, "user_id": BOT, "is_bot": True}], "event": event})


async def deliver(session: aiohttp.ClientSession, replica: Replica, body: str, retry: int = 0) -> float:
    """Posts a signed event as Slack does; returns the seconds until the replica acknowledged it."""
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
               "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
    if retry:
        headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"})
    started = time.monotonic()
    async with session.post(f"{replica.url}/slack/events", data=body.encode(), headers=headers,
                            timeout=aiohttp.ClientTimeout(total=10)) as response:
        if response.status != 200:
            raise AssertionError(f"replica {replica.n} answered {response.status}: {await response.text()}")
    return time.monotonic() - started


def ends_answer(message: Any) -> bool:
    """Whether a message of the bot ends an answer. An answer may span messages (its first sentences
    posted alone when the workspace's stream and edit tiers are spent, issue 44; a long answer cut at
    Slack's limit), and only its last carries the sources and buttons (the repository's settings keep the
    feedback buttons on); a failure is one message."""
    return (not message.streaming and bool(message.body.strip())
            and (any(b.get("type") != "markdown" for b in message.blocks) or message.body.startswith("⚠️")))


def answers_in(slack: FakeSlack, body: str) -> list[Any]:
    """The answers shown in the question's thread, one message each (``ends_answer``)."""
    event = json.loads(body)["event"]
    return [m for m in slack.thread(event["channel"], event["ts"]) if ends_answer(m)]


async def wait_for(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(0.2)
    return time.monotonic() - started




async def workers_seen(port: int, want: int, timeout_s: float = 240) -> dict[int, int]:
    """worker index -> pid, from /healthz over new connections (each may reach another worker)."""
    seen: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        while len(seen) < want:
            assert time.monotonic() < deadline, f"only workers {seen} answered within {timeout_s} s"
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz",
                                       timeout=aiohttp.ClientTimeout(total=5)) as response:
                    worker = (await response.json()).get("worker")
                    if response.status == 200 and worker:
                        assert worker["of"] == want
                        seen[worker["index"]] = worker["pid"]
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.05 if seen else 0.5)
    return seen


def serve_env(tmp: Path, *, config: Path, slack: FakeSlack, model_url: str) -> dict[str, str]:
    """What each replica runs with: this run's settings, the services of the environment, the fakes."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp)),
            "HAYSTACK_TELEMETRY_ENABLED": "False", "KBBOT_CONFIG": str(config), "KBBOT_LOG_FORMAT": "json",
            "REDIS_URL": os.environ["REDIS_URL"], "WEAVIATE_URL": os.environ["WEAVIATE_URL"],
            "WEAVIATE_GRPC_PORT": os.environ.get("WEAVIATE_GRPC_PORT", "50051"),
            "ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": model_url,
            "SLACK_BOT_TOKEN": slack.token, "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": slack.base_url,
            # A replica is one process here (serve would start one per core with Redis and Weaviate):
            # the replicas are what these runs count; ``Replica(workers=N)`` asks for workers.
            "KBBOT_WORKERS": "1"}


async def refresh_once(env: dict[str, str], data_dir: Path) -> None:
    """``kbbot refresh kb``, as an operator indexes before the replicas start."""
    refresh = await asyncio.create_subprocess_exec(sys.executable, "-m", "adapters.cli", "refresh", "kb", cwd=REPO,
                                                   env={**env, "KBBOT_DATA_DIR": str(data_dir)},
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await refresh.communicate()
    if refresh.returncode != 0:
        raise RuntimeError(f"kbbot refresh failed:\n{output.decode()[-2000:]}")


async def healthy(session: aiohttp.ClientSession, replica: Replica) -> bool:
    try:
        async with session.get(f"{replica.url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as response:
            replica.ready = response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        replica.ready = False
    return replica.ready


async def wait_healthy(session: aiohttp.ClientSession, replicas: list[Replica], timeout_s: float = 240) -> None:
    started = time.monotonic()
    while not all([await healthy(session, r) for r in replicas]):
        for r in replicas:
            if r.process.poll() is not None:
                raise AssertionError(f"replica {r.n} exited:\n{r.log.read_text()[-3000:]}")
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"the replicas did not become healthy within {timeout_s} s")
        await asyncio.sleep(1)


@contextlib.asynccontextmanager
async def running(count: int, env: dict[str, str], tmp: Path) -> AsyncIterator[list[Replica]]:
    """``count`` replicas started (each with a data directory and log of its own), stopped on exit."""
    replicas = [Replica(n, {**env, "KBBOT_DATA_DIR": str(tmp / f"replica{n}")}, tmp / f"replica{n}.log")
                for n in range(count)]
    try:
        yield replicas
    finally:
        for r in replicas:
            r.stop()


def refresh_runs(replicas: list[Replica]) -> list[tuple[str, int]]:
    """(time, replica) of every scheduled refresh run the replicas logged, oldest first."""
    return sorted((line["ts"], r.n) for r in replicas for line in r.lines()
                  if str(line.get("message", "")).startswith("refresh source=kb trigger=schedule status="))
