"""Two ``kbbot serve`` processes behind one Telegram webhook (``make test-cluster``): an update that
reaches both (Telegram retries a webhook call it saw no 200 for, and a load balancer may retry too)
is answered once, and two messages of one chat sent to different replicas at once are answered one
after the other, the second with the first in its history (the chat's lock and history live in Redis).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.replicas import (
    NEEDS_SERVICES,
    Replica,
    kb_folder,
    refresh_once,
    running,
    serve_env,
    wait_for,
    wait_healthy,
    write_config,
)
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram, message_update
from tests.model_router import ModelRouter, default_reply, quoting

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600), NEEDS_SERVICES]

SECRET = "tg-replicas-secret"
HOOK = "/telegram/hook"
FIRST, SECOND = "How often should the bearings be greased?", "And how much grease goes in?"


async def post_update(session: aiohttp.ClientSession, replica: Replica, update: dict[str, Any]) -> None:
    async with session.post(f"{replica.url}{HOOK}", json=update,
                            headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as response:
        assert response.status == 200, await response.text()


def finals(fake: FakeTelegram, chat_id: int) -> list[str]:
    return [call.text for call in fake.ok_calls("sendMessage") if int(call.args.get("chat_id", 0)) == chat_id]


async def test_webhook_updates_reaching_two_replicas_are_answered_once_and_in_order(tmp_path: Path):
    kb = kb_folder(tmp_path / "kb", "faq.md", "maintenance-schedule.md")
    config = write_config(tmp_path / "config", kb, f"TgReplicas_{uuid.uuid4().hex[:8]}",
                          f"kbbot:tg-replicas:{uuid.uuid4().hex[:8]}:", lease_s=4, refresh_every_s=3600)
    answer_requests: list[str] = []
    first_answers: list[str] = []  # what the slow first turn said (a sentence of its source, as the gate needs)

    def answer(body: dict[str, Any]) -> Script | str:
        messages = json.dumps(body.get("messages"), ensure_ascii=False)
        answer_requests.append(messages)
        if FIRST in messages and SECOND not in messages:  # the first turn is slow: the second must wait
            first_answers.append(quoting(1)(body))
            return Script(first_answers[-1], first_token_delay=3)
        return default_reply("answer", body)

    router = ModelRouter()
    router.responders["answer"] = answer
    async with FakeAnthropic() as claude, FakeSlack(token="xoxb-tg-replicas") as slack, FakeTelegram() as telegram, \
            aiohttp.ClientSession() as session:
        claude.responder = router
        env = {**serve_env(tmp_path, config=config, slack=slack, model_url=claude.base_url),
               "TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_API_URL": telegram.base_url,
               "TELEGRAM_WEBHOOK_URL": f"https://kbbot.example{HOOK}", "TELEGRAM_WEBHOOK_SECRET": SECRET}
        await refresh_once(env, tmp_path / "admin")
        async with running(2, env, tmp_path) as replicas:
            await wait_healthy(session, replicas)
            assert not telegram.calls_to("getUpdates")  # replicas take the webhook: no poller fights another

            # 1. Each update delivered to both replicas.
            chats = [7101, 7102, 7103, 7104]
            for i, chat in enumerate(chats):
                update = message_update("What does fault code E07 mean?", chat_id=chat,
                                        update_id=telegram.new_update_id())
                await post_update(session, replicas[i % 2], update)
                await post_update(session, replicas[(i + 1) % 2], update)
            await wait_for(lambda: all(finals(telegram, c) for c in chats), 120, "an answer in every chat")
            await asyncio.sleep(2)  # time for a duplicate to show up, were there one
            assert [len(finals(telegram, c)) for c in chats] == [1] * len(chats)

            # 2. Two messages of one chat, at once, to different replicas: one after the other.
            chat = 7201
            first = message_update(FIRST, chat_id=chat, update_id=telegram.new_update_id())
            second = message_update(SECOND, chat_id=chat, update_id=telegram.new_update_id())
            await post_update(session, replicas[0], first)
            await wait_for(lambda: any(FIRST in r for r in answer_requests), 60, "the first turn reaching the model")
            await post_update(session, replicas[1], second)
            await wait_for(lambda: len(finals(telegram, chat)) >= 2, 120, "both answers")
            [second_request] = [r for r in answer_requests if SECOND in r]
            # The second turn ran after the first had finished: its history holds the first answer.
            said = first_answers[0].removesuffix(" [1].")[:40]
            assert FIRST in second_request and said in second_request
            assert said in finals(telegram, chat)[0]
