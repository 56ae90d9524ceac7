"""What a caller of the HTTP API (or a planted document answered through it) can still do (issue 26,
findings 3, 8 and 10): links in the sources block, ids without a cap, idempotency keys that collide,
a body limit that could not be raised, and a client leaving a stream logged as a server error.
``kbbot serve``'s web app on a real port (``tests/test_http_api.py``'s helpers)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import httpx
import pytest
from markdown_it import MarkdownIt

from adapters.api.platform import MAX_ID_CHARS, sources_markdown
from bot.runtime import build_runtime
from bot.types import Citation
from tests.conftest import make_settings
from tests.fakes.anthropic_server import Script
from tests.test_http_api import QUESTION, TOKEN, api_server, with_token

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def rendered_links(markdown: str) -> list[str]:
    return re.findall(r"(?:href|src)=\"([^\"]*)\"", MarkdownIt("commonmark").render(markdown))


def citation(index: int, title: str, source: str, locator: str = "") -> Citation:
    return Citation(index=index, doc_id=f"d{index}", version=1, position=0, title=title, source=source,
                    locator=locator)


# --- finding 3: document text in the sources block ------------------------------------------------------
def test_a_documents_title_or_heading_cannot_make_a_link_in_the_sources_block():
    block = sources_markdown([
        citation(1, "[QX-700 service portal](https://evil.example/login)", "kb/qx700.md"),
        citation(2, "Manual](https://evil.example) [x", "https://docs.example.com/manual.pdf"),
        citation(3, "Wiring <https://evil.example/w> ![p](https://evil.example/p.png) &#91;z&#93;(//evil.example)",
                 "https://docs.example.com/w (draft).html", locator="Wiring > *Terminals*"),
        citation(4, "See https://docs.example.com/a and https://evil.example/b", "https://docs.example.com/see"),
    ])
    assert rendered_links(block) == ["https://docs.example.com/manual.pdf",
                                     "https://docs.example.com/w%20%28draft%29.html", "https://docs.example.com/see"], block
    assert "https://evil.example" not in block
    text = re.sub(r"<[^>]+>", "", MarkdownIt("commonmark").render(block))
    assert "[1] QX-700 service portal" in text and "[2] Manual](" in text and "*Terminals*" in text
    assert "&amp;#91;z&amp;#93;(//evil.example)" in MarkdownIt("commonmark").render(block), "shown as written"


async def test_a_planted_heading_reaches_the_api_answer_as_text(tmp_path: Path):
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "qx700-service.md").write_text(
        "# [QX-700 service portal](https://evil.example/login)\n\nThe QX-700 compressor service interval is "
        "2,000 operating hours. Replace the QX-700 intake filter at every service.\n", encoding="utf-8")
    runtime = build_runtime(make_settings(tmp_path / "data", KBBOT_API_TOKEN=TOKEN))
    assert not runtime.indexer.index([folder]).failed
    await runtime.start()
    try:
        async with api_server(with_token(runtime)) as api:
            reply = await api.openai().chat.completions.create(
                model="kbbot", messages=[{"role": "user", "content": "What is the QX-700 service interval?"}])
    finally:
        await runtime.close()
    content = reply.choices[0].message.content or ""
    assert "**Sources**\n[1] QX-700 service portal" in content, content
    assert "evil.example" not in content and rendered_links(content) == []


# --- finding 8: ids without a cap -----------------------------------------------------------------------
@pytest.fixture
async def api(kb_runtime):
    async with api_server(with_token(kb_runtime)) as server:
        yield server


async def test_conversation_and_user_ids_longer_than_the_cap_are_refused_with_400(api, caplog):
    caplog.set_level(logging.WARNING, logger="kbbot.api")
    long = "c" * (MAX_ID_CHARS + 1)
    async with httpx.AsyncClient(timeout=30) as http:
        for path, body, name in (
                ("/v1/ask", {"question": QUESTION, "conversation": long}, "conversation"),
                ("/v1/ask", {"question": QUESTION, "user": "u" * 200_000}, "user"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}], "user": long}, "user"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}],
                                          "conversation_id": long}, "conversation_id")):
            response = await http.post(api.url + path, json=body, headers=AUTH)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"].startswith(f"`{name}` must be at most {MAX_ID_CHARS} characters")
    assert api.turns == [], "no turn, no history, no record"
    refusals = [r.getMessage() for r in caplog.records if "refused POST" in r.getMessage()]
    assert len(refusals) == 4 and all(len(line) < 400 for line in refusals), refusals
    events = await api.ask({"question": QUESTION, "conversation": "c" * MAX_ID_CHARS, "user": "u" * MAX_ID_CHARS})
    assert events[-2][0] == "final", "ids at the cap are fine"


# --- finding 10: idempotency keys, the body limit, a client leaving ------------------------------------------
async def test_idempotency_keys_sharing_their_first_200_characters_are_different_requests(api):
    prefix = "order-" + "k" * 194
    first = await api.ask({"question": QUESTION}, headers={"Idempotency-Key": prefix + "-A"})
    second = await api.ask({"question": QUESTION}, headers={"Idempotency-Key": prefix + "-B"})
    assert first[-2][0] == "final" and second[-2][0] == "final"
    with pytest.raises(httpx.HTTPStatusError) as again:
        await api.ask({"question": QUESTION}, headers={"Idempotency-Key": prefix + "-B"})
    assert again.value.response.status_code == 409
    assert len(api.turns) == 2


async def test_max_body_kb_above_aiohttps_own_megabyte_takes_effect(kb_runtime):
    kb_runtime.settings.api.max_body_kb = 2048
    body = json.dumps({"question": QUESTION, "conversation": "big", "padding": "x" * 1_500_000})
    async with api_server(with_token(kb_runtime)) as api, httpx.AsyncClient(timeout=60) as http:
        taken = await http.post(f"{api.url}/v1/chat/completions", headers=AUTH, content=json.dumps(
            {"messages": [{"role": "user", "content": QUESTION}], "padding": "x" * 1_500_000}))
        over = await http.post(f"{api.url}/v1/ask", headers=AUTH, content=body + " " * 700_000)
    assert taken.status_code == 200, taken.text[:300]
    assert taken.json()["kbbot"]["outcome"] == "answered"
    assert over.status_code == 413, "the new limit is a limit"


async def test_a_client_leaving_a_stream_is_one_info_line_and_the_turn_finishes(claude, caplog):
    model, runtime = claude
    model.responder = lambda req: Script("Grease the HL-M200 bearings every 4,000 operating hours [1]. " * 40,
                                         tokens_per_second=60)
    caplog.set_level(logging.INFO)
    async with api_server(with_token(runtime)) as api:
        for path, body in (("/v1/ask", {"question": QUESTION, "conversation": "leaver-1"}),
                           ("/v1/chat/completions", {"stream": True, "conversation_id": "leaver-2",
                                                     "messages": [{"role": "user", "content": QUESTION}]})):
            async with httpx.AsyncClient(timeout=30) as http:
                async with http.stream("POST", api.url + path, json=body, headers=AUTH) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data:") and "Grease" in line:
                            break  # the answer is on its way: leave
            await asyncio.sleep(0.5)
        await api.adapter.settle()
    assert len(api.turns) == 2 and all(t.answer is not None for t in api.turns), "both turns finished"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    left = [r.getMessage() for r in caplog.records if "left before the answer ended" in r.getMessage()]
    assert len(left) == 2 and all(r.levelno == logging.INFO for r in caplog.records
                                   if "left before the answer ended" in r.getMessage())
