"""``kbbot serve --workers N`` (issue 44, item 1): N processes behind one port, Telegram's updates polled
once and handed to them, a worker that dies started again; and how many workers a host runs."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from adapters.workers import Worker, worker_count
from bot.errors import SettingsError
from bot.turn.capacity import usable_cores
from tests.cluster.replicas import Replica, kb_folder, refresh_once, serve_env, wait_for, workers_seen, write_config
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram, message_update
from tests.model_router import ModelRouter

SHARED = SimpleNamespace(redis_url="redis://127.0.0.1:6379/0", store_kind="weaviate")
EMBEDDED = SimpleNamespace(redis_url=None, store_kind="memory")
API_TOKEN = "workers-api-token"
CHATS = 20  # the kernel spreads connections at random: 20 all reaching one of two workers is a 1 in 500,000


def test_a_host_runs_a_worker_per_usable_core_only_when_the_workers_share_their_state():
    assert worker_count(None, SHARED, env={}) == usable_cores()
    assert worker_count(3, SHARED, env={}) == 3
    assert worker_count(None, SHARED, env={"KBBOT_WORKERS": "2"}) == 2
    # The embedded defaults: the store, history and claims are the process's own.
    assert worker_count(None, EMBEDDED, env={}) == 1
    assert worker_count(1, EMBEDDED, env={}) == 1
    with pytest.raises(SettingsError, match=r"--workers 2 needs shared state: REDIS_URL and WEAVIATE_URL are not set"):
        worker_count(2, EMBEDDED, env={})
    with pytest.raises(SettingsError, match="WEAVIATE_URL is not set"):
        worker_count(2, SimpleNamespace(redis_url="redis://x", store_kind="memory"), env={})
    with pytest.raises(SettingsError, match="at least 1"):
        worker_count(0, SHARED, env={})
    with pytest.raises(SettingsError, match="KBBOT_WORKERS must be a number"):
        worker_count(None, SHARED, env={"KBBOT_WORKERS": "many"})
    # A worker itself never supervises: it reads its place, not a count.
    assert Worker.from_env({"KBBOT_WORKERS": "2", "KBBOT_WORKER": "1", "KBBOT_PORT": "3100"}) == Worker(1, 2, "", 3100)
    assert Worker.from_env({}).alone and Worker.from_env({}).first


def finals(fake: FakeTelegram, chat_id: int) -> list[Any]:
    return [c for c in fake.ok_calls("sendMessage") if int(c.args.get("chat_id", 0)) == chat_id]


@pytest.mark.skipif(not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")),
                    reason="REDIS_URL and WEAVIATE_URL are not set (make test starts them)")
@pytest.mark.timeout(600)
async def test_two_workers_share_one_port_take_polled_updates_once_and_a_dead_one_is_started_again(tmp_path: Path):
    kb = kb_folder(tmp_path / "kb", "faq.md", "maintenance-schedule.md")
    config = write_config(tmp_path / "config", kb, f"Workers_{uuid.uuid4().hex[:8]}",
                          f"kbbot:workers:{uuid.uuid4().hex[:8]}:", lease_s=4, refresh_every_s=3600)
    async with FakeAnthropic(ModelRouter()) as claude, FakeSlack(token="xoxb-workers") as slack, \
            FakeTelegram() as telegram:
        env = {**serve_env(tmp_path, config=config, slack=slack, model_url=claude.base_url),
               "TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_URL": telegram.base_url,
               "KBBOT_API_TOKEN": API_TOKEN, "KBBOT_DATA_DIR": str(tmp_path / "data")}
        for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_API_URL"):
            env.pop(name)
        await refresh_once(env, tmp_path / "data")
        server = Replica(0, env, tmp_path / "serve.log", workers=2)
        pids: dict[int, int] = {}
        again: dict[int, int] = {}
        try:
            pids = await workers_seen(server.port, 2)
            assert sorted(pids) == [0, 1] and len(set(pids.values())) == 2

            # Telegram: one poller (worker 0), every update answered once, by both workers.
            assert telegram.calls_to("getUpdates")
            chats = [7300 + i for i in range(CHATS)]
            for chat in chats:
                telegram.push(message_update("What does fault code E07 mean?", chat_id=chat,
                                             update_id=telegram.new_update_id()))
            await wait_for(lambda: all(finals(telegram, c) for c in chats), 180, "an answer in every chat")
            await asyncio.sleep(1)  # time for a duplicate to show up, were there one
            assert [len(finals(telegram, c)) for c in chats] == [1] * CHATS
            took = {line.get("worker") for line in server.lines()
                    if str(line.get("message", "")).startswith("telegram: received message")}
            assert took == {0, 1}, f"updates taken by workers {took}"
            assert all(c.ok for c in telegram.calls_to("getUpdates"))  # one poller: no 409 Conflict

            # A worker killed outright is started again on the same port; the HTTP API answers throughout.
            os.kill(pids[1], signal.SIGKILL)
            again = await workers_seen(server.port, 2)
            assert again[0] == pids[0] and again[1] != pids[1]
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{server.url}/v1/chat/completions", json={
                        "model": "kbbot", "messages": [{"role": "user", "content": "What does fault code E07 mean?"}]},
                        headers={"Authorization": f"Bearer {API_TOKEN}"}) as response:
                    assert response.status == 200, await response.text()
        finally:
            server.stop()
        assert server.process.returncode == 0, server.log.read_text()[-3000:]
        for pid in (*pids.values(), *again.values()):
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
