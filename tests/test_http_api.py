"""The HTTP API end to end: ``kbbot serve``'s web app on a real port, the real ``openai`` client and an
SSE client (httpx-sse) against it, the turn on the indexed sample knowledge base (extractive, or the
fake Anthropic model for streamed answers)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from httpx_sse import aconnect_sse

from adapters.api.platform import HttpApi
from adapters.platforms import build_platforms
from adapters.server import build_web_app
from bot.conversation import HandledTurn
from bot.runtime import Runtime, build_runtime
from bot.settings import SettingsError
from tests.conftest import make_settings
from tests.fakes.anthropic_server import Script

TOKEN = "kbbot-test-token-0123456789"
QUESTION = "How often should the bearings be greased?"
# Three sentences of the maintenance schedule (source 1 of QUESTION): the gate shows what sources hold.
STREAMED = ("Grease HL-M200 bearings every **4,000 operating hours** with 15 g of lithium-complex grease [1]. "
            "Wipe the grease nipple clean before applying the grease gun [1]. "
            "Do not mix greases with different thickeners [1].")


class Api:
    def __init__(self, url: str, adapter: HttpApi, turns: list[HandledTurn]):
        self.url = url
        self.adapter = adapter
        self.turns = turns

    def openai(self, token: str = TOKEN) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=token, max_retries=0)

    async def ask(self, body: dict[str, Any], token: str = TOKEN,
                  headers: dict[str, str] | None = None) -> list[tuple[str, Any]]:
        """The events of one ``/v1/ask``, parsed."""
        async with httpx.AsyncClient(timeout=60) as client:
            async with aconnect_sse(client, "POST", f"{self.url}/v1/ask", json=body,
                                    headers={"Authorization": f"Bearer {token}", **(headers or {})}) as source:
                source.response.raise_for_status()
                return [(e.event, json.loads(e.data)) async for e in source.aiter_sse()]


@contextlib.asynccontextmanager
async def api_server(runtime: Runtime) -> AsyncIterator[Api]:
    turns: list[HandledTurn] = []
    adapter = HttpApi(runtime.conversations(on_turn=turns.append), runtime.settings.api)
    runner = web.AppRunner(build_web_app([adapter], runtime), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Api(f"http://127.0.0.1:{runner.addresses[0][1]}", adapter, turns)
    finally:
        await adapter.stop(10)
        await runner.cleanup()


def with_token(runtime: Runtime, **env: str) -> Runtime:
    runtime.settings.api.default_token = TOKEN  # what KBBOT_API_TOKEN sets
    runtime.settings.api.resolve_callers(env)
    return runtime


@pytest.fixture
async def api(kb_runtime: Runtime) -> AsyncIterator[Api]:
    async with api_server(with_token(kb_runtime)) as server:
        yield server


async def test_ask_streams_ready_progress_deltas_and_the_final_answer_then_closes(claude):
    model, runtime = claude
    model.responder = lambda req: Script(STREAMED, tokens_per_second=80)
    async with api_server(with_token(runtime)) as api:
        events = await api.ask({"question": QUESTION, "conversation": "c-1", "user": "alice"})
    names = [name for name, _ in events]
    assert names[0] == "ready" and events[0][1] == {"conversation": "c-1"}
    assert names[-2:] == ["final", "__close__"] and "error" not in names
    stages = [payload["stage"] for name, payload in events if name == "progress"]
    assert {"retrieve", "rank", "generate"} <= set(stages), stages
    assert names.index("progress") < names.index("delta") < names.index("final")
    streamed = "".join(payload["text"] for name, payload in events if name == "delta")
    assert len([n for n in names if n == "delta"]) >= 3, "the answer arrives in pieces"
    final = events[-2][1]
    assert final["outcome"] == "answered" and re.fullmatch(r"[0-9a-f]{32}", final["turn_id"])
    assert final["conversation"] == "c-1" and "4,000 operating hours" in final["answer"]
    assert flat(streamed) == flat(final["answer"])
    assert final["citations"] and final["citations"][0]["title"]
    [turn] = api.turns
    assert turn.inquiry.thread_key == "api:default:c-1" and turn.inquiry.user_id == "alice"
    assert turn.answer is not None and turn.answer.trace.turn_id == final["turn_id"]


def flat(text: str) -> str:
    return "".join(text.split())


async def test_the_openai_client_gets_answers_with_sources_and_the_thread_is_kept_by_user(api):
    client = api.openai()
    models = await client.models.list()
    assert [m.id for m in models.data] == ["kbbot"]

    first = await client.chat.completions.create(model="kbbot", user="bob",
                                                 messages=[{"role": "user", "content": QUESTION}])
    content = first.choices[0].message.content or ""
    assert first.choices[0].finish_reason == "stop" and first.object == "chat.completion"
    assert "**Sources**\n[1] " in content
    assert first.model_extra["kbbot"]["outcome"] == "answered"

    stream = await client.chat.completions.create(
        model="kbbot", user="bob", stream=True,
        messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": content},
                  {"role": "user", "content": "And what grease should I use?"}])
    chunks = [chunk async for chunk in stream]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "stop"
    assert "**Sources**" in streamed
    assert {c.id for c in chunks} == {chunks[0].id}
    # kbbot keeps the thread: the follow-up saw the first turn, whoever the client sent as messages.
    first_turn, follow_up = api.turns
    assert first_turn.inquiry.thread_key == follow_up.inquiry.thread_key == "api:default:bob"
    assert first_turn.answer.trace.history_turns == 0 and follow_up.answer.trace.history_turns == 1
    assert follow_up.inquiry.text == "And what grease should I use?"

    other = await client.chat.completions.create(model="kbbot", messages=[{"role": "user", "content": QUESTION}])
    assert other.model_extra["kbbot"]["conversation"] != "bob" and api.turns[-1].answer.trace.history_turns == 0


async def test_tokens_are_required_and_each_caller_searches_its_own_spaces(kb_runtime, monkeypatch):
    kb_runtime.settings.api.tokens = [{"name": "partners", "token_env": "PARTNER_TOKEN", "spaces": ["public"]}]
    async with api_server(with_token(kb_runtime, PARTNER_TOKEN="partner-secret-1")) as api:
        for token in ("", "wrong"):
            with pytest.raises(openai.AuthenticationError) as refused:
                await api.openai(token or "x").chat.completions.create(
                    model="kbbot", messages=[{"role": "user", "content": QUESTION}],
                    extra_headers={"Authorization": f"Bearer {token}" if token else ""})
            assert "valid API token" in str(refused.value)
        async with httpx.AsyncClient() as client:
            plain = await client.post(f"{api.url}/v1/ask", json={"question": QUESTION})
            assert plain.status_code == 401 and plain.headers["WWW-Authenticate"] == "Bearer"
        assert api.turns == []

        await api.openai("partner-secret-1").chat.completions.create(
            model="kbbot", messages=[{"role": "user", "content": QUESTION}], user="p1")
        await api.ask({"question": QUESTION})
    partner, default = api.turns
    assert partner.inquiry.spaces == ("public",) and partner.inquiry.tenant == "partners"
    assert partner.inquiry.thread_key == "api:partners:p1"
    assert default.inquiry.spaces == ("default",) and default.inquiry.tenant == "default"


async def test_an_idempotency_key_is_answered_once(api):
    headers = {"Idempotency-Key": "retry-me-1"}
    events = await api.ask({"question": QUESTION}, headers=headers)
    assert events[-2][0] == "final"
    with pytest.raises(httpx.HTTPStatusError) as again:
        await api.ask({"question": QUESTION}, headers=headers)
    assert again.value.response.status_code == 409
    with pytest.raises(openai.ConflictError, match="already answered"):
        await api.openai().chat.completions.create(model="kbbot", messages=[{"role": "user", "content": QUESTION}],
                                                   extra_headers=headers)
    assert len(api.turns) == 1


async def test_bad_requests_get_a_clear_error_and_start_no_turn(api):
    client = api.openai()
    with pytest.raises(openai.BadRequestError, match="must end with a user message"):
        await client.chat.completions.create(model="kbbot", messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="has no text"):
        await client.chat.completions.create(model="kbbot", messages=[{"role": "user", "content": "  "}])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient() as http:
        for body, status, words in ((b"{not json", 400, "JSON object"), (b"[1]", 400, "JSON object"),
                                    (json.dumps({"question": 3}).encode(), 400, "`question` must be"),
                                    (json.dumps({"question": "x" * 300_000}).encode(), 413, "larger than 256 KiB")):
            response = await http.post(f"{api.url}/v1/ask", content=body, headers=auth)
            assert response.status_code == status and words in response.json()["error"]["message"], response.text
    assert api.turns == []


async def test_rate_limits_and_caps_apply_as_on_every_platform(kb_data_dir: Path, tmp_path: Path):
    settings = make_settings(kb_data_dir, KBBOT_API_TOKEN=TOKEN)
    settings.limits.per_user = 1
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path
    await runtime.start()
    try:
        async with api_server(runtime) as api:
            first = await api.ask({"question": QUESTION, "user": "carol"})
            refused = await api.ask({"question": QUESTION, "user": "carol"})
            long = await api.openai().chat.completions.create(
                model="kbbot", user="dave", messages=[{"role": "user", "content": "why? " * 2000}])
    finally:
        await runtime.close()
    assert first[-2][0] == "final"
    assert [name for name, _ in refused] == ["ready", "error", "__close__"]
    assert "faster than I can answer (1 questions per" in refused[1][1]["message"]
    assert long.model_extra["kbbot"]["outcome"] == "error"
    assert "too long" in (long.choices[0].message.content or "")


@pytest.mark.parametrize(("tokens", "env", "message"), [
    ("{name: a, token: t1, token_env: A_TOKEN}", {},
     "api.tokens[0] needs exactly one of token (the value) or token_env (the variable holding it)"),
    ("{name: a, token_env: A_TOKEN, space: [x]}", {"A_TOKEN": "t"},  # a typo: "space"
     "unknown setting api.tokens[0].space (did you mean spaces?)"),
    ("{name: a, token_env: A_TOKEN}", {}, "api.tokens[0]: the environment variable A_TOKEN is not set"),
    ("{name: a, token_env: A_TOKEN, spaces: []}", {"A_TOKEN": "t"}, "api.tokens[0].spaces must have at least 1 item"),
    ("{name: default, token_env: A_TOKEN}", {"A_TOKEN": "t", "KBBOT_API_TOKEN": "u"},
     "api.tokens: each caller needs a name of its own (KBBOT_API_TOKEN's is `default`)"),
    ("{name: a, token_env: A_TOKEN}", {"A_TOKEN": "t", "KBBOT_API_TOKEN": "t"}, "api.tokens: two callers share a token"),
])
def test_api_tokens_are_checked_naming_the_key_and_the_fix(tmp_path, tokens: str, env: dict[str, str], message: str):
    config = tmp_path / "kbbot.yaml"
    config.write_text(f"api:\n  tokens:\n    - {tokens}\n", encoding="utf-8")
    with pytest.raises(SettingsError) as refused:
        make_settings_from(config, **env)
    assert message in str(refused.value)


def make_settings_from(config: Path, **env: str) -> Any:
    from adapters.platforms import load_settings

    return load_settings(config, env={"KBBOT_DATA_DIR": str(config.parent), **env})


async def test_serve_offers_the_api_when_a_token_is_set(kb_runtime):
    assert "api" not in build_platforms(kb_runtime, kb_runtime.conversations())
    with_token(kb_runtime)
    adapter = build_platforms(kb_runtime, kb_runtime.conversations())["api"]
    assert isinstance(adapter, HttpApi)
    assert adapter.health() == {"callers": 1, "turns_in_progress": 0}
