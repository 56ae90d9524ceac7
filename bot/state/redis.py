"""Thread history, idempotency claims and locks in Redis, shared by every replica.

Keys (``prefix`` defaults to ``kbbot:`` and is configurable, e.g. per deployment):

=================================  ======  =====================================================
key                                type    contents and lifetime
=================================  ======  =====================================================
``{prefix}history:{thread_key}``   list    one Haystack ``ChatMessage`` JSON per item, oldest
                                           first; trimmed to ``max_items`` on each append;
                                           expires ``ttl_days`` after the thread's last append
``{prefix}dedupe:{key}``           string  ``"1"`` while an event is claimed; expires after the
                                           ``ttl_s`` given to ``claim`` (deleted by ``release``)
``{prefix}lock:{name}``            string  the holder's random token; expires ``ttl_s`` after the
                                           last renewal (renewed every ``ttl_s / 3``)
``{prefix}pending-due:{account}`` zset    pending turn id -> its lease's deadline (ms, Redis
                                           ``TIME``), one set per platform account (Telegram
                                           bot, Slack bot user); removed when the turn ends
``{prefix}pending:{id}``           hash    the turn (``payload``), ``owner``, ``attempts``,
                                           ``lease_ms``, ``account``, posted ``messages``, the
                                           thread ``lock`` it holds and its ``lock_token``, the
                                           ``final`` answer once recorded; expires after the
                                           event's dedupe TTL at the latest
=================================  ======  =====================================================

The client comes from ``connect_redis``: bounded socket timeouts (a dead server is an error,
not a hang) and a bounded retry with backoff, after which the ``redis.exceptions`` error
propagates; the pool reconnects by itself once the server is back.

Behind Sentinels (``redis+sentinel://host:port,host:port/master_name[/db]``) the client asks the
Sentinels for the primary before each new connection, and its retries outlast a failover. The
writes a user relies on (a turn's history, an event's dedupe claim) are then acknowledged by
``replica_acks`` replicas with ``WAIT`` before the turn goes on: Sentinel promotes the replica that
has the most of the primary's stream, so a write a replica acknowledged survives the primary's
loss. Without a replica in reach ``WAIT`` gives up after ``REPLICA_ACK_TIMEOUT_MS`` and the write
stands on the primary alone (logged): kbbot keeps answering rather than stop with its replica.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from haystack.dataclasses import ChatMessage
from redis.asyncio import Redis
from redis.asyncio.lock import Lock as _RedisPyLock
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError, ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.settings.base import SENTINEL_SCHEME, sentinel_url  # noqa: F401 - sentinel_url: one place to import it
from bot.state import RenewingLock
from bot.state.history import cap_messages
from pipelines.errors import StateUnavailable
from pipelines.redact import redact_url, scrub

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "kbbot:"
#: How long a write waits for its replica acknowledgements (WAIT) before it stands on the primary alone.
REPLICA_ACK_TIMEOUT_MS = 200
#: Retries of a command behind Sentinels: with jittered backoff capped at 1 s, 28-31 s (the sum of
#: the backoffs, min and median of 2,000 draws), room for a failover whose Sentinels take several
#: seconds to agree on a loaded machine. (Raised from 12, ~10 s, while chasing failed turns whose
#: cause turned out to be the redial below, ``_PrimaryFollowingConnection``; with that fixed,
#: promotions took 3.1-8.1 s as clients saw them.)
SENTINEL_RETRIES = 34


class RedisUnavailable(StateUnavailable):
    """Redis could not be reached (or refused us) when connecting."""

    reason = "connection lost"


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, object]]:
    """(Sentinel addresses, master name, options: db, username, password) of a ``redis+sentinel://`` URL."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    addresses = []
    for host in hosts.split(","):
        name, _, port = host.strip().rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"Sentinel addresses are host:port, got {host!r}")
        addresses.append((name.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("the path of a redis+sentinel:// URL is /master_name or /master_name/db")
    options: dict[str, object] = {"db": int(path[1]) if len(path) == 2 else 0}
    if credentials:
        user, _, password = credentials.partition(":")
        options.update(username=unquote(user) or None, password=unquote(password) or None)
    return addresses, path[0], options


async def replicated(conn: Redis, replicas: int, what: str) -> None:
    """Waits until ``replicas`` replicas hold every write made so far on ``conn`` (one connection:
    WAIT counts that connection's writes), at most ``REPLICA_ACK_TIMEOUT_MS``."""
    if replicas <= 0:
        return
    acked = await conn.wait(replicas, REPLICA_ACK_TIMEOUT_MS)
    if acked < replicas:
        logger.warning("%s is on the Redis primary but acknowledged by %d of %d replicas within %d ms; "
                       "a failover now could lose it", what, acked, replicas, REPLICA_ACK_TIMEOUT_MS)


class _PrimaryFollowingConnection(SentinelManagedConnection):
    """A connection to the primary that asks the Sentinels where the primary is on every reconnect.

    redis-py 8.1 reconnects a dropped connection inside ``send_packed_command`` through
    ``connect_check_health``, which dials the address the connection last had, not through the
    Sentinel-aware ``connect``: a connection in use when the primary died redialled the dead primary
    until its retries ran out, 38 s after the replica was promoted (``tests/cluster/test_redis_failover.py``,
    a turn failed "cannot reach its conversation store").
    """

    #: Set while ``connect`` dials the address it has just asked the Sentinels for (``connect_to``).
    _asked = False

    async def connect_to(self, address: tuple[str, int]) -> None:
        self._asked = True  # not asked twice for one connect
        try:
            await super().connect_to(address)
        finally:
            self._asked = False

    async def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if not self.is_connected and self.connection_pool.is_master and not self._asked:
            # MasterNotFoundError mid-failover is a ConnectionError: the command's retry tries again.
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


def _client(url: str, *, socket_timeout: float, connect_timeout: float, retries: int, health_check_interval: int,
            **options: object) -> Redis:
    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                              retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries),
                              health_check_interval=health_check_interval, **options)
    addresses, master, auth = parse_sentinel_url(url)
    sentinels = Sentinel(addresses, socket_timeout=connect_timeout, socket_connect_timeout=connect_timeout)
    return sentinels.master_for(master, connection_class=_PrimaryFollowingConnection,
                                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                                retry=Retry(ExponentialWithJitterBackoff(base=0.1, cap=1.0), max(retries, SENTINEL_RETRIES)),
                                health_check_interval=health_check_interval, **auth, **options)


async def connect_redis(
    url: str,
    *,
    socket_timeout: float = 5.0,
    connect_timeout: float = 3.0,
    retries: int = 3,
    health_check_interval: int = 30,
    **options: object,
) -> Redis:
    """A client for ``url`` that answered one PING, or ``RedisUnavailable``.

    Each command is retried ``retries`` times on connection errors and timeouts (with jittered
    backoff, reconnecting in between), then the error is raised: an outage costs a turn at most
    a few seconds, and the first command after the server returns reconnects. Idle pooled
    connections are checked with a PING after ``health_check_interval`` seconds. A
    ``redis+sentinel://`` URL is retried at least ``SENTINEL_RETRIES`` times, through a failover.
    """
    shown = redact_url(url)
    try:
        client = _client(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
                         health_check_interval=health_check_interval, **options)
    except ValueError as error:
        raise RedisUnavailable(f"cannot reach Redis at {shown}: invalid URL: {scrub(str(error), url)}") from None
    try:
        await client.ping()
    except (RedisError, OSError) as error:
        await client.aclose()
        reason = scrub(str(error) or type(error).__name__, url)
        raise RedisUnavailable(f"cannot reach Redis at {shown}: {reason}") from None
    return client


_APPEND = """
redis.call('RPUSH', KEYS[1], unpack(ARGV, 3))
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[1]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[2])
"""


class RedisHistory:
    """``HistoryStore`` on Redis lists: one list per thread, one turn per MULTI/EXEC.

    The client belongs to the caller (usually shared with ``RedisIdempotency`` and locks), so
    ``close`` leaves it open.
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_turns: int = 20,
        max_chars: int = 20000,
        ttl_days: float = 30,
        max_items: int | None = None,
        replica_acks: int = 0,
    ):
        self.client = client
        self.replica_acks = replica_acks
        self.prefix = prefix
        self.max_turns = max_turns
        self.max_chars = max_chars
        self.ttl_s = max(1, int(ttl_days * 86400))
        # A turn is usually a question and an answer; the slack keeps turns that carry more
        # messages. ``load`` applies the exact caps; this only bounds the list.
        self.max_items = max_items if max_items is not None else max(4 * max_turns, 8)

    def key(self, thread_key: str) -> str:
        return f"{self.prefix}history:{thread_key}"

    async def load(self, thread_key: str) -> list[ChatMessage]:
        raw = await self.client.lrange(self.key(thread_key), 0, -1)
        messages: list[ChatMessage] = []
        for item in raw:
            try:
                messages.append(ChatMessage.from_dict(json.loads(item)))
            except (ValueError, TypeError, KeyError) as error:
                logger.warning("skipping an unreadable history item of thread %r: %s", thread_key, error)
        return cap_messages(messages, self.max_turns, self.max_chars)

    async def append(self, thread_key: str, messages: list[ChatMessage]) -> None:
        if not messages:
            return
        key = self.key(thread_key)
        payloads = [json.dumps(m.to_dict(), ensure_ascii=False) for m in messages]
        keep = max(self.max_items, len(payloads))
        # One script: the turn lands whole and contiguous, or not at all. (If its reply is lost
        # after the server ran it, the client's retry can write the turn twice.) One connection:
        # WAIT counts the writes of the connection it is sent on.
        async with self.client.client() as conn:
            await conn.eval(_APPEND, 1, key, keep, self.ttl_s, *payloads)
            await replicated(conn, self.replica_acks, f"the history of {thread_key!r}")

    async def clear(self, thread_key: str) -> None:
        await self.client.delete(self.key(thread_key))

    async def close(self) -> None:
        """Nothing to do: the shared client is closed by whoever created it."""


class RedisIdempotency:
    """``Idempotency`` with ``SET key 1 NX PX ttl``: exactly one claim wins across replicas."""

    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX, *, replica_acks: int = 0):
        self.client = client
        self.prefix = prefix
        self.replica_acks = replica_acks

    def key(self, key: str) -> str:
        return f"{self.prefix}dedupe:{key}"

    async def claim(self, key: str, ttl_s: float) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000))
        if not self.replica_acks:
            return bool(await self.client.set(self.key(key), 1, nx=True, px=ttl_ms))
        async with self.client.client() as conn:  # WAIT counts the writes of its own connection
            claimed = bool(await conn.set(self.key(key), 1, nx=True, px=ttl_ms))
            if claimed:
                await replicated(conn, self.replica_acks, f"the claim on {key!r}")
            return claimed

    async def release(self, key: str) -> None:
        await self.client.delete(self.key(key))

    async def extend(self, key: str, ttl_s: float) -> bool:
        return bool(await self.client.pexpire(self.key(key), max(1, int(ttl_s * 1000))))


class RedisLock(RenewingLock):
    """``Lock`` across replicas: redis-py's token-owned ``Lock`` plus background renewal.

    Acquire is ``SET NX PX``; renewal and release are redis-py's Lua scripts, which act only
    when the stored token is this holder's, so an expired holder cannot free a successor's lock.
    """

    def __init__(self, client: Redis, name: str, *, ttl_s: float = 30.0, prefix: str = DEFAULT_PREFIX,
                 wait_s: float = 0.0, poll_s: float = 0.1):
        super().__init__(name, ttl_s=ttl_s, wait_s=wait_s, poll_s=poll_s)
        self.client = client
        self._key = f"{prefix}lock:{name}"
        # thread_local=False: the token belongs to this object, whichever thread or task uses it.
        self._lock = _RedisPyLock(client, self._key, timeout=self.ttl_s, blocking=False, thread_local=False)

    @property
    def key(self) -> str:
        return self._key

    async def _try_acquire(self) -> bool:
        return await self._lock.acquire(blocking=False, token=self.token)

    async def _renew(self) -> bool:
        try:
            return await self._lock.reacquire()
        except LockError:  # LockNotOwnedError: expired, or someone else's token is stored
            return False

    async def _release(self) -> bool:
        try:
            await self._lock.release()
        except LockError:
            return False
        return True

    async def locked(self) -> bool:
        """Someone (anyone) holds the lock right now."""
        return await self._lock.locked()


# Pending turns: a sorted set of lease deadlines and a hash per turn, changed only by these scripts.
# Not a stream with a consumer group: the platform, not the queue, hands an event to a replica, so
# the replica that accepted it must own its entry at once (XREADGROUP gives new entries to whichever
# consumer reads next), an owner must be checked on every renewal (XCLAIM takes over regardless of
# who holds an entry) and the posted message ids change as the answer is written (stream entries
# are immutable). The deadlines are Redis's clock (TIME), so replicas' clocks never disagree on
# them. The take-over script touches hashes it finds in the set: one Redis (or Sentinel) only.


OUT_OF_REACH: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)


class SharedScript:
    """A Lua script every replica runs on Redis, answering None while Redis is out of reach: its caller
    then keeps to a state of this process, and Redis is tried again ``retry_s`` later. The outage and
    the return are logged once each (``what``: whose script; ``meanwhile``: what the process does)."""

    def __init__(self, client: Any, source: str, *, what: str, meanwhile: str, back: str, retry_s: float,
                 logger: logging.Logger = logger):
        self._script = client.register_script(source)
        self.what, self.meanwhile, self.back, self.retry_s, self.log = what, meanwhile, back, retry_s, logger
        self.down_until = float("-inf")

    async def __call__(self, keys: list[str], args: list[Any]) -> str | None:
        if time.monotonic() < self.down_until:
            return None
        try:
            answer = await self._script(keys=keys, args=args)
        except OUT_OF_REACH as exc:
            if self.down_until == float("-inf"):
                self.log.warning("%s: Redis out of reach (%s); %s, retrying Redis every %g s", self.what,
                                 type(exc).__name__, self.meanwhile, self.retry_s)
            self.down_until = time.monotonic() + self.retry_s
            return None
        if self.down_until != float("-inf"):
            self.log.warning("%s: Redis is back; %s", self.what, self.back)
            self.down_until = float("-inf")
        return answer.decode() if isinstance(answer, bytes) else str(answer)
