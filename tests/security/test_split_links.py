"""Issue 39, finding 6: the link filter ran on each streamed line alone, so a link whose address starts on
the next line (``[shop](⏎//evil.example/pay)``, ``<a href="https:⏎//evil.example/pay">``; browsers drop the
newline) reached the API's deltas and the final text. What shows is now judged as a renderer reads the
whole text shown so far; and URLs in every attribute a browser loads or follows count, not only ``href``."""

from __future__ import annotations

import json

import pytest

from pipelines.grounding import SentenceGate, SupportCheck
from pipelines.text import restrict_links
from tests.fakes.anthropic_server import Script
from tests.fakes.telegram_server import message_update
from tests.security.test_link_rendering import markdown_it_links, telegram_links
from tests.test_grounding import SCHEDULE, tokens
from tests.test_http_api import TOKEN, api_server, with_token
from tests.test_slack import fake_slack, slack_app  # noqa: F401 - fake_slack is a fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fake_tg is a fixture

ALLOWED = {"docs.example.com"}
# Words of the maintenance schedule (SCHEDULE, and source 1 of QUESTION), so that every sentence is shown.
TAIL = "before applying the grease gun, wipe the grease nipple clean with the motor running"

#: (a model's answer, text that must stay): each has a link whose address is on another line than its start.
SPLIT = [
    ("Regrease with the motor running from the [parts desk](\n//evil.example/pay) " + TAIL + ".\n"
     "Wipe the grease nipple clean [1].", "parts desk"),
    ("Regrease with the motor running [1] from the [parts desk](\n//evil.example/pay) " + TAIL + " [1].",
     "parts desk"),
    ("Regrease with the motor running at the <a href=\"https:\n//evil.example/pay\">grease desk</a> " + TAIL + " [1].\n"
     "Wipe the grease nipple clean [1].", "Wipe the grease nipple clean"),
    ("Regrease with the motor running [1] at the <img\nsrc=\"https://evil.example/p.png\"> grease desk, " + TAIL + " [1].",
     "Regrease with the motor running"),
    ("Regrease with the motor running [1], see the [grease\ngun](//evil.example/pay) " + TAIL + " [1].",
     "Regrease with the motor running"),
    # Links whose start the gate does not see as open: the whole text shown decides.
    ("Regrease with the motor running [1], see [the [1] grease\ngun](//evil.example/pay) " + TAIL + " [1].",
     "Regrease with the motor running"),
    ("Regrease with the motor running, if it is safe to do so, so that the grease is distributed evenly [1], at "
     "the <a title=\"a>b\" href=\"https:\n//evil.example/pay\">grease desk</a> "
     + TAIL + " [1].\nWipe the grease nipple clean [1].", "Wipe the grease nipple clean"),
    ("Wipe the grease nipple clean [1]. Regrease with the motor running, see [the grease gun][g] [1].\n\n"
     "[g]:\n//evil.example/pay\n\nThe grease is distributed evenly [1].", "the grease gun"),
]


def links_in(text: str) -> list[str]:
    return [u for u in markdown_it_links(text) + telegram_links(text) if "evil.example" in u.lower()]


@pytest.mark.parametrize("answer, kept", SPLIT, ids=[a[40:75] for a, _ in SPLIT])
def test_a_link_split_across_lines_never_shows_while_streaming(answer: str, kept: str):
    assert links_in(answer.replace("\n//", "//").replace("<img\n", "<img ").replace("grease\ngun", "grease gun")) \
        or links_in(answer), "the attack renders as a link"
    gate = SentenceGate(SupportCheck([SCHEDULE]), allowed_hosts=ALLOWED)
    shown = ""
    for delta in [gate.feed(t) for t in tokens(answer)] + [gate.close()]:
        shown += delta
        assert "evil.example" not in shown, shown  # at no moment, as text or as a link
        assert links_in(shown) == []
    assert gate.text == shown
    assert kept in shown, shown
    assert gate.stats.links_removed


#: URL-carrying attributes besides href and src, with addresses the written-out-URL pattern does not see.
ATTRIBUTES = [
    '<object data="//evil.example/x.swf"></object>',
    '<video poster="//evil.example/p.png"></video>',
    '<embed src="//evil.example/x">',
    '<iframe src="//evil.example/x"></iframe>',
    '<form action="//evil.example/pay"><button>Pay</button></form>',
    '<form><button formaction="//evil.example/pay">Pay</button></form>',
    '<img srcset="https://docs.example.com/a.png 1x, //evil.example/b.png 2x">',
    '<picture><source srcset="//evil.example/b.png"><img src="https://docs.example.com/a.png"></picture>',
    '<link rel="stylesheet" href="//evil.example/s.css">',
    '<map><area shape="rect" coords="0,0,9,9" href="//evil.example/pay"></map>',
    '<table background="//evil.example/bg.png"><tr><td>x</td></tr></table>',
    '<svg><a xlink:href="//evil.example/pay"><text>x</text></a></svg>',
    '<meta http-equiv="refresh" content="0; url=//evil.example/pay">',
    '<div style="background-image: url(//evil.example/p.png)">x</div>',
    '<blockquote cite="//evil.example/q">x</blockquote>',
    '<svg><a><set attributeName="href" to="//evil.example/pay"/><text>x</text></a></svg>',
]


@pytest.mark.parametrize("markup", ATTRIBUTES, ids=[m[:30] for m in ATTRIBUTES])
@pytest.mark.parametrize("place", ["inline", "block"])
def test_every_url_carrying_attribute_is_judged(markup: str, place: str):
    text = f"Grease the bearings {markup} every 4,000 hours." if place == "inline" else f"{markup}\n\nGrease the bearings."
    cleaned, removed = restrict_links(text, ALLOWED)
    assert "evil.example" not in cleaned, cleaned
    assert removed


def test_allowed_attributes_and_ordinary_text_stay():
    for text in ('See <img srcset="https://docs.example.com/a.png 1x, https://docs.example.com/b.png 2x"> here.',
                 '<a href="https://docs.example.com/manual" title="the manual">manual</a> [1]',
                 "Keep the torque < 40 Nm and the class=\"B\" insulation [1].",
                 "Set P00.14 & check data=5 [1]."):
        assert restrict_links(text, ALLOWED) == (text, [])


QUESTION = "How often should the bearings be greased?"
# Every word of it but the links is the maintenance schedule's (source 1 of this question).
PLANTED = ("In short: grease HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease "
           "from the [parts desk](\n//evil.example/pay) before applying the grease gun, wipe the grease nipple clean [1].\n"
           "Regrease at the <a href=\"https:\n//evil.example/pay\">grease desk</a> with the motor running, "
           "if it is safe to do so, so that the grease is distributed evenly [1].\n"
           "Wipe the grease nipple clean before applying the grease gun [1].")


async def test_no_delta_or_final_text_of_the_api_carries_a_split_link(claude):
    model, runtime = claude
    model.responder = lambda req: Script(PLANTED, tokens_per_second=300)
    async with api_server(with_token(runtime)) as api:
        events = await api.ask({"question": QUESTION, "conversation": "split-links"})
        stream = await api.openai(TOKEN).chat.completions.create(
            model="kbbot", stream=True, user="split-links2", messages=[{"role": "user", "content": QUESTION}])
        chunks = [chunk async for chunk in stream]
    deltas = "".join(p["text"] for name, p in events if name == "delta")
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    for text in (deltas, streamed, events[-2][1]["answer"]):
        assert "evil.example" not in text, text
        assert links_in(text) == []
        assert "grease nipple" in text and "parts desk" in text  # the rest of the answer is there


async def test_slack_and_telegram_never_show_a_split_link(claude, fake_slack, fake_tg):
    model, runtime = claude
    model.responder = lambda req: Script(PLANTED, tokens_per_second=300)
    async with slack_app(runtime, fake_slack) as slack:
        mention = (await slack.send(slack.mention(QUESTION)))["event"]
    assert "evil.example" not in " ".join(c.text_sent for c in fake_slack.calls)
    [message] = slack.thread(mention)
    assert "grease nipple" in message.body and "parts desk" in message.body
    async with telegram_bot(runtime, fake_tg) as tg:
        await tg.send(message_update(QUESTION))
        tg.only_turn()
    for call in fake_tg.calls:
        assert "evil.example" not in json.dumps(call.args)
