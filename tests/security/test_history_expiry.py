"""Embedded history kept past ``history.ttl_days`` (issue 15, finding 10): a thread nobody reads again
used to keep its messages for ever in the SQLite file; Redis expires its lists by itself."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from haystack.dataclasses import ChatMessage

from bot.state.history import SqliteHistory


def stored_threads(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT thread, COUNT(*) FROM messages GROUP BY thread").fetchall())


async def test_expired_messages_of_threads_never_read_again_are_deleted(tmp_path: Path):
    path = tmp_path / "history.sqlite3"
    history = SqliteHistory(path, ttl_days=0.5 / 86400)  # half a second
    turn = [ChatMessage.from_user("My serial number is HL-123-SECRET"), ChatMessage.from_assistant("Noted.")]
    await history.append("slack:T1:C1:abandoned", turn)
    await asyncio.sleep(0.7)
    await history.append("slack:T1:C1:other", turn)  # any later write expires the rest
    assert stored_threads(path) == {"slack:T1:C1:other": 2}
    await history.close()

    await asyncio.sleep(0.7)
    reopened = SqliteHistory(path, ttl_days=0.5 / 86400)  # and so does opening the file
    assert stored_threads(path) == {}
    await reopened.close()
