"""The fake Anthropic server must fool the real clients, or tests built on it prove nothing.

Everything here goes through the real ``anthropic`` SDK or haystack's ``AnthropicChatGenerator``; the exception
types asserted are the ones those libraries really raise, so bot code can be written against them.
"""

from __future__ import annotations

import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import anthropic
import httpx2
import pytest
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack_integrations.components.generators.anthropic import AnthropicChatGenerator

from tests.fakes.anthropic_server import FakeAnthropic, Script, tokenize

MODEL = "claude-test"
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        yield server


@pytest.fixture
def thread_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic().run_in_thread() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        yield server


@pytest.fixture
async def aclient(fake: FakeAnthropic) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(max_retries=0, timeout=5)
    yield client
    await client.close()


@pytest.fixture
def client(thread_fake: FakeAnthropic) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(max_retries=0, timeout=5) as sync_client:
        yield sync_client


def generator() -> AnthropicChatGenerator:
    return AnthropicChatGenerator(model=MODEL, generation_kwargs={"max_tokens": 256}, timeout=5, max_retries=0)


# --------------------------------------------------------------------------- tokenisation


@pytest.mark.parametrize(
    "text",
    ["Hello, world!", "  leading and trailing  ", "line one\nline two\n\n", "混合 text 日本語のテキスト。 done", ""],
)
def test_tokenize_round_trips(text: str) -> None:
    assert "".join(tokenize(text)) == text


def test_tokenize_sizes() -> None:
    assert tokenize("Hello big world") == ["Hello ", "big ", "world"]
    cjk = tokenize("你好世界和平")
    assert cjk == ["你好", "世界", "和平"]
    assert all(1 <= len(piece.strip()) <= 2 for piece in tokenize("日本語のテキスト"))


# --------------------------------------------------------------------------- SDK, non-streaming


async def test_non_streaming_reply(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("The pump is rated 3 kW.")
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert message.content[0].type == "text"
    assert message.content[0].text == "The pump is rated 3 kW."
    assert message.role == "assistant"
    assert message.model == MODEL
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == len(tokenize("The pump is rated 3 kW."))
    assert message.usage.input_tokens > 0


async def test_default_responder_echoes_last_user_message(aclient: anthropic.AsyncAnthropic) -> None:
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert message.content[0].text == "answer to hello"


async def test_str_and_async_responders(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: "plain string"
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert message.content[0].text == "plain string"

    async def responder(request: dict) -> Script:
        return Script("from a coroutine")

    fake.responder = responder
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert message.content[0].text == "from a coroutine"


async def test_enqueue_takes_precedence_in_order(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.enqueue("first", Script("second"))
    texts = [
        (await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)).content[0].text for _ in range(3)
    ]
    assert texts == ["first", "second", "answer to hello"]


async def test_max_tokens_truncates_like_the_real_api(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: "one two three four five"
    message = await aclient.messages.create(model=MODEL, max_tokens=2, messages=USER)
    assert message.content[0].text == "one two "
    assert message.stop_reason == "max_tokens"


async def test_custom_stop_reason(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("stop here", stop_reason="stop_sequence", stop_sequence="###")
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "###")


# --------------------------------------------------------------------------- SDK, streaming


async def test_streaming_deltas_in_order(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    text = "Open the valve, then 再起動してください. Done."
    fake.responder = lambda request: Script(text, tokens_per_second=500)
    stream = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER, stream=True)
    events = [event async for event in stream]

    kinds = [event.type for event in events]
    n = len(tokenize(text))
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * n,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    deltas = [event.delta.text for event in events if event.type == "content_block_delta"]
    assert deltas == tokenize(text)
    assert "".join(deltas) == text
    assert events[-2].delta.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens == n
    assert fake.last_request.tokens_sent == deltas


async def test_stream_helper_accumulates_final_message(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: "streamed via helper"
    async with aclient.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(pieces) == "streamed via helper"
    assert final.content[0].text == "streamed via helper"
    assert final.stop_reason == "end_turn"


async def test_sse_wire_format(fake: FakeAnthropic) -> None:
    """Pin the raw bytes, so the fake stays faithful even where the SDK would be lenient."""
    fake.responder = lambda request: "hi there"
    async with aiohttp.ClientSession() as session, session.post(
        f"{fake.base_url}/v1/messages",
        headers={"x-api-key": "sk-test", "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "max_tokens": 10, "messages": USER, "stream": True},
    ) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = await response.text()

    frames = [frame for frame in raw.split("\n\n") if frame]
    assert raw.endswith("\n\n")
    parsed = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        name, data = event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        parsed.append(data)

    start = parsed[0]["message"]
    assert {k: start[k] for k in ("type", "role", "model", "content", "stop_reason", "stop_sequence")} == {
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    assert start["id"].startswith("msg_")
    assert parsed[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert parsed[2] == {"type": "ping"}
    assert parsed[3:5] == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there"}},
    ]
    assert parsed[5:] == [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2},
        },
        {"type": "message_stop"},
    ]


# --------------------------------------------------------------------------- empty replies


async def test_empty_reply(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("ignored", empty=True)
    message = await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert message.content == []
    assert message.usage.output_tokens == 0

    async with aclient.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
        pieces = [piece async for piece in stream.text_stream]
        final = await stream.get_final_message()
    assert pieces == []
    assert final.content == []
    assert fake.last_request.first_token_at is None


async def test_empty_reply_through_haystack(fake: FakeAnthropic) -> None:
    fake.responder = lambda request: Script("", empty=True)
    gen = generator()
    try:
        reply = (await gen.run_async([ChatMessage.from_user("hi")]))["replies"][0]
        assert reply.text == ""
        # Streaming differs: with no text block haystack builds a reply whose text is None, not "".
        streamed = (await gen.run_async([ChatMessage.from_user("hi")], streaming_callback=_async_noop))["replies"][0]
        assert streamed.text is None
    finally:
        await gen.close_async()


async def _async_noop(chunk: StreamingChunk) -> None:
    return None


# --------------------------------------------------------------------------- cut streams


async def test_cut_stream_raises_in_async_sdk(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("one two three four five", cut_after_tokens=2)
    received: list[str] = []
    # The SDK does not wrap errors raised while iterating a stream: the transport error escapes as is.
    with pytest.raises(httpx2.RemoteProtocolError, match="incomplete chunked read"):
        async with aclient.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
            async for piece in stream.text_stream:
                received.append(piece)
    assert received == ["one ", "two "]
    assert fake.last_request.cut
    assert fake.last_request.tokens_sent == ["one ", "two "]


def test_cut_stream_raises_in_sync_sdk(thread_fake: FakeAnthropic, client: anthropic.Anthropic) -> None:
    thread_fake.responder = lambda request: Script("one two three", cut_after_tokens=1)
    stream = client.messages.create(model=MODEL, max_tokens=100, messages=USER, stream=True)
    deltas: list[str] = []
    with pytest.raises(httpx2.RemoteProtocolError):
        for event in stream:
            if event.type == "content_block_delta":
                deltas.append(event.delta.text)
    assert deltas == ["one "]
    # Not an SDK error class: code that only catches anthropic.APIError would miss it.
    assert not issubclass(httpx2.RemoteProtocolError, anthropic.APIError)


def test_cut_non_streaming_request_is_a_connection_error(
    thread_fake: FakeAnthropic, client: anthropic.Anthropic
) -> None:
    thread_fake.responder = lambda request: Script("never sent", cut_after_tokens=0)
    # Before a response exists the SDK does wrap transport errors.
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(model=MODEL, max_tokens=100, messages=USER)


def test_cut_stream_through_haystack(thread_fake: FakeAnthropic) -> None:
    thread_fake.responder = lambda request: Script("alpha beta gamma delta", cut_after_tokens=2)
    chunks: list[StreamingChunk] = []
    gen = generator()
    try:
        with pytest.raises(httpx2.RemoteProtocolError):
            gen.run([ChatMessage.from_user("hi")], streaming_callback=chunks.append)
    finally:
        gen.close()
    assert [chunk.content for chunk in chunks if chunk.content] == ["alpha ", "beta "]


# --------------------------------------------------------------------------- error statuses


async def test_529_raises_overloaded(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script(status=529)
    with pytest.raises(anthropic.OverloadedError) as caught:
        await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"
    assert len(fake.requests) == 1  # max_retries=0 really means one attempt
    assert fake.last_request.status == 529


async def test_529_through_haystack_async(fake: FakeAnthropic) -> None:
    fake.responder = lambda request: Script(status=529)
    gen = generator()
    try:
        with pytest.raises(anthropic.OverloadedError):
            await gen.run_async([ChatMessage.from_user("hi")], streaming_callback=_async_noop)
    finally:
        await gen.close_async()


def test_529_through_haystack_sync(thread_fake: FakeAnthropic) -> None:
    thread_fake.responder = lambda request: Script(status=529)
    gen = generator()
    try:
        with pytest.raises(anthropic.OverloadedError):
            gen.run([ChatMessage.from_user("hi")])
    finally:
        gen.close()


async def test_rate_limit_and_server_error(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.enqueue(Script(status=429, retry_after=7), Script(status=500))
    with pytest.raises(anthropic.RateLimitError) as rate_limited:
        await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert rate_limited.value.response.headers["retry-after"] == "7"
    assert rate_limited.value.body["error"]["type"] == "rate_limit_error"
    with pytest.raises(anthropic.InternalServerError) as server_error:
        await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    assert server_error.value.body["error"]["type"] == "api_error"


async def test_invalid_request_is_rejected(aclient: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError):
        await aclient.messages.create(model=MODEL, messages=USER, max_tokens=None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- auth


async def test_auth_headers(fake: FakeAnthropic) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": USER}
    async with aiohttp.ClientSession() as session:
        for headers in ({"x-api-key": "sk-a"}, {"Authorization": "Bearer sk-b"}):
            async with session.post(f"{fake.base_url}/v1/messages", headers=headers, json=body) as response:
                assert response.status == 200
        async with session.post(f"{fake.base_url}/v1/messages", json=body) as response:
            assert response.status == 401
            assert (await response.json())["type"] == "error"
            assert (await response.json())["error"]["type"] == "authentication_error"
    assert [request.api_key for request in fake.requests] == ["sk-a", "sk-b", None]
    assert [request.status for request in fake.requests] == [200, 200, 401]


async def test_sdk_sends_bearer(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    await aclient.messages.create(model=MODEL, max_tokens=10, messages=USER)
    assert fake.last_request.api_key == "sk-test"
    assert fake.last_request.headers["authorization"] == "Bearer sk-test"
    assert "x-api-key" not in fake.last_request.headers


# --------------------------------------------------------------------------- recording and dispatch


async def test_records_system_prompt_from_sdk(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    await aclient.messages.create(model=MODEL, max_tokens=10, system="You answer from the manual.", messages=USER)
    request = fake.last_request
    assert request.system == "You answer from the manual."
    assert request.body["system"] == "You answer from the manual."
    assert request.last_user_text == "hello"
    assert request.path == "/v1/messages"


async def test_haystack_system_prompt_and_dispatch(fake: FakeAnthropic) -> None:
    def responder(request: dict) -> str:
        system = " ".join(block["text"] for block in request.get("system", []))
        return "terse" if "brief" in system else "verbose"

    fake.responder = responder
    gen = generator()
    try:
        brief = await gen.run_async([ChatMessage.from_system("be brief"), ChatMessage.from_user("what is it?")])
        chatty = await gen.run_async([ChatMessage.from_user("what is it?")])
    finally:
        await gen.close_async()
    assert brief["replies"][0].text == "terse"
    assert chatty["replies"][0].text == "verbose"
    first = fake.requests[0]
    assert first.system == "be brief"
    assert first.last_user_text == "what is it?"
    assert first.messages == [{"role": "user", "content": [{"type": "text", "text": "what is it?"}]}]
    assert first.body["max_tokens"] == 256


def test_haystack_sync_run_in_thread(thread_fake: FakeAnthropic) -> None:
    thread_fake.responder = lambda request: Script("answer to " + thread_fake.requests[-1].last_user_text)
    chunks: list[StreamingChunk] = []
    gen = generator()
    try:
        plain = gen.run([ChatMessage.from_system("be brief"), ChatMessage.from_user("hello")])["replies"][0]
        streamed = gen.run([ChatMessage.from_user("hi there")], streaming_callback=chunks.append)["replies"][0]
    finally:
        gen.close()
    assert plain.text == "answer to hello"
    assert plain.meta["finish_reason"] == "stop"
    assert streamed.text == "answer to hi there"
    # Haystack also emits empty chunks for start/stop events; the UI has to skip them.
    assert [chunk.content for chunk in chunks if chunk.content] == ["answer ", "to ", "hi ", "there"]
    assert "" in [chunk.content for chunk in chunks]
    assert thread_fake.requests[0].system == "be brief"


# --------------------------------------------------------------------------- pacing and timestamps


async def test_pacing_and_timestamps(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    text = "a b c d e f g h i j k"  # 11 tokens, 10 gaps of 1/50 s
    fake.responder = lambda request: Script(text, tokens_per_second=50, first_token_delay=0.2)
    async with aclient.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
        assert "".join([piece async for piece in stream.text_stream]) == text
    request = fake.last_request
    assert request.first_token_at is not None and request.last_token_at is not None
    assert request.first_token_at - request.received_at >= 0.2
    assert 0.18 <= request.last_token_at - request.first_token_at < 1.0


async def test_non_streaming_spends_the_same_time(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("a b c d e f", tokens_per_second=50, first_token_delay=0.1)
    await aclient.messages.create(model=MODEL, max_tokens=100, messages=USER)
    request = fake.last_request
    assert request.first_token_at is not None
    assert request.first_token_at - request.received_at >= 0.1 + 5 / 50


async def test_stop_does_not_hang_on_inflight_stream(fake: FakeAnthropic, aclient: anthropic.AsyncAnthropic) -> None:
    fake.responder = lambda request: Script("word " * 200, tokens_per_second=20)
    stream = await aclient.messages.create(model=MODEL, max_tokens=1000, messages=USER, stream=True)
    await anext(aiter(stream))
    await fake.stop()
    with pytest.raises(httpx2.RemoteProtocolError):
        async for _ in stream:
            pass
