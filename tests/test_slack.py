"""The Slack adapter end to end: the real bolt ``AsyncApp`` behind ``kbbot serve``'s web app, signed
Events API requests over HTTP, the real slack-sdk client against a local fake of the Slack Web API,
and the answerer on the indexed sample knowledge base (extractive, or the fake Anthropic model)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any
from uuid import uuid4

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from adapters.server import build_web_app
from adapters.slack.platform import SlackAdapter
from adapters.slack.reply import make_rates
from adapters.slack.settings import SlackSettings
from adapters.slack.text import neutralise, question_text, stable_prefix
from bot.conversation import HandledTurn
from bot.delivery.rates import PlatformRates, Rate
from bot.delivery.reply import split_message
from bot.runtime import Runtime
from bot.state.feedback import Feedback, MemoryFeedback, RedisFeedback
from bot.types import Outcome
from tests.conftest import break_retrieval
from tests.fakes.anthropic_server import Script
from tests.fakes.slack_server import DOCUMENTED_TIERS, PER_CHANNEL, STREAM_METHODS, FakeSlack, Message
from tests.model_router import quoting, steps

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0KBBOT"
BOT = "UKBBOT"
QUESTION = "How often should the bearings be greased?"
_ts = itertools.count(1)


def new_ts() -> str:
    return f"{1_800_000_000 + next(_ts)}.000200"


class Slack:
    """One adapter behind a real HTTP server, a fake Slack Web API, and helpers to send events."""

    def __init__(self, fake: FakeSlack, adapter: SlackAdapter, url: str, session: aiohttp.ClientSession,
                 turns: list[HandledTurn]):
        self.fake = fake
        self.adapter = adapter
        self.url = url
        self.session = session
        self.turns = turns
        self._events = itertools.count(1)

    def event_body(self, event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
        return {"token": "legacy", "team_id": TEAM, "api_app_id": "AKBBOT", "type": "event_callback",
                "event_id": event_id or f"Ev{next(self._events):08d}", "event_time": int(time.time()),
                "authorizations": [{"team_id": TEAM, "user_id": BOT, "is_bot": True}],
                "event": {"team": TEAM, "event_ts": event.get("ts"), **event}}

    async def post(self, raw: str, *, content_type: str = "application/json", signed: bool = True,
                   timestamp: int | None = None, headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        ts = str(timestamp if timestamp is not None else int(time.time()))
        all_headers = {"Content-Type": content_type, **(headers or {})}
        if signed:
            all_headers["X-Slack-Request-Timestamp"] = ts
            all_headers["X-Slack-Signature"] = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=raw)
        async with self.session.post(f"{self.url}/slack/events", data=raw.encode(), headers=all_headers) as resp:
            await resp.read()
            return resp

    async def send(self, event: dict[str, Any], *, event_id: str | None = None, retry: int | None = None,
                   settle: bool = True) -> dict[str, Any]:
        body = self.event_body(event, event_id)
        headers = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"} if retry else None
        started = time.monotonic()
        resp = await self.post(json.dumps(body), headers=headers)
        assert resp.status == 200
        assert time.monotonic() - started < 3, "Slack needs its ack within 3 s"
        if settle:
            await self.adapter.settle()
        return body

    @staticmethod
    def mention(text: str = QUESTION, *, channel: str = "C0SUPPORT", ts: str | None = None,
                thread_ts: str | None = None, user: str = "U0ALICE") -> dict[str, Any]:
        event = {"type": "app_mention", "user": user, "text": f"<@{BOT}> {text}", "ts": ts or new_ts(),
                 "channel": channel}
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    @staticmethod
    def message(text: str, *, channel: str = "C0SUPPORT", thread_ts: str | None = None, user: str = "U0ALICE",
                channel_type: str = "channel", **extra: Any) -> dict[str, Any]:
        event = {"type": "message", "user": user, "text": text, "ts": new_ts(), "channel": channel,
                 "channel_type": channel_type, **extra}
        if thread_ts:
            event["thread_ts"] = thread_ts
        return event

    def thread(self, event: dict[str, Any]) -> list[Message]:
        return self.fake.thread(event["channel"], event.get("thread_ts") or event["ts"])

    def only_turn(self) -> HandledTurn:
        assert len(self.turns) == 1, [t.kind for t in self.turns]
        return self.turns[0]


@contextlib.asynccontextmanager
async def slack_app(runtime: Runtime, fake: FakeSlack, *, rates: PlatformRates | None = None,
                    idempotency: Any = None, admin: Any = None, answerer: Any = None, replica: str | None = None,
                    feedback: Any = None, **overrides: Any) -> AsyncIterator[Slack]:
    options: dict[str, Any] = {"stream_interval_s": 0.3, "edit_interval_s": 0.3, **overrides}
    settings = SlackSettings(bot_token=fake.token, signing_secret=SECRET, api_url=fake.base_url, **options)
    turns: list[HandledTurn] = []
    conversations = runtime.conversations(feedback=feedback or MemoryFeedback(), admin=admin, on_turn=turns.append)
    takeover = conversations.takeover
    if takeover is not None and replica is not None:
        takeover = replace(takeover, replica=replica)
    conversations = replace(conversations, idempotency=idempotency or conversations.idempotency,
                            answerer=answerer or conversations.answerer, takeover=takeover)
    adapter = SlackAdapter(conversations, settings, rates=rates,
                           reviewers_channel=runtime.settings.approvals.reviewers_channel,
                           digest_to=runtime.settings.slack.digest_to)
    runner = web.AppRunner(build_web_app([adapter], runtime), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    await adapter.start()  # as kbbot serve does
    try:
        async with aiohttp.ClientSession() as session:
            yield Slack(fake, adapter, f"http://127.0.0.1:{port}", session, turns)
    finally:
        await adapter.stop(10)
        await runner.cleanup()


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(team_id=TEAM, bot_user_id=BOT) as fake:
        yield fake


def stream_calls(fake: FakeSlack) -> list[Any]:
    return fake.calls_to(*STREAM_METHODS)


def feedback_values(message: Message) -> list[str]:
    values = []
    for block in message.blocks_of("context_actions"):
        for element in block["elements"]:
            values += [element["positive_button"]["value"], element["negative_button"]["value"]]
    return values


def sources_text(message: Message) -> str:
    return " ".join(e["text"] for b in message.blocks_of("context") for e in b["elements"])


# --- the tests -------------------------------------------------------------------------------
async def test_a_mention_shows_the_status_then_streams_natively_to_its_asker(kb_runtime, fake_slack):
    # The answer itself (in the thread, streamed, sources, feedback): tests/scenarios. Here: Slack's way.
    async with slack_app(kb_runtime, fake_slack) as slack:
        event = await slack.send(slack.mention())
        turn = slack.only_turn()

    mention = event["event"]
    assert turn.inquiry.text == QUESTION and turn.inquiry.thread_key == f"slack:{TEAM}:C0SUPPORT:{mention['ts']}"
    methods = [c.method for c in fake_slack.calls if c.method != "auth.test"]
    assert methods[0] == "assistant.threads.setStatus"
    assert fake_slack.statuses[("C0SUPPORT", mention["ts"])][0] == "Searching the knowledge base…"
    start = fake_slack.ok_calls("chat.startStream")[0]
    assert start.args["thread_ts"] == mention["ts"], "the answer goes into the mention's thread"
    assert start.args["recipient_team_id"] == TEAM and start.args["recipient_user_id"] == "U0ALICE"
    assert methods[-1] == "chat.stopStream" and "chat.postMessage" not in methods


async def test_follow_ups_in_the_answered_thread_use_its_history_other_threads_are_ignored(kb_runtime, fake_slack):
    async with slack_app(kb_runtime, fake_slack) as slack:
        first = (await slack.send(slack.mention("What does fault E-004 mean?")))["event"]
        await slack.send(slack.message("And how do I fix it?", thread_ts=first["ts"]))
        unrelated = await slack.send(slack.message("What does fault E-004 mean?", thread_ts=new_ts()))
        top_level = await slack.send(slack.message("Anyone around?"))
        parent = new_ts()
        in_thread_mention = (await slack.send(slack.mention("Grease interval?", thread_ts=parent)))["event"]

    kinds = [(t.kind, t.answer.trace.history_turns) for t in slack.turns]
    assert kinds == [("mention", 0), ("follow_up", 1), ("mention", 0)]
    assert len(slack.thread(first)) == 2
    assert slack.thread(unrelated["event"]) == [] and slack.thread(top_level["event"]) == []
    assert slack.turns[2].inquiry.thread_key.endswith(f":{parent}")
    assert len(fake_slack.thread("C0SUPPORT", parent)) == 1, "a mention inside a thread is answered there"
    assert in_thread_mention["thread_ts"] == parent


async def test_a_redelivered_event_gets_no_second_answer(kb_runtime, fake_slack):
    async with slack_app(kb_runtime, fake_slack) as slack:
        mention = slack.mention()
        first = await slack.send(mention, settle=False)
        await slack.send(mention, event_id=first["event_id"], retry=1, settle=False)
        await slack.adapter.settle()
        await slack.send(mention, event_id=first["event_id"], retry=2)
        slack.only_turn()
    assert len(slack.thread(mention)) == 1
    assert len(fake_slack.ok_calls("chat.startStream")) == 1


async def test_refused_streaming_falls_back_to_chat_update_with_the_same_final_text(claude, fake_slack):
    model, runtime = claude
    text = ("Grease the HL-M200 bearings every 4,000 operating hours [1]. Use 15 g of lithium-complex grease "
            "per bearing [1]. " * 6).strip()
    model.responder = lambda req: Script(text, tokens_per_second=120)
    async with slack_app(runtime, fake_slack) as slack:
        native = (await slack.send(slack.mention()))["event"]
        fake_slack.refuse_streaming("unknown_method")
        refused_from = len(fake_slack.calls)
        edited = (await slack.send(slack.mention()))["event"]
        again_from = len(fake_slack.calls)
        again = (await slack.send(slack.mention()))["event"]

    [streamed], [updated], [later] = slack.thread(native), slack.thread(edited), slack.thread(again)
    assert updated.body == streamed.body == neutralise(slack.turns[0].answer.text)
    assert sources_text(updated) == sources_text(streamed)
    refused_calls = fake_slack.calls[refused_from:again_from]
    assert [c.error for c in refused_calls if c.method in STREAM_METHODS] == ["unknown_method"]
    posts = [c for c in refused_calls if c.method == "chat.postMessage"]
    updates = [c for c in refused_calls if c.method == "chat.update"]
    assert len(posts) == 1 and len(updates) >= 2, "one message, updated while the answer grows"
    gaps = [b.at - a.at for a, b in zip(updates, updates[1:])]
    assert min(gaps) >= 0.3 - 0.01, "updates keep the configured interval"
    assert not [c for c in fake_slack.calls[again_from:] if c.method in STREAM_METHODS], \
        "the workspace's refusal is remembered"
    assert later.body == streamed.body


async def test_a_stream_that_expires_mid_answer_is_finished_with_chat_update(claude, fake_slack):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 60), tokens_per_second=200)
    fake_slack.expire_streams_after(1)
    async with slack_app(runtime, fake_slack, buffer_size=60) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    [message] = slack.thread(mention)
    assert message.body == slack.only_turn().answer.text
    assert "message_not_in_streaming_state" in [c.error for c in fake_slack.calls]
    assert fake_slack.ok_calls("chat.update")


async def test_a_15000_character_answer_arrives_complete_in_several_messages(claude, fake_slack):
    model, runtime = claude

    def long_answer(body: dict) -> Script:
        # Distinct steps from source 1 (a sentence said again is shown once), then one of source 2.
        text = steps(body, chars=15000) + " " + quoting(2)(body)
        assert len(text) >= 14900, len(text)
        return Script(text, tokens_per_second=None)

    model.responder = long_answer
    async with slack_app(runtime, fake_slack) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    answer = slack.only_turn().answer
    assert answer is not None and answer.outcome is Outcome.ANSWERED
    messages = slack.thread(mention)
    assert len(messages) == 2
    assert all(len(m.body) <= 12000 for m in messages)
    assert "".join(m.body for m in messages) == answer.text
    assert messages[0].body.endswith("\n\n"), "split at a paragraph boundary"
    assert not messages[0].blocks_of("context_actions") and messages[-1].blocks_of("context_actions")
    assert "[2]" in sources_text(messages[-1])


async def test_mentions_written_by_the_model_are_defused(claude, fake_slack):
    model, runtime = claude
    model.responder = lambda req: Script(
        "Attention <!channel>: grease the bearings every 4,000 hours [1]. <!here|here> grease HL-M200 bearings "
        "every 4,000 operating hours with 15 g of lithium-complex grease, ask <@U0BOSS> "
        "or @everyone in <!subteam^S0TEAM|@maintenance> [1].", tokens_per_second=100)
    async with slack_app(runtime, fake_slack) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    [message] = slack.thread(mention)
    sent = " ".join(c.text_sent for c in fake_slack.calls)
    for raw in ("<!channel>", "<!here", "<@U0BOSS>", "<!subteam", "@everyone"):
        assert raw not in sent and raw not in message.body
    assert re.search(r"@\u2060channel: grease", message.body)
    assert "ask @\u2060U0BOSS or @\u2060everyone in @\u2060maintenance" in message.body


async def test_a_failing_retrieval_ends_with_the_friendly_message(kb_runtime, fake_slack, monkeypatch):
    break_retrieval(kb_runtime, monkeypatch)
    async with slack_app(kb_runtime, fake_slack) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    [message] = slack.thread(mention)
    assert message.body.startswith("⚠️ The knowledge base cannot be reached right now")
    assert "Traceback" not in message.body
    assert fake_slack.statuses[("C0SUPPORT", mention["ts"])] == ["Searching the knowledge base…", ""]
    assert slack.only_turn().answer.outcome is Outcome.ERROR


async def test_unsigned_forged_or_stale_requests_are_refused(kb_runtime, fake_slack):
    async with slack_app(kb_runtime, fake_slack) as slack:
        raw = json.dumps(slack.event_body(slack.mention()))
        assert (await slack.post(raw, signed=False)).status == 401
        forged = {"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=" + "0" * 64}
        assert (await slack.post(raw, signed=False, headers=forged)).status == 401
        assert (await slack.post(raw, timestamp=int(time.time()) - 600)).status == 401
        await slack.adapter.settle()
        async with slack.session.get(f"{slack.url}/healthz") as health:
            assert health.status == 200
            assert (await health.json())["adapters"]["slack"]["mode"] == "events_api"
    assert slack.turns == [] and fake_slack.calls == []


async def test_dms_bots_edits_and_access_lists(kb_runtime, fake_slack, caplog):
    async with slack_app(kb_runtime, fake_slack, allowed_channels=["C0SUPPORT"],
                         channel_spaces={"C0SUPPORT": ["default", "drives"]}) as slack:
        dm = await slack.send(slack.message(QUESTION, channel="D0ALICE", channel_type="im"))
        await slack.send(slack.message("hello from a bot", channel="D0ALICE", channel_type="im", bot_id="B0OTHER"))
        await slack.send(slack.message("edited", channel="D0ALICE", channel_type="im", subtype="message_changed"))
        with caplog.at_level(logging.INFO, logger="kbbot.delivery"):
            refused = slack.mention(channel="C0RANDOM")
            await slack.send(refused, event_id="EvREFUSED1", retry=2)
        await slack.send(slack.mention(channel="C0SUPPORT"))
    # A mention delivered and refused still leaves its trace: which event, where, which delivery.
    assert f"received app_mention EvREFUSED1 in C0RANDOM at {refused['ts']} (retry 2)" in caplog.text
    assert "ignoring a question from U0ALICE" in caplog.text
    assert [(t.kind, t.inquiry.channel) for t in slack.turns] == [("dm", "D0ALICE"), ("mention", "C0SUPPORT")]
    assert slack.turns[1].inquiry.spaces == ("default", "drives")
    assert slack.turns[0].inquiry.spaces == ("default",)
    assert len(slack.thread(dm["event"])) == 1
    assert fake_slack.thread("C0RANDOM", "") == [] and not [c for c in fake_slack.calls
                                                            if c.args.get("channel") == "C0RANDOM"]


async def test_first_text_latency_and_call_count_for_a_1500_character_answer(claude, fake_slack, record_property):
    """The figure for the issue's closing note: ~1,500 characters at 40 tokens/s, default cadence."""
    model, runtime = claude
    sentence = "Grease the HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease [1]. "
    text = (sentence * 16)[:1500].rstrip()
    model.responder = lambda req: Script(text, tokens_per_second=40)
    async with slack_app(runtime, fake_slack, stream_interval_s=1.0, edit_interval_s=1.2) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    [message] = slack.thread(mention)
    assert message.body == slack.only_turn().answer.text
    request = model.last_request
    first_text = next(c for c in fake_slack.calls if c.method in ("chat.startStream", "chat.postMessage")
                      and c.text_sent)
    calls = [c for c in fake_slack.calls if c.method != "auth.test"]
    latency_ms = (first_text.at - request.first_token_at) * 1000
    by_method: dict[str, int] = {}
    for c in calls:
        by_method[c.method] = by_method.get(c.method, 0) + 1
    record_property("slack_calls", len(calls))
    record_property("first_text_after_first_token_ms", round(latency_ms))
    print(f"\n1,500-char answer at 40 tokens/s ({len(request.tokens_sent)} tokens, "
          f"{request.last_token_at - request.first_token_at:.1f} s of generation): {len(calls)} Slack calls "
          f"{by_method}; first text {latency_ms:.0f} ms after the model's first token")
    assert len(calls) <= 15


async def test_edit_mode_from_config_never_streams(kb_runtime, fake_slack):
    async with slack_app(kb_runtime, fake_slack, stream_mode="edit") as slack:
        mention = (await slack.send(slack.mention()))["event"]
    [message] = slack.thread(mention)
    assert message.body == slack.only_turn().answer.text
    assert stream_calls(fake_slack) == []
    assert [c.method for c in fake_slack.calls if c.method.startswith("chat.")][0] == "chat.postMessage"


async def test_an_invented_source_number_never_streams(claude, fake_slack):
    """An invented source number is repaired before its sentence shows (the sentence gate credits the
    sentence to the source that holds it): the stream never carries it, and what streamed is the
    final answer."""
    model, runtime = claude
    model.responder = lambda req: Script("Grease every 4,000 hours [42]. " + steps(req, 12), tokens_per_second=60)
    async with slack_app(runtime, fake_slack, buffer_size=40) as slack:
        mention = (await slack.send(slack.mention()))["event"]
    answer = slack.only_turn().answer
    [message] = slack.thread(mention)
    streamed = " ".join(c.text_sent for c in stream_calls(fake_slack))
    assert "Grease every 4,000 hours" in streamed and "[42]" not in streamed
    assert "[42]" not in answer.text and message.body == answer.text
    assert message.blocks_of("context_actions")


async def test_concurrent_answers_share_the_workspace_rate_budget(claude, fake_slack):
    """Three answers at once, edit mode: together they stay inside chat.update's (scaled) tier."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 25), tokens_per_second=120)
    fake_slack.limit("chat.update", calls=4, per_s=1.0)
    rates = make_rates(SlackSettings())
    # A bucket of 2 refilled once a second sends at most 3 in any second: one call (a second of
    # scheduling jitter on a loaded machine) short of the fake's 4, so a 429 here is a real overrun.
    rates.rates = {**rates.rates, "chat.update": Rate(per_minute=60, burst=2)}
    async with slack_app(runtime, fake_slack, rates=rates, stream_mode="edit", edit_interval_s=0.2) as slack:
        mentions = [slack.mention() for _ in range(3)]
        for mention in mentions:
            await slack.send(mention, settle=False)
        await slack.adapter.settle()
    assert len(slack.turns) == 3
    answer = slack.turns[0].answer.text
    for mention in mentions:
        # One message; or, when the update tier was empty at an answer's first text (a loaded
        # machine's timing), its first sentences in a message of their own and the rest after.
        *early, message = slack.thread(mention)
        assert len(early) <= 1 and (message.body == answer or "".join(
            "".join(m.body for m in [*early, message]).split()) == "".join(answer.split()))
        assert not early or not sources_text(early[0])
    updates = fake_slack.calls_to("chat.update")
    assert len(updates) >= 4 and not [c for c in updates if c.status == 429]
    assert len(updates) < 3 * 5, "waiting for the budget, each answer skipped stale states"


async def test_answers_beyond_the_stream_budget_are_posted_at_once_not_queued(claude, fake_slack):
    """Four answers at once, one stream start to spend: one streams, three post and edit at once;
    every answer shows its first text without waiting for a stream start, and the workspace keeps
    streaming afterwards (a spent budget is not a refusal)."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 20), tokens_per_second=150)
    rates = make_rates(SlackSettings())
    rates.rates = {**rates.rates, "chat.startStream": Rate(per_minute=6, burst=1)}  # one start per 10 s
    async with slack_app(runtime, fake_slack, rates=rates) as slack:
        mentions = [slack.mention(channel=f"C0TEAM{i}") for i in range(4)]
        for mention in mentions:
            await slack.send(mention, settle=False)
        await slack.adapter.settle()
        assert slack.adapter._streaming_allowed(TEAM), "the workspace is not marked as refusing streams"

    assert len(slack.turns) == 4
    for mention in mentions:
        [message] = slack.thread(mention)
        assert message.body == neutralise(slack.turns[0].answer.text) and not message.streaming
        assert sources_text(message)
    starts = fake_slack.ok_calls("chat.startStream")
    posts = [c for c in fake_slack.ok_calls("chat.postMessage") if c.text_sent]
    assert len(starts) == 1 and len(posts) == 3, "one stream, the others posted"
    first_sends = sorted(min(c.at for c in fake_slack.calls if c.ok and c.text_sent and c.args.get("channel") == m["channel"])
                         for m in mentions)
    assert first_sends[-1] - first_sends[0] < 2.0, "no answer waited ~10 s for the next stream start"
    assert not [c for c in fake_slack.calls if c.status == 429]


async def test_with_the_streaming_and_editing_tiers_spent_answers_show_their_first_sentences_then_the_rest(
        claude, fake_slack):
    """The workspace's chat.startStream, chat.stopStream and chat.update are spent for a minute (as at 120
    answers a minute under Slack's tiers): no answer shows text it could end only by waiting for them.
    Each shows its first checked sentences as a message of their own and the rest as the final message,
    each with one chat.postMessage (a per-channel budget), never edited (issue 44)."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 12), tokens_per_second=150)
    rates = busy_channel_rates(chat_startStream=Rate(1, burst=1), chat_stopStream=Rate(1, burst=1),
                               chat_update=Rate(1, burst=1))
    for method in ("chat.startStream", "chat.stopStream", "chat.update"):
        assert await rates.try_acquire(TEAM, method)
    async with slack_app(runtime, fake_slack, rates=rates) as slack:
        mentions = [slack.mention(channel=f"C0SPENT{i}") for i in range(3)]
        for mention in mentions:
            await slack.send(mention, settle=False)
        await asyncio.wait_for(slack.adapter.settle(), 20)  # a token of these tiers frees only after 60 s
    assert len(slack.turns) == 3 and all(t.answer.outcome is Outcome.ANSWERED for t in slack.turns)
    answer = neutralise(slack.turns[0].answer.text)
    for mention in mentions:
        first, final = slack.thread(mention)
        assert first.body.strip() and answer.startswith(first.body.strip()) and len(first.body) < len(answer) / 2
        assert "".join((first.body + final.body).split()) == "".join(answer.split()), "the answer once, in two"
        assert not sources_text(first) and sources_text(final), "the sources and buttons end the answer"
        assert [m for m, _ in first.changes] == [m for m, _ in final.changes] == ["chat.postMessage"]
        assert acknowledgements(fake_slack, mention["channel"], mention["ts"]), "acknowledged meanwhile"
    assert not fake_slack.calls_to("chat.update") and not fake_slack.calls_to("chat.startStream")


def acknowledgements(fake: FakeSlack, channel: str, thread_ts: str) -> list[Any]:
    """The successful calls that showed a question was taken: a status set, a reaction added."""
    return [c for c in fake.calls if c.ok and (
        (c.method == "assistant.threads.setStatus" and c.args.get("status")
         and (c.args.get("channel_id"), c.args.get("thread_ts")) == (channel, thread_ts))
        or (c.method == "reactions.add" and (c.args.get("channel"), c.args.get("timestamp")) == (channel, thread_ts)))]


def busy_channel_rates(**tiers: Rate) -> PlatformRates:
    rates = make_rates(SlackSettings())
    rates.rates = {**rates.rates, **{method.replace("_", "."): rate for method, rate in tiers.items()}}
    return rates


async def test_a_busy_channel_acknowledges_every_question_at_once_from_tiers_of_their_own(claude, fake_slack):
    """Eight mentions at once in one channel that posts two messages a second: each question shows
    the status or, the status budget spent after three, 👀, before the answers queue for the channel;
    every answer arrives whole, each 👀 is taken back once its answer is shown, and nothing gets a 429."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 10), tokens_per_second=150)
    # A token bucket of burst b and rate r stays inside a window of b + r * seconds calls.
    fake_slack.limit("chat.postMessage", calls=4, per_s=1.0, per="channel")
    fake_slack.limit("assistant.threads.setStatus", calls=3, per_s=60.0)
    fake_slack.limit("reactions.add", calls=50, per_s=60.0)
    rates = busy_channel_rates(chat_postMessage=Rate(120, burst=2), chat_startStream=Rate(6, burst=1),
                                 assistant_threads_setStatus=Rate(3, burst=3), reactions_remove=Rate(60, burst=8))
    async with slack_app(runtime, fake_slack, rates=rates) as slack:
        mentions = [slack.mention(f"{QUESTION} (ticket {i})", channel="C0BUSY", user=f"U0ASKER{i}") for i in range(8)]
        await asyncio.gather(*(slack.send(m, settle=False) for m in mentions))
        await slack.adapter.settle()

    assert len(slack.turns) == 8
    posts = [c for c in fake_slack.ok_calls("chat.postMessage") if c.text_sent]
    kinds = []
    for mention in mentions:
        [ack] = acknowledgements(fake_slack, "C0BUSY", mention["ts"])
        kinds.append(ack.method)
        shown = [c for c in fake_slack.calls if c.ok and c.method.startswith("chat.") and c.text_sent
                 and (c.args.get("thread_ts") == mention["ts"]
                      or c.args.get("ts") in {m.ts for m in slack.thread(mention)})]
        assert ack.at < min(c.at for c in shown), "the question was acknowledged before its text appeared"
        assert len(posts) < 3 or ack.at < posts[2].at, "no acknowledgement waited for the channel's messages"
        [message] = slack.thread(mention)
        turn = next(t for t in slack.turns if t.inquiry.thread_key.endswith(mention["ts"]))
        assert message.body == neutralise(turn.answer.text) and not message.streaming and sources_text(message)
        assert fake_slack.reactions[("C0BUSY", mention["ts"])] == [], "👀 is taken back with the answer"
    assert sorted(kinds) == ["assistant.threads.setStatus"] * 3 + ["reactions.add"] * 5
    assert {c.args["name"] for c in fake_slack.calls_to("reactions.add", "reactions.remove")} == {"eyes"}
    assert not [c for c in fake_slack.calls if c.status == 429]


async def test_the_acknowledging_reaction_is_taken_back_with_the_first_message_not_after_the_last(claude,
                                                                                                   fake_slack):
    """👀 says "working on it" as the status does, which Slack clears when the answer's first message is
    posted: it is taken back then, so a burst's removals (20 a minute) are not queued after every final."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 12), tokens_per_second=40)  # streams for about 6 s
    async with slack_app(runtime, fake_slack, status="") as slack:  # no status: 👀 acknowledges
        mention = slack.mention(QUESTION)
        await slack.send(mention)
        await slack.adapter.settle()
    assert slack.only_turn().answer.outcome is Outcome.ANSWERED
    [added] = acknowledgements(fake_slack, mention["channel"], mention["ts"])
    [removed] = fake_slack.ok_calls("reactions.remove")
    texts = [c.at for c in fake_slack.calls if c.ok and c.method.startswith("chat.") and c.text_sent]
    assert added.method == "reactions.add" and fake_slack.reactions[(mention["channel"], mention["ts"])] == []
    assert min(texts) <= removed.at < max(texts), "taken back once text shows, before the answer is complete"


async def test_a_reaction_is_added_only_with_its_removal_reserved_so_no_eyes_outlive_the_answers(claude, fake_slack):
    """Slack adds reactions at 50 a minute and removes them at 20: at 120 questions a minute the 👀 of
    the old code piled up and stayed up to 53 s after their answers (issue 28). A reaction now goes
    on only with a reactions.remove token taken with it, so each comes off with the answer's first
    message; past that budget the answer's first text is the acknowledgement."""
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 6), tokens_per_second=120)
    rates = busy_channel_rates(reactions_remove=Rate(6, burst=2))  # two now, then one each 10 s
    async with slack_app(runtime, fake_slack, rates=rates, status="") as slack:
        mentions = [slack.mention(f"{QUESTION} (ticket {i})", channel="C0MANY", user=f"U0ASKER{i}") for i in range(6)]
        await asyncio.wait_for(asyncio.gather(*(slack.send(m, settle=False) for m in mentions)), 30)
        await asyncio.wait_for(slack.adapter.settle(), 30)

    assert len(slack.turns) == 6 and all(t.answer.outcome is Outcome.ANSWERED for t in slack.turns)
    added = fake_slack.ok_calls("reactions.add")
    removed = fake_slack.ok_calls("reactions.remove")
    assert len(added) == 2, "no more reactions than removals at hand"
    assert len(removed) == 2 and all(fake_slack.reactions[("C0MANY", m["ts"])] == [] for m in mentions)
    last_text = max(c.at for c in fake_slack.calls if c.ok and c.method.startswith("chat.") and c.text_sent)
    assert max(c.at for c in removed) <= last_text, "every 👀 was gone by the time the answers were"
    assert not [c for c in fake_slack.calls if c.status == 429]


async def test_a_busy_channel_posts_a_complete_answer_before_others_first_texts(claude, fake_slack):
    """The channel's chat.postMessage budget is held (a 429 elsewhere) while four long answers wait to
    show their first text and a short one completes: when the budget frees, the complete answer is
    posted first, although the others were waiting before it; and they still all arrive."""
    model, runtime = claude
    short_text = "Grease the bearings every 4,000 operating hours [1]."
    model.responder = lambda body: (Script(short_text, tokens_per_second=200) if "(short)" in json.dumps(body)
                                    else Script(steps(body, 8), tokens_per_second=20))
    fake_slack.limit("chat.postMessage", calls=3, per_s=1.0, per="channel")
    rates = busy_channel_rates(chat_postMessage=Rate(120, burst=1), chat_startStream=Rate(1, burst=1))
    await rates.try_acquire(TEAM, "chat.startStream")  # no stream can start: every answer posts
    await rates.hold(f"{TEAM}:C0BUSY", "chat.postMessage", 3.0)
    async with slack_app(runtime, fake_slack, rates=rates, stream_mode="native") as slack:
        waiting = [slack.mention(f"{QUESTION} (long {i})", channel="C0BUSY", user=f"U0LONG{i}") for i in range(4)]
        await asyncio.gather(*(slack.send(m, settle=False) for m in waiting))
        await asyncio.sleep(0.3)
        short = slack.mention(f"{QUESTION} (short)", channel="C0BUSY", user="U0SHORT")
        await slack.send(short, settle=False)
        await slack.adapter.settle()

    posts = [c for c in fake_slack.ok_calls("chat.postMessage") if c.text_sent]
    assert posts[0].args["thread_ts"] == short["ts"], [p.args["thread_ts"] for p in posts]
    assert short_text in posts[0].text_sent and posts[0].args.get("blocks"), "posted whole, with its sources"
    for mention in [*waiting, short]:
        [message] = slack.thread(mention)
        turn = next(t for t in slack.turns if t.inquiry.thread_key.endswith(mention["ts"]))
        assert message.body == neutralise(turn.answer.text) and sources_text(message)
    assert not [c for c in fake_slack.calls if c.status == 429]


async def test_a_complete_answer_stuck_behind_a_busy_channel_takes_a_free_stream_instead(claude, fake_slack):
    """The channel's chat.postMessage is spent for the next 20 s; no stream could start at the first
    token, but a start and a stop are free a second later: the complete answer is streamed whole and
    stopped with its sources then, not posted 20 s later."""
    model, runtime = claude
    model.responder = lambda req: Script("Grease the bearings every 4,000 operating hours [1].", tokens_per_second=100)
    rates = busy_channel_rates(chat_startStream=Rate(60, burst=1))
    await rates.try_acquire(TEAM, "chat.startStream")
    await rates.hold(f"{TEAM}:C0BUSY", "chat.postMessage", 20.0)
    async with slack_app(runtime, fake_slack, rates=rates) as slack:
        mention = (await slack.send(slack.mention(channel="C0BUSY")))["event"]

    [message] = slack.thread(mention)
    assert message.body == neutralise(slack.only_turn().answer.text) and not message.streaming
    assert [m for m, _ in message.changes] == ["chat.startStream", "chat.stopStream"]
    assert message.blocks_of("context_actions") and sources_text(message)
    assert not fake_slack.calls_to("chat.postMessage")


async def test_reactions_follow_slack_s_rules_in_the_fake(fake_slack):
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    client = AsyncWebClient(token=fake_slack.token, base_url=fake_slack.base_url)
    await client.reactions_add(channel="C1", timestamp="1.000100", name="eyes")
    for bad, error in ((dict(name="eyes"), "already_reacted"), (dict(name=":eyes:"), "invalid_name"),
                       (dict(name="eyes", timestamp=""), "no_item_specified")):
        with pytest.raises(SlackApiError) as refused:
            await client.reactions_add(**{"channel": "C1", "timestamp": "1.000100", **bad})
        assert refused.value.response["error"] == error
    await client.reactions_remove(channel="C1", timestamp="1.000100", name="eyes")
    with pytest.raises(SlackApiError) as refused:
        await client.reactions_remove(channel="C1", timestamp="1.000100", name="eyes")
    assert refused.value.response["error"] == "no_reaction" and fake_slack.reactions[("C1", "1.000100")] == []
    fake_slack.limit("reactions.add", calls=1, per_s=60.0)
    await client.reactions_add(channel="C1", timestamp="2.000100", name="eyes")
    with pytest.raises(SlackApiError) as limited:
        await client.reactions_add(channel="C1", timestamp="3.000100", name="eyes")
    assert limited.value.response.status_code == 429 and int(limited.value.response.headers["Retry-After"]) >= 59


def test_the_apps_slack_rates_stay_inside_slacks_tiers_with_the_overrides():
    # Slack limits the app per workspace and channel, whichever process calls: replicas share these
    # buckets in Redis (tests/test_rate_buckets.py), so no process takes a share of them. A bucket lets
    # ``burst`` calls through at once and ``per_minute / 60`` a second after: no window of the tier's
    # length may hold more calls than the tier allows, or kbbot's own calls would meet 429s.
    rates = make_rates(SlackSettings())
    for method, per_minute in DOCUMENTED_TIERS.items():
        rate = rates.rates[method]
        assert rate.burst + rate.per_minute <= per_minute, method
    for method, (calls, per_s) in PER_CHANNEL.items():
        rate = rates.rates[method]
        assert rate.burst + rate.per_minute / 60 * per_s < calls + 1, method
    custom = make_rates(SlackSettings(rate_limits={"chat.update": 100}))
    assert custom.rates["chat.update"] == Rate(100, burst=5)


def test_an_acknowledging_reaction_must_be_an_emoji_name():
    # A wrong one (":eyes:") is refused when the settings load: tests/test_settings.py.
    assert SlackSettings(ack_reaction="white_check_mark").problems() == []
    assert SlackSettings(ack_reaction="").problems() == []
    with pytest.raises(ValueError, match="without colons"):
        SlackSettings(ack_reaction=":eyes:")


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="REDIS_URL is not set (scripts/services.sh start)")
async def test_two_replicas_sharing_redis_answer_a_redelivered_event_once(kb_runtime, fake_slack):
    from bot.state.redis import RedisIdempotency, connect_redis

    client = await connect_redis(os.environ["REDIS_URL"])
    prefix = f"kbbot-test:{uuid4().hex[:12]}:"
    try:
        shared = RedisIdempotency(client, prefix)
        async with slack_app(kb_runtime, fake_slack, idempotency=shared) as one, \
                slack_app(kb_runtime, fake_slack, idempotency=shared) as other:
            body = json.dumps(one.event_body(one.mention()))
            retry = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
            first, second = await asyncio.gather(one.post(body), other.post(body, headers=retry))
            assert first.status == second.status == 200
            await one.adapter.settle()
            await other.adapter.settle()
        assert len(one.turns) + len(other.turns) == 1
        assert len(fake_slack.ok_calls("chat.startStream")) == 1

        store = RedisFeedback(client, prefix)
        await store.record(Feedback(turn_id="t1", rating="up", user_id="U0BOB", tenant=TEAM, channel="C0SUPPORT",
                                    message_id="1.2", platform="slack"))
        stored = await client.hgetall(f"{prefix}feedback:t1")
        assert json.loads(stored[b"U0BOB"])["rating"] == "up"
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.mark.parametrize("text", [
    "Attention <!channel>: call <@U0BOSS|boss> or @here, then <!subteam^S1|@ops> <https://x.test|docs>.",
    "电机过热时请联系 <@U0ZHANG> 和 @everyone，然后检查风扇。",
])
def test_defusing_is_stable_while_the_text_grows(text):
    final = neutralise(text)
    for end in range(len(text) + 1):
        shown = neutralise(stable_prefix(text[:end]))
        assert final.startswith(shown), (end, shown)
    assert "<!" not in final and "<@" not in final and "@here" not in final


def test_split_message_keeps_every_character_and_prefers_paragraphs():
    text = ("A paragraph about grease. " * 30 + "\n\n") * 20
    parts = split_message(text, 2000)
    assert "".join(parts) == text and all(len(p) <= 2000 for p in parts)
    assert all(p.endswith("\n\n") for p in parts[:-1])
    assert split_message("x" * 5000, 2000) == ["x" * 2000, "x" * 2000, "x" * 1000]


def test_question_text_drops_the_mention_and_slack_markup():
    assert question_text(f"<@{BOT}> what is &lt;E-004&gt; in <https://kb.test/e4|the manual>?", BOT) == \
        "what is <E-004> in the manual (https://kb.test/e4)?"
