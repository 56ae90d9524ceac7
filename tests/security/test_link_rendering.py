"""Links the renderers make (issue 26, finding 2): spellings of a link that a pattern missed but
markdown-it (how the API's chat clients and Slack read Markdown) and Telegram's renderer
(``telegramify_markdown``) turn into links. What is judged is what they render."""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from adapters.telegram.text import render
from bot.types import Inquiry, Outcome
from pipelines.text import restrict_links, web_link_host
from tests.replies import RecordingReply

ALLOWED = {"docs.example.com"}

#: (attack, text that must stay): each renders as a link (or a written-out URL) to evil.example.
ATTACKS = [
    ("[b](<https://evil.example/a b>)", "b"),
    ("[c](https&#58;//evil.example/x)", "c"),
    ("[d](https:\\/\\/evil.example/x)", "d"),
    ("[e](//evil.example/x)", "e"),
    ("See the manual [1].\n\n[1]: <https://evil.example/a b>", "See the manual [1]."),
    ("Open [the portal][p].\n\n[p]: https://evil.example/login", "Open [the portal][p]."),
    ("[f](javascript:alert(document.cookie))", "f"),
    ("[g](https://evil.example\\\\@docs.example.com/)", "g"),  # a browser's host: evil.example
    ("[h](https://docs.example.com@evil.example/)", "h"),
    ("[i](HTTPS://EVIL.EXAMPLE/x 'title')", "i"),
    ("![pixel](https://evil.example/p.png) grease", "pixel grease"),
    ("Log in (https://evil.example/login) first.", "Log in ("),
    ("Log in at https&#58;//evil.example/login first.", ""),
    ("Log in at https:\\/\\/evil.example/login first.", ""),
    ("<a href=\"https&#x3a;//evil.example/\">portal</a>", ""),
    ("- step one\n- open [portal](<https://evil.example/a b>)\n- step three", "- step one\n- open portal"),
]


def markdown_it_links(text: str) -> list[str]:
    """The href and src of every link and image markdown-it renders (as a chat client would)."""
    rendered = MarkdownIt("commonmark").render(text)
    return re.findall(r"(?:href|src)=\"([^\"]*)\"", rendered)


def telegram_links(text: str) -> list[str]:
    rendered = render(text)
    urls = [e["url"] for e in rendered.entities if e["type"] == "text_link"]
    # Telegram's clients link a URL written out in plain text as well.
    return urls + re.findall(r"(?:https?://|www\.)\S+", rendered.text, re.I)


@pytest.mark.parametrize("attack, kept", ATTACKS, ids=[a[:40] for a, _ in ATTACKS])
def test_every_link_a_renderer_makes_to_another_host_is_removed(attack: str, kept: str):
    assert any("evil.example" in u.lower() for u in markdown_it_links(attack) + telegram_links(attack)) or \
        "javascript:" in attack, "the attack renders as a link"
    cleaned, removed = restrict_links(attack, ALLOWED)
    assert "evil.example" not in cleaned.lower(), cleaned
    assert removed, "the removal is reported"
    for url in markdown_it_links(cleaned) + telegram_links(cleaned):
        assert web_link_host(url) in ALLOWED, (url, cleaned)
    assert cleaned.startswith(kept), cleaned


def test_links_to_the_sources_hosts_and_ordinary_text_stay_as_written():
    text = ("Grease the bearings every 3,000 h [1]. See [the manual](https://docs.example.com/m.pdf \"Manual\"), "
            "<https://docs.example.com/x>, https://docs.example.com/a_(b) and [§3][m] [2].\n\n"
            "- torque < 40 Nm, R&D sign-off\n- `curl -s https://docs.example.com/api`\n\n"
            "| code | meaning |\n| --- | --- |\n| E-004 | [overheat](https://DOCS.example.com/e004) |\n\n"
            "[m]: https://docs.example.com/manual#s3")
    cleaned, removed = restrict_links(text, ALLOWED)
    assert (cleaned, removed) == (text, [])


def test_slack_mentions_are_left_to_the_adapters_and_an_e_mail_address_stays_as_text():
    mentions = "Ask <!here>, <@U0BOSS> in <#C0MAINT|maintenance> or <!subteam^S0TEAM|@maintenance>."
    assert restrict_links(mentions, ALLOWED) == (mentions, [])
    cleaned, removed = restrict_links("Write to <service@evil.example>.", ALLOWED)
    assert (cleaned, removed) == ("Write to service@evil.example.", ["mailto:service@evil.example"])
    assert markdown_it_links(cleaned) == []


def test_the_telegram_renderer_refuses_links_that_are_no_web_address():
    rendered = render("[a](javascript:alert(1)) [b](//evil.example/x) [c](manual.pdf) [d](mailto:x@evil.example) "
                      "[ok](https://docs.example.com/m)")
    links = [e["url"] for e in rendered.entities if e["type"] == "text_link"]
    assert links == ["https://docs.example.com/m"]
    assert rendered.text == "a b c d ok"


@pytest.mark.parametrize("url, host", [
    ("https://docs.example.com/x", "docs.example.com"), ("HTTP://Docs.Example.COM.:8080/x", "docs.example.com"),
    ("\t https://docs.exa\nmple.com/x", "docs.example.com"), ("https://[::1]:8080/", "::1"),
    ("//docs.example.com/x", None), ("javascript:alert(1)", None), ("/relative", None),
    ("https://docs.example.com@evil.example/", None), ("https://evil.example\\@docs.example.com/", None),
    ("https://docs.example.com%2F@evil.example/", None), ("https:/docs.example.com", None),
    ("https://", None), ("mailto:a@docs.example.com", None), ("data:text/html,<b>x</b>", None),
])
def test_the_host_a_link_leads_to(url: str, host: str | None):
    assert web_link_host(url) == host


async def test_a_model_answer_with_the_spellings_is_posted_without_them(claude):
    fake, runtime = claude
    fake.enqueue("Regrease the bearings every 3,000 operating hours [1]. Book a service at "
                 "[our portal](<https://evil.example/book now>) or [the shop](https&#58;//evil.example/pay), "
                 "see [the form](https:\\/\\/evil.example/f) and [the terms][t].\n\n[t]: //evil.example/t")
    inquiry = Inquiry("api", "default", "default", "api:default:links2", "u1", "How often should the bearings be greased?")
    reply = RecordingReply()
    answer = await runtime.answerer.answer(inquiry, reply)
    assert answer.outcome is Outcome.ANSWERED, answer.text
    assert "evil.example" not in answer.text, answer.text
    assert markdown_it_links(answer.text) == [] and telegram_links(answer.text) == []
    assert "our portal" in answer.text and "the shop" in answer.text and "the terms" in answer.text
