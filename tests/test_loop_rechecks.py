"""The knowledge loop, items 3 and 4: approved answers re-checked after a refresh (Slack buttons,
Telegram inline keyboard), the golden set replayed, and the weekly digest split by owner. On the fake
Slack and Telegram servers, with the real Redis when REDIS_URL is set."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from adapters.server import build_web_app
from adapters.slack.loop import KEEP_ACTION, RETIRE_ACTION
from adapters.slack.text import APPROVE_ACTION
from bot.knowledge.status import format_status
from bot.platform import ReviewerMessages
from bot.runtime import Runtime, build_runtime, status_of
from bot.types import Outcome
from tests.fakes.slack_server import Message
from tests.fakes.telegram_server import callback_update, message_update, user
from tests.refresh_helpers import folder_source
from tests.test_approvals import REVIEWER, TG_REVIEWER, ask, button, click, memory_settings, review_note, started
from tests.test_slack import fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

QUESTION = "What does fault E-917 mean?"
OLD = ("# Fault E-917\n\nFault E-917 means the cooling fan of the drive is blocked. "
       "Clean the fan grille and restart the drive.\n")
NEW = ("# Fault E-917\n\nFault E-917 means the drive's cooling fan is blocked or has failed. "
       "Clean the fan grille; replace the fan if it does not spin.\n")
PUMP = "# Pump P-3\n\nThe pump P-3 impeller is inspected every 2000 operating hours.\n"


@contextlib.asynccontextmanager
async def knowledge(tmp_path: Path, **golden: str) -> AsyncIterator[tuple[Runtime, Path]]:
    """A started runtime on a folder source ``docs`` (fault-e917.md, pump-p3.md), indexed by a refresh."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fault-e917.md").write_text(OLD, encoding="utf-8")
    (docs / "pump-p3.md").write_text(PUMP, encoding="utf-8")
    settings = memory_settings(tmp_path / "kb")
    settings.sources = [folder_source("docs", docs)]
    settings.approvals.golden_file = str(tmp_path / "golden.yaml")
    for name, text in golden.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    runtime = build_runtime(settings)
    async with started(settings, tmp_path / "state", runtime):
        record = await runtime.refresher().run("docs")
        assert record.ok and record.added == 2
        yield runtime, docs


def section_text(message: Message) -> str:
    return "\n".join(b["text"]["text"] for b in message.blocks_of("section"))


def rechecking(runtime: Runtime, adapter: Any) -> Any:
    """A refresher whose runs re-check approvals and replay the golden set, telling the reviewers through
    ``adapter``, as ``kbbot serve`` sets it up."""
    refresher = runtime.refresher()
    refresher.after_change.append(runtime.knowledge_loop(ReviewerMessages([adapter])).after_refresh)
    return refresher


async def approve_then_change(slack: Any, runtime: Runtime, docs: Path) -> tuple[Any, Message, Any]:
    """The question approved by REVIEWER, then a refresh that changed its source: (first turn, the
    re-check posted to the reviewer, the refresh's record)."""
    refresher = rechecking(runtime, slack.adapter)
    first, message = await ask(slack, QUESTION)
    assert first.answer.outcome is Outcome.ANSWERED and "blocked" in first.answer.text
    await click(slack, message, APPROVE_ACTION, REVIEWER)
    assert (await ask(slack, QUESTION))[0].answer.outcome is Outcome.CACHED
    (docs / "fault-e917.md").write_text(NEW, encoding="utf-8")
    record = await refresher.run("docs")
    assert record.ok and record.changed == 1
    [recheck] = [m for m in slack.fake.messages.values() if m.channel == REVIEWER]
    return first, recheck, record


async def test_slack_a_changed_source_sends_the_approval_to_its_reviewer_and_keep_approves_the_new_answer(
        tmp_path, fake_slack):
    async with knowledge(tmp_path) as (runtime, docs), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        first, recheck, record = await approve_then_change(slack, runtime, docs)
        turn_id = first.answer.trace.turn_id
        assert button(recheck, KEEP_ACTION)["value"] == turn_id and button(recheck, RETIRE_ACTION)["value"] == turn_id
        shown = section_text(recheck)
        assert QUESTION in shown and "cooling fan of the drive is blocked" in shown, "the old answer"
        assert "blocked or has failed" in shown, "and the new one"
        assert f"version {record.knowledge_version}" in shown

        # Until a reviewer decides, the old approved answer is not served.
        meanwhile, shown_meanwhile = await ask(slack, QUESTION)
        assert meanwhile.answer.outcome is Outcome.ANSWERED
        assert not shown_meanwhile.body.startswith("✅ Previously approved answer")

        await click(slack, recheck, KEEP_ACTION, "U0ALICE")  # not a reviewer: refused, nothing changes
        assert "only kbbot reviewers" in fake_slack.ephemerals[-1].text
        assert (await ask(slack, QUESTION))[0].answer.outcome is Outcome.ANSWERED

        await click(slack, recheck, KEEP_ACTION, REVIEWER)
        assert f"Kept approved by <@{REVIEWER}>" in review_note(recheck)
        assert button(recheck, KEEP_ACTION) is None and button(recheck, RETIRE_ACTION) is None
        hit, served = await ask(slack, QUESTION)
        assert hit.answer.outcome is Outcome.CACHED and hit.answer.approved_turn_id == turn_id
        assert "blocked or has failed" in served.body and "Previously approved answer" in served.body
        assert all(runtime.store.is_current(c.doc_id, c.version) for c in hit.answer.citations)
        [entry] = await runtime.approved.entries()
        assert entry.knowledge_version == record.knowledge_version and entry.held is None

        await click(slack, recheck, RETIRE_ACTION, REVIEWER, value=turn_id)  # decided already
        assert "Nothing waits for a decision" in fake_slack.ephemerals[-1].text


async def test_slack_retire_removes_the_approval(tmp_path, fake_slack):
    async with knowledge(tmp_path) as (runtime, docs), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        first, recheck, _ = await approve_then_change(slack, runtime, docs)
        await click(slack, recheck, RETIRE_ACTION, REVIEWER)
        assert f"Retired by <@{REVIEWER}>" in review_note(recheck)
        assert await runtime.approved.entries() == []
        after, _ = await ask(slack, QUESTION)
        assert after.answer.outcome is Outcome.ANSWERED and "blocked or has failed" in after.answer.text
        # A refresh that changes nothing the approval cites does not ask anyone.
        assert len([m for m in fake_slack.messages.values() if m.channel == REVIEWER]) == 1


async def test_slack_unchanged_sources_keep_serving_the_approval_across_a_refresh(tmp_path, fake_slack):
    async with knowledge(tmp_path) as (runtime, docs), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        refresher = rechecking(runtime, slack.adapter)
        _, message = await ask(slack, QUESTION)
        await click(slack, message, APPROVE_ACTION, REVIEWER)
        (docs / "valve-v9.md").write_text("# Valve V-9\n\nValve V-9 is replaced every 5 years.\n", encoding="utf-8")
        record = await refresher.run("docs")
        assert record.added == 1 and record.changed == 0
        hit, _ = await ask(slack, QUESTION)
        assert hit.answer.outcome is Outcome.CACHED, "a new document retires nothing the approval cites"
        assert not [m for m in fake_slack.messages.values() if m.channel == REVIEWER]


async def approved_on_telegram(tg: Any, fake_tg: Any) -> tuple[Any, str]:
    """The reviewer Rita asks in her private chat and approves the answer: (Rita, the turn id)."""
    reviewer = user(TG_REVIEWER, first_name="Rita")
    await tg.send(message_update(QUESTION, chat_id=TG_REVIEWER, from_user=reviewer))
    [answer_message] = fake_tg.chat(TG_REVIEWER)
    turn_id = tg.turns[-1].answer.trace.turn_id
    await tg.send(callback_update(f"kbap:{turn_id}", message=answer_message, from_user=reviewer))
    assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("✅ Approved")
    return reviewer, turn_id


async def test_telegram_the_reviewer_gets_an_inline_keyboard_and_keep_serves_the_new_answer(tmp_path, fake_tg):
    async with knowledge(tmp_path) as (runtime, docs), \
            telegram_bot(runtime, fake_tg, reviewers=[str(TG_REVIEWER)]) as tg:
        refresher = rechecking(runtime, tg.adapter)
        reviewer, turn_id = await approved_on_telegram(tg, fake_tg)

        (docs / "fault-e917.md").write_text(NEW, encoding="utf-8")
        record = await refresher.run("docs")
        recheck = fake_tg.chat(TG_REVIEWER)[-1]
        assert [b["callback_data"] for b in recheck.buttons()] == [f"kbkp:{turn_id}", f"kbrt:{turn_id}"]
        assert "cooling fan of the drive is blocked" in recheck.text and "blocked or has failed" in recheck.text
        assert "approved by Rita" not in recheck.text and "(by Rita)" in recheck.text

        await tg.send(message_update("/new", chat_id=7001, entities=[{"type": "bot_command", "offset": 0,
                                                                       "length": 4}]))
        await tg.send(message_update(QUESTION, chat_id=7001))
        assert tg.turns[-1].answer.outcome is Outcome.ANSWERED, "held: not served as approved"

        await tg.send(callback_update(f"kbkp:{turn_id}", message=recheck, from_user=user(7001)))
        assert "only kbbot reviewers" in fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"]
        await tg.send(callback_update(f"kbkp:{turn_id}", message=recheck, from_user=reviewer))
        assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("✅ Kept approved")
        assert recheck.buttons() == []
        await tg.send(message_update("/new", chat_id=7001, entities=[{"type": "bot_command", "offset": 0,
                                                                       "length": 4}]))
        await tg.send(message_update(QUESTION, chat_id=7001))
        cached = tg.turns[-1].answer
        assert cached.outcome is Outcome.CACHED and "blocked or has failed" in cached.text
        [entry] = await runtime.approved.entries()
        assert entry.knowledge_version == record.knowledge_version


async def test_telegram_retire(tmp_path, fake_tg):
    async with knowledge(tmp_path) as (runtime, docs), \
            telegram_bot(runtime, fake_tg, reviewers=[str(TG_REVIEWER)]) as tg:
        refresher = rechecking(runtime, tg.adapter)
        reviewer, turn_id = await approved_on_telegram(tg, fake_tg)
        (docs / "fault-e917.md").unlink()
        await refresher.run("docs")
        recheck = fake_tg.chat(TG_REVIEWER)[-1]
        assert "no longer answers it" in recheck.text, "a removed source: the new answer cannot be kept"
        assert [b["callback_data"] for b in recheck.buttons()] == [f"kbrt:{turn_id}"]
        await tg.send(callback_update(f"kbrt:{turn_id}", message=recheck, from_user=reviewer))
        assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("🗑 Retired")
        assert await runtime.approved.entries() == []


# --- the golden set ------------------------------------------------------------------------------------
GOLDEN = """\
- question: What does fault E-917 mean?
  cite: fault-e917.md
  words: [cooling fan]
- question: How often is the pump P-3 impeller inspected?
  cite: pump-p3.md
"""


async def test_the_golden_replay_fails_when_a_source_is_removed_and_status_healthz_and_reviewers_say_so(
        tmp_path, fake_slack):
    token = "admin-token-0123456789"
    async with knowledge(tmp_path, **{"golden.yaml": GOLDEN}) as (runtime, docs), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        runtime.settings.insights.admin_token = SecretStr(token)
        loop = runtime.knowledge_loop(ReviewerMessages([slack.adapter]))
        refresher = runtime.refresher()
        refresher.after_change.append(loop.after_refresh)
        passed = await loop.replay_golden(runtime.store.knowledge_version)
        assert (passed.passed, passed.failed) == (2, 0), passed.failures
        assert not [m for m in fake_slack.messages.values() if m.channel == REVIEWER], "a pass bothers nobody"

        (docs / "pump-p3.md").unlink()
        record = await refresher.run("docs")
        assert record.removed == 1

        # kbbot status (its own connections, as the command runs) shows the last replay.
        text = format_status(await status_of(runtime.settings))
        assert "Golden set: replayed" in text and "1 passed, 1 failed" in text
        assert "failed: How often is the pump P-3 impeller inspected?: " in text

        # /healthz's detail, for admins only.
        app = build_web_app([], runtime)
        async with TestClient(TestServer(app)) as client:
            public = await (await client.get("/healthz")).json()
            assert "detail" not in public
            refused = await client.get("/healthz?detail=1")
            assert refused.status == 401
            wrong = await client.get("/healthz?detail=1", headers={"Authorization": "Bearer nope"})
            assert wrong.status == 401
            body = await (await client.get("/healthz?detail=1", headers={"Authorization": f"Bearer {token}"})).json()
        golden = body["detail"]["golden"]
        assert (golden["passed"], golden["failed"]) == (1, 1)
        assert golden["knowledge_version"] == record.knowledge_version
        assert golden["failures"][0]["question"] == "How often is the pump P-3 impeller inspected?"

        # The reviewers were told (no reviewers channel: each Slack reviewer directly).
        [told] = [m for m in fake_slack.messages.values() if m.channel == REVIEWER]
        assert "golden set fails" in told.text and "pump P-3" in told.text


def test_a_golden_file_with_mistakes_is_refused_with_where_and_why(tmp_path):
    from bot.knowledge.loop.golden import GoldenError, load_golden

    assert load_golden(tmp_path / "absent.yaml") == []
    bad = tmp_path / "golden.yaml"
    for text, problem in (("question: x", "must be a list"), ("- cite: a.md", "case 1: needs a question"),
                          ("- question: q", "needs cite"), ("- question: q\n  cite: a\n  colour: red", "unknown key"),
                          ("- question: q\n  words: {a: 1}", "words must be a list")):
        bad.write_text(text, encoding="utf-8")
        try:
            load_golden(bad)
        except GoldenError as exc:
            assert problem in str(exc) and str(bad) in str(exc)
        else:
            raise AssertionError(f"accepted {text!r}")


# --- gaps to their owners ---------------------------------------------------------------------------
async def test_the_weekly_digest_sends_each_owner_their_gaps_and_keeps_the_rest(tmp_path, fake_slack, fake_tg):
    import time
    import uuid

    from adapters.insights import digest_poster, make_digest
    from adapters.slack.platform import SlackAdapter
    from adapters.slack.settings import SlackSettings
    from adapters.telegram.platform import TelegramAdapter
    from adapters.telegram.settings import TelegramSettings
    from bot.state.turn_log.records import TurnRecord, ranked_chunks
    from pipelines.query import retrieval_inputs

    docs = tmp_path / "docs"
    for folder, name, text in (("drives", "fault-e917.md", OLD), ("pumps", "pump-p3.md", PUMP),
                               ("misc", "valve-v9.md", "# Valve V-9\n\nValve V-9 has a red handle lever.\n")):
        (docs / folder).mkdir(parents=True)
        (docs / folder / name).write_text(text, encoding="utf-8")
    settings = memory_settings(tmp_path / "kb")
    settings.sources = [folder_source("docs", docs, owners={"drives/": ["U0OLD"], "drives/fault": ["U0OWNER"],
                                                            "./pumps/": ["7002"], "pumps/old/": ["U0PUMPS"]})]
    settings.slack.digest_to = "C0ADMINS"
    runtime = build_runtime(settings)
    async with started(settings, tmp_path / "state", runtime):
        assert (await runtime.refresher().run("docs")).added == 3
        retrieval = runtime.retrieval_pipeline()
        gaps = {"Which torque do the E-917 fan grille screws need?": "fault-e917.md",
                "What seal kit fits the P-3 pump impeller?": "pump-p3.md",
                "Who makes the valve V-9 handle lever?": "valve-v9.md"}
        for question, nearest in gaps.items():
            ranked = ranked_chunks(retrieval.run(retrieval_inputs(question))["rank"]["documents"])
            assert ranked[0]["source"].endswith(nearest), (question, ranked[0])
            for _ in range(2):  # asked twice: one group
                await runtime.turns.log.add(TurnRecord(
                    turn_id=uuid.uuid4().hex, at=time.time() - 3600, platform="slack", tenant="T1", channel="C1",
                    thread_key="slack:T1:C1:1", user="U1", question=question, outcome="not_found",
                    answer="not found", ranked=ranked))

        slack = SlackAdapter(None, SlackSettings(bot_token=fake_slack.token, signing_secret="s" * 32,
                                                 api_url=fake_slack.base_url), digest_to=settings.slack.digest_to)
        telegram = TelegramAdapter(None, TelegramSettings(token=fake_tg.token, api_url=fake_tg.base_url),
                                   digest_to=settings.telegram.digest_to)
        try:
            digest = make_digest(runtime, [slack, telegram], digest_poster([slack, telegram], settings))
            text = await digest.send()
        finally:
            await telegram.bot.session.close()

    [owner_dm] = [m for m in fake_slack.messages.values() if m.channel == "U0OWNER"]
    assert "Which torque do the E-917 fan grille screws need? — asked 2×" in owner_dm.text
    assert "fault-e917.md" in owner_dm.text and "cooling fan of the drive is blocked" in owner_dm.text, \
        "with the passage that came closest"
    assert "seal kit" not in owner_dm.text and "handle lever?" not in owner_dm.text, "only their gaps"
    [pump_owner] = fake_tg.chat(7002)
    assert "What seal kit fits the P-3 pump impeller?" in pump_owner.text and "2000 operating hours" in pump_owner.text
    assert not [m for m in fake_slack.messages.values() if m.channel in ("U0PUMPS", "U0OLD")], \
        "the longest matching prefix wins"
    [admins] = [m for m in fake_slack.messages.values() if m.channel == "C0ADMINS"]
    assert admins.text == text
    assert "Who makes the valve V-9 handle lever?" in text, "a gap nobody owns stays in the digest"
    assert "E-917 fan grille" not in text and "seal kit" not in text
    assert "2 more groups went to the owners of their nearest documents" in text


# --- the whole loop in kbbot serve, against the fake Slack ---------------------------------------------
async def wait_for(condition: Any, what: str, seconds: float = 60.0) -> Any:
    import asyncio
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := condition():
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_kbbot_serve_rechecks_an_approval_after_an_admins_refresh_and_replays_the_golden_set(
        tmp_path, fake_slack, monkeypatch):
    """``kbbot serve`` as deployed (its web app, scheduler and refresher) with the fake Slack: a reviewer
    approves, an admin's ``/kbbot refresh docs`` changes the cited page, the reviewer gets the re-check
    and keeps it, the next asker gets the new approved answer; the golden set's failure reaches the
    reviewer and ``/kbbot status``. Prints the transcript (``pytest -s``)."""
    import asyncio
    from urllib.parse import urlencode

    import aiohttp

    from adapters.server import serve
    from tests.test_admin_commands import slash
    from tests.test_slack import SECRET, TEAM, Slack, new_ts

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fault-e917.md").write_text(OLD, encoding="utf-8")
    (docs / "pump-p3.md").write_text(PUMP, encoding="utf-8")
    (tmp_path / "golden.yaml").write_text("- question: What does fault E-917 mean?\n  words: [cooling fan]\n"
                                          "- question: What does fault E-917 mean?\n  words: [spins at 400 rpm]\n",
                                          encoding="utf-8")
    for name, value in {"SLACK_BOT_TOKEN": fake_slack.token, "SLACK_SIGNING_SECRET": SECRET,
                        "SLACK_API_URL": fake_slack.base_url}.items():
        monkeypatch.setenv(name, value)
    settings = memory_settings(tmp_path / "kb", SLACK_BOT_TOKEN=fake_slack.token, SLACK_SIGNING_SECRET=SECRET,
                               SLACK_API_URL=fake_slack.base_url)
    settings.sources = [folder_source("docs", docs, interval="24h")]
    settings.approvals.golden_file = str(tmp_path / "golden.yaml")
    settings.slack.reviewers = [REVIEWER]
    settings.slack.admins = ["U0ADMIN"]
    settings.slack.stream_interval_s = settings.slack.edit_interval_s = 0.2
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path / "state"
    stop = asyncio.Event()
    ports: list[int] = []
    transcript: list[str] = []
    server = asyncio.create_task(serve(runtime, env={}, host="127.0.0.1", port=0, stop=stop, drain_s=10,
                                       on_listening=ports.append))
    try:
        await wait_for(lambda: ports or server.done(), "kbbot serve to listen")
        assert ports, server
        async with aiohttp.ClientSession() as session:
            slack = Slack(fake_slack, None, f"http://127.0.0.1:{ports[0]}", session, [])  # type: ignore[arg-type]
            await wait_for(lambda: runtime.store.knowledge_version >= 1, "the scheduled first refresh")

            async def mention(text: str, user: str = "U0ALICE") -> Message:
                event = await slack.send(slack.mention(text, user=user), settle=False)
                ts = event["event"]["ts"]
                return await wait_for(lambda: [m for m in fake_slack.thread("C0SUPPORT", ts)
                                               if not m.streaming and m.blocks], f"the answer to {text!r}")

            async def press(message: Message, action_id: str, user: str) -> None:
                before = len(fake_slack.calls)
                found = button(message, action_id)
                payload = {"type": "block_actions", "token": "legacy", "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
                           "team": {"id": TEAM, "domain": "kb"},
                           "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": TEAM},
                           "container": {"type": "message", "message_ts": message.ts, "channel_id": message.channel,
                                         "is_ephemeral": False, "thread_ts": message.thread_ts},
                           "channel": {"id": message.channel, "name": "x"},
                           "message": {"type": "message", "ts": message.ts, "thread_ts": message.thread_ts,
                                       "text": message.text or message.body, "blocks": message.blocks},
                           "response_url": fake_slack.response_url(f"click-{new_ts()}"),
                           "actions": [{"type": "button", "action_id": action_id, "block_id": "b",
                                        "value": found["value"], "action_ts": "1"}]}
                resp = await slack.post(urlencode({"payload": json.dumps(payload)}),
                                        content_type="application/x-www-form-urlencoded")
                assert resp.status == 200
                await wait_for(lambda: any(c.method in ("chat.update", "chat.postEphemeral")
                                           for c in fake_slack.calls[before:]), f"the effect of {action_id}")

            [answer] = await mention(QUESTION)
            transcript.append(f"U0ALICE: @kbbot {QUESTION}\nkbbot: {answer.body}")
            await press(answer, APPROVE_ACTION, REVIEWER)
            transcript.append(f"{REVIEWER} clicks ✅ Approve -> {review_note(answer)}")
            [cached] = await mention(QUESTION, user="U0BOB")
            assert cached.body.startswith("✅ Previously approved answer")

            (docs / "fault-e917.md").write_text(NEW, encoding="utf-8")
            status, _ = await slash(slack, "refresh docs", "U0ADMIN", "refresh")
            assert status == 200
            [result] = await wait_for(lambda: fake_slack.responses.get("refresh"), "the refresh result")
            transcript.append(f"U0ADMIN: /kbbot refresh docs\nkbbot: {result['text']}")
            recheck = await wait_for(lambda: next((m for m in fake_slack.messages.values()
                                                   if m.channel == REVIEWER and m.blocks), None),
                                     "the re-check to reach the reviewer")
            transcript.append(f"kbbot -> {REVIEWER} (DM):\n{section_text(recheck)}\n"
                              f"[{button(recheck, KEEP_ACTION)['text']['text']}] "
                              f"[{button(recheck, RETIRE_ACTION)['text']['text']}]")
            told = await wait_for(lambda: next((m for m in fake_slack.messages.values()
                                                if m.channel == REVIEWER and "golden set fails" in (m.text or "")),
                                               None), "the golden failure to reach the reviewer")
            transcript.append(f"kbbot -> {REVIEWER} (DM):\n{told.text}")
            assert "1 passed, 1 failed" in told.text and "spins at 400 rpm" in told.text

            [meanwhile] = await mention(QUESTION, user="U0CAROL")
            assert not meanwhile.body.startswith("✅ Previously approved answer"), "held: not served"
            await press(recheck, KEEP_ACTION, REVIEWER)
            transcript.append(f"{REVIEWER} clicks Keep approved -> {review_note(recheck)}")
            [kept] = await mention(QUESTION, user="U0DAVE")
            assert kept.body.startswith("✅ Previously approved answer") and "blocked or has failed" in kept.body
            transcript.append(f"U0DAVE: @kbbot {QUESTION}\nkbbot: {kept.body}")

            status, _ = await slash(slack, "status", "U0ADMIN", "status")
            [shown] = await wait_for(lambda: fake_slack.responses.get("status"), "the status")
            assert "Golden set: replayed" in shown["text"] and "1 passed, 1 failed" in shown["text"]
            transcript.append(f"U0ADMIN: /kbbot status\nkbbot: {shown['text']}")
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)
    print("\n\n".join(transcript))


def test_owners_of_web_pages_by_the_longest_url_prefix_and_bad_owner_ids_refused(tmp_path):
    import pytest
    from pydantic import ValidationError

    from bot.knowledge.loop.owners import owners_resolver
    from tests.refresh_helpers import url_source

    web = url_source("site", ["https://docs.example.com/sitemap.xml"],
                     owners={"https://docs.example.com/": ["U0DOCS"], "https://docs.example.com/motors/": ["555"]})
    folder = folder_source("kb", tmp_path, owners={"https://docs.example.com/pumps/": ["U0NOT"]})
    owners_of = owners_resolver([web, folder], lambda p: Path(p))
    assert owners_of({"source": "https://docs.example.com/motors/m1.html", "doc_id": "x"}) == ["555"]
    assert owners_of({"source": "https://docs.example.com/pumps/p.html", "doc_id": "y"}) == ["U0DOCS"], \
        "a folder's owners: are paths inside it, never URLs"
    assert owners_of({"source": "https://other.example.com/", "doc_id": "z"}) == []
    with pytest.raises(ValidationError, match="neither a Slack user id"):
        folder_source("kb", tmp_path, owners={"drives/": ["@jane"]})
