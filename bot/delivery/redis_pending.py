"""Pending turns in Redis, shared by every replica (``bot.delivery.pending.PendingTurns``): a sorted set of
due times per platform account and a hash per turn, changed only by the Lua scripts below."""

from __future__ import annotations

import dataclasses
import json
import logging

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from bot.delivery.pending import PendingTurn
from bot.state.redis import DEFAULT_PREFIX, replicated

logger = logging.getLogger(__name__)

_NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) "

# A turn recorded again (a redelivery, or a take-over keeping its entry) replaces the entry whole: a lock
# another owner recorded is not this one's to free. A final answer recorded before is kept with its
# messages (ARGV[8], ARGV[9]): the turn is still only to be shown again.
_PENDING_ADD = _NOW_MS + """
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'owner', ARGV[2], 'payload', ARGV[3], 'attempts', ARGV[4], 'lease_ms', ARGV[5],
           'account', ARGV[6], 'messages', ARGV[9])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'final', ARGV[8]) end
redis.call('PEXPIRE', KEYS[2], ARGV[7])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[5]), ARGV[1])
"""

# The same, only where no entry of that id is (accepting a question: a redelivery never steals a turn).
_PENDING_ACCEPT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
""" + _PENDING_ADD + """
return 1
"""

_PENDING_HOLD = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lock', ARGV[2], 'lock_token', ARGV[3])
return 1
"""

_PENDING_CONCLUDE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'final', ARGV[2], 'messages', ARGV[3])
return 1
"""

_PENDING_RENEW = _NOW_MS + """
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(redis.call('HGET', KEYS[2], 'lease_ms')), ARGV[1])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'messages', ARGV[3]) end
return 1
"""

_PENDING_REMOVE = """
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""

# Each account has a due set of its own (KEYS), so the LIMIT counts only entries this replica may take:
# another account's expired entries, however many, never starve it.
_PENDING_TAKE = _NOW_MS + """
local out = {}
local left = tonumber(ARGV[2])
for _, due in ipairs(KEYS) do
  if left <= 0 then break end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, left)) do
    local key = ARGV[3] .. id
    local f = redis.call('HMGET', key, 'payload', 'lease_ms', 'messages', 'final', 'lock', 'lock_token')
    redis.call('ZREM', due, id)
    if f[1] then  -- else its hash expired: nothing left to answer
      local attempts = redis.call('HINCRBY', key, 'attempts', 1)
      redis.call('HSET', key, 'owner', ARGV[1])
      redis.call('ZADD', due, now + tonumber(f[2]), id)
      -- The thread lock the dead owner held goes with its turn, if that owner still holds it (its token).
      if f[5] then
        if redis.call('GET', f[5]) == f[6] then redis.call('DEL', f[5]) end
        redis.call('HDEL', key, 'lock', 'lock_token')
      end
      table.insert(out, f[1]) table.insert(out, attempts) table.insert(out, f[3]) table.insert(out, f[4] or '')
      left = left - 1
    end
  end
end
return out
"""


class RedisPendingTurns:
    """``PendingTurns`` shared by replicas (see the scripts above for why a sorted set)."""

    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX, *, replica_acks: int = 0):
        self.client = client
        self.replica_acks = replica_acks
        self.due_prefix = f"{prefix}pending-due:"
        self.entry_prefix = f"{prefix}pending:"
        self._add = client.register_script(_PENDING_ADD)
        self._renew = client.register_script(_PENDING_RENEW)
        self._remove = client.register_script(_PENDING_REMOVE)
        self._take = client.register_script(_PENDING_TAKE)
        self._accept = client.register_script(_PENDING_ACCEPT)
        self._hold = client.register_script(_PENDING_HOLD)
        self._conclude = client.register_script(_PENDING_CONCLUDE)

    def _keys(self, turn: PendingTurn) -> list[str]:
        return [self.due_prefix + turn.account, self.entry_prefix + turn.id]

    async def add(self, turn: PendingTurn, owner: str) -> None:
        await self._record(self._add, turn, owner)

    async def accept(self, turn: PendingTurn, owner: str) -> bool:
        return bool(await self._record(self._accept, turn, owner))

    async def _record(self, script: AsyncScript, turn: PendingTurn, owner: str) -> object:
        args = [turn.id, owner, turn.payload(), turn.attempts, max(1, int(turn.entry_lease_s * 1000)), turn.account,
                max(1, int(turn.dedupe_ttl_s * 1000)), turn.final or "",
                json.dumps(turn.messages if turn.final else [])]
        async with self.client.client() as conn:  # WAIT counts the writes of its own connection
            result = await script(keys=self._keys(turn), args=args, client=conn)
            await replicated(conn, self.replica_acks, f"the pending turn {turn.id!r}")
        return result

    async def renew(self, turn: PendingTurn, owner: str, messages: list[str] | None = None) -> bool:
        recorded = "" if messages is None else json.dumps(messages)
        return bool(await self._renew(keys=self._keys(turn), args=[turn.id, owner, recorded]))

    async def remove(self, turn: PendingTurn, owner: str) -> bool:
        return bool(await self._remove(keys=self._keys(turn), args=[turn.id, owner]))

    async def hold_lock(self, turn: PendingTurn, owner: str, key: str, token: str) -> bool:
        return bool(await self._hold(keys=[self.entry_prefix + turn.id], args=[owner, key, token]))

    async def conclude(self, turn: PendingTurn, owner: str, final: str, messages: list[str]) -> bool:
        async with self.client.client() as conn:  # WAIT counts the writes of its own connection
            owned = bool(await self._conclude(keys=[self.entry_prefix + turn.id], args=[owner, final, json.dumps(messages)],
                                              client=conn))
            if owned:
                await replicated(conn, self.replica_acks, f"the final answer of {turn.id!r}")
        return owned

    async def take_expired(self, owner: str, accounts: list[str], limit: int) -> list[PendingTurn]:
        if not accounts or limit <= 0:
            return []
        raw = await self._take(keys=[self.due_prefix + a for a in accounts], args=[owner, limit, self.entry_prefix])
        turns = []
        for payload, attempts, messages, final in zip(raw[::4], raw[1::4], raw[2::4], raw[3::4]):
            try:
                turns.append(dataclasses.replace(
                    PendingTurn.from_payload(payload, attempts=int(attempts), messages=messages, final=final),
                    owner=owner))
            except (ValueError, TypeError, KeyError) as error:  # owned by us now: it expires again, logged each time
                logger.error("skipping an unreadable pending turn: %s", error)
        return turns
