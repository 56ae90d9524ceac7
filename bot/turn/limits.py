"""Per-user and per-channel rate limits: sliding windows, in Redis (shared by every replica) or in
this process.

A question is admitted when its user has asked fewer than ``per_user`` questions in the last
``window_s`` seconds *and* its channel fewer than ``per_channel``; an admitted question counts
against both, a refused one against neither (so someone who keeps asking during a refusal is
admitted again as soon as the window allows). The ``Answerer`` checks this before any other work,
so a refused question costs one Redis round trip and one message.

Redis keys (``prefix`` from ``redis_prefix``):

====================================  ======  ==============================================
key                                   type    contents and lifetime
====================================  ======  ==============================================
``{prefix}limit:user:{platform}:{tenant}:{user}``     zset  admitted questions (member: a unique
``{prefix}limit:channel:{platform}:{tenant}:{chan}``  zset  id, score: server time in ms);
                                                            expires one window after the last
====================================  ======  ==============================================

Both windows are checked and updated in one Lua script against Redis' own clock (no replica
clock skew). When Redis cannot be reached the limiter admits the question (logged): limits
protect the service, they must not become the reason it stops answering.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from bot.messages import say
from bot.types import Inquiry

log = logging.getLogger("kbbot.limits")


@dataclass(frozen=True)
class Limits:
    """``per_user`` / ``per_channel`` questions per ``window_s``; 0 turns a limit off."""

    per_user: int = 20
    per_channel: int = 120
    window_s: float = 60.0

    @property
    def active(self) -> bool:
        return self.window_s > 0 and (self.per_user > 0 or self.per_channel > 0)


@dataclass(frozen=True)
class Refusal:
    scope: str  # user | channel
    limit: int
    window_s: float
    retry_after_s: float


def subject_keys(inquiry: Inquiry) -> tuple[str, str]:
    base = f"{inquiry.platform}:{inquiry.tenant}"
    return f"user:{base}:{inquiry.user_id}", f"channel:{base}:{inquiry.channel}"


class MemoryRateLimiter:
    """Sliding windows of admitted questions, per key, in this process."""

    def __init__(self, limits: Limits, *, clock: Any = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._windows: dict[str, deque[float]] = {}
        self._lock = asyncio.Lock()

    def _window(self, key: str, now: float) -> deque[float]:
        window = self._windows.setdefault(key, deque())
        while window and window[0] <= now - self.limits.window_s:
            window.popleft()
        return window

    async def check(self, inquiry: Inquiry) -> Refusal | None:
        if not self.limits.active:
            return None
        user_key, channel_key = subject_keys(inquiry)
        async with self._lock:
            now = self._clock()
            checks = [("user", user_key, self.limits.per_user), ("channel", channel_key, self.limits.per_channel)]
            for scope, key, limit in checks:
                if limit <= 0:
                    continue
                window = self._window(key, now)
                if len(window) >= limit:
                    return Refusal(scope, limit, self.limits.window_s,
                                   max(0.0, window[0] + self.limits.window_s - now))
            for _, key, limit in checks:
                if limit > 0:
                    self._window(key, now).append(now)
            if len(self._windows) > 10000:  # forget idle subjects
                for key in [k for k, w in self._windows.items() if not w or w[-1] <= now - self.limits.window_s]:
                    del self._windows[key]
        return None


# KEYS: user zset, channel zset. ARGV: window ms, user limit, channel limit, member.
# Returns {0} when admitted, else {1 (user) | 2 (channel), retry-after ms}.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local limits = {tonumber(ARGV[2]), tonumber(ARGV[3])}
for i = 1, 2 do
  if limits[i] > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
    if redis.call('ZCARD', KEYS[i]) >= limits[i] then
      local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
      return {i, tonumber(oldest[2]) + window - now}
    end
  end
end
for i = 1, 2 do
  if limits[i] > 0 then
    redis.call('ZADD', KEYS[i], now, ARGV[4])
    redis.call('PEXPIRE', KEYS[i], window)
  end
end
return {0}
"""


class RedisRateLimiter:
    """The same windows in Redis sorted sets, shared by every replica."""

    def __init__(self, client: Any, limits: Limits, *, prefix: str = "kbbot:"):
        self.client = client
        self.limits = limits
        self.prefix = prefix
        self._script = client.register_script(_SCRIPT)

    async def check(self, inquiry: Inquiry) -> Refusal | None:
        if not self.limits.active:
            return None
        user_key, channel_key = subject_keys(inquiry)
        keys = [f"{self.prefix}limit:{user_key}", f"{self.prefix}limit:{channel_key}"]
        window_ms = int(math.ceil(self.limits.window_s * 1000))
        try:
            result = await self._script(keys=keys, args=[window_ms, self.limits.per_user, self.limits.per_channel,
                                                         uuid.uuid4().hex])
        except Exception as exc:  # noqa: BLE001 - fail open, see the module docstring
            log.warning("rate limit not checked: Redis failed (%s)", type(exc).__name__)
            return None
        if not result or int(result[0]) == 0:
            return None
        scope = "user" if int(result[0]) == 1 else "channel"
        limit = self.limits.per_user if scope == "user" else self.limits.per_channel
        return Refusal(scope, limit, self.limits.window_s, max(0.0, int(result[1]) / 1000))


class RateLimiter(Protocol):
    async def check(self, inquiry: Inquiry) -> Refusal | None:
        """None when the question may be answered (and it now counts), else why not."""


def describe_window(seconds: float, language: str) -> str:
    units = ((86400, "day", "天"), (3600, "hour", "小时"), (60, "minute", "分钟"))
    for size, en, zh in units:
        if seconds == size:
            return zh if language == "zh" else en
        if seconds % size == 0:
            n = int(seconds // size)
            return f"{n}{zh}" if language == "zh" else f"{n} {en}s"
    return f"{seconds:g}秒" if language == "zh" else f"{seconds:g} s"


def refusal_message(refusal: Refusal, language: str) -> str:
    return say(f"rate_limited_{refusal.scope}", language, limit=refusal.limit,
               window=describe_window(refusal.window_s, "en"), window_zh=describe_window(refusal.window_s, "zh"),
               seconds=max(1, math.ceil(refusal.retry_after_s)))
