"""Where rate budgets keep their token buckets: in this process, or in Redis, shared by every replica.

A platform's rate limits belong to the app (Slack: per workspace and channel; Telegram: per chat and
per bot), whichever replica calls. With ``REDIS_URL`` every replica draws from one bucket per
``(scope, method)`` in Redis, so together they stay inside the tier however many of them run, idle
or die; without it the buckets live in this process (``MemoryBuckets``). ``bot.delivery.reply.TokenBucket``
puts its waiting callers in priority order on top of either store.

A bucket holds up to ``burst`` tokens and gains ``per_minute / 60`` a second. Both stores give:

- ``take``: one token from each of several buckets, all or none, or the seconds until all could
  give one. A *spare* take (an intermediate state: only with budget to spare) also defers to
  callers waiting for the bucket anywhere: each waiting store marks the bucket "wanted" while it
  waits, so a replica's spare-only call never takes the token another replica's final text waits for,
  and it leaves the rate's ``reserve`` in the bucket for the next call that must go;
- ``give_back`` (a token taken but not used), ``hold`` (a 429's Retry-After: nothing goes through
  until it ends, for every replica; then one call at once and the rest at the rate) and ``peek``.

Redis keys (``prefix`` names the platform and app, e.g. ``kbbot:rate:slack:``):

==============================  ====  ==============================================================
key                             type  contents and lifetime
==============================  ====  ==============================================================
``{prefix}{scope}:{method}``    hash  ``tokens``, ``stamp`` (ms, when ``tokens`` was counted), ``held``
                                      (ms, end of a 429 hold); absent = full; expires once it would
                                      be full again
``{prefix}{scope}:{method}:w``  zset  stores waiting for the bucket (member: store id, score: until
                                      when, ms); expires with the last wait
==============================  ====  ==============================================================

Every operation is one Lua script against Redis' own clock (no replica clock skew), as
``bot.turn.limits`` does its windows. When Redis cannot be reached, ``RedisBuckets`` goes on with buckets of
its own in this process at the full rate for ``outage_retry_s`` and then tries Redis again (logged once
per outage): the platform may answer some calls with 429, which the callers hold and retry, so an
outage slows answers down and loses none.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.state.redis import SharedScript

log = logging.getLogger("kbbot.rate")

Clock = Callable[[], float]


@dataclass(frozen=True)
class Rate:
    """A method's allowance: ``per_minute`` on average, up to ``burst`` calls at once. A spare-only
    call (``take(spare=True)``: a state nobody waits for) leaves ``reserve`` tokens in the bucket, so
    the calls that must go (a first acknowledgement, a first or final text) arriving next find one."""

    per_minute: float
    burst: int = 1
    reserve: int = 0

    def __post_init__(self) -> None:
        if self.per_minute <= 0 or self.burst < 1 or not 0 <= self.reserve < self.burst:
            raise ValueError(f"a rate needs per_minute > 0, burst >= 1 and 0 <= reserve < burst, got {self}")

    @property
    def per_s(self) -> float:
        return self.per_minute / 60.0


#: How long a waiting store's "wanted" mark outlives its expected wait: it is renewed at every try,
#: so a replica that dies while waiting blocks spare-only callers for at most this long.
WANT_MARGIN_S = 1.0


class BucketStore(Protocol):
    """Token buckets by key; see the module docstring."""

    async def take(self, buckets: Sequence[tuple[str, Rate]], *, spare: bool = False,
                   still_waiting: bool = False) -> float:
        """One token from every bucket, or none: 0.0 when taken, else the seconds until all could give
        one. Not ``spare``, a refusal marks the buckets wanted by this store until then, and a take
        clears the mark unless ``still_waiting`` (more of this store's callers wait)."""

    async def take_some(self, key: str, rate: Rate, wanted: int) -> tuple[int, float]:
        """Up to ``wanted`` tokens of one bucket at once: (how many were taken, the seconds until the next
        one when fewer than ``wanted`` were free). Fewer than wanted marks the bucket wanted by this store."""

    async def give_back(self, key: str, rate: Rate) -> None:
        """Return a token taken but not used."""

    async def hold(self, key: str, rate: Rate, seconds: float) -> None:
        """Nothing goes through for ``seconds``; then one call at once, the rest at the rate."""

    async def peek(self, key: str, rate: Rate) -> tuple[float, float]:
        """(tokens now, seconds until one is free)."""


# --- in this process -----------------------------------------------------------------------------
@dataclass
class _State:
    tokens: float
    stamp: float
    held: float = float("-inf")
    wanted_until: float = float("-inf")

    def refill(self, rate: Rate, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(float(rate.burst), self.tokens + (now - self.stamp) * rate.per_s)
            self.stamp = now

    def delay(self, rate: Rate, now: float, reserve: int = 0) -> float:
        """Seconds until a token is free beyond ``reserve``: a hold first (nothing accrues while held),
        then the refill."""
        held = max(0.0, self.held - now)
        if not held:
            self.refill(rate, now)
        needed = 1.0 + reserve
        return held + (0.0 if self.tokens >= needed else (needed - self.tokens) / rate.per_s)


class MemoryBuckets:
    """Buckets in this process, on ``clock``: for one process without Redis (and for tests' fake time).
    A process has one queue of waiters per bucket, so its waiters need no "wanted" mark."""

    def __init__(self, clock: Clock = time.monotonic):
        self.clock = clock
        self._states: dict[str, _State] = {}

    def _state(self, key: str, rate: Rate) -> _State:
        found = self._states.get(key)
        if found is None:
            found = self._states[key] = _State(float(rate.burst), self.clock())
        return found

    async def take(self, buckets: Sequence[tuple[str, Rate]], *, spare: bool = False,
                   still_waiting: bool = False) -> float:
        now = self.clock()
        states = [(self._state(key, rate), rate) for key, rate in buckets]
        wait = max((state.delay(rate, now, rate.reserve if spare else 0) for state, rate in states), default=0.0)
        if wait > 0:
            return wait
        for state, _ in states:
            state.tokens -= 1.0
        return 0.0

    async def take_some(self, key: str, rate: Rate, wanted: int) -> tuple[int, float]:
        now = self.clock()
        state = self._state(key, rate)
        if state.delay(rate, now) > 0:
            return 0, state.delay(rate, now)
        taken = min(wanted, int(state.tokens))
        state.tokens -= taken
        return taken, 0.0 if taken >= wanted else state.delay(rate, now)

    async def give_back(self, key: str, rate: Rate) -> None:
        state = self._state(key, rate)
        state.refill(rate, self.clock())
        state.tokens = min(float(rate.burst), state.tokens + 1.0)

    async def hold(self, key: str, rate: Rate, seconds: float) -> None:
        now = self.clock()
        state = self._state(key, rate)
        state.held = max(state.held, now + seconds)
        state.refill(rate, now)
        state.tokens = min(state.tokens, 1.0)
        state.stamp = max(state.stamp, state.held)

    async def peek(self, key: str, rate: Rate) -> tuple[float, float]:
        state = self._state(key, rate)
        delay = state.delay(rate, self.clock())
        return state.tokens, delay


# --- in Redis ------------------------------------------------------------------------------------
# KEYS: bucket, wanted zset (pairs, one per bucket). ARGV: op, store id, mark ms (how long "wanted" lasts
# past the expected wait), hold ms, then per bucket its tokens per ms, burst and reserve (what a spare take
# leaves in the bucket). Ops: take (a grant clears
# this store's mark), take+ (a grant keeps it: more of its callers wait), spare (refused while any store
# waits), give, hold, peek (as spare would see it). Returns a string: take/spare "0" or the ms until all buckets could give a
# token; peek "tokens ms"; give/hold "0". Times are ms on Redis' clock.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local op, owner, mark, hold_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #KEYS / 2
local states = {}
local wait = 0
for i = 1, n do
  local rate, burst, reserve = tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i]), tonumber(ARGV[4 + 3 * i])
  local h = redis.call('HMGET', KEYS[2 * i - 1], 'tokens', 'stamp', 'held')
  local s = {tokens = tonumber(h[1]) or burst, stamp = tonumber(h[2]) or now, held = tonumber(h[3]) or 0,
             rate = rate, burst = burst}
  local held = math.max(0, s.held - now)
  if held == 0 and now > s.stamp then
    s.tokens = math.min(burst, s.tokens + (now - s.stamp) * rate)
    s.stamp = now
  end
  local delay = held
  local needed = 1
  if op == 'spare' then needed = 1 + reserve end
  if s.tokens < needed then delay = delay + (needed - s.tokens) / rate end
  if (op == 'spare' or op == 'peek') and delay == 0 then
    -- a spare-only caller looks again after a while: the waiters' next grants come first
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now)
    if redis.call('ZCARD', KEYS[2 * i]) > 0 then delay = 50 end
  end
  states[i] = s
  wait = math.max(wait, delay)
end
if op == 'peek' then
  return string.format('%.17g %.17g', states[1].tokens, wait)
end
local function save(i, s)
  local key = KEYS[2 * i - 1]
  redis.call('HSET', key, 'tokens', string.format('%.17g', s.tokens), 'stamp', string.format('%.17g', s.stamp),
             'held', string.format('%.17g', s.held))
  local full_in = math.max(0, s.held - now) + (s.burst - s.tokens) / s.rate
  redis.call('PEXPIRE', key, math.ceil(full_in) + 1000)
end
if op == 'give' then
  local s = states[1]
  s.tokens = math.min(s.burst, s.tokens + 1)
  save(1, s)
  return '0'
end
if op == 'hold' then
  local s = states[1]
  s.held = math.max(s.held, now + hold_ms)
  s.tokens = math.min(s.tokens, 1)
  s.stamp = math.max(s.stamp, s.held)
  save(1, s)
  return '0'
end
local waiting = op == 'take' or op == 'take+'
local function want(i, til)
  local key = KEYS[2 * i]
  redis.call('ZADD', key, til, owner)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.ceil(tonumber(last[2]) - now))
end
if op == 'some' then
  -- up to hold_ms (here: a count) tokens of one bucket in one call: a dispatcher serving a queue of
  -- waiters grants every free token at once, not one per round trip
  local s = states[1]
  local taken = 0
  if wait == 0 then
    taken = math.min(hold_ms, math.floor(s.tokens))
    s.tokens = s.tokens - taken
    save(1, s)
  end
  if taken < hold_ms then
    local next_in = math.max(0, s.held - now)
    if s.tokens < 1 then next_in = next_in + (1 - s.tokens) / s.rate end
    want(1, now + next_in + mark)
    return string.format('%d %.17g', taken, next_in)
  end
  redis.call('ZREM', KEYS[2], owner)
  return string.format('%d 0', taken)
end
if wait > 0 then
  if waiting then
    for i = 1, n do want(i, now + wait + mark) end
  end
  return string.format('%.17g', wait)
end
for i = 1, n do
  states[i].tokens = states[i].tokens - 1
  save(i, states[i])
  if waiting then
    if op == 'take+' then
      want(i, now + mark)
    else
      redis.call('ZREM', KEYS[2 * i], owner)
    end
  end
end
return '0'
"""


#: Redis out of reach: down, cut off, timing out, or a primary demoted during a failover (read-only).
@dataclass
class RedisBuckets:
    """Buckets in Redis, shared by every replica with the same ``prefix``; see the module docstring."""

    client: Any
    prefix: str = "kbbot:rate:"
    #: During a Redis outage: how long this process keeps to its own buckets before trying Redis again.
    outage_retry_s: float = 5.0
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    fallback: MemoryBuckets = field(default_factory=MemoryBuckets)
    _script: SharedScript = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._script = SharedScript(self.client, _SCRIPT, what="rate budgets",
                                    meanwhile="this process keeps to buckets of its own at the full rates",
                                    back="the replicas share the buckets again", retry_s=self.outage_retry_s)

    async def _run(self, op: str, buckets: Sequence[tuple[str, Rate]], *, mark_s: float = 0.0,
                   hold_s: float = 0.0, count: int | None = None) -> str | None:
        """The script's answer, or None when Redis is out of reach (then the fallback answers)."""
        keys: list[str] = []
        args: list[Any] = [op, self.id, round(mark_s * 1000, 3), count if count is not None else round(hold_s * 1000, 3)]
        for key, rate in buckets:
            keys += [self.prefix + key, f"{self.prefix}{key}:w"]
            args += [repr(rate.per_s / 1000.0), rate.burst, rate.reserve]
        return await self._script(keys, args)

    async def take(self, buckets: Sequence[tuple[str, Rate]], *, spare: bool = False,
                   still_waiting: bool = False) -> float:
        if not buckets:
            return 0.0
        op = "spare" if spare else "take+" if still_waiting else "take"
        answer = await self._run(op, buckets, mark_s=WANT_MARGIN_S)
        if answer is None:
            return await self.fallback.take(buckets, spare=spare, still_waiting=still_waiting)
        return float(answer) / 1000.0

    async def take_some(self, key: str, rate: Rate, wanted: int) -> tuple[int, float]:
        answer = await self._run("some", [(key, rate)], mark_s=WANT_MARGIN_S, count=wanted)
        if answer is None:
            return await self.fallback.take_some(key, rate, wanted)
        taken, ms = answer.split()
        return int(taken), float(ms) / 1000.0

    async def give_back(self, key: str, rate: Rate) -> None:
        if await self._run("give", [(key, rate)]) is None:
            await self.fallback.give_back(key, rate)

    async def hold(self, key: str, rate: Rate, seconds: float) -> None:
        if await self._run("hold", [(key, rate)], hold_s=seconds) is None:
            await self.fallback.hold(key, rate, seconds)

    async def peek(self, key: str, rate: Rate) -> tuple[float, float]:
        answer = await self._run("peek", [(key, rate)])
        if answer is None:
            return await self.fallback.peek(key, rate)
        tokens, ms = answer.split()
        return float(tokens), float(ms) / 1000.0
