"""Approved answers through the chat adapters: the real bolt ``AsyncApp`` and aiogram ``Dispatcher`` against
the Slack and Telegram fakes, with the answer cache in real Redis when ``REDIS_URL`` is set (in-process
otherwise). A reviewer's click approves by turn id; the same first question then gets the approved answer
with its sources at once; follow-ups never do; a knowledge refresh, or withdrawing, makes it miss;
clicks by anyone else, and buttons of turns the server does not hold, change nothing."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from uuid import uuid4

import pytest

from adapters.platforms import Settings, load_settings
from adapters.slack.settings import SlackSettings
from adapters.slack.text import APPROVE_ACTION, REVIEW_BLOCK, WITHDRAW_ACTION
from adapters.telegram.settings import TelegramSettings
from bot.runtime import Runtime, build_runtime
from bot.settings import SettingsError
from bot.types import Outcome
from tests.conftest import make_settings
from tests.fakes.slack_server import Message
from tests.fakes.telegram_server import callback_update, message_update, user
from tests.test_slack import TEAM, Slack, fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

REDIS_URL = os.environ.get("REDIS_URL")
REVIEWER = "U0REVIEW"
QUESTION = "How often should the bearings be greased?"
TG_REVIEWER = 9101
TG_USER = 7001


# --- runtimes: Redis when REDIS_URL is set -----------------------------------------------------------
def memory_settings(data_dir: Path, **env: str) -> Settings:
    """Settings on ``data_dir`` with Redis (a key prefix of this test's own) when REDIS_URL is set."""
    settings = make_settings(data_dir, **({"REDIS_URL": REDIS_URL} if REDIS_URL else {}), **env)
    settings.redis_prefix = f"kbbot-test:{uuid4().hex[:12]}:"
    return settings


@contextlib.asynccontextmanager
async def started(settings: Settings, state_dir: Path, runtime: Runtime | None = None) -> AsyncIterator[Runtime]:
    runtime = runtime or build_runtime(settings)
    runtime.settings.data_dir = state_dir  # history (embedded) goes to this test's folder
    await runtime.start()
    try:
        yield runtime
    finally:
        if runtime.redis is not None:
            keys = [k async for k in runtime.redis.scan_iter(match=f"{settings.redis_prefix}*")]
            if keys:
                await runtime.redis.delete(*keys)
        await runtime.close()


@pytest.fixture
async def memory_runtime(kb_data_dir: Path, tmp_path: Path) -> AsyncIterator[Runtime]:
    """The indexed sample KB, extractive answers, the answer cache and preferences in Redis if available."""
    async with started(memory_settings(kb_data_dir), tmp_path) as runtime:
        if REDIS_URL:
            assert type(runtime.approved.inner).__name__ == "RedisAnswerCache"  # under the turn records' wrapper
        yield runtime


@pytest.fixture
async def memory_claude(kb_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(the fake Anthropic server, runtime answering with it), memory in Redis if available."""
    from tests.fakes.anthropic_server import FakeAnthropic
    from tests.model_router import AnswerView, ModelRouter

    async with FakeAnthropic() as server:
        fake = AnswerView(server, ModelRouter())
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        settings = memory_settings(kb_data_dir, ANTHROPIC_API_KEY="sk-test")
        settings.generator.max_retries = 0
        settings.generator.timeout_s = 30
        async with started(settings, tmp_path) as runtime:
            yield fake, runtime


# --- Slack helpers -----------------------------------------------------------------------------------
def button(message: Message, action_id: str) -> dict[str, Any] | None:
    for block in message.blocks_of("actions"):
        for element in block["elements"]:
            if element.get("action_id") == action_id:
                return element
    return None


def sources_text(message: Message) -> str:
    return " ".join(e["text"] for b in message.blocks_of("context") if b.get("block_id") != "kbbot_review_note"
                    for e in b["elements"])


def review_note(message: Message) -> str:
    return " ".join(e["text"] for b in message.blocks_of("context") if b.get("block_id") == "kbbot_review_note"
                    for e in b["elements"])


async def click(slack: Slack, message: Message, action_id: str, user_id: str, *, value: str | None = None) -> None:
    """A click on a button of ``message`` as Slack delivers it: a signed ``block_actions`` payload."""
    if value is None:
        found = button(message, action_id)
        assert found is not None, f"no {action_id} button on the message"
        value = found["value"]
    payload = {
        "type": "block_actions", "token": "legacy", "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
        "team": {"id": TEAM, "domain": "kb"},
        "user": {"id": user_id, "username": user_id.lower(), "name": user_id.lower(), "team_id": TEAM},
        "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel,
                      "is_ephemeral": False, "thread_ts": message.thread_ts},
        "channel": {"id": message.channel, "name": "support"},
        "message": {"type": "message", "user": "UKBBOT", "bot_id": "BKBBOT", "ts": message.ts,
                    "thread_ts": message.thread_ts, "text": message.text or message.body, "blocks": message.blocks},
        "response_url": slack.fake.response_url(f"click-{message.ts}"),
        "actions": [{"type": "button", "action_id": action_id, "block_id": REVIEW_BLOCK, "value": value,
                     "action_ts": f"{time.time():.6f}"}],
    }
    resp = await slack.post(urlencode({"payload": json.dumps(payload)}),
                            content_type="application/x-www-form-urlencoded")
    assert resp.status == 200
    await slack.adapter.settle()


async def ask(slack: Slack, text: str = QUESTION, **kwargs: Any) -> tuple[Any, Message]:
    """A mention in a new thread (or ``thread_ts``); the turn and kbbot's (last) message there."""
    before = len(slack.turns)
    event = (await slack.send(slack.mention(text, **kwargs)))["event"]
    assert len(slack.turns) == before + 1
    return slack.turns[-1], slack.thread(event)[-1]


# --- Slack --------------------------------------------------------------------------------------------
async def test_slack_a_reviewers_approval_serves_the_same_question_from_cache_with_sources(memory_runtime,
                                                                                           fake_slack):
    async with slack_app(memory_runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        first, message = await ask(slack)
        answer = first.answer
        assert answer.outcome is Outcome.ANSWERED and answer.approvable
        assert button(message, APPROVE_ACTION)["value"] == answer.trace.turn_id
        assert message.blocks_of("context_actions"), "👍/👎 stay next to the approve button"
        sources = sources_text(message)
        assert sources

        await click(slack, message, APPROVE_ACTION, REVIEWER)
        assert message.body == answer.text, "the approved message keeps its text"
        assert f"Approved by <@{REVIEWER}>" in review_note(message)
        assert button(message, APPROVE_ACTION) is None
        assert button(message, WITHDRAW_ACTION)["value"] == answer.trace.turn_id
        assert message.blocks_of("context_actions") and sources_text(message) == sources

        cached, again = await ask(slack, "  how often should the BEARINGS be greased?")
        hit = cached.answer
        assert hit.outcome is Outcome.CACHED and hit.approved_turn_id == answer.trace.turn_id
        assert "retrieve" not in hit.trace.stages and hit.trace.model_calls == 0
        assert again.body.startswith("✅ Previously approved answer") and again.body.endswith(answer.text)
        today = time.strftime("%Y-%m-%d", time.gmtime())
        assert f"approved by {REVIEWER.lower()} on {today}" in again.body, "who approved it, by name, and when"
        assert sources_text(again) == sources_text(message) and [c.doc_id for c in hit.citations] == \
            [c.doc_id for c in answer.citations]
        assert button(again, WITHDRAW_ACTION)["value"] == answer.trace.turn_id, "reviewers may withdraw it here"
        assert button(again, APPROVE_ACTION) is None

        # A follow-up in a thread is neither served from the cache nor approvable, even the same words.
        parent = again.thread_ts
        follow, follow_message = await ask(slack, QUESTION, thread_ts=parent)
        assert follow.answer.outcome is Outcome.ANSWERED and follow.answer.trace.history_turns == 1
        assert not follow.answer.approvable and button(follow_message, APPROVE_ACTION) is None
        await click(slack, follow_message, APPROVE_ACTION, REVIEWER, value=follow.answer.trace.turn_id)
        assert "can no longer be approved" in fake_slack.ephemerals[-1].text

        fresh, _ = await ask(slack, f"!fresh {QUESTION}")
        assert fresh.answer.outcome is Outcome.ANSWERED, "!fresh bypasses the cache"


async def test_slack_withdrawing_an_approval_answers_the_question_afresh(memory_runtime, fake_slack):
    async with slack_app(memory_runtime, fake_slack, reviewers={TEAM: [REVIEWER]}) as slack:
        first, message = await ask(slack)
        await click(slack, message, APPROVE_ACTION, REVIEWER)
        _, cached = await ask(slack)
        assert slack.turns[-1].answer.outcome is Outcome.CACHED

        await click(slack, cached, WITHDRAW_ACTION, REVIEWER)
        assert f"Approval withdrawn by <@{REVIEWER}>" in review_note(cached)
        assert cached.body.startswith("✅ Previously approved answer"), "the text stays; the note says it is over"
        assert button(cached, APPROVE_ACTION)["value"] == first.answer.trace.turn_id

        after, after_message = await ask(slack)
        assert after.answer.outcome is Outcome.ANSWERED
        assert button(after_message, APPROVE_ACTION)["value"] == after.answer.trace.turn_id

        await click(slack, message, WITHDRAW_ACTION, REVIEWER, value=first.answer.trace.turn_id)
        assert "no approval of this answer to withdraw" in fake_slack.ephemerals[-1].text


async def test_slack_clicks_of_non_reviewers_and_old_buttons_change_nothing(memory_runtime, fake_slack):
    async with slack_app(memory_runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        first, message = await ask(slack)
        blocks_before = json.dumps(message.blocks)
        await click(slack, message, APPROVE_ACTION, "U0ALICE")
        [refusal] = fake_slack.ephemerals
        assert refusal.user == "U0ALICE" and refusal.channel == message.channel
        assert refusal.thread_ts == message.thread_ts and "only kbbot reviewers" in refusal.text
        assert json.dumps(message.blocks) == blocks_before and not fake_slack.calls_to("chat.update")

        # A button of a turn the server does not hold (expired, or made up) approves nothing.
        await click(slack, message, APPROVE_ACTION, REVIEWER, value=uuid4().hex)
        assert "can no longer be approved" in fake_slack.ephemerals[-1].text
        assert fake_slack.ephemerals[-1].user == REVIEWER
        assert json.dumps(message.blocks) == blocks_before

        again, _ = await ask(slack)
        assert again.answer.outcome is Outcome.ANSWERED, "nothing was approved"

        # A reviewer of another workspace is nobody's reviewer here.
        other = SlackSettings(reviewers={"T0OTHER": [REVIEWER]})
        assert not other.is_reviewer(TEAM, REVIEWER) and other.is_reviewer("T0OTHER", REVIEWER)


async def test_slack_without_reviewers_no_approve_button_is_shown(memory_runtime, fake_slack):
    async with slack_app(memory_runtime, fake_slack) as slack:
        first, message = await ask(slack)
    assert first.answer.approvable and message.blocks_of("actions") == []


async def test_slack_a_refresh_that_changed_the_cited_document_makes_the_approved_answer_miss(tmp_path, fake_slack):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "fault-e917.md"
    page.write_text("# Fault E-917\n\nFault E-917 means the cooling fan of the drive is blocked. "
                    "Clean the fan grille and restart the drive.\n", encoding="utf-8")
    settings = memory_settings(tmp_path / "kb")
    runtime = build_runtime(settings)
    assert not runtime.indexer.index([docs]).failed
    question = "What does fault E-917 mean?"
    async with started(settings, tmp_path / "state", runtime), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        first, message = await ask(slack, question)
        assert first.answer.outcome is Outcome.ANSWERED and first.answer.citations
        await click(slack, message, APPROVE_ACTION, REVIEWER)
        hit, _ = await ask(slack, question)
        assert hit.answer.outcome is Outcome.CACHED
        version = runtime.store.knowledge_version

        page.write_text("# Fault E-917\n\nFault E-917 means the drive's cooling fan is blocked or has failed. "
                        "Clean the fan grille; replace the fan if it does not spin.\n", encoding="utf-8")
        report = runtime.indexer.index([docs])
        assert not report.failed and runtime.store.knowledge_version > version

        after, after_message = await ask(slack, question)
        assert after.answer.outcome is Outcome.ANSWERED, "a changed cited document misses the old approval"
        assert "blocked or has failed" in after_message.body
        assert button(after_message, APPROVE_ACTION) is not None, "and the new answer can be approved"
        # Without a re-check (bot/knowledge/loop) the stale approval is kept, unserved, until withdrawn.
        await click(slack, message, WITHDRAW_ACTION, REVIEWER, value=first.answer.trace.turn_id)
        assert f"Approval withdrawn by <@{REVIEWER}>" in review_note(message)


# --- Telegram -----------------------------------------------------------------------------------------
def tg_buttons(message: Any) -> list[str]:
    return [b["callback_data"] for b in message.buttons()]


async def test_telegram_approve_and_withdraw_buttons_for_reviewers_only(memory_runtime, fake_tg):
    async with telegram_bot(memory_runtime, fake_tg, reviewers=[str(TG_REVIEWER)]) as tg:
        reviewer = user(TG_REVIEWER, first_name="Rita")
        await tg.send(message_update(QUESTION, chat_id=TG_USER))
        [plain] = fake_tg.chat(TG_USER)
        turn_of_user = tg.turns[-1].answer.trace.turn_id
        assert tg_buttons(plain) == [f"kbfb:up:{turn_of_user}", f"kbfb:down:{turn_of_user}"], \
            "no approve button in a non-reviewer's chat"

        await tg.send(message_update("How long is the standard warranty?", chat_id=TG_REVIEWER,
                                     from_user=reviewer))
        [mine] = fake_tg.chat(TG_REVIEWER)
        answer = tg.turns[-1].answer
        turn_id = answer.trace.turn_id
        assert answer.outcome is Outcome.ANSWERED and tg_buttons(mine)[-1] == f"kbap:{turn_id}"

        # Anyone else's click (a forged callback) is refused with an alert and changes nothing.
        await tg.send(callback_update(f"kbap:{turn_id}", message=mine, from_user=user(TG_USER)))
        refused = fake_tg.ok_calls("answerCallbackQuery")[-1]
        assert "only kbbot reviewers" in refused.args["text"] and refused.args["show_alert"] == "true"
        assert tg_buttons(mine)[-1] == f"kbap:{turn_id}"
        # An old button (a turn the server does not hold) approves nothing.
        await tg.send(callback_update(f"kbap:{uuid4().hex}", message=mine, from_user=reviewer))
        assert "can no longer be approved" in fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"]

        await tg.send(callback_update(f"kbap:{turn_id}", message=mine, from_user=reviewer))
        assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("✅ Approved")
        assert tg_buttons(mine) == [f"kbfb:up:{turn_id}", f"kbfb:down:{turn_id}", f"kbwd:{turn_id}"]

        await tg.send(message_update("/new", chat_id=TG_USER,
                                     entities=[{"type": "bot_command", "offset": 0, "length": 4}]))
        await tg.send(message_update("how long is the standard warranty?", chat_id=TG_USER))
        cached = tg.turns[-1].answer
        assert cached.outcome is Outcome.CACHED and "retrieve" not in cached.trace.stages
        served = fake_tg.chat(TG_USER)[-1]
        assert served.text.startswith("✅ Previously approved answer") and "Sources" in served.text
        assert "approved by Rita on " in served.text
        for citation in answer.citations:
            assert f"[{citation.index}] {citation.title}" in served.text
        assert not any(b.startswith(("kbap:", "kbwd:")) for b in tg_buttons(served))

        # A follow-up in the reviewer's chat is not served from the cache.
        await tg.send(message_update("How long is the standard warranty?", chat_id=TG_REVIEWER, from_user=reviewer))
        assert tg.turns[-1].answer.outcome is Outcome.ANSWERED
        assert not any(b.startswith("kbap:") for b in tg_buttons(fake_tg.chat(TG_REVIEWER)[-1]))

        await tg.send(callback_update(f"kbwd:{turn_id}", message=mine, from_user=reviewer))
        assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("Approval withdrawn")
        assert tg_buttons(mine)[-1] == f"kbap:{turn_id}"
        await tg.send(message_update("/new", chat_id=TG_USER,
                                     entities=[{"type": "bot_command", "offset": 0, "length": 4}]))
        await tg.send(message_update("How long is the standard warranty?", chat_id=TG_USER))
        assert tg.turns[-1].answer.outcome is Outcome.ANSWERED


def test_reviewer_settings_are_validated(tmp_path: Path):
    assert SlackSettings(reviewers=["U1"]).reviewers == ["U1"]
    assert SlackSettings(reviewers={"T1": ["U1"], "T2": "U2"}).reviewers == {"T1": ["U1"], "T2": ["U2"]}
    assert TelegramSettings(reviewers=[9001]).reviewers == ["9001"]
    config = tmp_path / "kbbot.yaml"
    for section, reviewers, message in (
            ("slack", "{T1: [true]}", "slack.reviewers must be a list of user ids, or a mapping team id -> list of user ids"),
            ("telegram", "[rita]", "telegram.reviewers must be a list of user ids (numbers)")):
        config.write_text(f"{section}:\n  reviewers: {reviewers}\n", encoding="utf-8")
        with pytest.raises(SettingsError, match=re.escape(message)):
            load_settings(config, env={"KBBOT_DATA_DIR": str(tmp_path)})
