"""Pending turns: a question a replica accepted stays recorded, on a lease, until its turn ends.

A platform does not resend what was acknowledged (Slack's 200 or Socket Mode ack, Telegram's
webhook 200 or advanced polling offset), so a replica that dies holding a question would lose it.
The replica that accepts an event records the turn here before it acknowledges it
(``Turns.accept``: ``PendingTurns.accept``, only where no entry of the question is, then the
claims), as a ``PendingTurn`` (the ``Inquiry``, where the reply goes, the claim keys, the ids of
messages already posted for the answer, the thread lock it holds) owned by it on a lease
(``TurnLease``) renewed while the turn runs, together with the event's dedupe claims, and removes it
when the turn ends. Every replica runs a ``RecoveryLoop``: entries whose lease expired
are taken over (owner changed, attempt counted, in one atomic step; the new owner is the replica and a
token of that take-over, so that two take-overs of one turn by the same replica are fenced from each
other like two replicas are), re-claimed, rebuilt through
the delivery layer of the platform account that accepted them (``Resumer``: ``bot.delivery.Delivery``)
and answered by ``Conversations.resume``. Entries are kept per platform account (``PendingTurn.account``:
the Telegram bot, the Slack app's bot user), so a replica only ever takes what it serves.

One answer per question:

- each renewal moves the entry on first and then, only if the entry is still this replica's, the
  claims; the entry's lease is a third longer than the claims' (``entry_lease_s``), so when an entry
  has expired the claims its owner renewed have too. A recovery that cannot claim them finds the
  question answered (claims kept after an answer) or in the live turn of a redelivery (which
  recorded the entry again as its own, so the old owner's next renewal stops it): it drops the entry;
- an owner that is slow but alive stops writing before anyone can take over: its turn is cancelled
  when a renewal finds the entry owned by another, and also when it could not renew for 2/3 of the
  lease (its own clock: the lease is measured from before the renewal was sent) and a last try
  failed;
- the final answer is recorded with the entry (and the claims kept) before it is posted, fenced by
  the entry's owner (``TurnLease.conclude``: the store says whether another replica took the turn
  meanwhile, and then nothing is shown); a turn taken over with a recorded answer shows that answer
  again in place of the messages recorded and never runs the question again. Exactly once is not
  possible across a side effect on another system: what is left is a message a final post creates,
  recorded a moment after the platform returned its id (a kill in that moment leaves it beside the
  answer shown again);
- the thread lock a turn is about to take is recorded with the entry first (``TurnLease.holds``,
  ``bot.state.TURN_LOCKS``), and the take-over frees it in the same step, if the dead owner still holds
  it: the turn taken over does not wait out the lock's TTL.

Every step between these is a named kill point (``bot.state.KILL_POINTS``), where tests kill a replica.

Turns taken over more than ``max_attempts`` times (a question that kills every replica it reaches)
are given up: the user sees the turn's failure message. A turn that ended with the Answerer's error
outcome already showed the user its message and is not retried.

``MemoryPendingTurns`` is the embedded default (one process); ``bot.state.redis.RedisPendingTurns``
is shared by replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bot.state import KILL_POINTS, PROCESS_LOCKS, Claim, Clock, MemoryLockTable, RenewingLock
from bot.types import Acknowledges, Answer, Citation, Inquiry, Outcome, Reply, Trace

log = logging.getLogger("kbbot.pending")

#: How often a lease looks at the reply for new messages (recorded at once, so a replica dying
#: right after posting still leaves their ids for the one taking over).
WATCH_S = 0.25


def replica_id() -> str:
    """This process among the replicas: readable in logs, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class PendingTurn:
    """Everything another replica needs to answer an accepted question."""

    id: str  # the question's message claim key: one entry per question, whichever delivery recorded it
    inquiry: Inquiry
    #: The platform's description of where the reply goes (its ``Platform.rebuild`` reads it).
    target: dict[str, Any]
    claim_keys: list[str]
    event_id: str
    kind: str
    crashed: str  # what the user sees if the turn breaks (or is given up), in their language
    lease_s: float
    dedupe_ttl_s: float
    #: The platform account that accepted the question (``Delivery.account``: ``telegram:{bot id}``,
    #: ``slack:{bot id}``): only a replica serving that account takes it over.
    account: str = ""
    attempts: int = 1
    #: Ids of messages already posted for the answer (``PostsMessages.message_ids`` of the reply).
    messages: list[str] = field(default_factory=list)
    #: The final answer (``answer_payload``), recorded just before it is posted (``TurnLease.conclude``):
    #: a turn taken over with one shows that answer again instead of running the question again.
    final: str | None = None
    #: Who holds the entry as it was taken over (``PendingTurns.take_expired``'s ``owner``): the lease,
    #: the fence and the removal of the turn taken over use it. Not stored in the payload.
    owner: str = ""

    @property
    def platform(self) -> str:
        return self.inquiry.platform

    @property
    def entry_lease_s(self) -> float:
        """The entry outlives the claims renewed with it (``lease_s``) by a third of a lease."""
        return self.lease_s * 4 / 3

    def payload(self) -> str:
        """The fixed part, as JSON (attempts, messages and the final answer change while the entry lives)."""
        data = dataclasses.asdict(self)
        del data["attempts"], data["messages"], data["final"], data["owner"]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_payload(cls, payload: str | bytes, *, attempts: int, messages: str | bytes | None,
                     final: str | bytes | None = None) -> PendingTurn:
        data = json.loads(payload)
        inquiry = data.pop("inquiry")
        inquiry["spaces"] = tuple(inquiry.get("spaces") or ("default",))
        return cls(inquiry=Inquiry(**inquiry), **data, attempts=attempts,
                   messages=[str(m) for m in json.loads(messages or "[]")],
                   final=(final.decode() if isinstance(final, bytes) else final) or None)


def answer_payload(answer: Answer) -> str:
    """What a reply needs to show ``answer`` again (``answer_of``), as JSON: text, outcome, sources, the
    turn id its buttons name, and how it was approved."""
    return json.dumps({"text": answer.text, "outcome": answer.outcome.value,
                       "citations": [c.to_dict() for c in answer.citations], "turn_id": answer.trace.turn_id,
                       "approvable": answer.approvable, "approved_turn_id": answer.approved_turn_id,
                       "approved_by": answer.approved_by, "approved_at": answer.approved_at}, ensure_ascii=False)


def answer_of(payload: str) -> Answer:
    data = json.loads(payload)
    return Answer(text=data["text"], outcome=Outcome(data["outcome"]),
                  citations=[Citation(**c) for c in data["citations"]], trace=Trace(turn_id=data["turn_id"]),
                  approvable=data["approvable"], approved_turn_id=data["approved_turn_id"],
                  approved_by=data["approved_by"], approved_at=data["approved_at"])


@runtime_checkable
class PendingTurns(Protocol):
    """The pending turns of every replica; deadlines are the store's own clock (Redis: ``TIME``)."""

    async def add(self, turn: PendingTurn, owner: str) -> None:
        """Record ``turn`` owned by ``owner`` for ``turn.lease_s`` (replacing an entry of the same id)."""

    async def accept(self, turn: PendingTurn, owner: str) -> bool:
        """Record ``turn`` owned by ``owner`` for ``turn.lease_s`` unless an entry of its id exists (a turn
        live, or left by a replica that died and due to be taken over): False then."""

    async def renew(self, turn: PendingTurn, owner: str, messages: list[str] | None = None) -> bool:
        """Move the lease of ``turn``'s entry on (and store ``messages``) if ``owner`` still owns it;
        False otherwise."""

    async def remove(self, turn: PendingTurn, owner: str) -> bool:
        """Forget ``turn``'s entry if ``owner`` owns it."""

    async def hold_lock(self, turn: PendingTurn, owner: str, key: str, token: str) -> bool:
        """Record that ``turn`` takes the lock ``key`` as ``token`` (if ``owner`` owns the entry): whoever
        takes the turn over frees that lock if this holder still has it."""

    async def conclude(self, turn: PendingTurn, owner: str, final: str, messages: list[str]) -> bool:
        """Record the final answer (``answer_payload``) and the messages posted so far, if ``owner`` still
        owns the entry; False otherwise (the answer must not be shown)."""

    async def take_expired(self, owner: str, accounts: list[str], limit: int) -> list[PendingTurn]:
        """Up to ``limit`` entries of ``accounts`` whose lease expired, now owned by ``owner`` on a new
        lease, each with its attempts counted and the lock its turn held freed (one atomic step: two
        replicas never take the same entry). Entries of other accounts never count against ``limit``. Each
        turn comes with ``owner`` set: what its lease and fence must present from then on."""


@dataclass
class _Entry:
    owner: str
    turn: PendingTurn
    deadline: float
    lock: tuple[str, str] | None = None


class MemoryPendingTurns:
    """``PendingTurns`` of one process (embedded defaults): a dict with deadlines on ``clock``; the locks
    its turns hold are ``bot.state.MemoryLock`` s of ``locks``."""

    def __init__(self, *, clock: Clock = time.monotonic, locks: MemoryLockTable = PROCESS_LOCKS):
        self._clock = clock
        self._locks = locks
        self._entries: dict[str, _Entry] = {}
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    async def add(self, turn: PendingTurn, owner: str) -> None:
        with self._mutex:
            stored = dataclasses.replace(turn, messages=list(turn.messages) if turn.final else [])
            self._entries[turn.id] = _Entry(owner, stored, self._clock() + turn.entry_lease_s)

    async def accept(self, turn: PendingTurn, owner: str) -> bool:
        with self._mutex:
            if turn.id in self._entries:
                return False
            self._entries[turn.id] = _Entry(owner, dataclasses.replace(turn, messages=[]),
                                            self._clock() + turn.entry_lease_s)
            return True

    async def renew(self, turn: PendingTurn, owner: str, messages: list[str] | None = None) -> bool:
        with self._mutex:
            entry = self._entries.get(turn.id)
            if entry is None or entry.owner != owner:
                return False
            entry.deadline = self._clock() + entry.turn.entry_lease_s
            if messages is not None:
                entry.turn.messages = list(messages)
            return True

    async def remove(self, turn: PendingTurn, owner: str) -> bool:
        with self._mutex:
            entry = self._entries.get(turn.id)
            if entry is None or entry.owner != owner:
                return False
            del self._entries[turn.id]
            return True

    async def hold_lock(self, turn: PendingTurn, owner: str, key: str, token: str) -> bool:
        with self._mutex:
            entry = self._entries.get(turn.id)
            if entry is None or entry.owner != owner:
                return False
            entry.lock = (key, token)
            return True

    async def conclude(self, turn: PendingTurn, owner: str, final: str, messages: list[str]) -> bool:
        with self._mutex:
            entry = self._entries.get(turn.id)
            if entry is None or entry.owner != owner:
                return False
            entry.turn.final, entry.turn.messages = final, list(messages)
            return True

    async def take_expired(self, owner: str, accounts: list[str], limit: int) -> list[PendingTurn]:
        now = self._clock()
        taken = []
        with self._mutex:
            for entry in sorted(self._entries.values(), key=lambda e: e.deadline):
                if len(taken) >= limit or entry.deadline > now:
                    break
                if entry.turn.account not in accounts:
                    continue
                entry.owner, entry.deadline = owner, now + entry.turn.entry_lease_s
                entry.turn.attempts += 1
                if entry.lock is not None:  # only if the dead owner still holds it (the token says)
                    self._locks.release(*entry.lock)
                    entry.lock = None
                taken.append(dataclasses.replace(entry.turn, messages=list(entry.turn.messages), owner=owner))
        return taken


class TurnLease:
    """One turn's entry and claims, renewed together while the turn runs (entry first: see the module).

    ``watch(task)`` cancels the turn's task when the lease is lost. ``messages`` (the reply's posted
    message ids) is read every ``WATCH_S`` and stored as soon as it changes.
    """

    def __init__(self, store: PendingTurns, turn: PendingTurn, owner: str, *, claims: Claim | None,
                 messages: Callable[[], list[str]] | None = None):
        self.store = store
        self.turn = turn
        self.owner = owner
        self.claims = claims
        self.messages = messages
        self.lost = False
        #: The reply's messages as last stored with the entry: what a replica taking the turn over is handed.
        self.recorded: list[str] = []
        self._valid_until = 0.0
        self._task: asyncio.Task[Any] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._stopped = False
        self._claims_kept = False

    async def start(self, *, recorded_at: float | None = None) -> None:
        """Keep the entry (recorded now, unless it was at ``recorded_at``, this process's monotonic clock
        before ``PendingTurns.accept`` was sent) and the claims from now on."""
        began = time.monotonic() if recorded_at is None else recorded_at
        if recorded_at is None:
            await self.store.add(self.turn, self.owner)
        self._valid_until = began + self.turn.lease_s * 2 / 3
        if self.claims is not None:
            await self.claims.stop_renewing()  # renewed here from now on, always before the entry
        self._keeper = asyncio.create_task(self._keep(), name=f"lease {self.turn.id}")

    @property
    def valid(self) -> bool:
        """Renewed recently enough that no one else can have taken the turn over."""
        return not self.lost and time.monotonic() < self._valid_until

    async def confirm(self) -> bool:
        """Whether this replica may still write: valid, or renewed now (after a stall: the store says
        whether another replica took the turn meanwhile)."""
        if not self.valid and not self.lost:
            await self._renew_now(None)
        return self.valid

    def watch(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    def lose(self, why: str) -> None:
        """Another take-over has the turn (another replica's, or this one's again): stop it (its task is
        cancelled) and write nothing more."""
        if self.lost:
            return
        self.lost = True
        log.warning("turn %s (%s): %s; stopping it, its new owner answers it", self.turn.id, self.turn.event_id, why)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _renew(self, messages: list[str] | None) -> None:
        began = time.monotonic()
        if not await self.store.renew(self.turn, self.owner, messages):
            self.lose("its pending entry was taken over")
            return
        if self.claims is not None and not self._claims_kept:  # kept for the dedupe TTL: not shortened again
            await self.claims.renew()
        self._valid_until = began + self.turn.lease_s * 2 / 3

    async def _renew_now(self, messages: list[str] | None) -> bool:
        """One renewal, bounded (a store that hangs must not hold the turn past its lease); a failure once
        the lease is no longer valid loses the turn: the entry may be taken over from then on."""
        try:
            async with asyncio.timeout(self.turn.lease_s / 3):
                await self._renew(messages)
        except Exception:  # a hiccup: tried again next tick, while the lease is valid
            if not self.valid:
                self.lose(f"the lease could not be renewed for {self.turn.lease_s * 2 / 3:.1f} s")
            else:
                log.warning("could not renew the lease of turn %s", self.turn.id, exc_info=True)
            return False
        return not self.lost

    async def _keep(self) -> None:
        # Ticks of at most a sixth of the lease: a last renewal tried once the lease stopped being
        # valid (2/3) fails, bounded by a third, before the entry can expire (4/3).
        every = self.turn.lease_s / 3
        last_renewal = time.monotonic()
        # The flag, not only the cancellation: a cancellation that meets a renewal's timeout can be
        # turned into a TimeoutError (Python 3.11), which the loop would take for a hiccup.
        while not self.lost and not self._stopped:
            await asyncio.sleep(min(WATCH_S, every / 2))
            current = list(self.messages()) if self.messages is not None else self.recorded
            if current == self.recorded and self.valid and time.monotonic() - last_renewal < every:
                continue
            if await self._renew_now(current if current != self.recorded else None):
                self.recorded, last_renewal = current, time.monotonic()

    async def holds(self, lock: RenewingLock) -> None:
        """``bot.state.TURN_LOCKS``: the turn is about to take ``lock``. Recorded with the entry first, so a
        replica taking the turn over frees it at once instead of waiting out its TTL (30 s)."""
        try:
            async with asyncio.timeout(self.turn.lease_s / 3):
                await self.store.hold_lock(self.turn, self.owner, lock.key, lock.token)
        except Exception:  # the lock still works; only a take-over would wait for it to expire
            log.warning("turn %s: could not record its lock %s with the pending entry", self.turn.id, lock.name,
                        exc_info=True)

    async def conclude(self, answer: Answer) -> bool:
        """Before the final message is posted: the answer and the messages posted so far recorded with the
        entry, if this replica still owns it (a fence: False, and nothing may be shown, once another took
        the turn), then the claims kept as answered. From here on a replica taking the turn over shows
        this answer again (in place of the messages recorded) and never runs the question again, and a
        redelivery finds it answered, whether this replica dies before the post or after it."""
        if self.lost:
            return False
        messages = list(self.messages()) if self.messages is not None else []
        try:
            async with asyncio.timeout(self.turn.lease_s / 3):
                owned = await self.store.conclude(self.turn, self.owner, answer_payload(answer), messages)
        except Exception:  # the store is out of reach: posting on a valid lease as before, not fenced
            log.warning("turn %s: could not record its final answer; posting it unfenced", self.turn.id,
                        exc_info=True)
            return await self.confirm()
        if not owned:
            return False
        self._claims_kept = True
        if self.claims is not None:
            await self.claims.finish(answered=True)
        return True

    async def stop(self) -> None:
        """Stop renewing; the entry stays (a turn cut short, e.g. at shutdown, is taken over later)."""
        self._stopped = True
        task, self._keeper = self._keeper, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def end(self, answered: bool) -> None:
        """The turn is over: claims kept (answered) or released, then the entry removed. In this order a
        death in between leaves an entry whose claims tell the recovery the question was answered."""
        await self.stop()
        if self.lost:
            return
        if self.claims is not None:
            await self.claims.finish(answered=answered)
        try:
            await self.store.remove(self.turn, self.owner)
        except Exception:
            log.exception("could not remove the pending turn %s; its claims keep it from being answered again",
                          self.turn.id)


class LeasedReply:
    """The ``Reply`` of a turn on a lease: its final answer is shown only once recorded with the entry this
    replica still owns (``TurnLease.conclude``), a failure only while the lease is valid; a lost lease
    stops the turn instead (``TurnLease.lose``). It acknowledges when the
    platform's reply does (``Acknowledges``): nothing else of the wrapped reply is reached through it.
    """

    def __init__(self, reply: Reply, lease: TurnLease):
        self.reply = reply
        self.lease = lease

    async def _check(self) -> None:
        if not await self.lease.confirm():
            self.lease.lose("the turn was taken over before its final message")
            raise asyncio.CancelledError(f"turn {self.lease.turn.id}: lease lost")

    async def acknowledge(self) -> None:
        if isinstance(self.reply, Acknowledges):
            await self.reply.acknowledge()

    async def start(self) -> None:
        await self.reply.start()

    async def push(self, delta: str) -> None:
        await self.reply.push(delta)

    async def finish(self, answer: Answer) -> None:
        # Recorded (and the claims kept) before it is posted, fenced by the entry's owner: a replica that
        # dies anywhere around the post leaves a turn that is shown again, never answered again.
        if not await self.lease.conclude(answer):
            self.lease.lose("the turn was taken over before its final message")
            raise asyncio.CancelledError(f"turn {self.lease.turn.id}: lease lost")
        await KILL_POINTS.reach("final recorded")
        await self.reply.finish(answer)
        await KILL_POINTS.reach("final posted")

    async def fail(self, message: str) -> None:
        await self._check()
        await self.reply.fail(message)


@runtime_checkable
class PostsMessages(Protocol):
    """A ``Reply`` that posts messages of its own (a chat platform's): their ids are recorded in the
    pending entry, so a replica taking the turn over can retire what was left half-written."""

    def message_ids(self) -> list[str]:
        """Ids of the messages posted so far for this answer."""


@runtime_checkable
class Resumer(Protocol):
    """What answers the turns of one platform account taken over from another replica
    (``bot.delivery.Delivery``, registered with ``Conversations.serve``)."""

    name: str

    async def account(self) -> str:
        """The account this process serves on the platform (``PendingTurn.account``)."""

    async def resume(self, turn: PendingTurn) -> Reply | None:
        """The reply of ``turn`` rebuilt, with the messages a dead replica left half-written dealt with;
        ``None`` for a turn of an account this process does not serve (refused, nothing touched)."""

    async def withdraw(self, turn: PendingTurn, reply: Reply, keep: list[str]) -> None:
        """``reply`` of a turn that lost its lease while alive stops writing, and the messages it posted
        other than ``keep`` (those its entry held: the new owner retires them) are retired."""


class RecoveryLoop:
    """Every ``interval_s`` (± 20 %, so replicas do not poll in step), ``recover`` takes over expired turns."""

    def __init__(self, recover: Callable[[], Any], interval_s: float):
        self.recover = recover
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="recover pending turns")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s * random.uniform(0.8, 1.2))
            try:
                await self.recover()
            except Exception:
                log.exception("recovering pending turns failed; trying again in %.0f s", self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
