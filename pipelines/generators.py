"""The generator factory: Anthropic Claude, any OpenAI-compatible chat endpoint (a local GGUF model
served in process is one: ``pipelines/local_model.py``), or extractive."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from haystack.utils import Secret

from pipelines.components.extractive import ExtractiveAnswerer

GENERATOR_KINDS = ("anthropic", "openai", "local", "extractive")

#: Called with the status and headers of every response of the model's API (retried ones included):
#: how a hosted model's admission learns the provider's limits (``bot.turn.model_calls``).
ResponseHook = Callable[[int, Mapping[str, str]], Awaitable[None]]


def _observing(generator_class: type, client_class: type, http_client_class: type, on_response: ResponseHook) -> type:
    """``generator_class`` whose async client (made in ``warm_up_async``, as the base class does) passes
    every response to ``on_response`` through an httpx response hook: the SDK's own retries of a 429
    are seen too, and the generator's streaming and parsing stay the integration's."""

    async def hook(response: Any) -> None:
        await on_response(response.status_code, response.headers)

    class Observed(generator_class):  # type: ignore[misc, valid-type]
        async def warm_up_async(self) -> None:
            if self.async_client is None:
                self.async_client = client_class(**self._client_kwargs(),
                                                 http_client=http_client_class(event_hooks={"response": [hook]}))

    Observed.__name__ = Observed.__qualname__ = f"Observed{generator_class.__name__}"
    return Observed


def make_generator(
    kind: str,
    *,
    model: str = "claude-sonnet-5-5",
    max_tokens: int = 1024,
    timeout_s: float = 60,
    max_retries: int = 2,
    base_url: str | None = None,
    temperature: float | None = None,
    logprobs: int | None = None,
    on_response: ResponseHook | None = None,
) -> Any:
    """A chat generator with bounded time and retries. Keys come from the environment only:
    ``ANTHROPIC_API_KEY`` (and the SDK's ``ANTHROPIC_BASE_URL``) or ``OPENAI_API_KEY``.

    ``local`` is the OpenAI-compatible path pointed at ``base_url``, the in-process llama.cpp
    server (started by the caller); ``temperature`` (OpenAI-compatible kinds) None leaves the
    model's default; ``logprobs`` (OpenAI-compatible kinds) asks for that many alternatives of each
    generated token with their log-probabilities (the answerability judgement reads them);
    ``on_response`` (async runs of the hosted kinds) sees every response's status and headers."""
    sampling = {} if temperature is None else {"temperature": temperature}
    if logprobs:
        sampling |= {"logprobs": True, "top_logprobs": logprobs}
    if kind == "anthropic":
        from haystack_integrations.components.generators.anthropic import AnthropicChatGenerator  # its SDK: this kind only

        anthropic_class: type = AnthropicChatGenerator
        if on_response is not None:
            from anthropic import AsyncAnthropic, DefaultAsyncHttpxClient

            anthropic_class = _observing(AnthropicChatGenerator, AsyncAnthropic, DefaultAsyncHttpxClient, on_response)
        return anthropic_class(
            api_key=Secret.from_env_var("ANTHROPIC_API_KEY"),
            model=model,
            # The anthropic SDK in use takes no temperature: Claude runs at its default.
            generation_kwargs={"max_tokens": max_tokens},
            timeout=timeout_s,
            max_retries=max_retries,
        )
    if kind in ("openai", "local"):
        from haystack.components.generators.chat import OpenAIChatGenerator  # the openai SDK: these kinds only

        if not base_url:
            raise ValueError(f"generator.kind {kind!r} needs a base_url (e.g. http://localhost:11434/v1)")
        openai_class: type = OpenAIChatGenerator
        if on_response is not None:
            from openai import AsyncOpenAI, DefaultAsyncHttpxClient

            openai_class = _observing(OpenAIChatGenerator, AsyncOpenAI, DefaultAsyncHttpxClient, on_response)
        return openai_class(
            # Keyless servers (llama.cpp, Ollama) still need the client to hold some key.
            api_key=Secret.from_env_var("OPENAI_API_KEY") if kind == "openai" and os.environ.get("OPENAI_API_KEY")
            else Secret.from_token("unused"),
            model=model,
            api_base_url=base_url,
            generation_kwargs={"max_completion_tokens": max_tokens, **sampling},
            timeout=timeout_s,
            max_retries=max_retries,
        )
    if kind == "extractive":
        return ExtractiveAnswerer()
    raise ValueError(f"unknown generator kind {kind!r} (expected one of {', '.join(GENERATOR_KINDS)})")
