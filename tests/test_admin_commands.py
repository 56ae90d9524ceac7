"""Admin commands through the real SDKs: Slack's ``/kbbot status|refresh`` (bolt, signed slash-command
requests, results on the response_url) and Telegram's ``/status`` and ``/refresh`` (aiogram, long
polling against the fake Bot API). Non-admins get a polite refusal and nothing runs."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from slack_sdk.signature import SignatureVerifier

from bot.knowledge.refresh import Refresher
from bot.knowledge.scheduler import KnowledgeAdmin
from bot.settings import SourceSettings
from tests.conftest import make_settings
from tests.fakes.telegram_server import message_update
from tests.test_slack import SECRET, TEAM, Slack, fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

ADMIN = "UADMIN01"
TG_ADMIN = 9001


@pytest.fixture
async def admin(tmp_path: Path, kb_runtime) -> AsyncIterator[KnowledgeAdmin]:  # noqa: ANN001
    """An admin over a small folder source of its own (embedded store, run log in the data dir)."""
    from bot.runtime import build_runtime

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fault-e917.md").write_text("# Fault E-917\n\nFault E-917 means the cooling fan is blocked.\n",
                                        encoding="utf-8")
    settings = make_settings(tmp_path / "admin-data")
    settings.sources = [SourceSettings(name="docs", path=str(docs), interval="1h")]
    runtime = build_runtime(settings)
    yield KnowledgeAdmin(Refresher(settings, runtime.store, runtime.indexer))


async def slash(slack: Slack, text: str, user: str, key: str) -> tuple[int, str]:
    body = urlencode({"token": "legacy", "team_id": TEAM, "team_domain": "kb", "channel_id": "C0SUPPORT",
                      "channel_name": "support", "user_id": user, "user_name": "someone", "command": "/kbbot",
                      "text": text, "api_app_id": "AKBBOT", "response_url": slack.fake.response_url(key),
                      "trigger_id": "1.2.3"})
    ts = str(int(time.time()))
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": ts,
               "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
    started = time.monotonic()
    async with slack.session.post(f"{slack.url}/slack/events", data=body.encode(), headers=headers) as resp:
        text_body = await resp.text()
        assert time.monotonic() - started < 3, "Slack needs its ack within 3 s"
        return resp.status, text_body


def ack_text(body: str) -> str:
    """The ack's message: bolt answers a text-only ack as plain text, anything else as JSON."""
    if body.startswith("{"):
        return json.loads(body)["text"]
    return body


async def test_slack_admins_get_status_and_refresh_others_a_polite_refusal(kb_runtime, fake_slack, admin):  # noqa: F811
    async with slack_app(kb_runtime, fake_slack, admin=admin, admins=[ADMIN]) as slack:
        status, body = await slash(slack, "status", "U0ALICE", "refused")
        await slack.adapter.settle()
        assert status == 200 and "for kbbot admins only" in ack_text(body)
        assert fake_slack.responses["refused"] == []
        assert await admin.refresher.last_run("docs") is None, "a refused command runs nothing"

        status, body = await slash(slack, "refresh docs", ADMIN, "refresh")
        assert status == 200 and ack_text(body).startswith("Refreshing `docs` now")
        await slack.adapter.settle()
        [result] = fake_slack.responses["refresh"]
        assert result["response_type"] == "ephemeral"
        assert result["text"].startswith("docs: refreshed in ") and "1 new, 0 changed" in result["text"]

        status, body = await slash(slack, "status", ADMIN, "status")
        await slack.adapter.settle()
        [result] = fake_slack.responses["status"]
        assert result["text"].startswith("Knowledge version 1 · Weaviate off · Redis off")
        assert "• docs: 1 documents, 1 chunks; last run " in result["text"] and "next run " in result["text"]

        _, body = await slash(slack, "refresh nope", ADMIN, "unknown")
        assert ack_text(body) == "There is no source named “nope”. Sources: docs."
        _, body = await slash(slack, "reindex", ADMIN, "usage")
        assert ack_text(body).startswith("Usage: `/kbbot status`")


async def test_telegram_admins_get_status_and_refresh_others_a_polite_refusal(kb_runtime, fake_tg, admin):  # noqa: F811
    def command(text: str, chat_id: int) -> dict:
        name = text.split()[0]
        return message_update(text, chat_id=chat_id, entities=[{"type": "bot_command", "offset": 0,
                                                                 "length": len(name)}])

    async with telegram_bot(kb_runtime, fake_tg, admin=admin, admins=[str(TG_ADMIN)]) as tg:
        await tg.send(command("/refresh", 7001))
        [refusal] = fake_tg.chat(7001)
        assert "for kbbot admins only" in refusal.text
        assert await admin.refresher.last_run("docs") is None

        await tg.send(command("/refresh docs", TG_ADMIN))
        started, result = fake_tg.chat(TG_ADMIN)
        assert started.text == "Refreshing docs now; the result follows."
        assert result.text.startswith("docs: refreshed in ") and "1 new" in result.text

        await tg.send(command("/status", TG_ADMIN))
        status = fake_tg.chat(TG_ADMIN)[-1].text
        assert status.startswith("Knowledge version 1 · Weaviate off · Redis off")
        assert "• docs: 1 documents, 1 chunks; last run" in status
        assert not tg.turns, "commands are not questions"


def test_long_admin_texts_are_split_at_lines_within_telegrams_limit():
    from adapters.telegram.text import plain_parts, utf16_len

    text = "\n".join(f"line {i}: " + "电机" * 30 for i in range(200)) + "\n" + "x" * 5000
    parts = plain_parts(text, 4096)
    assert all(utf16_len(p) <= 4096 for p in parts) and len(parts) >= 3
    assert "".join(parts).replace("\n", "") == text.replace("\n", "")
