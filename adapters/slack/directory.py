"""Slack identities for the access rule (``bot.permissions.Directory``).

- a user's e-mail address (``users.info``, scope ``users:read`` and ``users:read.email``) is their
  account at the knowledge sources: ``user:<e-mail>``; a user without one (the scope missing, a bot)
  cannot be mapped;
- their Slack user groups (``usergroups.list`` with ``include_users``, scope ``usergroups:read``) are
  ``slackgroup:<handle>``, and the source groups ``permissions.slack_groups`` maps a handle to: whoever
  may create or edit Slack user groups must not be able to grant themselves a source group by its name;
- a channel's members (``conversations.members``, scopes ``channels:read``, ``groups:read``,
  ``im:read``, ``mpim:read``), bots and deactivated users left out, when they are its only readers:
  ``conversations.info`` says it is private and shared with no other organisation, and no member is a
  guest (``is_restricted``, ``is_ultra_restricted``). Anyone in the workspace may open a public channel
  and read its history; another organisation's people read a Slack Connect channel; a guest's e-mail
  says nothing of what they may read at the sources. Such a channel, or one Slack will not describe,
  has no members here: a thread's answer there uses what the whole channel may read.

What Slack answered is remembered here, once, for ``cache_s``: users, the user groups (read for every
user at once), each channel's description and member list. ``bot.permissions.Audiences`` keeps nothing
of its own, so a change at Slack counts after ``cache_s`` at most.

A channel with many members not yet known is read from ``users.list`` (Tier 2, 20 calls a minute, 200
users a call) instead of ``users.info`` for each (Tier 4, 100 a minute: a channel of 300 would be three
minutes of calls before its first answer). Paging stops once every member wanted is found, or once it
has cost what ``users.info`` for each would have (a page is worth five calls by the tiers); members
still missing are looked up one by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("kbbot.slack")

#: Members not yet known above which a channel's are read with users.list, not users.info each.
PRIME_ABOVE = 20
#: users.list's page (Slack recommends no more than 200).
USERS_PAGE = 200
#: What one users.list call costs in users.info calls: Tier 4 (100 a minute) over Tier 2 (20 a minute).
PAGE_COST = 5


def _slim(user: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the access rule reads of a user: a workspace's whole directory may be cached."""
    if user is None:
        return None
    email = (user.get("profile") or {}).get("email")
    return {"id": user.get("id"), "is_bot": bool(user.get("is_bot")), "deleted": bool(user.get("deleted")),
            "guest": bool(user.get("is_restricted") or user.get("is_ultra_restricted")),
            "profile": {"email": email} if email else {}}


def members_only(channel: Mapping[str, Any] | None) -> bool:
    """Whether conversations.info's ``channel`` can be read by its members only: private, and shared with
    no other organisation (Slack Connect, or an invitation to it pending). Shared without saying it is
    within the organisation (``is_shared`` without ``is_org_shared``) counts as shared outside it."""
    if not channel or channel.get("is_private") is not True:
        return False
    if channel.get("is_ext_shared") or channel.get("is_pending_ext_shared"):
        return False
    return not channel.get("is_shared") or channel.get("is_org_shared") is True


class SlackDirectory:
    """``groups``: a Slack user group's handle -> the source principals it stands for
    (``permissions.slack_groups``)."""

    def __init__(self, client: AsyncWebClient, *, cache_s: float = 300,
                 groups: Mapping[str, Collection[str]] | None = None):
        self.client = client
        self.cache_s = cache_s
        self.groups = {h.lower(): frozenset(p) for h, p in (groups or {}).items()}
        self._groups: tuple[float, dict[str, frozenset[str]]] | None = None
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        #: channel -> (until, its member ids when only they can read it, else None)
        self._channels: dict[str, tuple[float, list[str] | None]] = {}
        self._warned: set[str] = set()

    def _warn_once(self, what: str, exc: SlackApiError) -> None:
        code = str(exc.response.get("error") if exc.response is not None else exc)
        if what not in self._warned:
            self._warned.add(what)
            log.warning("Slack refused %s (%s): %s", what, code,
                        "askers are matched without their user groups" if what == "usergroups.list"
                        else "users are looked up one by one" if what == "users.list"
                        else "such channels read public documents and those granted to them"
                        if what.startswith("conversations.")
                        else "that user reads public documents only")

    def _cached(self, user: str, now: float) -> tuple[float, dict[str, Any] | None] | None:
        """The user as cached (found or known not to be), while fresh."""
        hit = self._users.get(user)
        return hit if hit is not None and hit[0] > now else None

    async def _user(self, user: str) -> dict[str, Any] | None:
        now = time.monotonic()
        if (hit := self._cached(user, now)) is not None:
            return hit[1]
        try:
            found = _slim((await self.client.users_info(user=user)).get("user"))
        except SlackApiError as exc:
            self._warn_once("users.info", exc)
            found = None
        self._keep(user, found, now)
        return found

    def _keep(self, user: str, found: dict[str, Any] | None, now: float) -> None:
        if len(self._users) > 20000:
            self._users = {k: v for k, v in self._users.items() if v[0] > now}
        self._users[user] = (now + self.cache_s, found)

    def _unknown(self, users: list[str]) -> set[str]:
        now = time.monotonic()
        return {u for u in users if self._cached(u, now) is None}

    async def _prime(self, wanted: set[str]) -> None:
        """Reads users.list until every user of ``wanted`` is known, or until the pages read have cost
        what looking up the rest one by one would (see the module docstring)."""
        budget = max(1, len(wanted) // PAGE_COST)
        cursor = None
        try:
            for _ in range(budget):
                answer = await self.client.users_list(limit=USERS_PAGE, cursor=cursor)
                now = time.monotonic()
                for user in answer.get("members") or []:
                    if user.get("id"):
                        self._keep(str(user["id"]), _slim(user), now)
                        wanted.discard(str(user["id"]))
                cursor = (answer.get("response_metadata") or {}).get("next_cursor")
                if not cursor or not wanted:
                    break
        except SlackApiError as exc:  # e.g. rate limited past the client's retries: one by one, then
            self._warn_once("users.list", exc)

    async def _user_groups(self) -> dict[str, frozenset[str]]:
        """User id -> the handles of their user groups."""
        now = time.monotonic()
        if self._groups is not None and self._groups[0] > now:
            return self._groups[1]
        by_user: dict[str, set[str]] = {}
        try:
            answer = await self.client.usergroups_list(include_users=True)
            for group in answer.get("usergroups") or []:
                handle = str(group.get("handle") or "").lower()
                if handle and not group.get("date_delete"):
                    for member in group.get("users") or []:
                        by_user.setdefault(str(member), set()).add(handle)
        except SlackApiError as exc:
            self._warn_once("usergroups.list", exc)
        groups = {u: frozenset(h) for u, h in by_user.items()}
        self._groups = (now + self.cache_s, groups)
        return groups

    async def principals(self, tenant: str, user: str) -> frozenset[str] | None:
        found = await self._user(user)
        if not found or found.get("is_bot") or found.get("deleted"):
            return None
        email = str((found.get("profile") or {}).get("email") or "").strip().lower()
        if not email:
            return None
        handles = (await self._user_groups()).get(user, frozenset())
        mapped = (p for h in handles for p in self.groups.get(h, ()))
        return frozenset({f"user:{email}", *(f"slackgroup:{h}" for h in handles), *mapped})

    async def _readers(self, channel: str) -> list[str] | None:
        """The channel's member ids when only they can read it (``members_only``), else None."""
        method = "conversations.info"
        try:
            described = (await self.client.conversations_info(channel=channel)).get("channel")
            if not members_only(described):
                log.debug("Slack channel %s is readable beyond its members: what the channel may read", channel)
                return None
            method = "conversations.members"
            members: list[str] = []
            cursor = None
            while True:
                answer = await self.client.conversations_members(channel=channel, limit=1000, cursor=cursor)
                members += [str(m) for m in answer.get("members") or []]
                cursor = (answer.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    return members
        except SlackApiError as exc:
            self._warn_once(method, exc)
            return None

    async def members(self, tenant: str, channel: str) -> list[str] | None:
        now = time.monotonic()
        hit = self._channels.get(channel)
        if hit is None or hit[0] <= now:
            if len(self._channels) > 20000:
                self._channels = {k: v for k, v in self._channels.items() if v[0] > now}
            hit = (now + self.cache_s, await self._readers(channel))
            self._channels[channel] = hit
        members = hit[1]
        if members is None:
            return None
        unknown = self._unknown(members)
        if len(unknown) > PRIME_ABOVE and self.cache_s > 0:  # nothing is kept without a cache
            await self._prime(unknown)
        people = []
        for member in members:
            found = await self._user(member)
            # The bot itself and other apps read nothing; a user Slack would not describe counts as a person.
            if found is not None and (found.get("is_bot") or found.get("deleted") or member == "USLACKBOT"):
                continue
            if found is not None and found.get("guest"):
                return None  # a guest: the channel is no longer its members' alone
            people.append(member)
        return people
