"""``ConfluencePermissions``: who may read a Confluence page or attachment, from its space's permissions
and the read restrictions of the page and its ancestors."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pipelines.records import PUBLIC
from pipelines.sources.confluence.client import PAGE_SIZE, ConfluenceClient

log = logging.getLogger("pipelines.sources.confluence")


class Listed(Protocol):
    """A page or attachment as the listing showed it (``source.Entry``): what its readers depend on."""

    space: str
    ancestors: tuple[str, ...]
    page_id: str


class ReadersUnknown(Exception):
    """Who may read a document cannot be established (its space's permissions are hidden from the API
    user and no setting maps them): it is indexed, readable by nobody; the message says why."""


@dataclass(frozen=True)
class Level:
    """Who passes one level of restriction (the space's read permission, or one page's read restriction)."""

    people: frozenset[str] = frozenset()  # user principals
    groups: frozenset[str] = frozenset()  # Confluence group names (members can be listed)
    #: Principals an operator mapped that name no Confluence user or group (``space:ops``): matched by
    #: name only, so they admit no one person in an intersection.
    others: frozenset[str] = frozenset()
    #: Every Confluence account passes (an everyone group): the level restricts no account further.
    everyone: bool = False


class ConfluencePermissions:
    """Who may read a page (or an attachment, as its page), read through the REST API once per run:

    - the page's and each ancestor's read restrictions
      (``GET rest/api/content/{id}/restriction/byOperation/read``): a reader must satisfy every one of
      them that restricts anything (Confluence inherits view restrictions down the tree);
    - the space's permissions (``GET rest/api/space/{key}?expand=permissions``, the ``read`` operation
      on the space): no restriction when anonymous access is granted; every Confluence account when one
      of ``everyone_groups`` has it; else a reader must hold it too. A space whose read permissions the
      API user is not shown (Data Center's REST API shows none; a Cloud user without the right sees
      none) takes its readers from ``hidden_spaces`` (space key or ``*`` -> principals), else its pages'
      readers are unknown (``ReadersUnknown``): held back, never public.

    One level: its users and groups are the readers; a level every Confluence account passes gives
    ``everyone_readers`` (an explicit principal such as ``confluence:everyone``, never ``public`` unless
    the operator says so). Several: their intersection (a level every account passes narrows nothing),
    the groups of one expanded to members (``GET rest/api/group/{name}/member``) where the other does not
    name them. Users become ``user:<e-mail>`` (``user:confluence:<account id or user name>`` when the
    API shows no e-mail), groups ``group:<name>``. An intersection no one passes: ``[]`` (nobody).
    """

    def __init__(self, client: ConfluenceClient, everyone_groups: Collection[str] = ("confluence-users",),
                 everyone_readers: Collection[str] = ("confluence:everyone",),
                 hidden_spaces: Mapping[str, Collection[str]] | None = None):
        self.client = client
        self.everyone = frozenset(g.lower() for g in everyone_groups)
        self.everyone_readers = sorted(everyone_readers)
        self.hidden_spaces = {k.upper(): list(v) for k, v in (hidden_spaces or {}).items()}
        self._restrictions: dict[str, Level | None] = {}
        self._spaces: dict[str, Level | None | ReadersUnknown] = {}
        self._members: dict[str, frozenset[str]] = {}

    @staticmethod
    def user_principal(user: dict[str, Any]) -> str | None:
        email = str(user.get("email") or "").strip().lower()
        if email:
            return f"user:{email}"
        ident = user.get("accountId") or user.get("username") or user.get("userKey")
        return f"user:confluence:{str(ident).lower()}" if ident else None

    def _level(self, users: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Level | None:
        people = frozenset(p for p in map(self.user_principal, users) if p)
        names = frozenset(str(g.get("name") or "").lower() for g in groups if g.get("name"))
        if names & self.everyone:
            return Level(everyone=True)
        return Level(people, names) if people or names else None

    def _mapped(self, principals: Collection[str]) -> Level | None:
        """A level from principals the operator gave a hidden space."""
        if PUBLIC in principals:
            return None
        if any(p in self.everyone_readers for p in principals):
            return Level(everyone=True)
        return Level(people=frozenset(p for p in principals if p.startswith("user:")),
                     groups=frozenset(p.removeprefix("group:") for p in principals if p.startswith("group:")),
                     others=frozenset(p for p in principals if not p.startswith(("user:", "group:"))))

    def restriction(self, content_id: str) -> Level | None:
        if content_id not in self._restrictions:
            data = self.client.json(f"rest/api/content/{content_id}/restriction/byOperation/read",
                                    {"expand": "restrictions.user,restrictions.group"})
            found = data.get("restrictions") or {}
            self._restrictions[content_id] = self._level(list(self._all(found.get("user"))),
                                                         list(self._all(found.get("group"))))
        return self._restrictions[content_id]

    def _all(self, listing: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
        """A restriction's or permission's users or groups, following ``_links.next`` if it has more."""
        while listing:
            yield from listing.get("results") or []
            following = (listing.get("_links") or {}).get("next")
            listing = self.client.json(following) if following else None

    def space(self, key: str) -> Level | None:
        """The space's read level; None: anyone may read (anonymous access). ``ReadersUnknown``: hidden."""
        if key not in self._spaces:
            self._spaces[key] = self._read_space(key)
        found = self._spaces[key]
        if isinstance(found, ReadersUnknown):
            raise found
        return found

    def _read_space(self, key: str) -> Level | None | ReadersUnknown:
        data = self.client.json(f"rest/api/space/{key}", {"expand": "permissions"})
        reads = [p for p in data.get("permissions") or []
                 if (p.get("operation") or {}).get("operation") == "read"
                 and (p.get("operation") or {}).get("targetType") == "space"]
        if not reads:
            mapped = self.hidden_spaces.get(key.upper(), self.hidden_spaces.get("*"))
            if mapped is not None:
                log.info("confluence: space %s shows no read permissions; its readers are %s "
                         "(confluence.hidden_space_readers)", key, ", ".join(mapped))
                return self._mapped(mapped)
            log.warning("confluence: no read permissions visible for space %s; its pages are held back (readable "
                        "by nobody) until confluence.hidden_space_readers names its readers", key)
            return ReadersUnknown(f"the read permissions of Confluence space {key} are not visible to the API user: "
                                  f"held back until confluence.hidden_space_readers names its readers (e.g. "
                                  f"{key}: [space:{key.lower()}], or [confluence:everyone] to let page restrictions "
                                  "decide)")
        if any(p.get("anonymousAccess") for p in reads):
            return None
        users: list[dict[str, Any]] = []
        groups: list[dict[str, Any]] = []
        for permission in reads:
            subjects = permission.get("subjects") or {}
            users += list(self._all(subjects.get("user")))
            groups += list(self._all(subjects.get("group")))
        # Read permission shown but naming no one: no one reads it (not "no restriction").
        return self._level(users, groups) or Level()

    def members(self, group: str) -> frozenset[str]:
        if group not in self._members:
            people = self.client.results(f"rest/api/group/{group}/member", {"limit": PAGE_SIZE})
            self._members[group] = frozenset(p for p in map(self.user_principal, people) if p)
        return self._members[group]

    def _admits(self, level: Level, user: str) -> bool:
        return user in level.people or any(user in self.members(g) for g in level.groups)

    def readers(self, entry: Listed) -> list[str]:
        """The principals who may read ``entry``; ``[]`` when no one passes every level.
        :raises ReadersUnknown: its space's permissions are hidden and not mapped (or it has no space)."""
        if not entry.space:
            raise ReadersUnknown("the Confluence listing gave no space for it: its space permissions are unknown")
        space = self.space(entry.space)
        found = [level for level in (space, *(self.restriction(c) for c in (*entry.ancestors, entry.page_id)))
                 if level is not None]
        if not found:
            return [PUBLIC]
        # A level every account passes narrows none of the others: all their users and groups are accounts.
        levels = [level for level in found if not level.everyone]
        if not levels:
            return list(self.everyone_readers)
        if len(levels) == 1:
            level = levels[0]
            return sorted(level.people | {f"group:{g}" for g in level.groups} | level.others)
        # A reader must pass every level: a group (or mapped principal) named by all of them passes as
        # such; anyone else is checked one by one (groups expanded to their members).
        common_groups = frozenset.intersection(*(level.groups for level in levels))
        common_others = frozenset.intersection(*(level.others for level in levels))
        candidates = set().union(*(level.people for level in levels))
        for level in levels:
            for group in level.groups - common_groups:
                candidates |= self.members(group)
        people = {u for u in candidates if all(self._admits(level, u) for level in levels)}
        return sorted(people | {f"group:{g}" for g in common_groups} | common_others)
