"""The HTTP API on ``kbbot serve``: ``/v1/ask`` (Server-Sent Events) and ``/v1/chat/completions`` (OpenAI's format)."""

from __future__ import annotations

from typing import Any

from adapters.api.platform import HttpApi


def build(runtime: Any, conversations: Any) -> HttpApi | None:
    """The API when callers are configured (``api.tokens`` or ``KBBOT_API_TOKEN``)."""
    return HttpApi(conversations, runtime.settings.api) if runtime.settings.api.enabled else None
