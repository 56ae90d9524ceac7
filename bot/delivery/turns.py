"""A chat turn's life, from its arrival to its end or its take-over: one owner for every platform.

- ``accept``: a question's ``Arrival`` recorded as pending for the platform account that took it
  (``bot.delivery.pending``), then its dedupe keys claimed on a renewed lease (``bot.state.Claim``),
  before the platform is told it arrived; ``claim`` alone where the caller holds the request (the HTTP
  API);
- ``answer``: the Answerer's turn (rate limits, capacity, the thread's lock, the pipeline, history) on
  that lease; a friendly message when the turn crashes; the claim kept after an answer and released
  after a failure (a redelivery may try again); the outcome's log line and ``on_turn``;
- the turns of a replica that died: ``recover`` takes over those whose lease expired, of the platform
  accounts this process serves, and ``resume`` answers each through that account's ``Delivery`` (a
  ``Resumer``, registered with ``serve``); a turn that lost its lease while alive withdraws what it
  posted.

The gate before it and the platform's side of a take-over are ``bot.delivery.gate.Delivery``'s; commands
and clicks are ``bot.conversation.Conversations``'.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.delivery.pending import (
    LeasedReply,
    PendingTurn,
    PendingTurns,
    PostsMessages,
    Resumer,
    TurnLease,
    answer_of,
    replica_id,
)
from bot.messages import say
from bot.state import KILL_POINTS, TURN_LOCKS, Claim, Idempotency, TaskSet, take_claim
from bot.turn.answering import Answerer
from bot.types import Answer, Inquiry, Outcome, Reply

log = logging.getLogger("kbbot.conversation")

#: Called after each turn that produced an answer, with the ids of the messages it posted (the expert
#: replies of the knowledge loop listen for replies to a not-found answer).
AfterTurn = Callable[[Inquiry, Answer, list[str] | None], Awaitable[Any]]


def _log_outcome(inquiry: Inquiry, event_id: str, kind: str, answer: Answer, *, shown_again: bool = False) -> None:
    """One line per question answered, whichever replica ended it (bench.load counts outcomes by it):
    ``shown_again``, a final answer its dead owner recorded, shown by the replica that took it over."""
    # The outcome stays the line's last word.
    log.info("%s %s %s in %s -> turn %s%s %s", inquiry.platform, event_id, kind, inquiry.thread_key,
             answer.trace.turn_id, " (its recorded final shown again)" if shown_again else "", answer.outcome.value)

#: What a turn that failed shows when its adapter gives no words of the asker's language.
CRASHED = say("crashed", "en")


@dataclass
class HandledTurn:
    """What one handled event produced (for ``on_turn`` observers: tests, metrics)."""

    event_id: str  # the platform's id of the event: Slack event id, Telegram update id, HTTP request id
    kind: str  # mention | follow_up | dm (Slack), private | group (Telegram), ask | chat (HTTP)
    inquiry: Inquiry
    answer: Answer | None
    reply: Reply


@dataclass
class TakeOver:
    """What answers the turns of replicas that died (``bot.delivery.pending``)."""

    #: Accepted questions recorded until answered.
    pending: PendingTurns
    #: This process among the replicas (the owner of its pending turns).
    replica: str = field(default_factory=replica_id)
    #: Take-overs of one question before it is given up (``recovery.max_attempts``).
    max_attempts: int = 3
    #: Turns taken over per recovery round.
    batch: int = 20


@dataclass(frozen=True)
class Arrival:
    """A question's event as its platform delivered it, before the platform is told it arrived."""

    inquiry: Inquiry
    #: Its dedupe keys (the event's id, the message's): a redelivery of either is answered once.
    keys: list[str]
    event_id: str  # the platform's id of the event: Slack event id, Telegram update id
    kind: str  # mention | follow_up | dm (Slack), private | group (Telegram)
    #: Where the reply goes, as its platform rebuilds it after a take-over (``PlatformMessages.rebuild``).
    target: dict[str, Any]
    #: How long its keys stay claimed after an answer, and the lease a live turn renews.
    ttl_s: float
    lease_s: float
    #: What the user sees if the turn breaks.
    crashed: str = CRASHED


@dataclass
class Accepted:
    """A question's event this replica took (``Turns.accept``): its claims, and the lease of its pending
    turn (None when the turn could not be recorded, or nothing is recorded: no Redis take-over)."""

    arrival: Arrival
    claim: Claim
    lease: TurnLease | None


@dataclass
class Turns:
    """The life of every chat turn of this process (see the module); built by ``Conversations``."""

    answerer: Answerer
    idempotency: Idempotency
    #: None: turns are not recorded as pending (nothing is taken over).
    takeover: TakeOver | None = None
    after_turn: AfterTurn | None = None
    on_turn: Callable[[HandledTurn], None] | None = None
    #: The platform accounts whose turns this process takes over (``serve``).
    resumers: list[Resumer] = field(default_factory=list)
    recovering: TaskSet = field(default_factory=TaskSet, init=False, repr=False)

    def serve(self, resumer: Resumer) -> None:
        """Take over the pending turns of ``resumer``'s platform account (the composition root registers
        each chat platform's ``Delivery``)."""
        self.resumers.append(resumer)

    # --- a turn -------------------------------------------------------------------------------------
    async def claim(self, keys: list[str], ttl_s: float, *, lease_s: float | None = None) -> Claim | None:
        """Claims an event's keys; None when it was already handled (a redelivery). With ``lease_s``
        they are held on a lease renewed while the turn runs: a replica that dies mid-turn frees the
        event ``lease_s`` later for a redelivery to another."""
        return await take_claim(self.idempotency, keys, ttl_s=ttl_s, lease_s=lease_s)

    async def accept(self, arrival: Arrival, account: str) -> Accepted | None:
        """A question's event taken by this replica, before the platform is told it arrived (Slack's 200,
        Telegram's webhook 200 or polling offset): recorded as a pending turn of ``account`` first, then
        its keys claimed on a lease. None: a redelivery of a question answered, being answered, or left by
        a replica that died (the take-over answers it); the adapter acknowledges it and does nothing more.

        In this order no kill point loses the question: dead before the entry, the platform never had its
        acknowledgement and sends the event again; dead after it, the entry is taken over. An entry is only
        recorded where none is (``PendingTurns.accept``), so a redelivery never steals a live turn's."""
        a = arrival
        inquiry, keys, ttl_s, lease_s, event_id = a.inquiry, a.keys, a.ttl_s, a.lease_s, a.event_id
        if self.takeover is None or not keys:
            claim = await self.claim(keys, ttl_s, lease_s=lease_s)
            return None if claim is None else Accepted(arrival, claim, None)
        t = self.takeover
        turn = PendingTurn(id=keys[-1], inquiry=inquiry, target=a.target, claim_keys=list(keys), event_id=event_id,
                           kind=a.kind, crashed=a.crashed, lease_s=lease_s, dedupe_ttl_s=ttl_s, account=account)
        began = time.monotonic()  # the lease runs from before the entry was recorded
        try:
            recorded = await t.pending.accept(turn, t.replica)
        except Exception:  # answered all the same, only not recoverable
            log.exception("%s %s: could not record the pending turn; a replica dying now would lose it",
                          inquiry.platform, event_id)
            claim = await self.claim(keys, ttl_s, lease_s=lease_s)
            return None if claim is None else Accepted(arrival, claim, None)
        if not recorded:
            log.info("%s %s: the question is pending already (answered by its turn or a take-over); not answering "
                     "twice", inquiry.platform, event_id)
            return None
        await KILL_POINTS.reach("recorded")
        claim = await take_claim(self.idempotency, keys, ttl_s=ttl_s, lease_s=lease_s)
        if claim is None:  # answered before (its claims kept): the entry just recorded is this delivery's own
            await t.pending.remove(turn, t.replica)
            return None
        lease = TurnLease(t.pending, turn, t.replica, claims=claim)
        try:
            await lease.start(recorded_at=began)
        except Exception:
            log.exception("%s %s: could not keep the pending turn's lease", inquiry.platform, event_id)
            return Accepted(arrival, claim, None)
        await KILL_POINTS.reach("claimed")
        return Accepted(arrival, claim, lease)

    async def answer(self, inquiry: Inquiry, reply: Reply, *, claimed: Claim | Accepted | None, event_id: str,
                     kind: str, crashed: str = CRASHED) -> Answer | None:
        """One turn of a claimed event (``claim``) or of an accepted question (``accept``: recorded as
        pending until it ends, so another replica serving its account answers it if this one dies);
        ``crashed`` is what the user sees if the turn breaks."""
        lease = None
        if isinstance(claimed, Accepted):
            claimed, lease = claimed.claim, claimed.lease
            if lease is not None and isinstance(reply, PostsMessages):
                lease.messages = reply.message_ids
        return await self._turn(inquiry, reply, claimed=claimed, event_id=event_id, kind=kind, crashed=crashed,
                                lease=lease)

    async def _lease(self, turn: PendingTurn, claim: Claim | None, reply: Reply) -> TurnLease | None:
        assert self.takeover is not None
        lease = TurnLease(self.takeover.pending, turn, turn.owner, claims=claim,
                          messages=reply.message_ids if isinstance(reply, PostsMessages) else None)
        try:
            await lease.start()
        except Exception:  # the claims keep their own renewal: answered, only not recoverable
            log.exception("%s %s: could not record the pending turn; a replica dying now would lose it",
                          turn.platform, turn.event_id)
            return None
        return lease

    async def _turn(self, inquiry: Inquiry, reply: Reply, *, claimed: Claim | None, event_id: str, kind: str,
                    crashed: str, lease: TurnLease | None) -> Answer | None:
        answer: Answer | None = None
        shown = reply if lease is None else LeasedReply(reply, lease)
        context = contextvars.copy_context()
        if lease is not None:  # the thread's lock is recorded with the entry, so a take-over frees it
            context.run(TURN_LOCKS.set, lease.holds)
        # A task of its own, so that a lost lease can stop the turn (the Answerer lets cancellation through).
        task = asyncio.create_task(self.answerer.answer(inquiry, shown), name=f"turn {event_id}", context=context)
        try:
            if lease is not None:
                lease.watch(task)
            try:  # the Answerer runs one turn per thread at a time (its thread locks)
                answer = await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if lease is None or not lease.lost or (current is not None and current.cancelling()):
                    raise
                await self._withdraw(lease, reply)
                return None  # another take-over has the turn: nothing more is written here
            except Exception:
                # The Answerer reports its own failures; reaching here is a bug, still shown to the user.
                log.exception("%s %s: the turn crashed", inquiry.platform, event_id)
                await shown.fail(crashed)
            answered = answer is not None and answer.outcome is not Outcome.ERROR
            if lease is not None:
                await lease.end(answered=answered)
            elif claimed is not None:  # kept for the dedupe TTL after an answer, else released
                await claimed.finish(answered=answered)
        finally:
            if lease is not None:
                await lease.stop()  # cut short (shutdown): the entry stays for another replica
        if answer is not None:
            _log_outcome(inquiry, event_id, kind, answer)
            if self.after_turn is not None:
                await self.after_turn(inquiry, answer, reply.message_ids() if isinstance(reply, PostsMessages) else None)
        if self.on_turn is not None:
            self.on_turn(HandledTurn(event_id=event_id, kind=kind, inquiry=inquiry, answer=answer, reply=reply))
        return answer

    async def _withdraw(self, lease: TurnLease, reply: Reply) -> None:
        """What a turn that lost its lease while alive posted and never recorded is taken back by the
        platform's delivery (``Resumer.withdraw``)."""
        resumer = (await self._served()).get(lease.turn.account)
        if resumer is None:
            return
        try:
            await resumer.withdraw(lease.turn, reply, lease.recorded)
        except Exception:  # a courtesy to the reader: the new owner's answer is shown all the same
            log.exception("%s %s: could not take back the messages of a turn taken over", lease.turn.platform,
                          lease.turn.event_id)

    # --- turns of replicas that died ------------------------------------------------------------
    async def _served(self) -> dict[str, Resumer]:
        return {await resumer.account(): resumer for resumer in self.resumers}

    async def recover(self) -> int:
        """Takes over the pending turns whose lease expired (of the platform accounts this process
        serves) and answers them in the background (``recovering``); returns how many it took."""
        if self.takeover is None or not self.resumers:
            return 0
        t = self.takeover
        # An owner of its own for each take-over, not the replica's id: one replica can take the same turn
        # twice (its first take-over starved past the lease on a loaded machine), and a fence that only
        # knew the replica let both of its turns post an answer.
        holder = f"{t.replica}#{uuid.uuid4().hex[:12]}"
        turns = await t.pending.take_expired(holder, sorted(await self._served()), t.batch)
        for turn in turns:
            self.recovering.track(asyncio.create_task(self.resume(turn), name=f"resume {turn.id}"))
        return len(turns)

    async def resume(self, turn: PendingTurn) -> Answer | None:
        """Answers a turn taken over from a replica that stopped renewing it (``recover``); a turn of an
        account this process does not serve is refused and left alone."""
        assert self.takeover is not None
        t = self.takeover
        if not turn.owner:  # a turn not from ``take_expired``: held under the replica's own id
            turn = replace(turn, owner=t.replica)
        resumer = (await self._served()).get(turn.account)
        if resumer is None:
            log.warning("%s %s: pending turn %s belongs to %s, which this process does not serve; not resuming",
                        turn.platform, turn.event_id, turn.id, turn.account or "an unknown account")
            return None
        if turn.final is not None:
            return await self._show_again(turn, resumer)
        claims = await take_claim(self.idempotency, turn.claim_keys, ttl_s=turn.dedupe_ttl_s, lease_s=turn.lease_s)
        if claims is None:  # answered (claims kept), or in the live turn of a redelivery (its own entry)
            log.info("%s %s: pending turn %s is answered or being answered; dropping it", turn.platform,
                     turn.event_id, turn.id)
            await t.pending.remove(turn, turn.owner)
            return None
        reply = await self._rebuilt(turn, resumer)
        if reply is None:
            await claims.finish(answered=False)
            return None
        if turn.attempts > t.max_attempts:
            log.error("%s %s: pending turn %s was taken over %d times; giving up and telling the user",
                      turn.platform, turn.event_id, turn.id, turn.attempts - 1)
            try:
                await reply.fail(turn.crashed)
            finally:
                await claims.finish(answered=True)  # the user was told: a redelivery starts no new round
                await t.pending.remove(turn, turn.owner)
            return None
        log.warning("%s %s: taking over pending turn %s (attempt %d, %d message(s) left by the previous owner)",
                    turn.platform, turn.event_id, turn.id, turn.attempts, len(turn.messages))
        lease = await self._lease(turn, claims, reply)
        return await self._turn(turn.inquiry, reply, claimed=claims, event_id=turn.event_id, kind=turn.kind,
                                crashed=turn.crashed, lease=lease)

    @staticmethod
    async def _rebuilt(turn: PendingTurn, resumer: Resumer) -> Reply | None:
        """The reply of a pending turn as its platform rebuilds it; None (logged) when it cannot: the entry
        then expires again and is retried, within ``max_attempts``."""
        try:
            reply = await resumer.resume(turn)
            if reply is None:
                raise RuntimeError(f"{resumer.name} refused the turn of {turn.account}")
            return reply
        except Exception:
            log.exception("%s %s: could not rebuild the reply of pending turn %s", turn.platform, turn.event_id,
                          turn.id)
            return None

    async def _show_again(self, turn: PendingTurn, resumer: Resumer) -> Answer | None:
        """A turn whose owner died around posting its final answer (recorded first, claims kept): that
        answer is shown again in place of the messages the owner recorded, not asked for again, so the
        question is answered once whether the post landed or not. Shown on a lease like any turn."""
        assert self.takeover is not None
        t = self.takeover
        answer = answer_of(turn.final or "")
        reply = await self._rebuilt(turn, resumer)
        if reply is None:
            return None
        log.warning("%s %s: pending turn %s had its final answer recorded; showing it again (attempt %d)",
                    turn.platform, turn.event_id, turn.id, turn.attempts)
        lease = await self._lease(turn, None, reply)
        shown = reply if lease is None else LeasedReply(reply, lease)
        try:
            await shown.finish(answer)
        except asyncio.CancelledError:  # another replica took it meanwhile: it shows the answer
            current = asyncio.current_task()
            if lease is None or not lease.lost or (current is not None and current.cancelling()):
                raise
            return None
        finally:
            if lease is not None:
                await lease.stop()
        if lease is not None:
            await lease.end(answered=True)
        else:
            await t.pending.remove(turn, turn.owner)
        _log_outcome(turn.inquiry, turn.event_id, turn.kind, answer, shown_again=True)
        if self.on_turn is not None:
            self.on_turn(HandledTurn(event_id=turn.event_id, kind=turn.kind, inquiry=turn.inquiry, answer=answer,
                                    reply=reply))
        return answer
