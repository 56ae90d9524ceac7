"""Per-thread conversation history.

Stored as Haystack ``ChatMessage`` JSON, one row (or Redis list item) per message, capped by
turns and characters so a long thread cannot grow without bound. The embedded default is a
SQLite file in the data directory; ``REDIS_URL`` switches to Redis with the same interface.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

from haystack.dataclasses import ChatMessage


class HistoryStore(Protocol):
    async def load(self, thread_key: str) -> list[ChatMessage]:
        """The thread's messages, oldest first, within the caps."""

    async def append(self, thread_key: str, messages: list[ChatMessage]) -> None:
        """Add messages of one turn; all or nothing."""

    async def clear(self, thread_key: str) -> None: ...

    async def close(self) -> None: ...


def cap_messages(messages: list[ChatMessage], max_turns: int, max_chars: int) -> list[ChatMessage]:
    """The newest messages that fit ``max_turns`` user turns and ``max_chars`` characters."""
    kept: list[ChatMessage] = []
    chars = 0
    turns = 0
    for message in reversed(messages):
        size = len(message.text or "")
        if kept and chars + size > max_chars:
            break
        if message.role.value == "user":
            turns += 1
            if turns > max_turns:
                break
        kept.append(message)
        chars += size
    kept.reverse()
    # A history that starts with an assistant reply lost its question: drop the orphan.
    while kept and kept[0].role.value != "user":
        kept.pop(0)
    return kept


class SqliteHistory:
    """History in one SQLite file; safe for concurrent turns of one process."""

    def __init__(self, path: str | Path, *, max_turns: int = 20, max_chars: int = 20000, ttl_days: float = 30):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_turns = max_turns
        self.max_chars = max_chars
        self.ttl_s = ttl_days * 86400
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "thread TEXT NOT NULL, at REAL NOT NULL, message TEXT NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS messages_thread ON messages(thread, id)")
        self._db.execute("CREATE INDEX IF NOT EXISTS messages_at ON messages(at)")
        self._expire()

    def _expire(self) -> None:
        """Deletes every message older than ``ttl_days``, of any thread: a thread nobody reads again
        must not keep what it said for ever (Redis expires its lists the same way)."""
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE at < ?", (time.time() - self.ttl_s,))

    def _load(self, thread_key: str) -> list[ChatMessage]:
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE thread = ? AND at < ?", (thread_key, time.time() - self.ttl_s))
            rows = self._db.execute(
                "SELECT message FROM messages WHERE thread = ? ORDER BY id", (thread_key,)
            ).fetchall()
        messages = [ChatMessage.from_dict(json.loads(r[0])) for r in rows]
        return cap_messages(messages, self.max_turns, self.max_chars)

    def _append(self, thread_key: str, messages: list[ChatMessage]) -> None:
        now = time.time()
        rows = [(thread_key, now, json.dumps(m.to_dict(), ensure_ascii=False)) for m in messages]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM messages WHERE at < ?", (now - self.ttl_s,))
                self._db.executemany("INSERT INTO messages (thread, at, message) VALUES (?, ?, ?)", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _clear(self, thread_key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM messages WHERE thread = ?", (thread_key,))

    async def load(self, thread_key: str) -> list[ChatMessage]:
        return await asyncio.to_thread(self._load, thread_key)

    async def append(self, thread_key: str, messages: list[ChatMessage]) -> None:
        await asyncio.to_thread(self._append, thread_key, messages)

    async def clear(self, thread_key: str) -> None:
        await asyncio.to_thread(self._clear, thread_key)

    async def close(self) -> None:
        with self._lock:
            self._db.close()
