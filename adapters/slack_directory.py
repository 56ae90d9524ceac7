"""Slack identities for the access rule (``bot.permissions.Directory``).

- a user's e-mail address (``users.info``, scope ``users:read`` and ``users:read.email``) is their
  account at the knowledge sources: ``user:<e-mail>``; a user without one (the scope missing, a bot)
  cannot be mapped;
- their Slack user groups (``usergroups.list`` with ``include_users``, scope ``usergroups:read``) are
  ``group:<handle>``: name a group at the source like its Slack handle (``hr``) to grant it;
- a channel's members (``conversations.members``, scopes ``channels:read``, ``groups:read``,
  ``im:read``, ``mpim:read``), bots and deactivated users left out: a thread's answer may use what all
  of them may read.

``bot.permissions.Audiences`` caches what this returns; the user groups, read for every user at
once, are cached here for the same time.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("kbbot.slack")


class SlackDirectory:
    def __init__(self, client: AsyncWebClient, *, cache_s: float = 300):
        self.client = client
        self.cache_s = cache_s
        self._groups: tuple[float, dict[str, frozenset[str]]] | None = None
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._warned: set[str] = set()

    def _warn_once(self, what: str, exc: SlackApiError) -> None:
        code = str(exc.response.get("error") if exc.response is not None else exc)
        if what not in self._warned:
            self._warned.add(what)
            log.warning("Slack refused %s (%s): %s", what, code,
                        "askers are matched without their user groups" if what == "usergroups.list"
                        else "that user reads public documents only")

    async def _user(self, user: str) -> dict[str, Any] | None:
        hit = self._users.get(user)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            found = (await self.client.users_info(user=user)).get("user")
        except SlackApiError as exc:
            self._warn_once("users.info", exc)
            found = None
        if len(self._users) > 20000:
            self._users = {k: v for k, v in self._users.items() if v[0] > now}
        self._users[user] = (now + self.cache_s, found)
        return found

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
        groups = (await self._user_groups()).get(user, frozenset())
        return frozenset({f"user:{email}", *(f"group:{g}" for g in groups)})

    async def members(self, tenant: str, channel: str) -> list[str] | None:
        members: list[str] = []
        cursor = None
        try:
            while True:
                answer = await self.client.conversations_members(channel=channel, limit=1000, cursor=cursor)
                members += [str(m) for m in answer.get("members") or []]
                cursor = (answer.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        except SlackApiError as exc:
            self._warn_once("conversations.members", exc)
            return None
        people = []
        for member in members:
            found = await self._user(member)
            # The bot itself and other apps read nothing; a user Slack would not describe counts as a person.
            if found is not None and (found.get("is_bot") or found.get("deleted") or member == "USLACKBOT"):
                continue
            people.append(member)
        return people
