"""Issue 26, finding 1: links in a model's answer were filtered in the final text only, so the streamed
deltas of /v1/chat/completions (stream: true) and /v1/ask, and the Slack and Telegram previews, carried
them. What streams now passes the sentence gate (pipelines/grounding.py), which filters each sentence
before it shows: the streamed text and the final text are the same, cleaned, text."""

from __future__ import annotations

import json

from tests.fakes.anthropic_server import Script
from tests.fakes.telegram_server import message_update
from tests.test_http_api import TOKEN, api_server, with_token
from tests.test_slack import fake_slack, slack_app  # noqa: F401 - fake_slack is a fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fake_tg is a fixture

QUESTION = "How often should the bearings be greased?"
# Every word of it but the links is the maintenance schedule's (source 1 of this question).
PLANTED = ("In short: grease HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease, "
           "order it at [our shop](https://evil.example/pay) or https://evil.example/login [1]. "
           "Wipe the grease nipple clean before applying the grease gun [1].")


def planted(req: dict) -> Script:
    return Script(PLANTED, tokens_per_second=300)


async def test_no_streamed_delta_of_the_api_carries_a_planted_link(claude):
    model, runtime = claude
    model.responder = planted
    async with api_server(with_token(runtime)) as api:
        events = await api.ask({"question": QUESTION, "conversation": "links"})
        stream = await api.openai(TOKEN).chat.completions.create(
            model="kbbot", stream=True, user="links2", messages=[{"role": "user", "content": QUESTION}])
        chunks = [chunk async for chunk in stream]
    deltas = "".join(p["text"] for name, p in events if name == "delta")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    for text in (deltas, streamed, events[-2][1]["answer"]):
        assert "evil.example" not in text
        assert "grease nipple" in text  # the rest of the answer is there
    assert "our shop" in deltas  # a link's text stays, without its address


async def test_slack_and_telegram_previews_never_carry_a_planted_link(claude, fake_slack, fake_tg):
    model, runtime = claude
    model.responder = planted
    async with slack_app(runtime, fake_slack) as slack:
        mention = (await slack.send(slack.mention(QUESTION)))["event"]
    assert "evil.example" not in " ".join(c.text_sent for c in fake_slack.calls)
    [message] = slack.thread(mention)
    assert "grease nipple" in message.body
    async with telegram_bot(runtime, fake_tg) as tg:
        await tg.send(message_update(QUESTION))
        tg.only_turn()
    for call in fake_tg.calls:
        assert "evil.example" not in json.dumps(call.args)
