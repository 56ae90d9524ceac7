"""``kbbot serve``'s web app with the Slack adapter (against the fake Slack) and the admin page, on a
started runtime: what the admin page tests drive over HTTP and in the browser."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from adapters.insights import mount_admin
from adapters.server import build_web_app
from adapters.slack.platform import SlackAdapter
from adapters.slack.settings import SlackSettings
from bot.conversation import HandledTurn
from bot.knowledge.refresh import Refresher
from bot.knowledge.scheduler import KnowledgeAdmin
from tests.fakes.slack_server import FakeSlack
from tests.test_slack import SECRET, TEAM, Slack, feedback_values

TOKEN = "test-admin-token-0123456789abcdef"


@dataclass
class Site:
    url: str  # http://127.0.0.1:<port>
    slack: Slack
    admin: Any  # adapters.admin.AdminSite

    async def ask(self, text: str, *, channel: str = "C0SUPPORT", user: str = "U0ALICE") -> HandledTurn:
        before = len(self.slack.turns)
        await self.slack.send(self.slack.mention(text, channel=channel, user=user))
        assert len(self.slack.turns) == before + 1
        return self.slack.turns[-1]

    async def thumbs_down(self, turn: HandledTurn, *, user: str = "U0BOB") -> None:
        [message] = self.slack.fake.thread(turn.inquiry.channel, turn.inquiry.thread_key.rsplit(":", 1)[1])
        down = feedback_values(message)[1]
        payload = {"type": "block_actions", "team": {"id": TEAM}, "user": {"id": user}, "api_app_id": "AKBBOT",
                   "container": {"type": "message", "message_ts": message.ts, "channel_id": turn.inquiry.channel},
                   "channel": {"id": turn.inquiry.channel}, "trigger_id": "1.2.3",
                   "actions": [{"type": "feedback_buttons", "action_id": "kbbot_feedback", "block_id": "fb",
                                "value": down, "action_ts": str(time.time())}]}
        resp = await self.slack.post(urlencode({"payload": json.dumps(payload)}),
                                     content_type="application/x-www-form-urlencoded")
        assert resp.status == 200
        await self.slack.adapter.settle()


@contextlib.asynccontextmanager
async def admin_site(runtime: Any, fake: FakeSlack) -> AsyncIterator[Site]:
    runtime.settings.insights.admin_token = TOKEN
    settings = SlackSettings(bot_token=fake.token, signing_secret=SECRET, api_url=fake.base_url,
                             stream_interval_s=0.3, edit_interval_s=0.3)
    turns: list[HandledTurn] = []
    adapter = SlackAdapter(runtime.conversations(on_turn=turns.append), settings)
    knowledge = KnowledgeAdmin(Refresher(runtime.settings, runtime.store, runtime.indexer, redis=runtime.redis))
    app = build_web_app([adapter], runtime)
    site = mount_admin(app, runtime, knowledge)
    assert site is not None
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            yield Site(url, Slack(fake, adapter, url, session, turns), site)
    finally:
        await adapter.drain(10)
        await site.close(30)
        await runner.cleanup()
