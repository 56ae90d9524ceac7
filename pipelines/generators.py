"""The generator factory: Anthropic Claude, any OpenAI-compatible chat endpoint, or extractive."""

from __future__ import annotations

from typing import Any

from haystack.utils import Secret

from pipelines.components.extractive import ExtractiveAnswerer

GENERATOR_KINDS = ("anthropic", "openai", "extractive")


def make_generator(
    kind: str,
    *,
    model: str = "claude-sonnet-5-5",
    max_tokens: int = 1024,
    timeout_s: float = 60,
    max_retries: int = 2,
    base_url: str | None = None,
) -> Any:
    """A chat generator with bounded time and retries. Keys come from the environment only:
    ``ANTHROPIC_API_KEY`` (and the SDK's ``ANTHROPIC_BASE_URL``) or ``OPENAI_API_KEY``."""
    if kind == "anthropic":
        from haystack_integrations.components.generators.anthropic import AnthropicChatGenerator

        return AnthropicChatGenerator(
            api_key=Secret.from_env_var("ANTHROPIC_API_KEY"),
            model=model,
            generation_kwargs={"max_tokens": max_tokens},
            timeout=timeout_s,
            max_retries=max_retries,
        )
    if kind == "openai":
        from haystack.components.generators.chat import OpenAIChatGenerator

        if not base_url:
            raise ValueError("generator.kind 'openai' needs generator.base_url (e.g. http://localhost:11434/v1)")
        return OpenAIChatGenerator(
            api_key=Secret.from_env_var("OPENAI_API_KEY", strict=False) or Secret.from_token("unused"),
            model=model,
            api_base_url=base_url,
            generation_kwargs={"max_completion_tokens": max_tokens},
            timeout=timeout_s,
            max_retries=max_retries,
        )
    if kind == "extractive":
        return ExtractiveAnswerer()
    raise ValueError(f"unknown generator kind {kind!r} (expected one of {', '.join(GENERATOR_KINDS)})")
