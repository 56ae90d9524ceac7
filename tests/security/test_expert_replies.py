"""Expert replies (issue 39, items 7, 8 and 13) on the fake Slack and Telegram servers, with the embedded
state and with Redis (skipped without REDIS_URL):

- 7: reviewers see exactly the text that would be kept (links filtered), a reply too long to show whole is
  refused with a clear message, and an approved reply (no citations) stops being served after
  ``approvals.uncited_days``;
- 8: in a Telegram group only a reply to kbbot's not-found message is an expert's reply, and the thread is
  open to one such reply, on Telegram and on Slack;
- 13: a reply said in a private channel is served only where that place's readers are, and added to the
  knowledge base it is readable by that place only (never public).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from adapters.platforms import Settings
from adapters.slack.directory import SlackDirectory
from bot.runtime import Runtime
from bot.types import Outcome
from tests.fakes.telegram_server import message_update, user
from tests.refresh_helpers import folder_source
from tests.security.loop_world import folder_runtime, state  # noqa: F401 - fixture
from tests.test_knowledge_loop import expert_click
from tests.test_refresh import FAULT_V1, GREASE, VIBRATION, WARRANTY
from tests.test_slack import Slack, fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import GROUP, fake_tg, mention, telegram_bot  # noqa: F401 - fixture

QUESTION = "What is the part number of the HL-M200 shaft seal kit?"
DOCS = {"fault.md": FAULT_V1, "warranty.md": WARRANTY, "grease.txt": GREASE, "vibration.md": VIBRATION}
ALICE, BOB, DAVE, RITA = "U0ALICE", "U0BOB", "U0DAVE", "U0RITA"
TG_RITA = 9101


def knowledge(state: str, tmp_path: Path) -> contextlib.AbstractAsyncContextManager[tuple[Runtime, Path]]:
    """A started runtime (extractive answers, embedded store) on a folder source ``docs`` that is also
    where "Add to the knowledge base" writes; its state in memory or in Redis."""

    def configure(settings: Settings, docs: Path) -> None:
        settings.sources = [folder_source("docs", docs)]
        settings.insights.capture_source = "docs"
        settings.permissions.cache_s = 0

    return folder_runtime(state, tmp_path, DOCS, configure)


def note_text(ephemeral: Any) -> str:
    return "\n".join(b["text"]["text"] for b in ephemeral.blocks if b.get("type") == "section")


def notes_to(fake: Any, reviewer: str) -> list[Any]:
    return [e for e in fake.ephemerals if e.user == reviewer and e.blocks
            and any(b.get("block_id") == "kbbot_expert" for b in e.blocks)]


# --- item 7: the hidden tail --------------------------------------------------------------------------
FILLER = " ".join(f"Step {i}: check the seal seat for wear and clean it." for i in range(1, 31))  # ~1,600 chars
TAIL = "Order kit SK-2040 from [the parts desk](https://evil.example/pay) today."


async def test_reviewers_see_exactly_what_is_kept_and_links_are_not(state, tmp_path, fake_slack):
    async with knowledge(state, tmp_path) as (runtime, _), \
            slack_app(runtime, fake_slack, reviewers=[RITA]) as slack:
        asked = (await slack.send(Slack.mention(QUESTION, user=ALICE)))["event"]
        assert slack.only_turn().answer.outcome is Outcome.NOT_FOUND
        reply = f"{FILLER} {TAIL}"
        assert 1500 < len(reply) < 3000
        await slack.send(Slack.message(reply, user=BOB, thread_ts=asked["ts"]))
        [note] = notes_to(fake_slack, RITA)
        shown = note_text(note)
        # The whole reply is shown, its end too; the link it hid there is not kept, so not shown either.
        assert "Step 30" in shown and "today." in shown and "the parts desk" in shown
        assert "evil.example" not in shown

        assert (await expert_click(slack, note, "kbbot_expert_approve", RITA)).startswith("Saved:")
        dave = (await slack.send(Slack.mention(QUESTION, user=DAVE)))["event"]
        served = slack.turns[-1].answer
        assert served.outcome is Outcome.CACHED and "today." in served.text
        assert "evil.example" not in served.text and "evil.example" not in slack.thread(dave)[-1].body

        # Approved replies cite nothing, so no refresh ever retires them: they expire instead.
        runtime.answerer.approvals.uncited_s = 0.0
        await slack.send(Slack.mention(QUESTION, user="U0ERIN"))
        assert slack.turns[-1].answer.outcome is Outcome.NOT_FOUND, "past approvals.uncited_days: answered afresh"

        assert (await expert_click(slack, note, "kbbot_expert_capture", RITA)).startswith("Added to the knowledge")
        [doc] = (tmp_path / "docs" / "expert-answers").rglob("*.md")
        kept = doc.read_text(encoding="utf-8")
        assert "today." in kept and "evil.example" not in kept


async def test_a_reply_too_long_to_show_whole_is_refused_and_the_author_is_told(state, tmp_path, fake_slack):
    async with knowledge(state, tmp_path) as (runtime, _), \
            slack_app(runtime, fake_slack, reviewers=[RITA]) as slack:
        asked = (await slack.send(Slack.mention(QUESTION, user=ALICE)))["event"]
        long_reply = f"{FILLER} {FILLER} {TAIL}"
        assert len(long_reply) > 3000
        await slack.send(Slack.message(long_reply, user=BOB, thread_ts=asked["ts"]))
        assert notes_to(fake_slack, RITA) == [], "nothing offered that reviewers could not read whole"
        [told] = [e for e in fake_slack.ephemerals if e.user == BOB]
        assert "3,000 characters" in told.text and told.thread_ts == asked["ts"]
        # The thread stays open: a shorter reply is offered.
        await slack.send(Slack.message("It is SK-2040.", user=BOB, thread_ts=asked["ts"]))
        assert len(notes_to(fake_slack, RITA)) == 1
        assert len(slack.turns) == 1


async def test_telegram_reviewers_get_the_whole_reply(state, tmp_path, fake_tg):
    async with knowledge(state, tmp_path) as (runtime, _), \
            telegram_bot(runtime, fake_tg, groups_enabled=True, reviewers=[str(TG_RITA)]) as tg:
        await tg.send(mention(QUESTION))
        [not_found] = fake_tg.chat(GROUP)
        reply = f"{FILLER} {FILLER[:1200]} {TAIL}"
        assert 3000 > len(reply) > 2800
        await tg.send(message_update(reply, chat_id=GROUP, chat_type="supergroup",
                                     from_user=user(7002, first_name="Bob"), reply_to=bot_message(not_found, fake_tg)))
        shown = "\n".join(m.text for m in fake_tg.chat(TG_RITA))
        assert "today." in shown and "evil.example" not in shown


# --- item 8: one unanswered question silences the group -----------------------------------------------
def bot_message(message: Any, fake: Any) -> dict[str, Any]:
    return {"message_id": message.message_id, "date": int(time.time()), "text": message.text,
            "chat": {"id": GROUP, "type": "supergroup"},
            "from": {"id": fake.bot_id, "is_bot": True, "first_name": "kbbot"}}


async def test_in_a_telegram_group_only_a_reply_to_the_not_found_message_is_an_expert_reply(state, tmp_path,
                                                                                            fake_tg):
    async with knowledge(state, tmp_path) as (runtime, _), \
            telegram_bot(runtime, fake_tg, groups_enabled=True, reviewers=[str(TG_RITA)]) as tg:
        await tg.send(mention(QUESTION))
        assert tg.turns[-1].answer.outcome is Outcome.NOT_FOUND
        [not_found] = fake_tg.chat(GROUP)

        # Carol asks kbbot her own question in the group: answered, not taken for an expert's reply.
        await tg.send(mention("What does fault E-917 mean?", from_user=user(7003, first_name="Carol")))
        assert len(tg.turns) == 2 and tg.turns[-1].answer.outcome is Outcome.ANSWERED
        assert "cooling fan" in fake_tg.chat(GROUP)[-1].text
        assert fake_tg.chat(TG_RITA) == []

        # Bob answers by replying to the not-found message: offered to the reviewer.
        await tg.send(message_update("It is SK-2040.", chat_id=GROUP, chat_type="supergroup",
                                     from_user=user(7002, first_name="Bob"), reply_to=bot_message(not_found, fake_tg)))
        assert len(fake_tg.chat(TG_RITA)) == 1 and "SK-2040" in fake_tg.chat(TG_RITA)[0].text
        assert len(tg.turns) == 2

        # The offer closed with Bob's reply: Dave's reply to the same message is not offered.
        await tg.send(message_update("Or ask the parts desk for SK-2041.", chat_id=GROUP, chat_type="supergroup",
                                     from_user=user(7004, first_name="Dave"), reply_to=bot_message(not_found, fake_tg)))
        assert len(fake_tg.chat(TG_RITA)) == 1


async def test_a_slack_thread_is_open_to_one_expert_reply(state, tmp_path, fake_slack):
    async with knowledge(state, tmp_path) as (runtime, _), \
            slack_app(runtime, fake_slack, reviewers=[RITA]) as slack:
        asked = (await slack.send(Slack.mention(QUESTION, user=ALICE)))["event"]
        await slack.send(Slack.message("It is SK-2040.", user=BOB, thread_ts=asked["ts"]))
        await slack.send(Slack.message("Or SK-2041, I think.", user=DAVE, thread_ts=asked["ts"]))
        [note] = notes_to(fake_slack, RITA)
        assert "SK-2040" in note_text(note)


# --- item 13: a private place's reply --------------------------------------------------------------------
async def test_a_reply_said_in_a_private_channel_stays_with_that_channels_readers(state, tmp_path, fake_slack):
    for member, email in ((ALICE, "alice@example.com"), (BOB, "bob@example.com"), (RITA, "rita@example.com"),
                          (DAVE, "dave@example.com")):
        fake_slack.add_user(member, email)
    fake_slack.add_channel("C0PRIV", [ALICE, BOB, RITA, "UKBBOT"], private=True)
    fake_slack.add_channel("C0OTHER", [DAVE, "UKBBOT"])
    async with knowledge(state, tmp_path) as (runtime, _), \
            slack_app(runtime, fake_slack, reviewers=[RITA]) as slack:
        runtime.audiences.register("slack", SlackDirectory(slack.adapter.client, cache_s=0))  # as kbbot serve does
        asked = (await slack.send(Slack.mention(QUESTION, user=ALICE, channel="C0PRIV")))["event"]
        await slack.send(Slack.message("It is SK-2040, ask the parts desk.", user=BOB, thread_ts=asked["ts"],
                                       channel="C0PRIV"))
        [note] = notes_to(fake_slack, RITA)
        assert (await expert_click(slack, note, "kbbot_expert_approve", RITA)).startswith("Saved:")

        # Dave, not in the private channel, asks elsewhere: not served what was said there.
        await slack.send(Slack.mention(QUESTION, user=DAVE, channel="C0OTHER"))
        assert slack.turns[-1].answer.outcome is Outcome.NOT_FOUND
        assert "SK-2040" not in slack.turns[-1].answer.text
        # Alice, who was there, gets it in the channel and in a direct message.
        await slack.send(Slack.mention(QUESTION, user=ALICE, channel="C0PRIV"))
        assert slack.turns[-1].answer.outcome is Outcome.CACHED
        await slack.send(Slack.message(QUESTION, user=ALICE, channel="D0ALICE", channel_type="im"))
        assert slack.turns[-1].answer.outcome is Outcome.CACHED

        # Added to the knowledge base, it is read by that channel only, never public.
        assert (await expert_click(slack, note, "kbbot_expert_capture", RITA)).startswith("Added to the knowledge")
        run = await runtime.refresher().run("docs")
        assert run.ok and run.added == 1
        [(doc_id, record)] = [(d, r) for d, r in runtime.store.records().items() if "expert-answers" in d]
        assert record.readers == ["channel:c0priv"], record.readers
        await slack.send(Slack.mention(f"!fresh {QUESTION}", user=DAVE, channel="C0OTHER"))
        answer = slack.turns[-1].answer
        assert doc_id not in {c.doc_id for c in answer.citations} and "SK-2040" not in answer.text
        await slack.send(Slack.mention(f"!fresh {QUESTION}", user=ALICE, channel="C0PRIV"))
        assert doc_id in {c.doc_id for c in slack.turns[-1].answer.citations}
