"""A chat platform account's side of its turns: the gate, claims, tracking and take-over, written once.

A platform (``adapters/slack/``, ``adapters/telegram/``) translates its events and renders its messages;
between them, for every platform:

- the gate (``Delivery.admit``): each handler is tracked (shutdown drains it, tests settle on it) and
  passes the access checks: the shared ones (a click must name a turn id kbbot made) and those the
  platform registered once with ``Delivery.check`` (workspaces, channels, users), like bolt's middleware
  or aiogram's filters. A check registered here cannot exist on one platform and not on the other path;
- claims: an event's dedupe keys are claimed only once it passed the gate, as a ``bot.state.Claim`` on a
  renewed lease; ``Delivery.claimed`` finishes a command's claim whatever happens to the command;
- the turn: ``Delivery.accept`` takes a question's ``Arrival`` for this account (``bot.delivery.turns``:
  recorded as pending, then claimed) before the platform acknowledges the event; ``Delivery.answer``
  then runs its turn;
- take-over: ``Delivery.resume`` refuses a turn of any other account, deletes the messages a dead
  replica left half-written (or marks them, where the platform refuses), and rebuilds the reply;
- what a platform refused (streaming in a workspace, drafts on a Bot API server) is left untried for an
  hour (``RefusedCapabilities``), so later answers go the other way at once.

What a platform supplies here is ``PlatformMessages``: its name and account, how to rebuild a reply
from a pending turn's target, how to delete and edit one of its messages; its replies post, edit, stream
and react through its own SDK (``bot.delivery.reply``), paced by ``bot.delivery.reply`` and inside its
rate tiers (``bot.delivery.rates``). The whole contract of a platform is ``bot.platform``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bot.delivery.pending import PendingTurn, PostsMessages
from bot.delivery.reply import ChatReply
from bot.delivery.turns import Accepted, Arrival, Turns
from bot.messages import say
from bot.state import Claim, TaskSet
from bot.types import Answer, Reply

log = logging.getLogger("kbbot.delivery")

#: What ``bot.types.Trace`` makes turn ids of: uuid4 hex. A click naming anything else is refused.
TURN_ID = re.compile(r"[0-9a-f]{32}")
#: How long a capability a platform refused (streaming in a Slack workspace, drafts on a Bot API server)
#: is left untried: an hour, then one answer tries it again. A server is upgraded, a workspace's setting
#: changes: trying again costs one refused call and a fallback within that answer, so an hour keeps it
#: rare without leaving a fixed platform unused for long. Kept in this process only (``time.monotonic``).
#: Not ``STRANGER_TOLD_EVERY_S``, which spaces the messages that tell a person they are refused.
CAPABILITY_RETRY_S = 3600.0
#: A person not allowed to ask is told so once in this long (``Delivery.first_refusal``); the rest of the
#: time their messages are ignored, so a stranger cannot make kbbot talk to a chat at will.
STRANGER_TOLD_EVERY_S = 30 * 86400.0


@dataclass(frozen=True)
class Access:
    """Who asks for what, as the gate sees it (the same fields on every platform)."""

    what: str  # question | command | click
    user: str
    tenant: str = ""  # Slack workspace, Telegram bot
    chat: str = ""  # channel or chat id
    private: bool = False  # a direct message / private chat
    turn_id: str | None = None  # the turn a click names


#: An access check: the reason ``access`` is refused (logged), or None.
Check = Callable[[Access], str | None]


def _click_names_a_turn(access: Access) -> str | None:
    if access.what == "click" and not TURN_ID.fullmatch(access.turn_id or ""):
        return f"a click that names no turn of kbbot ({(access.turn_id or '')[:40]!r})"
    return None


class PlatformMessages(Protocol):
    """What a chat platform supplies to its ``Delivery``."""

    name: str

    async def account(self) -> str:
        """The platform account this process serves, ``{name}:{id}`` (Telegram: the bot id; Slack: the
        bot user of the app's token)."""

    def rebuild(self, turn: PendingTurn) -> Reply:
        """The reply of a turn taken over, from the target its adapter recorded (``turn.target``)."""

    def reply_to(self, target: dict[str, Any]) -> Reply:
        """A reply in the place ``target`` names (a question's ``Inquiry.reply_to``), for an answer posted
        later, outside any turn."""

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        """Delete one of the answer's messages; True when it is gone (or was already), False when the
        platform refused."""

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        """Replace one message's text (raises the platform's error when it cannot)."""


class RefusedCapabilities:
    """The capabilities a platform refused, by key (``stream:<team>``, ``drafts``), left untried for
    ``retry_s`` (then tried again)."""

    def __init__(self, retry_s: float = CAPABILITY_RETRY_S, *, clock: Callable[[], float] = time.monotonic):
        self.retry_s = retry_s
        self._clock = clock
        self._until: dict[str, float] = {}

    def refuse(self, key: str) -> None:
        self._until[key] = self._clock() + self.retry_s

    def refused(self, key: str) -> bool:
        until = self._until.get(key)
        return until is not None and until > self._clock()


class Delivery:
    """One platform account's side of every turn: gate, claims, tracking, take-over (see the module)."""

    def __init__(self, turns: Turns | None, platform: PlatformMessages):
        self.turns = turns
        self.platform = platform
        self.name = platform.name
        self.tasks = TaskSet()
        self.refused_capabilities = RefusedCapabilities()
        self._checks: list[Check] = [_click_names_a_turn]
        self._account: str | None = None

    # --- the gate -------------------------------------------------------------------------------
    def check(self, check: Check) -> Check:
        """Register an access check (once, when the adapter is built); usable as a decorator."""
        self._checks.append(check)
        return check

    def received(self, what: str, event_id: str, where: str, *, retry: str = "") -> None:
        """The line every delivered event leaves, before any check or claim: a question later refused,
        deduplicated or never answered can be traced to the replica that got it (and which delivery)."""
        log.info("%s: received %s %s in %s%s", self.name, what or "event", event_id or "?", where or "?",
                 f" (retry {retry})" if retry else "")

    def admit(self, access: Access) -> bool:
        """The first call of every handler: tracks it, then runs every check; False (logged) when one
        refuses."""
        self.tasks.track_current()
        for check in self._checks:
            reason = check(access)
            if reason is not None:
                log.info("%s: ignoring a %s from %s: %s", self.name, access.what, access.user or "?", reason)
                return False
        return True

    def background(self, task: asyncio.Task[Any]) -> None:
        """Work a handler left running (a reaction taken back): drained at shutdown too."""
        self.tasks.track(task)

    # Where a platform acknowledges an update once its handler returned (Telegram's webhook 200, its next
    # polling offset), only accepting a question may run before the acknowledgement; the rest runs after.
    def later(self, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
        """``handler`` run in a task of its own, after its update is acknowledged (drained at shutdown)."""

        @functools.wraps(handler)
        async def run_later(*args: Any, **kwargs: Any) -> None:
            self.background(asyncio.create_task(handler(*args, **kwargs)))

        return run_later

    @staticmethod
    def own_task(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
        """``handler`` awaited in a task of its own (the gate tracks that task, not the platform's loop
        that called it: a polling loop never ends)."""

        @functools.wraps(handler)
        async def run_own(*args: Any, **kwargs: Any) -> None:
            await asyncio.create_task(handler(*args, **kwargs))

        return run_own

    @property
    def in_progress(self) -> int:
        return len(self.tasks)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the handlers in progress (shutdown)."""
        await self.tasks.drain(timeout_s)

    async def settle(self, quiet_s: float = 0.05) -> None:
        """Wait until every admitted event has been handled (tests)."""
        await self.tasks.settle(quiet_s)

    # --- claims and turns -----------------------------------------------------------------------
    async def claim(self, keys: list[str], ttl_s: float, lease_s: float) -> Claim | None:
        """The event's claim on a renewed lease, or None: it was already handled (a redelivery)."""
        assert self.turns is not None
        return await self.turns.claim(keys, ttl_s, lease_s=lease_s)

    async def first_refusal(self, who: str) -> bool:
        """Whether to tell ``who`` (the platform's account-scoped key of a person not allowed) that they are
        refused: the first time in ``STRANGER_TOLD_EVERY_S``, across replicas. When the store fails the
        refusal is not repeated: silence is the side that cannot be abused."""
        assert self.turns is not None
        try:
            return await self.turns.idempotency.claim(f"refused:{who}", STRANGER_TOLD_EVERY_S)
        except Exception:
            log.exception("the idempotency store failed; not repeating the refusal")
            return False

    @contextlib.asynccontextmanager
    async def claimed(self, keys: list[str], ttl_s: float, lease_s: float) -> AsyncIterator[Claim | None]:
        """A command's claim, finished (kept as answered) however the command ends, unless the command
        finished it itself (``claim.finish(answered=False)``: a redelivery may try again)."""
        claim = await self.claim(keys, ttl_s, lease_s)
        try:
            yield claim
        finally:
            if claim is not None:
                await claim.finish(answered=True)

    async def accept(self, arrival: Arrival) -> Accepted | None:
        """A question's event taken: recorded as pending for this account, then claimed on a lease; None
        for a redelivery (answered, or in another turn or take-over). Called before the platform is told
        the event arrived: a platform acknowledges only once this returned (``Turns.accept``)."""
        assert self.turns is not None
        return await self.turns.accept(arrival, await self.account())

    async def answer(self, accepted: Accepted, reply: Reply) -> Answer | None:
        """An accepted question's turn (after its acknowledgement), pending for this account while it runs;
        tracked like a handler (the task that runs it may not be the one the gate saw)."""
        assert self.turns is not None
        self.tasks.track_current()
        a = accepted.arrival
        return await self.turns.answer(a.inquiry, reply, claimed=accepted, event_id=a.event_id, kind=a.kind,
                                       crashed=a.crashed)

    # --- answers outside a turn -------------------------------------------------------------------
    async def post_answer(self, target: dict[str, Any], answer: Answer) -> Reply:
        """``answer`` posted where ``target`` (an ``Inquiry.reply_to`` of this platform) points, as a turn's
        final answer is (sources, buttons, the platform's rate budgets), with no acknowledgement first: a
        follow-up nobody is waiting for. Not tracked as a handler: it runs in the refresh's task, which the
        scheduler's shutdown waits for. The platform's errors propagate."""
        reply = self.platform.reply_to(target)
        await reply.finish(answer)
        return reply

    # --- take-over ------------------------------------------------------------------------------
    async def account(self) -> str:
        if self._account is None:
            self._account = await self.platform.account()
        return self._account

    async def resume(self, turn: PendingTurn) -> Reply | None:
        """The reply of a turn taken over from a replica that died: the messages it left half-written
        retired, so the new answer is the one the user reads. A turn of another account is refused."""
        account = await self.account()
        if turn.account != account:
            log.warning("%s: refusing pending turn %s of %s; this process serves %s", self.name, turn.id,
                        turn.account or "an unknown account", account)
            return None
        language = str(turn.target.get("language") or "en")
        for message_id in turn.messages:
            await self._retire(turn.target, message_id, language)
        return self.platform.rebuild(turn)

    async def withdraw(self, turn: PendingTurn, reply: Reply, keep: list[str]) -> None:
        """A turn of this account that stalled past its lease while alive, and was taken over (by another
        replica, or by this one again), stops writing; the messages it posted that its entry never held
        are retired, since the new owner retires only those it was handed (``keep``). Without this a
        replica under load left a half-written answer beside the whole one."""
        if isinstance(reply, ChatReply):
            await reply.stop()  # a send in flight completes first: its message id is known
        if not isinstance(reply, PostsMessages):
            return
        language = str(turn.target.get("language") or "en")
        for message_id in reply.message_ids():
            if message_id not in keep:
                await self._retire(turn.target, message_id, language)

    async def _retire(self, target: dict[str, Any], message_id: str, language: str) -> None:
        """Deleted, so the conversation ends with one whole answer; where the platform refuses (a message
        too old), edited to say the answer continues below."""
        try:
            if await self.platform.delete(target, message_id):
                return
        except Exception as exc:  # noqa: BLE001 - marked below instead
            log.info("%s: could not delete the interrupted message %s (%s); marking it", self.name, message_id, exc)
        try:
            await self.platform.edit(target, message_id, say("interrupted", language))
        except Exception as exc:  # noqa: BLE001 - a courtesy: the new answer follows anyway
            log.warning("%s: the interrupted message %s stays as it was (%s)", self.name, message_id, exc)
