"""Who may do what (issue 15, findings 7 and 8): slash commands, feedback and review clicks honour
``slack.allowed_teams`` / ``telegram.allowed_users`` as questions do; a Telegram feedback click must name
a turn on a button of the message it came from; a space setting that would open every space is refused.
Through the real bolt and aiogram stacks against the Slack and Telegram fakes."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest

from adapters.slack.settings import SlackSettings
from adapters.telegram.settings import TelegramSettings
from bot.settings import SettingsError
from bot.types import Inquiry, Outcome
from pipelines.store import space_filter
from tests.conftest import REPO
from tests.fakes.telegram_server import callback_update, message_update, user
from tests.replies import RecordingReply
from tests.test_admin_commands import ack_text, slash
from tests.test_slack import TEAM, feedback_values, slack_app
from tests.test_telegram import telegram_bot

pytest_plugins = ["tests.test_slack", "tests.test_telegram"]  # the fake_slack and fake_tg fixtures


def feedback_payload(message, value: str, team: str) -> str:
    payload = {"type": "block_actions", "team": {"id": team}, "user": {"id": "U0MALLORY", "team_id": team},
               "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
               "container": {"type": "message", "message_ts": message.ts, "channel_id": "C0SUPPORT"},
               "channel": {"id": "C0SUPPORT"},
               "actions": [{"type": "feedback_buttons", "action_id": "kbbot_feedback", "block_id": "fb",
                            "value": value, "action_ts": str(time.time())}]}
    return urlencode({"payload": json.dumps(payload)})


async def test_slack_commands_and_clicks_from_a_workspace_not_allowed_are_refused(kb_runtime, fake_slack):
    async with slack_app(kb_runtime, fake_slack, allowed_teams=[TEAM]) as slack:
        mention = (await slack.send(slack.mention()))["event"]
        [message] = slack.thread(mention)
        value = feedback_values(message)[1]
        for team, stored in (("T0OTHER", 0), (TEAM, 1)):
            resp = await slack.post(feedback_payload(message, value, team),
                                    content_type="application/x-www-form-urlencoded")
            assert resp.status == 200
            await slack.adapter.settle()
            assert len(slack.adapter.conversations.kept.feedback.items) == stored  # type: ignore[attr-defined]
        slack.adapter.settings.allowed_teams = ["T0ELSEWHERE"]
        status, body = await slash(slack, "prefs concise", "U0ALICE", "prefs")
        assert status == 200 and ack_text(body) == "Sorry, kbbot does not answer in this workspace."
        prefs = await kb_runtime.preferences.load("slack", TEAM, "U0ALICE")
        assert prefs.effective() == {}, "a refused command changed nothing"


async def test_telegram_clicks_from_users_not_allowed_and_invented_turn_ids_are_not_stored(kb_runtime, fake_tg):
    async with telegram_bot(kb_runtime, fake_tg, allowed_users=["7001"]) as tg:
        await tg.send(message_update("How often should the bearings be greased?", from_user=user(7001)))
        [message] = [m for m in fake_tg.chat(7001) if m.buttons()]
        turn_id = tg.turns[0].answer.trace.turn_id
        stored = tg.adapter.conversations.kept.feedback.items  # type: ignore[attr-defined]
        await tg.send(callback_update(f"kbfb:down:{turn_id}", message=message, from_user=user(7666)))
        assert stored == [], "a user outside telegram.allowed_users"
        for forged in ("kbfb:up:" + "x" * 40, "kbfb:up:" + "0" * 32, "kbfb:up:../../etc"):
            await tg.send(callback_update(forged, message=message, from_user=user(7001)))
        assert stored == [], "turn ids on no button of the message are never stored"
        await tg.send(callback_update(f"kbfb:up:{turn_id}", message=message, from_user=user(7001)))
    assert [(f.turn_id, f.rating) for f in stored] == [(turn_id, "up")]


@pytest.mark.parametrize("section, name, value", [
    ("slack", "default_spaces", []), ("slack", "default_spaces", "manuals"),
    ("telegram", "default_spaces", []), ("telegram", "chat_spaces", {"42": "drives"}),
    ("slack", "channel_spaces", {"C1": []}),
])
def test_space_settings_that_would_open_every_space_are_refused(tmp_path, section, name, value):
    import yaml

    raw = yaml.safe_load((REPO / "config" / "kbbot.yaml").read_text())
    raw.setdefault(section, {})[name] = value
    path = tmp_path / "kbbot.yaml"
    path.write_text(yaml.safe_dump(raw))
    for relative in ("prompts", "topics.yaml"):
        source = REPO / "config" / relative
        (tmp_path / relative).symlink_to(source, target_is_directory=source.is_dir())
    with pytest.raises(SettingsError, match=rf"{section}\.{name}.* must be a non-empty list of knowledge space names"):
        _load(path, tmp_path)


def _load(path, tmp_path):
    from adapters.platforms import load_settings

    return load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path / "data")})


def test_the_defaults_are_valid_and_spaces_resolve_to_lists():
    assert SlackSettings().problems() == [] and TelegramSettings().problems() == []
    assert SlackSettings(channel_spaces={"C1": ["drives"]}).spaces_for("C1") == ("drives",)


def test_no_space_is_an_error_not_every_space():
    with pytest.raises(ValueError, match="non-empty list"):
        space_filter([])
    with pytest.raises(ValueError, match="non-empty list"):
        space_filter("manuals")  # type: ignore[arg-type]
    assert space_filter(["default"]) == {"field": "meta.space", "operator": "in", "value": ["default"]}


async def test_a_turn_without_a_space_is_refused_not_answered_from_every_space(kb_runtime):
    inquiry = Inquiry("slack", "T1", "C1", "slack:T1:C1:1", "u1", "How often should the bearings be greased?",
                      spaces=())
    reply = RecordingReply()
    answer = await kb_runtime.answerer.answer(inquiry, reply)
    assert answer.outcome is Outcome.ERROR and reply.failure and not reply.deltas
