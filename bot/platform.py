"""The one platform contract: what a way in to kbbot (Slack, Telegram, the HTTP API, the next one) supplies.

A platform is one folder under ``adapters/`` (``adapters/slack/``, ``adapters/telegram/``, ``adapters/api/``)
whose ``build(runtime, conversations)`` returns a ``Platform`` (or None when its settings leave it off);
``adapters/platforms.py`` lists the builders, and ``kbbot serve`` builds ``platforms: dict[name, Platform]``
from them. Everything outside a platform's folder (the server, the knowledge loop's reviewers and re-checks,
the digest, owners' lists) talks to that registry through this contract, never to a concrete platform.

What a platform supplies:

- **serving**: ``mount`` its HTTP routes on the one web server, ``start`` (connections of its own: Socket
  Mode, long polling), ``stop`` (after the turns in progress), ``health``;
- **turns** (chat platforms): its events become ``Inquiry`` s, commands and clicks handed to its
  ``delivery`` (``bot.delivery.Delivery``: gate, pending record, claim, take-over, the turn), and the
  operations that layer asks of it (``bot.delivery.PlatformMessages``: its account, a reply rebuilt
  from a pending turn's target or for a place, delete and edit one of its messages); its replies post,
  edit, stream and react with its own SDK inside its rate tiers (``bot.delivery.reply.PlatformRates``). A way in
  whose caller holds the request (the HTTP API) has no ``delivery``;
- **who**: ``owns(user)`` (an id of its users: an owner's or a reviewer's), ``tenant`` (the account its
  principals are read under) and, registered with ``bot.permissions.Audiences`` when it is built, which
  principals a user has and who may read a place;
- **messages outside a turn**, each through its rate budget: ``send_note`` (plain text to a person or a
  channel: a reviewers' alert, an owner's list, the digest), ``post_recheck`` (a re-checked approval with
  its two buttons), and where they go: ``reviewers`` (its reviewers' channel, its reviewers) and
  ``digest_to``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from bot.delivery.gate import Delivery
from bot.knowledge.loop.recheck import RecheckRequest
from bot.types import Inquiry

log = logging.getLogger("kbbot.loop")


@dataclass(frozen=True)
class Reviewers:
    """Where a platform's reviewers read kbbot: a channel of theirs (``place``, "" for none) and each
    reviewer's own id (a direct message)."""

    place: str = ""
    users: list[str] = field(default_factory=list)


class Platform(Protocol):
    """One way in to kbbot, as the registry holds it (see the module)."""

    name: str
    #: Its chat turns' delivery layer; None where the caller holds the request (the HTTP API).
    delivery: Delivery | None
    #: The account under which its users' principals are read (Telegram: the bot id; "" where ids are global).
    tenant: str
    reviewers: Reviewers
    #: Where the weekly digest goes on this platform ("" for nowhere).
    digest_to: str

    def mount(self, web_app: web.Application) -> None:
        """Add its HTTP routes (none for connection-based modes)."""

    async def start(self) -> None: ...

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop taking events and wait up to ``timeout_s`` for the turns in progress."""

    def health(self) -> dict[str, Any]: ...

    def owns(self, user: str) -> bool:
        """Whether ``user`` is an id of this platform's users."""

    async def send_note(self, to: str, text: str) -> bool:
        """``text`` (kbbot's words, or a document's: shown literally, mentions inert) to ``to`` (a user's
        id: a direct message; or a channel), split to the platform's message size; False when refused."""

    async def post_recheck(self, to: str, request: RecheckRequest) -> bool:
        """A re-checked approval, both answers and "Keep approved" / "Retire", to ``to``; False when refused."""


class NoChat:
    """The parts of ``Platform`` a way in without chat messages of its own has (the HTTP API): no turns
    to take over, no users to write to."""

    delivery: Delivery | None = None
    tenant = ""
    reviewers = Reviewers()
    digest_to = ""

    def owns(self, user: str) -> bool:
        return False

    async def send_note(self, to: str, text: str) -> bool:
        return False

    async def post_recheck(self, to: str, request: RecheckRequest) -> bool:
        return False


# --- the reviewers' desk over the registry --------------------------------------------------------
class ReviewerMessages:
    """The knowledge loop's ``ReviewerDesk`` on the platforms of ``kbbot serve``.

    A re-checked approval goes to the platform it was approved on (``RecheckRequest.tenant``): to that
    platform's reviewers' channel when it has one and every reader there may read what both answers cite,
    else to the reviewer who approved it while still a reviewer there, else to every reviewer there who
    may read it, else to the approver (``RecheckRequest.may_post``: whoever approved it read it). Plain
    messages (golden set failures) go to each platform's reviewers' channel, else to each of its reviewers.
    """

    def __init__(self, platforms: Iterable[Platform]):
        self.platforms = {platform.name: platform for platform in platforms}

    async def ask_recheck(self, request: RecheckRequest) -> bool:
        platform = self.platforms.get(request.platform)
        if platform is None:
            log.warning("turn %s: approved on %s, which this process does not serve", request.turn_id,
                        request.tenant or "?")
            return False
        return any([await platform.post_recheck(to, request) for to in await self._places(platform, request)])

    async def _places(self, platform: Platform, request: RecheckRequest) -> list[str]:
        tenant = request.tenant.partition(":")[2]
        approver, reviewers = request.approved_by, platform.reviewers
        if reviewers.place:
            if await request.may_post(_place(platform.name, tenant, reviewers.place, request, private=False)):
                return [reviewers.place]
            log.info("turn %s: its re-check cites what not every reader of %s may read: sent to its approver",
                     request.turn_id, reviewers.place)
            return [approver] if approver else []
        if approver in reviewers.users:
            return [approver]
        readable = [r for r in reviewers.users
                    if await request.may_post(_place(platform.name, tenant, r, request, private=True, user=r))]
        return readable or ([approver] if approver else [])

    async def tell(self, text: str) -> bool:
        sent = []
        for platform in self.platforms.values():
            places = [platform.reviewers.place] if platform.reviewers.place else platform.reviewers.users
            sent += [await platform.send_note(to, text) for to in places]
        if not sent:
            log.warning("no reviewer to tell (approvals.reviewers_channel, slack.reviewers, telegram.reviewers): %s",
                        text.splitlines()[0] if text else "")
        return any(sent)


def _place(platform: str, tenant: str, channel: str, request: RecheckRequest, *, private: bool,
           user: str = "") -> Inquiry:
    """A turn-less inquiry standing for a place a re-check could be posted in (its readers decide)."""
    return Inquiry(platform=platform, tenant=tenant, channel=channel, thread_key=f"recheck:{request.turn_id}",
                   user_id=user or request.approved_by, text="", private=private)
