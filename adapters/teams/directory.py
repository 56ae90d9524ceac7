"""Teams identities for the access rule (``bot.permissions.Directory``), from the Bot Connector's rosters.

- a user's e-mail address (else their UPN), as ``GET /v3/conversations/{id}/members/{user}`` or a roster
  page gives it, is their account at the knowledge sources: ``user:<e-mail>``; a user the connector does
  not describe, or without either, cannot be mapped (``permissions.principals`` may still map their
  ``teams:29:…`` id). A user is looked up in a conversation kbbot saw them in (the connector describes
  members of a conversation only);
- a channel's or group chat's readers are its roster (``pagedmembers``: for a standard channel the
  team's, for a private channel its own members, which needs the ``ChannelMember.Read.Group``
  permission), with the rule Slack's channels follow: a roster Teams will not give (403, 404), one with a
  guest, or with someone of another tenant (a shared channel, an external chat), has no members here,
  and the conversation reads what everyone of it may: public documents and those granted to it.

With ``teams.graph_groups``, a user of the app's tenant also holds ``group:<object id>`` for each Entra
group they are in, nested ones included (``adapters.teams.graph``). When Graph cannot say (down, consent
missing, throttled past its bound), the user holds what is known without it, never more: in a channel,
a member without their groups reads less, so the channel does too. One warning per cause, until Graph
answers again; such a lookup is tried again after ``FAILED_S`` (or ``cache_s``, if shorter).

What Teams and Graph answered is remembered for ``cache_s``: each user, their groups, each
conversation's roster.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from adapters.teams.connector import Connector
from adapters.teams.graph import GraphGroups, GraphUnavailable
from bot.delivery.reply import RetryAfter

log = logging.getLogger("kbbot.teams")

#: The largest roster page Teams gives.
PAGE_SIZE = 500
#: Seconds a user's groups that Graph could not give are not asked for again.
FAILED_S = 60.0


class TeamsDirectory:
    """``service_url(tenant)``: the connector of a tenant; ``seen``: user id -> a conversation kbbot saw them
    in (the platform's, kept as activities arrive); ``groups``: Graph, when configured, for users of
    ``graph_tenant`` (the app's: its token reads only that directory)."""

    def __init__(self, connector: Connector, service_url: Callable[[str], str], seen: Mapping[str, str], *,
                 cache_s: float = 300, max_members: int = 500, groups: GraphGroups | None = None,
                 graph_tenant: str = ""):
        self.connector = connector
        self.service_url = service_url
        self.seen = seen
        self.cache_s = cache_s
        self.max_members = max_members
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._rosters: dict[str, tuple[float, list[str] | None]] = {}
        #: User id -> a conversation whose roster named them (where to ask again once forgotten).
        self._listed_in: dict[str, str] = {}
        self.groups = groups
        self.graph_tenant = graph_tenant
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}
        #: Causes of Graph failures already warned of (cleared when Graph answers again).
        self._warned: set[str] = set()

    async def principals(self, tenant: str, user: str) -> frozenset[str] | None:
        account = await self._user(tenant, user)
        if account is None:
            return None
        address = str(account.get("email") or account.get("upn") or "").strip().lower()
        found = {f"user:{address}"} if address else set()
        found |= {f"group:{g}" for g in await self._groups_of(account)}
        return frozenset(found) or None

    async def _groups_of(self, account: dict[str, Any]) -> frozenset[str]:
        object_id = str(account.get("aad") or "")
        if self.groups is None or not object_id:
            return frozenset()
        if account["tenant"] and self.graph_tenant and account["tenant"] != self.graph_tenant:
            return frozenset()  # another tenant's object id: not in the app's directory
        now = time.monotonic()
        cached = self._groups.get(object_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            found = await self.groups.of(object_id)
        except GraphUnavailable as exc:
            if exc.cause not in self._warned:
                self._warned.add(exc.cause)
                log.warning("Microsoft Graph gives no groups (%s): Teams users read without them until it does", exc)
            self._groups[object_id] = (now + min(self.cache_s, FAILED_S), frozenset())
            return frozenset()
        if self._warned:
            log.warning("Microsoft Graph gives groups again")
            self._warned.clear()
        self._groups[object_id] = (now + self.cache_s, found)
        return found

    async def members(self, tenant: str, channel: str) -> list[str] | None:
        now = time.monotonic()
        cached = self._rosters.get(channel)
        if cached is not None and cached[0] > now:
            return cached[1]
        roster = await self._roster(tenant, channel)
        self._rosters[channel] = (now + self.cache_s, roster)
        return roster

    # --- the connector ------------------------------------------------------------------------------------
    async def _user(self, tenant: str, user: str) -> dict[str, Any] | None:
        now = time.monotonic()
        cached = self._users.get(user)
        if cached is not None and cached[0] > now:
            return cached[1]
        conversation = self.seen.get(user) or self._listed_in.get(user)
        if not conversation:
            return None  # never seen: nowhere to ask about them (not remembered: they may write soon)
        try:
            member = await self.connector.call(self.service_url(tenant), "member", lambda api: (
                api.conversations.get_member_by_id(conversation, user)))
        except (httpx.HTTPError, RetryAfter) as exc:
            log.info("Teams does not describe user %s (%s): not mapped", user, _why(exc))
            member = None
        found = _account(member) if member is not None else None
        self._users[user] = (now + self.cache_s, found)
        return found

    async def _roster(self, tenant: str, channel: str) -> list[str] | None:
        """The conversation's members when they are its only readers, else None (see the module)."""
        members: list[Any] = []
        token: str | None = None
        try:
            while True:
                page = await self.connector.call(self.service_url(tenant), "roster", lambda api: (
                    api.conversations.get_paged_members(channel, page_size=PAGE_SIZE, continuation_token=token)))
                members += list(page.members or [])
                token = page.continuation_token
                if not token or len(members) > self.max_members:
                    break
        except (httpx.HTTPError, RetryAfter) as exc:
            log.info("Teams gives no roster of %s (%s): what the whole conversation may read", channel, _why(exc))
            return None
        ids = []
        now = time.monotonic()
        for member in members:
            account = _account(member)
            if account["guest"] or (tenant and account["tenant"] and account["tenant"] != tenant):
                log.info("%s has a guest or someone of another tenant: what the whole conversation may read", channel)
                return None
            self._users[account["id"]] = (now + self.cache_s, account)
            self._listed_in[account["id"]] = channel
            ids.append(account["id"])
        return ids


def _account(member: Any) -> dict[str, Any]:
    """What the access rule reads of a ``TeamsChannelAccount``."""
    return {"id": str(member.id), "email": getattr(member, "email", None), "aad": getattr(member, "aad_object_id", None),
            "upn": getattr(member, "user_principal_name", None),
            "guest": str(getattr(member, "user_role", "") or "").lower() == "guest",
            "tenant": str(getattr(member, "tenant_id", "") or "")}


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{exc.response.status_code}"
    return type(exc).__name__
