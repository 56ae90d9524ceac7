"""The generator factory: Anthropic Claude, any OpenAI-compatible chat endpoint (a local GGUF model
served in process is one: ``pipelines/local_model.py``), or extractive."""

from __future__ import annotations

import os
from typing import Any

from haystack.utils import Secret

from pipelines.components.extractive import ExtractiveAnswerer

GENERATOR_KINDS = ("anthropic", "openai", "local", "extractive")


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
) -> Any:
    """A chat generator with bounded time and retries. Keys come from the environment only:
    ``ANTHROPIC_API_KEY`` (and the SDK's ``ANTHROPIC_BASE_URL``) or ``OPENAI_API_KEY``.

    ``local`` is the OpenAI-compatible path pointed at ``base_url``, the in-process llama.cpp
    server (started by the caller); ``temperature`` (OpenAI-compatible kinds) None leaves the
    model's default; ``logprobs`` (OpenAI-compatible kinds) asks for that many alternatives of each
    generated token with their log-probabilities (the answerability judgement reads them)."""
    sampling = {} if temperature is None else {"temperature": temperature}
    if logprobs:
        sampling |= {"logprobs": True, "top_logprobs": logprobs}
    if kind == "anthropic":
        from haystack_integrations.components.generators.anthropic import AnthropicChatGenerator  # its SDK: this kind only

        return AnthropicChatGenerator(
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
        return OpenAIChatGenerator(
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
