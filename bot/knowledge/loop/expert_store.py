"""Where expert replies wait for a reviewer: the threads whose question kbbot could not answer (or that
got a 👎), and each reply offered to the reviewers, with which of its two clicks were already made.

A thread takes one reply: its first takes the open question (``take_gap``). ``MemoryExpertStore`` for one
process; ``RedisExpertStore`` shared by replicas (keys after ``redis_prefix``):

| key | holds | expiry |
| --- | --- | --- |
| ``{prefix}expert:gap:{thread_key}`` | JSON: the thread's open question (question, asker, spaces, turn, kbbot's messages) | ``ttl_s`` |
| ``{prefix}expert:reply:{id}`` | JSON: a reply offered to reviewers (text, author, question, link) | ``ttl_s`` |
| ``{prefix}expert:done:{id}:{action}`` | who made that click first (``approve`` / ``capture``) | ``ttl_s`` |
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol


class ExpertStore(Protocol):
    async def open_gap(self, thread_key: str, gap: dict[str, Any]) -> None: ...

    async def gap(self, thread_key: str) -> dict[str, Any] | None: ...

    async def take_gap(self, thread_key: str) -> dict[str, Any] | None:
        """The open question of the thread, which is no longer open; None if it was not (or another reply
        took it first)."""

    async def keep_reply(self, reply_id: str, reply: dict[str, Any]) -> None: ...

    async def reply(self, reply_id: str) -> dict[str, Any] | None: ...

    async def take(self, reply_id: str, action: str, by: str) -> str | None:
        """Marks ``action`` on the reply as done by ``by``; None for the first, else who did it before."""

    async def release(self, reply_id: str, action: str) -> None:
        """Undoes ``take`` (the click's work failed: it may be tried again)."""


class MemoryExpertStore:
    def __init__(self, ttl_s: float = 7 * 86400):
        self.ttl_s = ttl_s
        self._data: dict[str, tuple[float, Any]] = {}

    def _get(self, key: str) -> Any:
        held = self._data.get(key)
        return held[1] if held is not None and held[0] > time.monotonic() else None

    def _set(self, key: str, value: Any) -> None:
        now = time.monotonic()
        self._data = {k: v for k, v in self._data.items() if v[0] > now}
        self._data[key] = (now + self.ttl_s, value)

    async def open_gap(self, thread_key: str, gap: dict[str, Any]) -> None:
        self._set(f"gap:{thread_key}", dict(gap))

    async def gap(self, thread_key: str) -> dict[str, Any] | None:
        return self._get(f"gap:{thread_key}")

    async def take_gap(self, thread_key: str) -> dict[str, Any] | None:
        gap = self._get(f"gap:{thread_key}")
        self._data.pop(f"gap:{thread_key}", None)
        return gap

    async def keep_reply(self, reply_id: str, reply: dict[str, Any]) -> None:
        self._set(f"reply:{reply_id}", dict(reply))

    async def reply(self, reply_id: str) -> dict[str, Any] | None:
        return self._get(f"reply:{reply_id}")

    async def take(self, reply_id: str, action: str, by: str) -> str | None:
        key = f"done:{reply_id}:{action}"
        before = self._get(key)
        if before is not None:
            return str(before)
        self._set(key, by)
        return None

    async def release(self, reply_id: str, action: str) -> None:
        self._data.pop(f"done:{reply_id}:{action}", None)


class RedisExpertStore:
    def __init__(self, redis: Any, prefix: str = "kbbot:", ttl_s: float = 7 * 86400):
        self.redis = redis
        self.prefix = prefix
        self.ttl_s = max(1, int(ttl_s))

    def _k(self, *parts: str) -> str:
        return self.prefix + "expert:" + ":".join(parts)

    async def _json(self, key: str) -> dict[str, Any] | None:
        raw = await self.redis.get(key)
        return json.loads(raw) if raw else None

    async def open_gap(self, thread_key: str, gap: dict[str, Any]) -> None:
        await self.redis.set(self._k("gap", thread_key), json.dumps(gap, ensure_ascii=False), ex=self.ttl_s)

    async def gap(self, thread_key: str) -> dict[str, Any] | None:
        return await self._json(self._k("gap", thread_key))

    async def take_gap(self, thread_key: str) -> dict[str, Any] | None:
        raw = await self.redis.getdel(self._k("gap", thread_key))  # one reply takes it, whichever replica
        return json.loads(raw) if raw else None

    async def keep_reply(self, reply_id: str, reply: dict[str, Any]) -> None:
        await self.redis.set(self._k("reply", reply_id), json.dumps(reply, ensure_ascii=False), ex=self.ttl_s)

    async def reply(self, reply_id: str) -> dict[str, Any] | None:
        return await self._json(self._k("reply", reply_id))

    async def take(self, reply_id: str, action: str, by: str) -> str | None:
        key = self._k("done", reply_id, action)
        if await self.redis.set(key, by, nx=True, ex=self.ttl_s):
            return None
        before = await self.redis.get(key)
        return before.decode() if isinstance(before, bytes) else str(before or "")

    async def release(self, reply_id: str, action: str) -> None:
        await self.redis.delete(self._k("done", reply_id, action))
