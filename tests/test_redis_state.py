"""Redis history, idempotency and locks against a real Redis server.

Most tests use the server of ``REDIS_URL`` (``bash scripts/services.sh start``) with a key
prefix of their own; the restart test runs a private ``redis-server`` it can kill.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.exceptions
from haystack.dataclasses import ChatMessage
from redis.asyncio import Redis

from bot.state import Idempotency, Lock, LockNotAcquired
from bot.state.history import HistoryStore
from bot.state.redis import (
    RedisHistory,
    RedisIdempotency,
    RedisLock,
    RedisUnavailable,
    _PrimaryFollowingConnection,
    connect_redis,
    redact_url,
)
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(
    not REDIS_URL, reason="REDIS_URL is not set (run `bash scripts/services.sh start` and export its env lines)"
)
needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="the redis-server binary is not on PATH (apt-get install redis-server)"
)


def turn(question: str, answer: str) -> list[ChatMessage]:
    return [ChatMessage.from_user(question), ChatMessage.from_assistant(answer)]


def texts(messages: list[ChatMessage]) -> list[tuple[str, str | None]]:
    return [(m.role.value, m.text) for m in messages]


@pytest.fixture
def prefix() -> str:
    return f"kbbot-test:{uuid.uuid4().hex[:12]}:"


async def _client(prefix: str) -> AsyncIterator[Redis]:
    assert REDIS_URL
    client = await connect_redis(REDIS_URL)
    try:
        yield client
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
async def client_a(prefix: str) -> AsyncIterator[Redis]:
    async for client in _client(prefix):
        yield client


@pytest.fixture
async def client_b(prefix: str) -> AsyncIterator[Redis]:
    async for client in _client(prefix):
        yield client


# --- connecting ---------------------------------------------------------------------------

def test_redact_url_hides_passwords() -> None:
    assert redact_url("redis://:s3cret@db.internal:6379/0") == "redis://:***@db.internal:6379/0"
    assert redact_url("rediss://bot:s3cret@db.internal:6380/2") == "rediss://bot:***@db.internal:6380/2"
    assert redact_url("redis://127.0.0.1:6390/0") == "redis://127.0.0.1:6390/0"
    assert redact_url("unix:///run/redis.sock?db=1&password=s3cret") == "unix:///run/redis.sock?db=1&password=***"


async def test_connect_to_nothing_fails_fast_with_a_masked_url() -> None:
    url = f"redis://:top-s3cret@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(RedisUnavailable) as info:
        await asyncio.wait_for(connect_redis(url), 15)
    message = str(info.value)
    assert message.startswith(f"cannot reach Redis at redis://:***@127.0.0.1:{url.rsplit(':', 1)[1]}: ")
    assert "onnect" in message  # the reason: connection refused
    assert "top-s3cret" not in message and "top-s3cret" not in repr(info.value.__cause__)
    assert isinstance(info.value, RuntimeError)
    assert time.monotonic() - started < 10


async def test_connect_with_a_bad_url_is_reported() -> None:
    with pytest.raises(RedisUnavailable, match="cannot reach Redis at http://x:6379: invalid URL"):
        await connect_redis("http://x:6379")


@needs_redis_server
async def test_connect_with_a_wrong_password_never_shows_it(private_redis: PrivateRedis) -> None:
    private_redis.start("--requirepass", "the-right-one")
    url = f"redis://:hunter2-secret@127.0.0.1:{private_redis.port}/0"
    with pytest.raises(RedisUnavailable) as info:
        await asyncio.wait_for(connect_redis(url), 15)
    message = str(info.value)
    assert message.startswith(f"cannot reach Redis at redis://:***@127.0.0.1:{private_redis.port}/0: ")
    assert "hunter2-secret" not in message and "the-right-one" not in message
    client = await connect_redis(f"redis://:the-right-one@127.0.0.1:{private_redis.port}/0")
    await client.aclose()


# --- history ------------------------------------------------------------------------------

@needs_redis
async def test_history_round_trip_with_chinese_text(client_a: Redis, prefix: str) -> None:
    history: HistoryStore = RedisHistory(client_a, prefix=prefix)
    thread = "slack:T1:C1:1700000000.000100"
    first = turn("变频器报 E07 故障是什么意思？", "E07 表示直流母线过压 [1]。Check the braking resistor.")
    second = turn("How do I reset it?", "断电 5 分钟后重新上电 [2]。")
    await history.append(thread, first)
    await history.append(thread, second)

    loaded = await history.load(thread)
    assert [m.to_dict() for m in loaded] == [m.to_dict() for m in first + second]
    raw = await client_a.lrange(RedisHistory(client_a, prefix=prefix).key(thread), 0, -1)
    assert len(raw) == 4 and "变频器".encode() in raw[0]  # stored as UTF-8 JSON, one item a message
    assert await history.load("slack:T1:C1:other") == []

    await history.clear(thread)
    assert await history.load(thread) == []
    await history.close()
    assert await client_a.ping()  # close leaves the shared client open


@needs_redis
async def test_history_is_capped_by_turns_chars_and_list_length(client_a: Redis, prefix: str) -> None:
    thread = "telegram:bot:42"
    writer = RedisHistory(client_a, prefix=prefix, max_turns=3, max_chars=10_000)
    for i in range(10):
        await writer.append(thread, turn(f"q{i}", f"a{i}"))
    assert texts(await writer.load(thread)) == [
        ("user", "q7"), ("assistant", "a7"), ("user", "q8"), ("assistant", "a8"), ("user", "q9"), ("assistant", "a9"),
    ]
    assert await client_a.llen(writer.key(thread)) == writer.max_items == 12

    by_chars = RedisHistory(client_a, prefix=prefix, max_turns=20, max_chars=40)
    await by_chars.clear(thread)
    await by_chars.append(thread, turn("问" * 10, "答" * 10))
    await by_chars.append(thread, turn("q" * 10, "a" * 10))
    await by_chars.append(thread, turn("x" * 5, "y" * 30))
    # The newest 40 characters hold the last turn only (35); with the previous answer the
    # history would start with an orphan assistant message, which is dropped.
    assert texts(await by_chars.load(thread)) == [("user", "x" * 5), ("assistant", "y" * 30)]


@needs_redis
async def test_a_turn_longer_than_the_list_cap_is_kept_whole(client_a: Redis, prefix: str) -> None:
    history = RedisHistory(client_a, prefix=prefix, max_turns=1, max_items=2)
    messages = [ChatMessage.from_user("q"), ChatMessage.from_assistant("tool call"),
                ChatMessage.from_assistant("answer")]
    await history.append("t", turn("old", "old answer"))
    await history.append("t", messages)
    assert texts(await history.load("t")) == texts(messages)


@needs_redis
async def test_history_expires_after_ttl_days(client_a: Redis, prefix: str) -> None:
    history = RedisHistory(client_a, prefix=prefix, ttl_days=30)
    await history.append("t", turn("q", "a"))
    ttl = await client_a.ttl(history.key("t"))
    assert 30 * 86400 - 5 <= ttl <= 30 * 86400

    short = RedisHistory(client_a, prefix=prefix, ttl_days=1 / 86400)  # one second
    await short.append("t", turn("q2", "a2"))  # each append restarts the clock
    assert 0 < await client_a.pttl(short.key("t")) <= 1000
    await asyncio.sleep(1.1)
    assert await short.load("t") == []


@needs_redis
async def test_concurrent_appends_lose_nothing_and_keep_turns_whole(prefix: str) -> None:
    assert REDIS_URL
    clients = [await connect_redis(REDIS_URL) for _ in range(5)]
    try:
        stores = [RedisHistory(c, prefix=prefix, max_turns=100, max_chars=1_000_000) for c in clients]
        thread = "slack:T1:C1:busy"
        await asyncio.gather(*(
            stores[i % len(stores)].append(thread, turn(f"问题 {i}", f"回答 {i}")) for i in range(50)
        ))
        loaded = await stores[0].load(thread)
        assert len(loaded) == 100
        seen = []
        for question, answer in zip(loaded[::2], loaded[1::2], strict=True):
            assert question.role.value == "user" and answer.role.value == "assistant"
            number = question.text.removeprefix("问题 ")
            assert answer.text == f"回答 {number}"
            seen.append(int(number))
        assert sorted(seen) == list(range(50))
    finally:
        keys = [k async for k in clients[0].scan_iter(match=f"{prefix}*")]
        if keys:
            await clients[0].delete(*keys)
        for c in clients:
            await c.aclose()


# --- idempotency --------------------------------------------------------------------------

@needs_redis
async def test_claim_once_across_two_clients(client_a: Redis, client_b: Redis, prefix: str) -> None:
    a, b = RedisIdempotency(client_a, prefix), RedisIdempotency(client_b, prefix)
    assert isinstance(a, Idempotency)
    results = await asyncio.gather(*(x.claim("slack:T1:Ev01", 60) for x in (a, b) * 10))
    assert results.count(True) == 1
    assert 0 < await client_a.pttl(f"{prefix}dedupe:slack:T1:Ev01") <= 60_000
    assert await b.claim("slack:T1:Ev02", 60)


@needs_redis
async def test_release_allows_the_redelivery(client_a: Redis, client_b: Redis, prefix: str) -> None:
    a, b = RedisIdempotency(client_a, prefix), RedisIdempotency(client_b, prefix)
    assert await a.claim("evt", 60)
    assert not await b.claim("evt", 60)
    await a.release("evt")  # the turn failed: let the platform's retry be answered
    assert await b.claim("evt", 60)
    assert not await a.claim("evt", 60)


@needs_redis
async def test_claim_expires_after_its_ttl(client_a: Redis, prefix: str) -> None:
    idem = RedisIdempotency(client_a, prefix)
    assert await idem.claim("evt", 0.2)
    assert not await idem.claim("evt", 0.2)
    await asyncio.sleep(0.3)
    assert await idem.claim("evt", 0.2)


# --- locks --------------------------------------------------------------------------------

@needs_redis
async def test_lock_is_exclusive_across_two_clients(client_a: Redis, client_b: Redis, prefix: str) -> None:
    a = RedisLock(client_a, "refresh", prefix=prefix)
    b = RedisLock(client_b, "refresh", prefix=prefix)
    assert isinstance(a, Lock)
    assert await a.acquire()
    assert not await b.acquire()
    assert await b.locked()
    assert 0 < await client_b.pttl(f"{prefix}lock:refresh") <= 30_000
    assert await a.release()
    assert await b.acquire()
    with pytest.raises(LockNotAcquired):
        async with a:
            pass
    assert await b.release()
    async with RedisLock(client_a, "refresh", prefix=prefix) as held:
        assert held.held
    assert not await b.locked()


@needs_redis
async def test_blocking_acquire_gets_the_lock_when_freed(client_a: Redis, client_b: Redis, prefix: str) -> None:
    a = RedisLock(client_a, "job", prefix=prefix)
    b = RedisLock(client_b, "job", prefix=prefix, wait_s=3)
    assert await a.acquire()

    async def release_soon() -> None:
        await asyncio.sleep(0.3)
        await a.release()

    releaser = asyncio.create_task(release_soon())
    async with b:  # waits up to wait_s
        assert b.held
    await releaser


@needs_redis
async def test_renewal_keeps_the_lock_past_its_ttl(client_a: Redis, client_b: Redis, prefix: str) -> None:
    holder = RedisLock(client_a, "job", ttl_s=0.6, prefix=prefix)
    other = RedisLock(client_b, "job", ttl_s=0.6, prefix=prefix)
    assert await holder.acquire()
    await asyncio.sleep(1.5)  # 2.5 TTLs
    assert not await other.acquire()
    assert 0 < await client_b.pttl(holder.key) <= 600
    assert not holder.lost
    assert await holder.release()
    assert await client_b.exists(holder.key) == 0


HOLDER = """
import asyncio, sys
from bot.state.redis import RedisLock, connect_redis

async def main():
    client = await connect_redis(sys.argv[1])
    lock = RedisLock(client, "job", ttl_s=float(sys.argv[2]), prefix=sys.argv[3])
    assert await lock.acquire()
    print("acquired", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@needs_redis
@pytest.mark.timeout(60)
async def test_a_lock_whose_holder_dies_expires(client_b: Redis, prefix: str) -> None:
    assert REDIS_URL
    ttl_s = 0.8
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, REDIS_URL, str(ttl_s), prefix,
        cwd=REPO, stdout=asyncio.subprocess.PIPE, env={**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"},
    )
    try:
        assert holder.stdout is not None
        assert await asyncio.wait_for(holder.stdout.readline(), 45) == b"acquired\n"
        waiter = RedisLock(client_b, "job", ttl_s=ttl_s, prefix=prefix)
        await asyncio.sleep(2 * ttl_s)
        assert not await waiter.acquire()  # the live holder renews across processes
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        killed = time.monotonic()
        assert await waiter.acquire(blocking=True, timeout=5)
        assert time.monotonic() - killed <= ttl_s + 0.5
        assert await waiter.release()
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


@needs_redis
async def test_a_lost_lock_is_reported_and_the_new_owner_keeps_it(
    client_a: Redis, client_b: Redis, prefix: str
) -> None:
    old = RedisLock(client_a, "job", ttl_s=0.6, prefix=prefix)
    assert await old.acquire()
    await client_b.delete(old.key)  # as if the TTL ran out while the old holder was cut off
    new = RedisLock(client_b, "job", ttl_s=30, prefix=prefix)
    assert await new.acquire()
    await asyncio.sleep(0.4)  # old's next renewal (every 0.2 s) sees a foreign token
    assert old.lost
    assert not await old.release()
    assert await client_a.exists(new.key) == 1  # the old holder did not free it
    assert await new.release()


# --- Redis restarted in the middle of a test ----------------------------------------------

class PrivateRedis:
    """A redis-server of this test only, on a fixed port so it can be restarted in place."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *options: str) -> None:
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - the server writes it while it runs
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", str(self.directory), *options],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.directory / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):  # up (NOAUTH: with a password)
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within 10 s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@needs_redis_server
@pytest.mark.timeout(60)
async def test_redis_restart_fails_clearly_then_reconnects(private_redis: PrivateRedis) -> None:
    private_redis.start()
    client = await connect_redis(private_redis.url, socket_timeout=2, connect_timeout=1)
    try:
        history = RedisHistory(client, prefix="kbbot:")
        idem = RedisIdempotency(client)
        await history.append("t", turn("before", "restart"))

        private_redis.kill()
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError) as info:
            await asyncio.wait_for(history.append("t", turn("during", "outage")), 15)
        assert f"127.0.0.1:{private_redis.port}" in str(info.value)
        with pytest.raises(redis.exceptions.ConnectionError):
            await asyncio.wait_for(history.load("t"), 15)
        with pytest.raises(redis.exceptions.ConnectionError):
            await asyncio.wait_for(idem.claim("evt", 60), 15)
        assert time.monotonic() - started < 10  # bounded retries, not a hang

        private_redis.start()  # same port, empty (no persistence)
        await asyncio.wait_for(history.append("t", turn("after", "restart")), 15)
        assert texts(await history.load("t")) == [("user", "after"), ("assistant", "restart")]
        assert await idem.claim("evt", 60)
    finally:
        await client.aclose()


class _SentinelsSay:
    """A Sentinel connection pool's side a connection asks: where the primary is now (the live server)."""

    is_master = True
    check_connection = False

    def __init__(self, address: tuple[str, int]):
        self.address = address
        self.asked = 0

    async def get_master_address(self) -> tuple[str, int]:
        self.asked += 1
        return self.address


@needs_redis
async def test_a_dropped_primary_connection_redials_where_the_sentinels_now_say_the_primary_is():
    """redis-py 8.1 reconnects a dropped connection in ``send_packed_command`` at the address it last
    had: after a failover, the dead primary's, until the command's retries run out. Ours asks the
    Sentinels first. The plain Sentinel-managed connection is shown failing the same way as proof."""
    from redis.asyncio.connection import parse_url
    from redis.asyncio.sentinel import SentinelManagedConnection

    assert REDIS_URL
    live = parse_url(REDIS_URL)
    dead = ("127.0.0.1", free_port())  # the primary that was killed: nothing listens there
    for kind in (SentinelManagedConnection, _PrimaryFollowingConnection):
        pool = _SentinelsSay((live["host"], live["port"]))
        connection = kind(connection_pool=pool, host=dead[0], port=dead[1], socket_connect_timeout=1)
        try:
            if kind is SentinelManagedConnection:
                with pytest.raises(redis.exceptions.ConnectionError, match=str(dead[1])):
                    await connection.send_command("PING")
                assert pool.asked == 0
                continue
            await connection.send_command("PING")
            assert await connection.read_response() in (b"PONG", "PONG", True)
            assert pool.asked == 1 and (connection.host, connection.port) == (live["host"], live["port"])
            await connection.disconnect()
            await connection.connect()  # a connect of its own asks the Sentinels once, not once more to dial
            assert pool.asked == 2 and connection.is_connected
        finally:
            await connection.disconnect()
