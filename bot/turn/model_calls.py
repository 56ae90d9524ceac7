"""How many model calls run at once: a fixed cap for the model kbbot runs itself, an adaptive one for a
hosted model, whose provider's own limits are the real bound.

A fixed cap below the provider's bound is a queue people wait in for nothing (50 questions at once
were answered in waves of ``limits.concurrent_model_calls``, 16); a cap above it draws 429s and the
SDK's retry sleeps. A hosted model says what it allows in every response: a 429 (or 529, overloaded)
with ``retry-after`` when a limit is hit, and rate headers on the others (Anthropic's
``anthropic-ratelimit-requests-remaining`` / ``-reset``, OpenAI's ``x-ratelimit-remaining-requests`` /
``x-ratelimit-reset-requests``). So ``AdaptiveModelCalls`` starts high and adapts as TCP's congestion
window does, additive increase and multiplicative decrease:

- a 429 halves the number of calls allowed at once (from the number running when it came, so an
  unused allowance is not mistaken for one the provider refused), once per Retry-After: the other
  429s of the same burst are the same news; and no new call starts until the Retry-After has passed;
- every call that succeeds adds ``1 / limit`` (one more call at once per round of calls), up to
  ``maximum``;
- the requests a response says remain in the provider's window bound the calls started until the
  window resets.

The state belongs to the provider account, not to the process: with ``REDIS_URL`` every replica keeps
to one state in Redis (``RedisModelCalls``: one Lua script per operation, on Redis' clock), else it
lives in this process (``MemoryModelCalls``). Each call in flight holds a lease of ``lease_s`` (6 s,
about when a dead replica's turns are taken over) that its process renews every third of it while the
call runs (one script call for all of them), so a replica that dies mid-call frees its places within
``lease_s``: a lease as long as a turn kept them for 130 s, and where 429s had brought the limit down to
a few calls, a killed replica's places were all there were, and the survivors' turns timed out waiting
for them (bench.load, faults run, 2026-12-03).

Redis keys (``prefix`` names the account's kind and model, e.g. ``kbbot:model:anthropic:claude-sonnet-5-5:``):

======================  ====  ====================================================================
key                     type  contents and lifetime
======================  ====  ====================================================================
``{prefix}state``       hash  ``limit`` (calls at once, a float), ``held`` (ms, end of a 429's
                              Retry-After), ``remaining`` / ``reset`` (the provider's window as last
                              reported; ms); expires after ``idle_s`` without calls (then: ``start``)
``{prefix}calls``       zset  calls in flight (member: call id, score: lease end, ms)
======================  ====  ====================================================================
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.state.redis import SharedScript

log = logging.getLogger("kbbot.model_calls")

Clock = Callable[[], float]


@dataclass(frozen=True)
class Adaptation:
    """The adaptive limit's bounds: where it starts, how low and how high it goes."""

    start: int = 64
    minimum: int = 1
    maximum: int = 128
    #: How long a call holds its place unless its process renews it (every third of it while the call
    #: runs): a replica that died mid-call frees its places after this long.
    lease_s: float = 6.0
    #: After this long without any call the state is forgotten and the limit starts high again.
    idle_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.start <= self.maximum:
            raise ValueError(f"model calls need 1 <= minimum <= start <= maximum, got {self}")


@dataclass(frozen=True)
class Signal:
    """What one response of the provider says about its limits."""

    status: int
    retry_after_s: float | None = None
    #: Requests left in the provider's current window, and seconds until it resets (None: not said).
    remaining: int | None = None
    reset_in_s: float | None = None

    @property
    def refused(self) -> bool:
        """Too many calls: rate limited (429) or overloaded (529)."""
        return self.status in (429, 529)


@dataclass(frozen=True)
class Snapshot:
    limit: float
    in_flight: int
    held_s: float
    remaining: int | None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def _seconds(value: str | None, now: float) -> float | None:
    """A reset or retry time as seconds from now: a number of seconds, an RFC 3339 / HTTP date
    (Anthropic's ``-reset``), or a duration such as ``6m0s`` (OpenAI's ``-reset-requests``)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    if parts := _DURATION.findall(value):
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(n) * scale[unit] for n, unit in parts)
    try:
        from datetime import datetime

        when = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
    return max(0.0, when - now)


def read_signal(status: int, headers: Mapping[str, str], *, now: float | None = None) -> Signal:
    """The limits a provider's response states (Anthropic's and OpenAI's header names)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    wall = time.time() if now is None else now
    retry = None
    if "retry-after-ms" in lowered:
        try:
            retry = max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
        except ValueError:
            retry = None
    if retry is None:
        retry = _seconds(lowered.get("retry-after"), wall)
    remaining = reset = None
    for left, resets in (("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
                         ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")):
        if left in lowered:
            try:
                remaining = int(float(lowered[left]))
            except ValueError:
                continue
            reset = _seconds(lowered.get(resets), wall)
            break
    return Signal(status, retry, remaining, reset)


class ModelCallState(Protocol):
    """The provider account's calls in flight and its adaptive limit; see the module docstring."""

    async def start(self, call: str) -> float:
        """Start ``call``: 0.0 when it may go, else the seconds to wait before asking again (a 429's
        hold or the provider's window), or -1.0 when every place is taken (ask again after a call ends)."""

    async def finish(self, call: str) -> None:
        """``call`` ended; its place is free."""

    async def renew(self, calls: list[str]) -> None:
        """``calls`` are still running: their places are held ``lease_s`` more (a call already let go stays so)."""

    async def observe(self, signal: Signal) -> float:
        """Adapt to one response of the provider; returns the limit now."""

    async def snapshot(self) -> Snapshot: ...


# --- in this process -----------------------------------------------------------------------------
class MemoryModelCalls:
    """The state in this process, on ``clock`` (seconds): for one process without Redis, and tests."""

    def __init__(self, adaptation: Adaptation | None = None, clock: Clock = time.monotonic):
        self.adaptation = adaptation or Adaptation()
        self.clock = clock
        self.limit = float(self.adaptation.start)
        self.held = float("-inf")
        self.remaining: int | None = None
        self.reset = float("-inf")
        self.calls: dict[str, float] = {}

    def _tidy(self, now: float) -> None:
        self.calls = {c: until for c, until in self.calls.items() if until > now}
        if self.remaining is not None and self.reset <= now:
            self.remaining = None

    async def start(self, call: str) -> float:
        now = self.clock()
        self._tidy(now)
        if self.held > now:
            return self.held - now
        if self.remaining is not None and self.remaining < 1:
            return max(0.001, self.reset - now)
        if len(self.calls) >= math.floor(self.limit):
            return -1.0
        self.calls[call] = now + self.adaptation.lease_s
        if self.remaining is not None:
            self.remaining -= 1
        return 0.0

    async def finish(self, call: str) -> None:
        self.calls.pop(call, None)

    async def renew(self, calls: list[str]) -> None:
        now = self.clock()
        self._tidy(now)
        for call in calls:
            if call in self.calls:
                self.calls[call] = now + self.adaptation.lease_s

    async def observe(self, signal: Signal) -> float:
        now = self.clock()
        self._tidy(now)
        a = self.adaptation
        if signal.refused:
            if self.held <= now:  # the first refusal of a burst cuts; the rest only extend the hold
                self.limit = max(float(a.minimum), min(self.limit, float(len(self.calls))) / 2)
            self.held = max(self.held, now + (signal.retry_after_s or 0.0))
        elif signal.status < 400:
            self.limit = min(float(a.maximum), self.limit + 1 / self.limit)
        if signal.remaining is not None:
            self.remaining = signal.remaining
            self.reset = now + (signal.reset_in_s if signal.reset_in_s is not None else 60.0)
        return self.limit

    async def snapshot(self) -> Snapshot:
        now = self.clock()
        self._tidy(now)
        return Snapshot(self.limit, len(self.calls), max(0.0, self.held - now), self.remaining)


# --- in Redis ------------------------------------------------------------------------------------
# KEYS: state hash, calls zset. ARGV: op, start, minimum, maximum, idle ms, then per op: start: call id,
# lease ms; finish: call id; renew: lease ms, call ids; observe: status, retry ms (-1: none), remaining
# (-1: none), reset ms (-1: none).
# Returns: start "0", the ms to wait, or "-1" (full); finish "0"; observe the limit; peek
# "limit calls held_ms remaining" (remaining -1: unknown). Times are ms on Redis' clock.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local op = ARGV[1]
local start, minimum, maximum, idle = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local h = redis.call('HMGET', KEYS[1], 'limit', 'held', 'remaining', 'reset')
local limit = tonumber(h[1]) or start
local held = tonumber(h[2]) or 0
local remaining = tonumber(h[3])
local reset = tonumber(h[4]) or 0
if remaining ~= nil and reset <= now then remaining = nil end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local calls = redis.call('ZCARD', KEYS[2])
local function save()
  redis.call('HSET', KEYS[1], 'limit', string.format('%.17g', limit), 'held', string.format('%.17g', held),
             'reset', string.format('%.17g', reset))
  if remaining == nil then
    redis.call('HDEL', KEYS[1], 'remaining')
  else
    redis.call('HSET', KEYS[1], 'remaining', remaining)
  end
  redis.call('PEXPIRE', KEYS[1], idle)
end
if op == 'start' then
  if held > now then return string.format('%.17g', held - now) end
  if remaining ~= nil and remaining < 1 then return string.format('%.17g', math.max(1, reset - now)) end
  if calls >= math.floor(limit) then return '-1' end
  local lease = tonumber(ARGV[7])
  redis.call('ZADD', KEYS[2], now + lease, ARGV[6])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', KEYS[2], math.ceil(tonumber(last[2]) - now) + 1000)
  if remaining ~= nil then remaining = remaining - 1 end
  save()
  return '0'
end
if op == 'finish' then
  redis.call('ZREM', KEYS[2], ARGV[6])
  return '0'
end
if op == 'renew' then
  local lease = tonumber(ARGV[6])
  for i = 7, #ARGV do
    redis.call('ZADD', KEYS[2], 'XX', now + lease, ARGV[i])
  end
  if calls > 0 then redis.call('PEXPIRE', KEYS[2], math.ceil(lease) + 1000) end
  return '0'
end
if op == 'observe' then
  local status, retry, left, resets = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  if status == 429 or status == 529 then
    if held <= now then limit = math.max(minimum, math.min(limit, calls) / 2) end
    if retry > 0 then held = math.max(held, now + retry) end
  elseif status < 400 then
    limit = math.min(maximum, limit + 1 / limit)
  end
  if left >= 0 then
    remaining = left
    if resets >= 0 then reset = now + resets else reset = now + 60000 end
  end
  save()
  return string.format('%.17g', limit)
end
return string.format('%.17g %d %.17g %d', limit, calls, math.max(0, held - now), remaining or -1)
"""


@dataclass
class RedisModelCalls:
    """The state in Redis, shared by every replica with the same ``prefix``; see the module docstring.

    When Redis cannot be reached this process keeps to a state of its own (``fallback``, at the same
    adaptation) for ``outage_retry_s`` and then tries Redis again, as the platforms' rate budgets do
    (``bot.delivery.buckets``): an outage never fails a model call, the provider's 429s still teach the limit.
    """

    client: Any
    prefix: str = "kbbot:model:"
    adaptation: Adaptation = field(default_factory=Adaptation)
    outage_retry_s: float = 5.0
    fallback: MemoryModelCalls | None = None
    _script: SharedScript = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._script = SharedScript(self.client, _SCRIPT, what="model calls", meanwhile="this process keeps its own count",
                                    back="the replicas share the model's limit again", retry_s=self.outage_retry_s,
                                    logger=log)
        if self.fallback is None:
            self.fallback = MemoryModelCalls(self.adaptation)

    async def _run(self, op: str, *args: Any) -> str | None:
        """The script's answer, or None when Redis is out of reach (the fallback answers then)."""
        a = self.adaptation
        return await self._script([f"{self.prefix}state", f"{self.prefix}calls"],
                                  [op, a.start, a.minimum, a.maximum, round(a.idle_s * 1000), *args])

    async def start(self, call: str) -> float:
        assert self.fallback is not None
        answer = await self._run("start", call, round(self.adaptation.lease_s * 1000))
        if answer is None:
            return await self.fallback.start(call)
        wait = float(answer)
        return wait if wait <= 0 else wait / 1000.0

    async def finish(self, call: str) -> None:
        assert self.fallback is not None
        await self.fallback.finish(call)  # a call started during an outage
        await self._run("finish", call)

    async def renew(self, calls: list[str]) -> None:
        assert self.fallback is not None
        await self.fallback.renew(calls)
        await self._run("renew", round(self.adaptation.lease_s * 1000), *calls)

    async def observe(self, signal: Signal) -> float:
        assert self.fallback is not None

        def ms(seconds: float | None) -> int:
            return -1 if seconds is None else round(seconds * 1000)

        answer = await self._run("observe", signal.status, ms(signal.retry_after_s),
                                 -1 if signal.remaining is None else signal.remaining, ms(signal.reset_in_s))
        return await self.fallback.observe(signal) if answer is None else float(answer)

    async def snapshot(self) -> Snapshot:
        assert self.fallback is not None
        answer = await self._run("peek")
        if answer is None:
            return await self.fallback.snapshot()
        limit, calls, held, remaining = answer.split()
        return Snapshot(float(limit), int(calls), float(held) / 1000.0, None if int(remaining) < 0 else int(remaining))


# --- the admission the generators go through --------------------------------------------------------
class AdaptiveModelCalls:
    """Model calls of a hosted model, admitted by the account's ``ModelCallState``; ``observe`` is the
    response hook of the model's HTTP client (``pipelines.generators.make_generator(on_response=...)``)."""

    #: Every place taken: how soon a waiting call looks again for a place another replica freed (a call
    #: ending in this process wakes its waiters at once), doubling to ``POLL_MAX_S``: a hundred calls
    #: waiting out a dead replica's places polled Redis 400 times a second and emptied the connection
    #: pool the turns' leases are renewed through.
    POLL_S = 0.25
    POLL_MAX_S = 2.0

    def __init__(self, state: ModelCallState, *, renew_every_s: float | None = None):
        self.state = state
        self.peak = 0
        self.in_use = 0
        self.refusals = 0
        self._waiting: set[asyncio.Future[None]] = set()
        self._held_back = 0
        adaptation = getattr(state, "adaptation", None)
        lease_s = adaptation.lease_s if adaptation is not None else Adaptation().lease_s
        self.renew_every_s = lease_s / 3 if renew_every_s is None else renew_every_s
        self._running: set[str] = set()  # this process's calls in flight, renewed together
        self._renewer: asyncio.Task[None] | None = None

    def _renewing(self) -> None:
        """The task renewing this process's calls runs while any is in flight (started by the first)."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(), name="model-call-leases")

    async def _renew_loop(self) -> None:
        while self._running:
            await asyncio.sleep(self.renew_every_s)
            if not self._running:
                return
            try:
                await self.state.renew(sorted(self._running))
            except Exception:  # noqa: BLE001 - a lease lost is a place counted free for a moment, no more
                log.warning("could not renew the model calls' leases; retrying in %.0f s", self.renew_every_s,
                            exc_info=True)

    @property
    def waiting(self) -> int:
        """Calls of this process that found no place and wait for one."""
        return self._held_back

    async def enter(self) -> str:
        """Wait for a place; returns the call's ticket for ``leave``. Waiting calls are not ordered:
        whichever looks first after a place frees takes it."""
        call = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        held_back = False
        poll_s = self.POLL_S
        try:
            while True:
                ended = loop.create_future()
                self._waiting.add(ended)  # before looking: a call ending meanwhile still wakes this one
                try:
                    try:
                        wait = await self.state.start(call)
                    except asyncio.CancelledError:  # the place may have been taken as the turn ended
                        await asyncio.shield(self.state.finish(call))
                        raise
                    if wait == 0:
                        self.in_use += 1
                        self.peak = max(self.peak, self.in_use)
                        self._running.add(call)
                        self._renewing()
                        return call
                    if not held_back:
                        held_back = True
                        self._held_back += 1
                    await asyncio.wait({ended}, timeout=poll_s if wait < 0 else wait)
                    if wait < 0:
                        poll_s = min(self.POLL_MAX_S, poll_s * 2)
                finally:
                    self._waiting.discard(ended)
                    ended.cancel()
        finally:
            if held_back:
                self._held_back -= 1

    async def leave(self, call: str) -> None:
        self.in_use -= 1
        self._running.discard(call)
        try:
            await self.state.finish(call)
        finally:
            for ended in list(self._waiting):
                if not ended.done() and ended.get_loop() is asyncio.get_running_loop():
                    ended.set_result(None)

    async def observe(self, status: int, headers: Mapping[str, str]) -> None:
        """One response of the provider (429s the SDK retries included)."""
        signal = read_signal(status, headers)
        if signal.refused:
            self.refusals += 1
        if signal.refused or signal.status < 400 or signal.remaining is not None:
            limit = await self.state.observe(signal)
            if signal.refused:
                log.warning("model refused a call (%d, retry after %s s): %.1f calls at once from now",
                            signal.status, signal.retry_after_s, limit)
