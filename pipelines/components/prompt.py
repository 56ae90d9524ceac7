"""The chat prompt builder, with its templates compiled once."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from haystack.components.builders import ChatPromptBuilder


def compiled_chat_prompt_builder(**kwargs: Any) -> ChatPromptBuilder:
    """Haystack's ``ChatPromptBuilder`` (``kwargs`` are its own), compiling each template text once.

    It calls its jinja2 environment's ``from_string`` for every message on every run, and
    ``from_string`` keeps no cache (only loaded templates are cached): ~1.5 ms of a turn's CPU
    (``bench.turn``). A compiled template renders any number of times, from any thread, so the
    builder's environment gets a cached ``from_string`` (a subclass would do the same, but Haystack's
    ``@component`` rebuilds the class, which breaks ``super()`` in it).
    """
    builder = ChatPromptBuilder(**kwargs)
    builder._env.from_string = lru_cache(maxsize=32)(builder._env.from_string)  # type: ignore[method-assign]
    return builder
