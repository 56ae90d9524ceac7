"""Claims and take-over (issue 26, findings 4, 5 and 7): a second bot on the same Redis never takes over
the first bot's questions, a Telegram stranger or a command leaves no claim renewing for ever, and
another platform's expired entries cannot starve a replica's take-over. Through the real aiogram stack
against the Telegram fake (two bots, two fakes), and on both pending-turn stores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from bot.delivery.pending import MemoryPendingTurns, PendingTurn, PendingTurns
from bot.delivery.redis_pending import RedisPendingTurns
from bot.runtime import Runtime
from bot.state import MemoryIdempotency
from bot.types import Inquiry, Outcome
from tests.fakes.telegram_server import FakeTelegram, message_update, user
from tests.replies import Stuck
from tests.test_takeover import LEASE, PARTIAL, until
from tests.test_telegram import QUESTION, telegram_bot

pytest_plugins = ["tests.test_telegram"]  # the fake_tg fixture

REDIS_URL = os.environ.get("REDIS_URL")

# --- finding 4: one bot's replica takes over another bot's pending turn ---------------------------------
async def test_a_replica_of_another_bot_neither_takes_over_nor_resumes_a_turn(kb_runtime: Runtime,
                                                                              fake_tg: FakeTelegram):
    stuck = Stuck(PARTIAL)
    async with telegram_bot(kb_runtime, fake_tg, answerer=stuck, stream_mode="edit", claim_lease_s=LEASE) as a:
        a.adapter.conversations.turns.serve(a.adapter.delivery)
        fake_tg.push(message_update(QUESTION, chat_id=7002))
        await until(lambda: bool(fake_tg.chat(7002)))
        [orphan] = fake_tg.chat(7002)
        await asyncio.sleep(0.5)  # the lease records the message's id
        for task in list(a.adapter.delivery.tasks._tasks):  # SIGKILL: nothing more from bot A's replica
            task.cancel()

    async with FakeTelegram(token="987654321:OTHER-bot_xyz", username="other_bot") as fake_b, \
            telegram_bot(kb_runtime, fake_b, stream_mode="edit", claim_lease_s=LEASE) as b:
        conversations = b.adapter.conversations
        assert conversations.takeover is not None
        conversations.takeover.replica = "B"
        conversations.turns.serve(b.adapter.delivery)
        await asyncio.sleep(LEASE * 1.6)
        assert await conversations.turns.recover() == 0, "bot B's replica takes nothing of bot A"
        await conversations.turns.recovering.settle(0.05)
        # Handed the turn anyway (a store that returned it), B refuses it before touching anything.
        turn = PendingTurn(id="telegram:message:x", inquiry=Inquiry("telegram", str(fake_tg.bot_id), "7002",
                                                                     f"telegram:{fake_tg.bot_id}:7002", "7002",
                                                                     QUESTION),
                           target={"chat": {"bot_id": fake_tg.bot_id, "chat_id": 7002, "user_id": 7002,
                                            "private": True}, "language": "en"},
                           claim_keys=["telegram:message:x"], event_id="1", kind="private", crashed="x",
                           lease_s=LEASE, dedupe_ttl_s=60, account=f"telegram:{fake_tg.bot_id}",
                           messages=[str(orphan.message_id)])
        assert await conversations.turns.resume(turn) is None
        assert await b.adapter.delivery.resume(turn) is None
    assert not orphan.deleted and b.turns == [], "B deleted nothing and answered nothing"
    assert not [c for c in fake_b.calls if c.method in ("sendMessage", "deleteMessage", "editMessageText")]

    # Bot A's next replica takes its question over and answers it once.
    async with telegram_bot(kb_runtime, fake_tg, stream_mode="edit", claim_lease_s=LEASE) as a2:
        conversations = a2.adapter.conversations
        assert conversations.takeover is not None
        conversations.takeover.replica = "A2"
        conversations.turns.serve(a2.adapter.delivery)
        assert await conversations.turns.recover() == 1
        await conversations.turns.recovering.settle(0.05)
    [answer] = fake_tg.chat(7002)
    assert orphan.deleted and answer.message_id != orphan.message_id
    [turn_record] = a2.turns
    assert turn_record.answer is not None and turn_record.answer.outcome is Outcome.ANSWERED


# --- finding 5: Telegram claims renewed for ever ---------------------------------------------------------
class Watching(MemoryIdempotency):
    """Claims and lease renewals, as the store sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed: list[str] = []
        self.extended: list[tuple[float, str]] = []

    async def claim(self, key: str, ttl_s: float) -> bool:
        self.claimed.append(key)
        return await super().claim(key, ttl_s)

    async def extend(self, key: str, ttl_s: float) -> bool:
        self.extended.append((time.monotonic(), key))
        return await super().extend(key, ttl_s)


def renewing() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "renew claims" and not t.done()]


async def test_strangers_and_commands_leave_no_claim_renewing(kb_runtime: Runtime, fake_tg: FakeTelegram):
    store = Watching()
    help_command = [{"type": "bot_command", "offset": 0, "length": 5}]
    async with telegram_bot(kb_runtime, fake_tg, idempotency=store, allowed_users=["7001"], claim_lease_s=0.3,
                            dedupe_ttl_s=2.0) as tg:
        for n in range(30):
            await tg.send(message_update(f"question {n}", chat_id=7666, from_user=user(7666)))
        for _ in range(10):
            await tg.send(message_update("/help", chat_id=7001, entities=help_command))
        await asyncio.sleep(0.5)
        assert renewing() == [], "every claim is finished once its update is handled"
        since = time.monotonic()
        await asyncio.sleep(1.0)  # more than three renewal periods of the lease
        assert [key for at, key in store.extended if at > since] == [], "no claim is renewed any more"
    assert not any(":7666:" in key for key in store.claimed), "a stranger's messages claim nothing"
    assert len(fake_tg.chat(7666)) == 1, "the stranger is told once"
    assert len(fake_tg.chat(7001)) == 10, "each /help is answered"


# --- finding 7: take-over starved by another platform's expired entries --------------------------------
@contextlib.asynccontextmanager
async def pending_store(kind: str) -> AsyncIterator[PendingTurns]:
    if kind == "memory":
        yield MemoryPendingTurns()
        return
    if not REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    async with Redis.from_url(REDIS_URL) as client:
        yield RedisPendingTurns(client, f"kbbot:test:{uuid.uuid4().hex[:8]}:")


def turn(platform: str, n: int, account: str) -> PendingTurn:
    inquiry = Inquiry(platform, "T1", "C1", f"{platform}:T1:C1:{n}", "U1", f"question {n}")
    return PendingTurn(id=f"{platform}:message:{account}:{n}", inquiry=inquiry, target={"n": n},
                       claim_keys=[f"{platform}:message:{account}:{n}"], event_id=f"Ev{n}", kind="dm",
                       crashed="x", lease_s=0.3, dedupe_ttl_s=60, account=account)


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_another_accounts_expired_entries_do_not_starve_the_take_over(kind: str):
    async with pending_store(kind) as store:
        for n in range(25):  # another platform's (and another bot's) entries, expiring first
            await store.add(turn("telegram", n, "telegram:42"), "dead")
        await store.add(turn("telegram", 99, "telegram:43"), "dead")
        await asyncio.sleep(0.1)
        await store.add(mine := turn("slack", 1, "slack:B1"), "dead")
        await asyncio.sleep(0.5)  # every entry's lease has expired
        taken = await store.take_expired("me", ["slack:B1"], 20)
        assert [t.id for t in taken] == [mine.id], "the batch is spent on entries this replica may take"
        taken = await store.take_expired("me", ["telegram:43"], 1)
        assert [t.account for t in taken] == ["telegram:43"], "one bot's entries are not another's"
