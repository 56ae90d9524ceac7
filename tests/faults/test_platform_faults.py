"""The chat platforms misbehaving (429 storms, 5xx) and users sending what is not a question (an empty
mention, 50,000 characters, only emoji): through the real adapters and SDKs against the fake Slack and
Telegram servers. Each turn ends with the final text or a clear message, and the next turn is answered."""

from __future__ import annotations

from adapters.telegram.session import instrument
from bot.types import Outcome
from tests.fakes.anthropic_server import Script
from tests.fakes.telegram_server import _ApiError, message_update
from tests.model_router import steps
from tests.test_slack import fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

QUESTION = "How often should the bearings be greased?"


def server_errors(fake, method: str, times: int) -> None:
    """The next ``times`` calls of ``method`` on the fake Telegram fail with HTTP 500."""
    original = getattr(fake, f"_m_{method}")
    left = [times]

    async def failing(args):
        if left[0] > 0:
            left[0] -= 1
            raise _ApiError(500, "Internal Server Error")
        return await original(args)

    setattr(fake, f"_m_{method}", failing)


async def test_slack_5xx_on_stream_calls_loses_nothing(claude, fake_slack):  # noqa: F811
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=150)
    fake_slack.fail("chat.appendStream", error="internal_error", status=500, times=3)
    fake_slack.fail("chat.stopStream", error="internal_error", status=503, times=1)
    async with slack_app(runtime, fake_slack) as slack:
        first = (await slack.send(slack.mention()))["event"]
        second = (await slack.send(slack.mention("What grease type should be used?")))["event"]
    assert [t.answer.outcome for t in slack.turns] == [Outcome.ANSWERED, Outcome.ANSWERED]
    assert [c.status for c in fake_slack.calls if c.status >= 500] == [500, 500, 500, 503]
    [message] = slack.thread(first)
    assert message.body == slack.turns[0].answer.text and not message.streaming
    assert slack.thread(second)[0].body == slack.turns[1].answer.text


async def test_telegram_5xx_on_drafts_and_the_final_message_loses_nothing(claude, fake_tg):  # noqa: F811
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=150)
    server_errors(fake_tg, "sendMessageDraft", 2)
    server_errors(fake_tg, "sendMessage", 1)
    async with telegram_bot(runtime, fake_tg) as tg:
        instrument(tg.adapter.bot)  # as kbbot serve does: 5xx are retried in the bot's session
        await tg.send(message_update(QUESTION))
        await tg.send(message_update("What grease type should be used?"))
    outcomes = [t.answer.outcome if t.answer else None for t in tg.turns]
    assert outcomes == [Outcome.ANSWERED, Outcome.ANSWERED], outcomes
    assert [c.status for c in fake_tg.calls if c.status >= 500] == [500, 500, 500]
    messages = fake_tg.chat(7001)
    assert len(messages) == 2, [m.text for m in messages]


async def test_telegram_429_storm_on_every_call_of_a_turn_loses_nothing(claude, fake_tg):  # noqa: F811
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=150)
    for method in ("sendChatAction", "sendMessageDraft", "sendMessage"):
        fake_tg.rate_limit(method, times=2, retry_after=1)  # Telegram's retry_after is whole seconds
    async with telegram_bot(runtime, fake_tg) as tg:
        await tg.send(message_update(QUESTION))
        await tg.send(message_update("What grease type should be used?"))
    assert [t.answer.outcome for t in tg.turns] == [Outcome.ANSWERED, Outcome.ANSWERED]
    assert len(fake_tg.chat(7001)) == 2


# --- what users send ----------------------------------------------------------------------------------
EMOJI = "🔥🔥🔥😡👍🏽❤️‍🔥"


async def test_slack_empty_mention_huge_message_and_emoji_only(kb_runtime, fake_slack):  # noqa: F811
    async with slack_app(kb_runtime, fake_slack) as slack:
        empty = (await slack.send(slack.mention("")))["event"]
        huge = (await slack.send(slack.mention("Why does the motor overheat? " * 1725)))["event"]  # 50,024 characters once trimmed
        emoji = (await slack.send(slack.mention(EMOJI)))["event"]
        fine = (await slack.send(slack.mention(QUESTION)))["event"]
    assert slack.thread(empty)[0].body.startswith("⚠️ Please type a question")
    assert slack.thread(huge)[0].body.startswith("⚠️ That message is too long (50024 characters; the limit is 4000)")
    [reply] = slack.thread(emoji)
    assert reply.body and not reply.streaming
    emoji_turn = next(t for t in slack.turns if t.inquiry.text.strip() == EMOJI)
    assert emoji_turn.answer.outcome in (Outcome.NOT_FOUND, Outcome.OFF_TOPIC, Outcome.ERROR)
    assert "Traceback" not in reply.body
    assert slack.thread(fine)[0].body == slack.turns[-1].answer.text
    assert slack.turns[-1].answer.outcome is Outcome.ANSWERED


async def test_telegram_huge_message_and_emoji_only(kb_runtime, fake_tg):  # noqa: F811
    async with telegram_bot(kb_runtime, fake_tg) as tg:
        await tg.send(message_update("电机过热怎么办？" * 6250))  # 50,000 characters
        await tg.send(message_update(EMOJI))
        await tg.send(message_update(QUESTION))
    texts = [m.text for m in fake_tg.chat(7001)]
    assert len(texts) == 3, texts
    assert texts[0].startswith("⚠️ 消息太长（50000 个字符，上限为 4000）")
    assert texts[1] and "Traceback" not in texts[1]
    assert tg.turns[-1].answer.outcome is Outcome.ANSWERED
