"""Where turn records live: Redis when the bot has it, else a SQLite file in the data directory.

Both keep a record ``retention_days`` after its turn, then drop it; both can list a time window
(newest first), find one turn, add feedback and approvals to a turn, and delete everything of
one user (``forget``).

Redis keys (``prefix`` is ``redis_prefix``):

| key | holds | expiry |
| --- | --- | --- |
| ``{prefix}turn:{turn_id}`` | hash: ``record`` (JSON), ``fb:{user}`` (up/down), ``approval`` (JSON), ``follow_up`` (JSON) | retention |
| ``{prefix}turns`` | sorted set of turn ids by time (trimmed on each write) | none |
| ``{prefix}turns:user:{platform}:{tenant}:{user}`` | set of that user's turn ids (for ``forget``) | retention |
| ``{prefix}admin:revoked:{session_id}`` | an admin page session logged out before it expired | the session's rest |

The admin page's sessions are signed cookies; one logged out is remembered here as revoked until it
would have expired, so its cookie (copied, or kept by a shared browser) no longer opens the page.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from bot.state.turn_log.records import TurnRecord


class TurnLog(Protocol):
    async def add(self, record: TurnRecord) -> None: ...

    async def get(self, turn_id: str) -> TurnRecord | None: ...

    async def window(self, since: float, until: float | None = None) -> list[TurnRecord]:
        """The records of turns in [since, until), newest first."""

    async def set_feedback(self, turn_id: str, user: str, rating: str) -> bool:
        """False when no record of ``turn_id`` is kept (expired, or recording was off)."""

    async def set_approval(self, turn_id: str, approval: dict[str, Any] | None) -> bool: ...

    async def claim_follow_up(self, turn_id: str, follow_up: dict[str, Any]) -> bool:
        """Sets the turn's follow-up only if it has none (one atomic step, whichever replica asks):
        True for the one caller that may post it."""

    async def set_follow_up(self, turn_id: str, follow_up: dict[str, Any] | None) -> bool:
        """Replaces (None: drops) the turn's follow-up; False when no record of ``turn_id`` is kept."""

    async def forget(self, platform: str, tenant: str, user: str) -> int:
        """Deletes the user's records; how many there were."""

    async def revoke_session(self, session_id: str, ttl_s: float) -> None:
        """Remembers an admin page session as logged out for ``ttl_s`` (what is left of its life)."""

    async def session_revoked(self, session_id: str) -> bool: ...

    async def close(self) -> None: ...


class SqliteTurnLog:
    """One SQLite file (``":memory:"`` for a process of its own); one writer at a time."""

    def __init__(self, path: str | Path, *, retention_days: float = 90):
        self.retention_s = retention_days * 86400
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS turns (turn_id TEXT PRIMARY KEY, at REAL NOT NULL, "
                         "platform TEXT NOT NULL, tenant TEXT NOT NULL, user TEXT NOT NULL, record TEXT NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS turns_at ON turns(at)")
        self._db.execute("CREATE INDEX IF NOT EXISTS turns_user ON turns(platform, tenant, user)")
        self._db.execute("CREATE TABLE IF NOT EXISTS revoked_sessions (session_id TEXT PRIMARY KEY, until REAL NOT NULL)")

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _add(self, record: TurnRecord) -> None:
        with self._lock:
            self._db.execute("DELETE FROM turns WHERE at < ?", (time.time() - self.retention_s,))
            self._db.execute("INSERT OR REPLACE INTO turns VALUES (?, ?, ?, ?, ?, ?)",
                             (record.turn_id, record.at, record.platform, record.tenant, record.user,
                              json.dumps(record.to_dict(), ensure_ascii=False)))

    def _get(self, turn_id: str) -> TurnRecord | None:
        rows = self._run("SELECT record FROM turns WHERE turn_id = ? AND at >= ?",
                         (turn_id, time.time() - self.retention_s))
        return TurnRecord.from_dict(json.loads(rows[0][0])) if rows else None

    def _update(self, turn_id: str, change: Any) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute("SELECT record FROM turns WHERE turn_id = ?", (turn_id,)).fetchall()
                if rows:
                    record = TurnRecord.from_dict(json.loads(rows[0][0]))
                    change(record)
                    self._db.execute("UPDATE turns SET record = ? WHERE turn_id = ?",
                                     (json.dumps(record.to_dict(), ensure_ascii=False), turn_id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return bool(rows)

    async def add(self, record: TurnRecord) -> None:
        await asyncio.to_thread(self._add, record)

    async def get(self, turn_id: str) -> TurnRecord | None:
        return await asyncio.to_thread(self._get, turn_id)

    async def window(self, since: float, until: float | None = None) -> list[TurnRecord]:
        since = max(since, time.time() - self.retention_s)
        rows = await asyncio.to_thread(self._run, "SELECT record FROM turns WHERE at >= ? AND at < ? ORDER BY at DESC",
                                       (since, until if until is not None else float("inf")))
        return [TurnRecord.from_dict(json.loads(r[0])) for r in rows]

    async def set_feedback(self, turn_id: str, user: str, rating: str) -> bool:
        return await asyncio.to_thread(self._update, turn_id, lambda r: r.feedback.__setitem__(user, rating))

    async def set_approval(self, turn_id: str, approval: dict[str, Any] | None) -> bool:
        return await asyncio.to_thread(self._update, turn_id, lambda r: setattr(r, "approval", approval))

    def _claim(self, turn_id: str, follow_up: dict[str, Any]) -> bool:
        claimed = False

        def change(record: TurnRecord) -> None:
            nonlocal claimed
            if record.follow_up is None:
                record.follow_up, claimed = follow_up, True

        self._update(turn_id, change)
        return claimed

    async def claim_follow_up(self, turn_id: str, follow_up: dict[str, Any]) -> bool:
        return await asyncio.to_thread(self._claim, turn_id, follow_up)

    async def set_follow_up(self, turn_id: str, follow_up: dict[str, Any] | None) -> bool:
        return await asyncio.to_thread(self._update, turn_id, lambda r: setattr(r, "follow_up", follow_up))

    async def forget(self, platform: str, tenant: str, user: str) -> int:
        def delete() -> int:
            with self._lock:
                return self._db.execute("DELETE FROM turns WHERE platform = ? AND tenant = ? AND user = ?",
                                        (platform, tenant, user)).rowcount

        return await asyncio.to_thread(delete)

    def _revoke(self, session_id: str, ttl_s: float) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("DELETE FROM revoked_sessions WHERE until < ?", (now,))
            self._db.execute("INSERT OR REPLACE INTO revoked_sessions VALUES (?, ?)", (session_id, now + ttl_s))

    async def revoke_session(self, session_id: str, ttl_s: float) -> None:
        await asyncio.to_thread(self._revoke, session_id, ttl_s)

    async def session_revoked(self, session_id: str) -> bool:
        rows = await asyncio.to_thread(self._run, "SELECT 1 FROM revoked_sessions WHERE session_id = ? AND until >= ?",
                                       (session_id, time.time()))
        return bool(rows)

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisTurnLog:
    """The records in Redis, shared by every replica; see the module docstring for the keys."""

    def __init__(self, redis: Any, prefix: str = "kbbot:", *, retention_days: float = 90):
        self.redis = redis
        self.prefix = prefix
        self.retention_s = int(retention_days * 86400)

    def _turn(self, turn_id: str) -> str:
        return f"{self.prefix}turn:{turn_id}"

    def _user(self, platform: str, tenant: str, user: str) -> str:
        return f"{self.prefix}turns:user:{platform}:{tenant}:{user}"

    @property
    def _index(self) -> str:
        return f"{self.prefix}turns"

    async def add(self, record: TurnRecord) -> None:
        key, mine = self._turn(record.turn_id), self._user(record.platform, record.tenant, record.user)
        ttl = int(record.at + self.retention_s - time.time())
        if ttl <= 0:  # already past retention (an imported or replayed turn): nothing to keep
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "record", json.dumps(record.to_dict(), ensure_ascii=False))
            pipe.expire(key, ttl)
            pipe.zadd(self._index, {record.turn_id: record.at})
            pipe.zremrangebyscore(self._index, "-inf", time.time() - self.retention_s)
            pipe.sadd(mine, record.turn_id)
            pipe.expire(mine, self.retention_s)
            await pipe.execute()

    @staticmethod
    def _decode(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def _parse(self, fields: dict[Any, Any]) -> TurnRecord | None:
        values = {self._decode(k): self._decode(v) for k, v in fields.items()}
        if "record" not in values:
            return None
        record = TurnRecord.from_dict(json.loads(values["record"]))
        record.feedback = {k[3:]: v for k, v in values.items() if k.startswith("fb:")}
        record.approval = json.loads(values["approval"]) if values.get("approval") else None
        record.follow_up = json.loads(values["follow_up"]) if values.get("follow_up") else None
        return record

    async def get(self, turn_id: str) -> TurnRecord | None:
        return self._parse(await self.redis.hgetall(self._turn(turn_id)))

    async def window(self, since: float, until: float | None = None) -> list[TurnRecord]:
        ids = await self.redis.zrevrangebyscore(self._index, f"({until}" if until is not None else "+inf",
                                                max(since, time.time() - self.retention_s))
        records: list[TurnRecord] = []
        for start in range(0, len(ids), 500):
            async with self.redis.pipeline(transaction=False) as pipe:
                for turn_id in ids[start:start + 500]:
                    pipe.hgetall(self._turn(self._decode(turn_id)))
                found = await pipe.execute()
            records += [r for r in map(self._parse, found) if r is not None]
        return records

    async def _set_if_kept(self, turn_id: str, field: str, value: str | None) -> bool:
        key = self._turn(turn_id)
        if not await self.redis.hexists(key, "record"):
            return False
        if value is None:
            await self.redis.hdel(key, field)
        else:
            await self.redis.hset(key, field, value)
        return True

    async def set_feedback(self, turn_id: str, user: str, rating: str) -> bool:
        return await self._set_if_kept(turn_id, f"fb:{user}", rating)

    async def set_approval(self, turn_id: str, approval: dict[str, Any] | None) -> bool:
        return await self._set_if_kept(turn_id, "approval", None if approval is None else json.dumps(approval))

    async def claim_follow_up(self, turn_id: str, follow_up: dict[str, Any]) -> bool:
        key = self._turn(turn_id)
        if not await self.redis.hexists(key, "record"):
            return False
        return bool(await self.redis.hsetnx(key, "follow_up", json.dumps(follow_up, ensure_ascii=False)))

    async def set_follow_up(self, turn_id: str, follow_up: dict[str, Any] | None) -> bool:
        return await self._set_if_kept(turn_id, "follow_up",
                                       None if follow_up is None else json.dumps(follow_up, ensure_ascii=False))

    async def forget(self, platform: str, tenant: str, user: str) -> int:
        mine = self._user(platform, tenant, user)
        ids = [self._decode(t) for t in await self.redis.smembers(mine)]
        if not ids:
            return 0
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(*[self._turn(t) for t in ids], mine)
            pipe.zrem(self._index, *ids)
            deleted, _ = await pipe.execute()
        return max(0, int(deleted) - 1)

    def _revoked(self, session_id: str) -> str:
        return f"{self.prefix}admin:revoked:{session_id}"

    async def revoke_session(self, session_id: str, ttl_s: float) -> None:
        await self.redis.set(self._revoked(session_id), "1", ex=max(1, math.ceil(ttl_s)))

    async def session_revoked(self, session_id: str) -> bool:
        return bool(await self.redis.exists(self._revoked(session_id)))

    async def close(self) -> None:
        """The client belongs to the runtime, which closes it."""
