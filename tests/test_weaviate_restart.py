"""Weaviate stopped and started again in the middle of a conversation (a private server, so the
shared one the other tests use is left alone)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from tests.conftest import REPO, make_settings
from tests.ports import free_port
from tests.replies import RecordingReply

SERVICES = REPO / "scripts" / "services.sh"
pytestmark = pytest.mark.skipif(not (os.environ.get("WEAVIATE_URL") and os.environ.get("REDIS_URL")),
                                reason="WEAVIATE_URL and REDIS_URL are not set (make test builds and starts Weaviate)")


@pytest.fixture
def private_weaviate(tmp_path: Path):
    http, grpc, gossip, raft = free_port(2), free_port(2), free_port(2), free_port(2)
    env = {k: v for k, v in os.environ.items() if k not in ("WEAVIATE_URL", "WEAVIATE_GRPC_PORT")}
    # Written as another host name, the shared Redis is "external" to this private start: the
    # script checks it answers and starts no Redis of its own.
    env["REDIS_URL"] = os.environ["REDIS_URL"].replace("127.0.0.1", "localhost")
    env.update(KBBOT_STATE_DIR=str(tmp_path / "state"), KBBOT_WEAVIATE_DATA_DIR=str(tmp_path / "weaviate-data"),
               KBBOT_WEAVIATE_PORT=str(http), KBBOT_WEAVIATE_GRPC_PORT=str(grpc),
               KBBOT_WEAVIATE_GOSSIP_PORT=str(gossip), KBBOT_WEAVIATE_RAFT_PORT=str(raft))

    def services(command: str) -> None:
        subprocess.run(["bash", str(SERVICES), command], env=env, check=True, capture_output=True, timeout=180)

    services("start")
    try:
        yield f"http://127.0.0.1:{http}", grpc, services
    finally:
        services("stop")


async def test_turns_fail_plainly_while_weaviate_is_down_and_work_once_it_is_back(
        private_weaviate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    url, grpc, services = private_weaviate
    monkeypatch.setenv("WEAVIATE_GRPC_PORT", str(grpc))
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "warranty.md").write_text("# Warranty\nThe standard warranty lasts 24 months from delivery.\n",
                                    encoding="utf-8")
    runtime = build_runtime(make_settings(tmp_path / "data", WEAVIATE_URL=url))
    assert runtime.indexer.index([kb]).added
    await runtime.start()
    assert await runtime.warm_up()
    # The loop's async client is connected before anyone asks (each question used to connect its own).
    assert runtime.store.connection._async[0] is asyncio.get_running_loop()
    question = Inquiry("test", "t", "c", "test:restart", "u", "How long is the standard warranty?")
    try:
        assert (await runtime.answerer.answer(question, RecordingReply())).outcome is Outcome.ANSWERED

        services("stop")
        reply = RecordingReply()
        down = await runtime.answerer.answer(question, reply)
        assert down.outcome is Outcome.ERROR
        assert reply.failure.startswith("The knowledge base cannot be reached right now")
        assert reply.final is None

        services("start")  # same data directory: the documents are still there
        back = RecordingReply()
        answer = await runtime.answerer.answer(question, back)
        assert answer.outcome is Outcome.ANSWERED and back.final is answer
        assert "24 months" in answer.text
        # The failed turn left no half turn behind: two good turns, four messages.
        assert len(await runtime.history.load("test:restart")) == 4
    finally:
        await runtime.close()
