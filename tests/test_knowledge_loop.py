"""The knowledge loop against the Slack and Telegram fakes, real Redis and Weaviate: questions kbbot could
not answer are answered once where they were asked when a refresh brings the answer (on every platform:
tests/scenarios; here not for an asker who muted follow-ups, nor for a question still not covered, and a
follow-up the platform refused is posted by the next refresh); the report counts the gaps closed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from adapters.insights import start_follow_ups
from bot.knowledge.insights.report import build_report, format_report
from bot.knowledge.scheduler import KnowledgeAdmin
from bot.state.preferences import PreferenceError, Preferences, apply_command
from bot.types import Outcome
from tests.fakes.telegram_server import message_update
from tests.refresh_helpers import SERVICES_MISSING, isolated_stack
from tests.test_insights import record, turn_log  # noqa: F401 - fixture
from tests.test_prefs import kbbot
from tests.test_refresh import FAULT_V1, GREASE, VIBRATION, WARRANTY
from tests.test_slack import Slack, fake_slack, slack_app, sources_text  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

QUESTION = "What is the part number of the HL-M200 shaft seal kit?"
UNRELATED = "What is the flange diameter of the HL-X9 pump?"
FLANGE = "# HL-X9 pump flange\n\nThe flange diameter of the HL-X9 pump is 180 mm (DN100, PN16).\n"
SEAL = ("# HL-M200 shaft seal kit\n\nThe shaft seal kit of the HL-M200 motor has the part number SK-2040. "
        "Replace the shaft seal every 16,000 operating hours.\n")
DOCS = {"fault.md": FAULT_V1, "warranty.md": WARRANTY, "grease.txt": GREASE, "vibration.md": VIBRATION}
COVERS = "📚 The knowledge base now covers a question asked here on"
ALICE, BOB = "U0ALICE", "U0BOB"


def texts(messages: list) -> list[str]:
    return [m.body if hasattr(m, "body") else m.text for m in messages]


@pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")
async def test_a_refresh_answers_each_gap_once_where_it_was_asked(tmp_path: Path, fake_slack):
    async with isolated_stack(tmp_path, "Loop", DOCS) as stack:
        assert stack.refresher is not None
        await stack.refresher.run("docs")
        runtime = stack.runtime
        async with slack_app(runtime, fake_slack) as slack:
            follow_ups = start_follow_ups(runtime, KnowledgeAdmin(stack.refresher), [slack.adapter])
            assert follow_ups is not None and set(follow_ups.posters) == {"slack"}
            said = await kbbot(slack, "prefs followups off here", BOB)
            assert said.startswith("OK: in this channel I will not come back")

            alice = await slack.send(Slack.mention(QUESTION, user=ALICE))
            bob = await slack.send(Slack.mention(QUESTION, user=BOB))
            other = await slack.send(Slack.mention(UNRELATED, user=ALICE))
            assert [t.answer.outcome for t in slack.turns] == [Outcome.NOT_FOUND] * 3
            before = {"alice": texts(slack.thread(alice["event"])), "bob": texts(slack.thread(bob["event"])),
                      "other": texts(slack.thread(other["event"]))}

            (tmp_path / "docs" / "seal-kit.md").write_text(SEAL, encoding="utf-8")
            record_ = await stack.refresher.run("docs")
            assert record_ is not None and record_.added == 1
            await slack.adapter.settle()

            thread = slack.thread(alice["event"])
            assert len(thread) == len(before["alice"]) + 1, "exactly one follow-up in the asker's thread"
            follow = thread[-1]
            assert follow.body.startswith(COVERS) and QUESTION in follow.body and "SK-2040" in follow.body
            assert "[1] HL-M200 shaft seal kit" in sources_text(follow)
            assert texts(slack.thread(bob["event"])) == before["bob"], "Bob muted follow-ups in this channel"
            assert texts(slack.thread(other["event"])) == before["other"], "still not in the knowledge base"

            # The next refresh changes documents again: nothing is posted a second time.
            (tmp_path / "docs" / "seal-kit.md").write_text(SEAL + "\nThe kit includes two O-rings.\n",
                                                           encoding="utf-8")
            again = await stack.refresher.run("docs")
            assert again is not None and again.changed == 1
            await slack.adapter.settle()
            assert len(slack.thread(alice["event"])) == len(thread)
            assert texts(slack.thread(bob["event"])) == before["bob"]

            # A follow-up in the thread goes on from the answer now shown there.
            await slack.send(Slack.message("And how often should it be replaced?", user=ALICE,
                                           thread_ts=alice["event"]["ts"]))
            assert "16,000" in slack.thread(alice["event"])[-1].body

            now = time.time()
            records = await runtime.turns.log.window(now - 3600, now + 1)
            report = build_report(records, since=now - 3600, until=now + 1)
            assert report["gaps_closed"]["count"] == 1
            assert {g["platform"] for g in report["gaps_closed"]["items"]} == {"slack"}
            assert all("seal-kit.md" in " ".join(g["sources"]) for g in report["gaps_closed"]["items"])
            assert "Gaps closed by a refresh (1):" in format_report(report)

            # A follow-up Slack refuses is given back: the next refresh posts it.
            fake_slack.fail("chat.postMessage", error="not_in_channel")
            (tmp_path / "docs" / "flange.md").write_text(FLANGE, encoding="utf-8")
            await stack.refresher.run("docs")
            unanswered = [t for t in slack.turns if t.inquiry.text == UNRELATED][0].answer
            assert texts(slack.thread(other["event"])) == before["other"]
            assert (await runtime.turns.log.get(unanswered.trace.turn_id)).follow_up is None
            (tmp_path / "docs" / "flange.md").write_text(FLANGE + "\nUse eight M16 bolts.\n", encoding="utf-8")
            await stack.refresher.run("docs")
            assert len(slack.thread(other["event"])) == len(before["other"]) + 1
            assert "180 mm" in slack.thread(other["event"])[-1].body
            assert (await runtime.turns.log.get(unanswered.trace.turn_id)).gap_closed


async def test_a_follow_up_is_claimed_once_whichever_replica_asks(turn_log):  # noqa: F811 - fixture
    gap = record("What is the part number of the seal kit?", outcome="not_found")
    await turn_log.add(gap)
    claims = await asyncio.gather(*[turn_log.claim_follow_up(gap.turn_id, {"state": "posting", "by": n})
                                    for n in range(6)])
    assert claims.count(True) == 1
    assert not await turn_log.claim_follow_up("no-such-turn", {"state": "posting"})
    assert await turn_log.set_follow_up(gap.turn_id, None), "a failed post gives its claim back"
    assert await turn_log.claim_follow_up(gap.turn_id, {"state": "posting"})
    assert await turn_log.set_follow_up(gap.turn_id, {"state": "posted", "at": 1.0, "citations": []})
    kept = await turn_log.get(gap.turn_id)
    assert kept.gap_closed and kept.follow_up["state"] == "posted"
    assert not await turn_log.claim_follow_up(gap.turn_id, {"state": "posting"}), "closed: never posted again"
    assert [r.gap_closed for r in await turn_log.window(0)] == [True]


def test_follow_ups_are_muted_per_user_everywhere_or_per_channel():
    prefs = Preferences()
    assert prefs.wants_follow_ups("C1"), "on unless the asker says otherwise"
    prefs, _ = apply_command(prefs, ["prefs", "followups", "off", "here"], channel="C1")
    assert not prefs.wants_follow_ups("C1") and prefs.wants_follow_ups("C2") and not prefs.is_empty()
    prefs, _ = apply_command(prefs, ["prefs", "followups", "off"], channel="C2")
    assert not prefs.wants_follow_ups("C1") and not prefs.wants_follow_ups("C2")
    prefs, _ = apply_command(prefs, ["prefs", "followups", "on", "here"], channel="C2")
    assert prefs.wants_follow_ups("C2") and not prefs.wants_follow_ups("C3")
    prefs, _ = apply_command(prefs, ["prefs", "followups", "on"], channel="C2")
    assert prefs.wants_follow_ups("C1") and prefs.is_empty()
    with pytest.raises(PreferenceError):
        apply_command(prefs, ["prefs", "followups", "off", "here"])  # where is "here"?
    with pytest.raises(PreferenceError):
        apply_command(prefs, ["prefs", "followups", "sometimes"], channel="C1")


# --- expert replies kept -------------------------------------------------------------------------------
EXPERT_REPLY = "It is SK-2040 <@U0ALICE>; order it from the spare parts desk and replace it every 16,000 hours."
RITA = "U0RITA"


def expert_button(ephemeral, action_id: str) -> dict:
    return next(e for b in ephemeral.blocks if b.get("type") == "actions" for e in b["elements"]
                if e["action_id"] == action_id)


async def expert_click(slack: Slack, ephemeral, action_id: str, user_id: str) -> str:
    """A reviewer's click on a button of the ephemeral note; the text of the ephemeral note it got back."""
    import json
    from urllib.parse import urlencode

    from tests.test_slack import TEAM
    before = len(slack.fake.ephemerals)
    payload = {"type": "block_actions", "token": "legacy", "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
               "team": {"id": TEAM, "domain": "kb"},
               "user": {"id": user_id, "username": user_id.lower(), "name": user_id[2:].lower(), "team_id": TEAM},
               "container": {"type": "message", "message_ts": ephemeral.ts, "channel_id": ephemeral.channel,
                             "is_ephemeral": True, "thread_ts": ephemeral.thread_ts},
               "channel": {"id": ephemeral.channel, "name": "support"},
               "actions": [{"type": "button", "action_id": action_id, "block_id": "kbbot_expert",
                            "value": expert_button(ephemeral, action_id)["value"], "action_ts": f"{time.time():.6f}"}]}
    resp = await slack.post(urlencode({"payload": json.dumps(payload)}), content_type="application/x-www-form-urlencoded")
    assert resp.status == 200
    await slack.adapter.settle()
    [note] = slack.fake.ephemerals[before:]
    assert note.user == user_id
    return note.text


@pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")
async def test_an_expert_reply_is_kept_both_ways_by_a_reviewer_and_cited_on_the_next_ask(tmp_path: Path, fake_slack):
    async with isolated_stack(tmp_path, "Loop", DOCS) as stack:
        assert stack.refresher is not None
        await stack.refresher.run("docs")
        stack.settings.insights.capture_source = "docs"
        runtime = stack.runtime
        async with slack_app(runtime, fake_slack, reviewers=[RITA]) as slack:
            asked = (await slack.send(Slack.mention(QUESTION, user=ALICE)))["event"]
            assert slack.only_turn().answer.outcome is Outcome.NOT_FOUND
            await slack.send(Slack.message(EXPERT_REPLY, user=BOB, thread_ts=asked["ts"]))
            assert len(slack.turns) == 1, "an expert's reply is not a question to answer"
            [note] = fake_slack.ephemerals
            assert note.user == RITA and note.thread_ts == asked["ts"]
            shown = note.blocks[0]["text"]["text"]
            assert "<@U0BOB> replied after kbbot could not answer" in shown and "SK-2040" in shown
            assert "<@U0ALICE>" not in shown, "what the expert wrote pings nobody"
            assert [e["text"]["text"] for e in note.blocks[1]["elements"]] == ["Save as approved answer",
                                                                               "Add to the knowledge base"]
            # Nothing is kept before a reviewer's click: Bob is not one.
            refused = await expert_click(slack, note, "kbbot_expert_approve", BOB)
            assert refused.startswith("Only reviewers")
            carol = (await slack.send(Slack.mention(QUESTION, user="U0CAROL")))["event"]
            assert slack.turns[-1].answer.outcome is Outcome.NOT_FOUND
            assert not (tmp_path / "docs" / "expert-answers").exists()

            saved = await expert_click(slack, note, "kbbot_expert_approve", RITA)
            assert saved.startswith("Saved: “What is the part number")
            dave = (await slack.send(Slack.mention(QUESTION, user="U0DAVE")))["event"]
            cached = slack.turns[-1].answer
            assert cached.outcome is Outcome.CACHED and "Answer by Bob" in cached.text and "SK-2040" in cached.text
            assert "approved by rita" in slack.thread(dave)[-1].body
            assert len(slack.thread(carol)) == 1

            added = await expert_click(slack, note, "kbbot_expert_capture", RITA)
            assert added.startswith("Added to the knowledge base:") and "expert-answers" in added
            assert (await expert_click(slack, note, "kbbot_expert_capture", RITA)).startswith("Already done by rita")
            [doc] = (tmp_path / "docs" / "expert-answers" / "slack-C0SUPPORT").glob("*.md")  # the place it was said in
            text = doc.read_text(encoding="utf-8")
            assert text.startswith(f"# {QUESTION}\n\n{EXPERT_REPLY}") and "Answered by Bob on" in text
            assert f"/C0SUPPORT/thread/C0SUPPORT-{asked['ts']}" in text and "by rita" in text

            run = await stack.refresher.run("docs")  # the source's next refresh indexes it
            assert run is not None and run.added == 1
            # The captured document is the first to name a reader (the channel it was said in), so the channel's
            # approvals are kept under another key from now on; asked again, the answer comes from the document
            # the reply became.
            eve = (await slack.send(Slack.mention(f"!fresh {QUESTION}", user="U0EVE")))["event"]
            answer = slack.turns[-1].answer
            assert answer.outcome is Outcome.ANSWERED and "SK-2040" in answer.text
            assert any("expert-answers" in c.source and c.title == QUESTION for c in answer.citations)
            assert QUESTION in sources_text(slack.thread(eve)[-1])


@pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")
async def test_a_telegram_group_reply_is_offered_to_reviewers_and_kept_as_a_confluence_draft(
        tmp_path: Path, fake_tg, monkeypatch: pytest.MonkeyPatch):  # noqa: F811 - fixture
    from tests.fakes.confluence_server import FakeConfluence
    from tests.fakes.telegram_server import callback_update, user
    from tests.test_confluence import confluence_source
    from tests.test_telegram import GROUP, mention

    monkeypatch.setenv("KBBOT_TEST_CONFLUENCE_TOKEN", "conf-token")
    reviewer = 7009
    with FakeConfluence(cloud=True, user="ops@example.com").run_in_thread() as wiki:
        wiki.add_page("OPS", "HL-K8 alarms", "<p>Alarm A1 means low oil pressure.</p>")
        async with isolated_stack(tmp_path, "Loop", DOCS) as stack:
            assert stack.refresher is not None
            await stack.refresher.run("docs")
            stack.settings.sources = [*stack.settings.sources, confluence_source(wiki, user="ops@example.com")]
            stack.settings.insights.capture_source = "wiki"
            runtime = stack.runtime
            async with telegram_bot(runtime, fake_tg, groups_enabled=True, reviewers=[str(reviewer)]) as tg:
                await tg.send(mention(QUESTION))
                [turn] = tg.turns
                assert turn.answer.outcome is Outcome.NOT_FOUND
                [not_found] = fake_tg.chat(GROUP)
                bot_message = {"message_id": not_found.message_id, "date": int(time.time()), "text": not_found.text,
                               "chat": {"id": GROUP, "type": "supergroup"},
                               "from": {"id": fake_tg.bot_id, "is_bot": True, "first_name": "kbbot"}}
                await tg.send(message_update("It is SK-2040 <b>from the parts desk</b>.", chat_id=GROUP,
                                             chat_type="supergroup", from_user=user(7002, first_name="Bob"),
                                             reply_to=bot_message))
                assert len(tg.turns) == 1 and len(fake_tg.chat(GROUP)) == 1, "a reply to keep, not a question"
                [note] = fake_tg.chat(reviewer)
                assert note.text.startswith("💬 Bob replied after kbbot could not answer") and "SK-2040" in note.text
                data = [b["callback_data"] for b in note.buttons()]
                assert [d.split(":")[0] for d in data] == ["kbxa", "kbxc"]

                await tg.send(callback_update(data[1], message=note, from_user=user(7002, first_name="Bob")))
                assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("Only reviewers")
                assert wiki.drafts == {}
                await tg.send(callback_update(data[1], message=note, from_user=user(reviewer, first_name="Rita")))
                [draft] = wiki.drafts.values()
                assert draft["space"] == "OPS" and draft["title"] == QUESTION and draft["status"] == "draft"
                assert "It is SK-2040 &lt;b&gt;from the parts desk&lt;/b&gt;." in draft["body"], "escaped"
                assert "Answered by Bob" in draft["body"] and "by Rita" in draft["body"]
                assert fake_tg.chat(reviewer)[-1].text.startswith("Added to the knowledge base: http")

                await tg.send(callback_update(data[0], message=note, from_user=user(reviewer, first_name="Rita")))
                assert fake_tg.chat(reviewer)[-1].text.startswith("Saved: “What is the part number")
                # Kept for the group's readers: Carol gets it there, not in her private chat (it was said in
                # the group, whatever the documents' permissions).
                await tg.send(message_update("/new", chat_id=GROUP, chat_type="supergroup",
                                             entities=[{"type": "bot_command", "offset": 0, "length": 4}]))
                await tg.send(mention(QUESTION, from_user=user(7003, first_name="Carol")))
                cached = tg.turns[-1].answer
                assert cached.outcome is Outcome.CACHED and "Answer by Bob" in cached.text
                assert "approved by Rita" in fake_tg.chat(GROUP)[-1].text
                await tg.send(message_update(QUESTION, chat_id=7003, from_user=user(7003, first_name="Carol")))
                assert tg.turns[-1].answer.outcome is Outcome.NOT_FOUND


def test_the_capture_source_must_be_one_kbbot_can_write_to(tmp_path: Path):
    from bot.settings import SettingsError
    from tests.test_insights import settings_with

    (tmp_path / "kb").mkdir()
    sources = (f"sources:\n  - name: kb\n    path: {tmp_path / 'kb'}\n    interval: 1h\n"
               "  - name: site\n    urls: [https://example.com/docs/]\n    interval: 1h\n")
    with pytest.raises(SettingsError, match=r"insights.capture_source.*names no configured source \(sources: kb, site\)"):
        settings_with(tmp_path, sources + "insights:\n  capture_source: wiki\n")
    with pytest.raises(SettingsError, match="insights.capture_source.*cannot write to"):
        settings_with(tmp_path, sources + "insights:\n  capture_source: site\n")
    assert settings_with(tmp_path, sources + "insights:\n  capture_source: kb\n").insights.capture_source == "kb"
    assert settings_with(tmp_path, "").insights.reanswer_days == 14, "on with nothing configured"


@pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")
async def test_a_disliked_answer_opens_its_thread_to_experts_and_is_answered_again_from_new_documents(
        tmp_path: Path, fake_slack):
    import json
    from urllib.parse import urlencode

    from tests.test_slack import TEAM, feedback_values
    warranty_q = "How long is the extended warranty of the HL-M200 motor?"
    update = ("# Warranty update 2027\n\nFrom 2027 the extended warranty of the HL-M200 motor is 72 months "
              "when the motor is registered online within 30 days.\n")
    async with isolated_stack(tmp_path, "Loop", DOCS) as stack:
        assert stack.refresher is not None
        await stack.refresher.run("docs")
        runtime = stack.runtime
        # 👍/👎 as serve keeps them: in Redis and on the turn records.
        async with slack_app(runtime, fake_slack, reviewers=[RITA], feedback=runtime.feedback) as slack:
            start_follow_ups(runtime, KnowledgeAdmin(stack.refresher), [slack.adapter])
            asked = (await slack.send(Slack.mention(warranty_q, user=ALICE)))["event"]
            assert slack.only_turn().answer.outcome is Outcome.ANSWERED
            [answer] = slack.thread(asked)
            payload = {"type": "block_actions", "team": {"id": TEAM}, "user": {"id": ALICE}, "api_app_id": "AKBBOT",
                       "container": {"type": "message", "message_ts": answer.ts, "channel_id": "C0SUPPORT"},
                       "channel": {"id": "C0SUPPORT"}, "trigger_id": "1.2.3",
                       "actions": [{"type": "feedback_buttons", "action_id": "kbbot_feedback", "block_id": "fb",
                                    "value": feedback_values(answer)[1], "action_ts": str(time.time())}]}
            resp = await slack.post(urlencode({"payload": json.dumps(payload)}),
                                    content_type="application/x-www-form-urlencoded")
            assert resp.status == 200
            await slack.adapter.settle()

            await slack.send(Slack.message("It is 72 months since the 2027 price list.", user=BOB,
                                           thread_ts=asked["ts"]))
            assert len(slack.turns) == 1, "after a 👎, another person's reply is kept, not answered"
            [note] = fake_slack.ephemerals
            assert note.user == RITA and "72 months" in note.blocks[0]["text"]["text"]

            (tmp_path / "docs" / "warranty-2027.md").write_text(update, encoding="utf-8")
            await stack.refresher.run("docs")
            thread = slack.thread(asked)
            assert len(thread) == 2 and thread[-1].body.startswith(COVERS) and "72 months" in thread[-1].body
            assert "Warranty update 2027" in sources_text(thread[-1])
