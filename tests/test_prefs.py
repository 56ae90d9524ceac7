"""Users' answering preferences through the chat adapters: ``/kbbot prefs|remember|forget`` (bolt, signed
slash-command requests) and ``/prefs``, ``/remember``, ``/forget`` (aiogram, long polling), with the
preference store in real Redis when ``REDIS_URL`` is set. Preferences set by command reach the system
prompt of that user's answers (what the fake model receives), learning from messages happens only after
``remember on``, ``forget`` removes everything, and another user never sees them."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from bot.state.preferences import Preferences
from bot.types import Outcome
from tests.fakes.telegram_server import message_update, user
from tests.test_approvals import REDIS_URL, memory_claude  # noqa: F401 - fixture
from tests.test_slack import SECRET, TEAM, Slack, fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

QUESTION = "How often should the bearings be greased?"
ALICE, BOB = "U0ALICE", "U0BOB"
CONCISE = "Keep answers short"
STEPS = "Present procedures as numbered steps."
DETAILED = "Give detailed answers"


async def kbbot(slack: Slack, text: str, user_id: str) -> str:
    """``/kbbot {text}`` from ``user_id``; the text of the (ephemeral) ack."""
    body = urlencode({"token": "legacy", "team_id": TEAM, "team_domain": "kb", "channel_id": "C0SUPPORT",
                      "channel_name": "support", "user_id": user_id, "user_name": user_id.lower(),
                      "command": "/kbbot", "text": text, "api_app_id": "AKBBOT",
                      "response_url": slack.fake.response_url("prefs"), "trigger_id": "1.2.3"})
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
               "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
    started = time.monotonic()
    async with slack.session.post(f"{slack.url}/slack/events", data=body.encode(), headers=headers) as resp:
        raw = await resp.text()
        assert resp.status == 200 and time.monotonic() - started < 3, "Slack needs its ack within 3 s"
    await slack.adapter.settle()
    return json.loads(raw)["text"] if raw.startswith("{") else raw


async def settle_learning(runtime: Any) -> None:
    await asyncio.gather(*runtime.answerer._background)


async def stored_keys(runtime: Any) -> list[str]:
    if runtime.redis is None:
        return []
    return [k.decode() if isinstance(k, bytes) else k
            async for k in runtime.redis.scan_iter(match=f"{runtime.settings.redis_prefix}prefs:*")]


async def test_slack_prefs_by_command_shape_that_users_answers_only(memory_claude, fake_slack):
    model, runtime = memory_claude
    async with slack_app(runtime, fake_slack) as slack:
        said = await kbbot(slack, "prefs concise", ALICE)
        assert said.startswith("Your answering preferences") and "style: concise" in said
        said = await kbbot(slack, "prefs steps on", ALICE)
        assert "style: concise" in said and "step numbers: on" in said
        assert "learning from your messages: off" in said
        if REDIS_URL:
            assert await stored_keys(runtime) == [f"{runtime.settings.redis_prefix}prefs:slack:{TEAM}:{ALICE}"]
        assert (await kbbot(slack, "prefs loud", ALICE)).startswith("Usage: /kbbot prefs concise|detailed|default")

        await slack.send(slack.mention(QUESTION, user=ALICE))
        assert slack.turns[-1].answer.outcome is Outcome.ANSWERED
        assert CONCISE in model.last_request.system and STEPS in model.last_request.system
        await slack.send(slack.mention(QUESTION, user=BOB))
        assert CONCISE not in model.last_request.system and STEPS not in model.last_request.system

        shown = await kbbot(slack, "prefs", BOB)
        assert "style: default" in shown and "step numbers: default" in shown, "Bob sees only his own"
        said = await kbbot(slack, "prefs lang zh", ALICE)
        assert said.startswith("您的回答偏好") and "语言：中文" in said, "replies follow the chosen language"
        await slack.send(slack.mention(QUESTION, user=ALICE))
        assert "Answer in Chinese" in model.last_request.system

        assert (await kbbot(slack, "forget", ALICE)).startswith("已完成"), "still in the language she chose"
        assert await runtime.preferences.load("slack", TEAM, ALICE) == Preferences()
        assert await stored_keys(runtime) == []
        await slack.send(slack.mention(QUESTION, user=ALICE))
        assert CONCISE not in model.last_request.system and "Answer in Chinese" not in model.last_request.system


async def test_slack_learning_only_after_remember_on_and_forget_removes_everything(memory_claude, fake_slack):
    model, runtime = memory_claude
    model.router.responders["preferences"] = lambda body: json.dumps(
        {"style": "detailed", "language": None, "step_numbers": True})
    stated = "Please always answer in detail with numbered steps: how often should the bearings be greased?"
    async with slack_app(runtime, fake_slack) as slack:
        await slack.send(slack.mention(stated, user=ALICE))
        await settle_learning(runtime)
        assert "preferences" not in model.router.kinds, "no consent, no learning call"
        assert await runtime.preferences.load("slack", TEAM, ALICE) == Preferences()

        said = await kbbot(slack, "remember on", ALICE)
        assert said.startswith("OK: from now on I may pick up answering preferences")
        await slack.send(slack.mention(stated, user=ALICE))
        await settle_learning(runtime)
        assert model.router.kinds.count("preferences") == 1
        assert (await runtime.preferences.load("slack", TEAM, ALICE)).learned == {"style": "detailed",
                                                                                  "step_numbers": True}
        assert "style: detailed" in await kbbot(slack, "prefs", ALICE)

        await slack.send(slack.mention(QUESTION, user=ALICE))
        assert DETAILED in model.last_request.system and STEPS in model.last_request.system
        await slack.send(slack.mention(QUESTION, user=BOB))
        assert DETAILED not in model.last_request.system, "learned for Alice, never applied to Bob"

        said = await kbbot(slack, "remember off", ALICE)
        assert said.startswith("OK: I stopped learning")
        assert await runtime.preferences.load("slack", TEAM, ALICE) == Preferences()
        await slack.send(slack.mention(stated, user=ALICE))
        await settle_learning(runtime)
        assert model.router.kinds.count("preferences") == 1, "no learning after remember off"

        await kbbot(slack, "prefs concise", ALICE)
        await kbbot(slack, "remember on", ALICE)
        assert (await kbbot(slack, "forget", ALICE)).startswith("Done: I forgot")
        assert await runtime.preferences.load("slack", TEAM, ALICE) == Preferences()
        assert await stored_keys(runtime) == []
        await slack.send(slack.mention(stated, user=ALICE))
        await settle_learning(runtime)
        assert model.router.kinds.count("preferences") == 1, "forget withdrew the consent too"
        assert CONCISE not in model.last_request.system and DETAILED not in model.last_request.system


async def test_telegram_prefs_remember_and_forget_commands(memory_claude, fake_tg):
    model, runtime = memory_claude
    model.router.responders["preferences"] = lambda body: json.dumps(
        {"style": None, "language": None, "step_numbers": True})
    tenant = str(fake_tg.bot_id)

    def command(text: str, chat_id: int, language_code: str = "en") -> dict[str, Any]:
        name = text.split()[0]
        return message_update(text, chat_id=chat_id, from_user=user(chat_id, language_code=language_code),
                              entities=[{"type": "bot_command", "offset": 0, "length": len(name)}])

    async with telegram_bot(runtime, fake_tg) as tg:
        await tg.send(command("/help", 7001))
        assert "/prefs concise|detailed|default" in fake_tg.chat(7001)[-1].text and "/forget" in \
            fake_tg.chat(7001)[-1].text

        await tg.send(command("/prefs concise", 7001))
        said = fake_tg.chat(7001)[-1].text
        assert said.startswith("Your answering preferences") and "style: concise" in said
        await tg.send(command("/prefs loud", 7001))
        assert fake_tg.chat(7001)[-1].text.startswith("Usage: /prefs concise|detailed|default")
        await tg.send(command("/prefs", 7002, language_code="zh-hans"))
        assert fake_tg.chat(7002)[-1].text.startswith("您的回答偏好") and "风格：默认" in fake_tg.chat(7002)[-1].text
        assert not tg.turns, "commands are not questions"

        await tg.send(message_update(QUESTION, chat_id=7001))
        assert CONCISE in model.last_request.system
        await tg.send(message_update(QUESTION, chat_id=7002))
        assert CONCISE not in model.last_request.system, "another user never sees them"

        stated = "Please always use numbered steps: how do I replace the cooling fan?"
        await tg.send(message_update(stated, chat_id=7001))
        await settle_learning(runtime)
        assert "preferences" not in model.router.kinds
        await tg.send(command("/remember on", 7001))
        assert fake_tg.chat(7001)[-1].text.startswith("OK: from now on")
        await tg.send(message_update(stated, chat_id=7001))
        await settle_learning(runtime)
        assert (await runtime.preferences.load("telegram", tenant, "7001")).learned == {"step_numbers": True}

        await tg.send(command("/forget", 7001))
        assert fake_tg.chat(7001)[-1].text.startswith("Done: I forgot")
        assert await runtime.preferences.load("telegram", tenant, "7001") == Preferences()
        assert await stored_keys(runtime) == []
        await tg.send(message_update(QUESTION, chat_id=7001))
        assert CONCISE not in model.last_request.system and STEPS not in model.last_request.system
