"""Feedback clicks (👍 / 👎) on answers, stored with the turn id, whatever the platform."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Feedback:
    turn_id: str
    rating: str  # "up" | "down"
    user_id: str
    tenant: str
    channel: str
    message_id: str  # Slack message ts, Telegram message id
    platform: str
    at: float = field(default_factory=time.time)


class FeedbackStore(Protocol):
    async def record(self, feedback: Feedback) -> None: ...


class MemoryFeedback:
    def __init__(self) -> None:
        self.items: list[Feedback] = []

    async def record(self, feedback: Feedback) -> None:
        self.items.append(feedback)


class JsonlFeedback:
    """One JSON line per click in the data directory (the embedded default)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    async def record(self, feedback: Feedback) -> None:
        await asyncio.to_thread(self._append, json.dumps(asdict(feedback), ensure_ascii=False))


class RedisFeedback:
    """``{prefix}feedback:{turn_id}``: a hash of user id -> the user's latest click (JSON), kept 180 days."""

    def __init__(self, client: Any, prefix: str = "kbbot:", ttl_s: int = 180 * 86400):
        self.client = client
        self.prefix = prefix
        self.ttl_s = ttl_s

    async def record(self, feedback: Feedback) -> None:
        key = f"{self.prefix}feedback:{feedback.turn_id}"
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(key, feedback.user_id, json.dumps(asdict(feedback), ensure_ascii=False))
            pipe.expire(key, self.ttl_s)
            await pipe.execute()
