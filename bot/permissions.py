"""Who will see an answer, and so which documents it may be built from: the one access rule.

``Audience`` is computed once per inquiry (``Audiences.of``) and gives the retrieval filter
(``Audience.filter``), the key that the answer cache and the history are kept under
(``Audience.key``), and, for a shared audience, the asker's own (``Audience.alone``: what a direct
message would search). Other flows (re-answering gaps, digests, the admin page) call the same two:
``Audiences.of(inquiry)`` and ``Audience.filter()``.

The rule:

- seen only by the asker (a Slack DM or ephemeral reply, a Telegram private chat, an API caller,
  the console): documents the asker may read: public ones and those whose readers hold one of the
  asker's principals;
- seen by others (a channel or group thread): public documents and those whose readers hold the
  channel; and, where only its members can read the channel (``Directory.members``: a private Slack
  channel shared with no other organisation and without guests), those every current member may
  read. A public channel (anyone may open it and read its history), a Slack Connect channel, one
  with a guest, one whose kind or members cannot be read, a Telegram group, or a member kbbot cannot
  map limits the thread to public documents and those granted to the channel.

An asker that cannot be mapped to an identity gets public documents only (``Audience.mapped`` False).
Identities come from the platform (``Directory``: Slack's e-mail, and its user groups as
``slackgroup:<handle>``, source groups only as ``permissions.slack_groups`` maps them; in the adapter) and
from the ``permissions.principals`` settings (``platform:user id`` -> principals, which add to the
platform's; Telegram users and API callers have only these). An asker with ``user:<e-mail>`` also holds
``domain:<the e-mail's domain>`` (``with_domains``: Google Drive files shared with a whole domain).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from haystack import Document

from bot.types import Inquiry
from pipelines.filters import PUBLIC, compile_filter, readers_filter

log = logging.getLogger("kbbot.permissions")

#: How the history and the answer cache mark what an audience saw.
AUDIENCE_META = "audience"
#: How the history marks the documents an answer cited (their ids).
CITED_META = "cited"


@dataclass(frozen=True)
class Audience:
    """Who sees one answer. ``everyone``: principals admitting the whole audience (``public``, the
    channel, and for a private answer the asker's own); ``each``: for a shared answer, every member's
    principals (a document must admit each member). ``asker``: the asker's own principals (None: not
    mapped); ``private``: only the asker sees the answer."""

    private: bool
    everyone: frozenset[str]
    each: tuple[frozenset[str], ...] = ()
    asker: frozenset[str] | None = None
    channel: str = ""

    @classmethod
    def public(cls, *, private: bool = True) -> Audience:
        """Public documents only: no identity known (the default of a turn without ``Audiences``)."""
        return cls(private=private, everyone=frozenset({PUBLIC}))

    @property
    def mapped(self) -> bool:
        return self.asker is not None

    def filter(self, known: Collection[str] | None = None) -> dict[str, Any]:
        """The Haystack filter on ``meta.readers`` applied inside the store's query.

        ``known``: every principal some document's readers name (``KnownPrincipals``). A principal no
        document names can match nothing, so it is left out of the query: a store's cost grows with
        the values it is sent (Weaviate: 1,000 principals x2.6, 100 x1.16; bench.retrieval
        --permissions). Leaving out only ever narrows what matches, so a stale ``known`` hides a new
        document for a moment, never shows one."""
        if known is None:
            return readers_filter(self.everyone, self.each)
        named = frozenset(known) | {PUBLIC}
        return readers_filter(self.everyone & named, [m & named for m in self.each])

    def projected(self, known: Collection[str]) -> Audience:
        """This audience narrowed to the principals some document names (``known``): it reads exactly
        the same documents (``filter(known)`` is its filter), so its ``key`` is what approved answers are
        kept under. Audiences that read the same documents share them: with no restriction anywhere,
        every channel's and every asker's is the public's, as before permissions existed."""
        named = frozenset(known) | {PUBLIC}
        each = {frozenset(m & named) for m in self.each}
        # A member who may read nothing named limits the audience to ``everyone`` (``readers_filter``):
        # such an ``each`` matches what none does, and is written as none.
        canonical = () if frozenset() in each else tuple(sorted(each, key=sorted))
        return Audience(private=self.private, everyone=self.everyone & named, each=canonical, asker=self.asker,
                        channel=self.channel)

    @cached_property
    def _matches(self) -> Callable[[Document], bool]:
        return compile_filter(self.filter())

    def admits(self, meta: dict[str, Any]) -> bool:
        """Whether a chunk (its meta) may be shown to this audience: the same rule as ``filter``."""
        return self._matches(Document(content="", meta=meta))

    @property
    def key(self) -> str:
        """A short, stable name of what this audience may read: answers and history are kept apart by it."""
        payload = json.dumps([sorted(self.everyone), sorted(sorted(s) for s in set(self.each))])
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def alone(self) -> Audience | None:
        """The asker's own audience (what a direct message would search), for a shared audience of a
        mapped asker whose own reaches further; else None."""
        if self.private or self.asker is None:
            return None
        own = Audience(private=True, everyone=frozenset({PUBLIC, *self.asker}), asker=self.asker)
        return own if own.key != self.key else None


class KnownPrincipals:
    """Every principal the documents' readers name, read from the store's records again when the
    knowledge version moves (a permissions refresh moves it too)."""

    def __init__(self, store: Any):
        self.store = store
        self._version: int | None = None
        self._known: frozenset[str] = frozenset()

    def __call__(self) -> frozenset[str]:
        version = self.store.knowledge_version
        if version != self._version:
            self._known = frozenset(p for record in self.store.records().values() for p in record.readers)
            self._version = version
        return self._known


class Directory(Protocol):
    """What a platform tells of identities (``adapters``: Slack's users.info, user groups and members)."""

    async def principals(self, tenant: str, user: str) -> frozenset[str] | None:
        """The user's principals (``user:<e-mail>``, ``slackgroup:<handle>``, the source groups a Slack group
        is mapped to); None: the user cannot be mapped."""
        ...

    async def members(self, tenant: str, channel: str) -> list[str] | None:
        """The channel's current human members, when they are the only people who can read it (a private
        channel shared with no other organisation, without guests); None otherwise, or when the platform
        cannot tell: the channel then reads public documents and those granted to it."""
        ...


class Audiences:
    """Computes the ``Audience`` of an inquiry (see the module docstring). Nothing is cached here: a
    directory remembers what its platform told (Slack's for ``permissions.cache_s``), once, so a
    change there (a member who left, a group change) counts after at most that long, not twice it."""

    def __init__(self, directories: Mapping[str, Directory] | None = None,
                 principals: Mapping[str, Collection[str]] | None = None, *, max_members: int = 500):
        self.directories = dict(directories or {})
        self.principals_map = {k: frozenset(v) for k, v in (principals or {}).items()}
        self.max_members = max_members

    def register(self, platform: str, directory: Directory) -> None:
        self.directories[platform] = directory

    async def principals_of(self, platform: str, tenant: str, user: str) -> frozenset[str] | None:
        """The user's principals: the platform's (if it has a directory) and the settings' map
        (``platform:user``; for API callers ``api:<caller>``). None: neither knows the user."""
        from_map = self.principals_map.get(f"{platform}:{user}")
        directory = self.directories.get(platform)
        found: frozenset[str] | None = None
        if directory is not None:
            try:
                found = await directory.principals(tenant, user)
            except Exception as exc:  # noqa: BLE001 - an unknown identity reads public documents only
                log.warning("cannot read the identity of %s user %s (%s): public documents only", platform, user,
                            type(exc).__name__)
        if found is None and from_map is None:
            return None
        return with_domains(frozenset(found or ()) | (from_map or frozenset()))

    def maps(self, platform: str) -> bool:
        """Whether identities of ``platform`` are mapped at all (a directory, or settings naming its
        users): only then is an asker who is not mapped worth telling."""
        return platform in self.directories or any(k.startswith(f"{platform}:") for k in self.principals_map)

    async def _members(self, inquiry: Inquiry) -> list[str] | None:
        directory = self.directories.get(inquiry.platform)
        if directory is None:
            return None
        try:
            return await directory.members(inquiry.tenant, inquiry.channel)
        except Exception as exc:  # noqa: BLE001 - unknown members: the thread reads public documents only
            log.warning("cannot list the members of %s channel %s (%s): public documents only", inquiry.platform,
                        inquiry.channel, type(exc).__name__)
            return None

    async def of(self, inquiry: Inquiry, known: Collection[str] | None = None) -> Audience:
        """``known``: every principal some document names (``KnownPrincipals``), when the caller has it."""
        user = inquiry.tenant if inquiry.platform == "api" else inquiry.user_id  # an API caller is its token
        asker = await self.principals_of(inquiry.platform, inquiry.tenant, user)
        if inquiry.private:
            return Audience(private=True, everyone=frozenset({PUBLIC, *(asker or ())}), asker=asker)
        channel = f"channel:{inquiry.channel}".lower()
        everyone = frozenset({PUBLIC, channel})
        if known is not None and all(p == PUBLIC or p.startswith("channel:") for p in known):
            # No document names a person or a group: the members could read only what the channel reads,
            # the same documents (and the same approvals, ``projected``), so they are not looked up: in a
            # channel of hundreds that is as many users.info calls before the first answer.
            return Audience(private=False, everyone=everyone, each=(frozenset(),), asker=asker, channel=channel)
        members = await self._members(inquiry)
        if not members or len(members) > self.max_members:
            # Readable beyond its members, unknown, or too many to check one by one: what the whole
            # channel may read.
            return Audience(private=False, everyone=everyone, each=(frozenset(),), asker=asker,
                            channel=channel)
        each = await asyncio.gather(*(self.principals_of(inquiry.platform, inquiry.tenant, m) for m in members))
        return Audience(private=False, everyone=everyone, each=tuple(p or frozenset() for p in each), asker=asker,
                        channel=channel)


def with_domains(principals: frozenset[str]) -> frozenset[str]:
    """``principals`` and, for each ``user:<e-mail>``, ``domain:<its domain>``: a document shared with a
    whole Google Workspace domain reads as that domain's people. The e-mail is one the platform checked
    (Slack's, Teams') or the operator wrote in ``permissions.principals``, never one an asker typed."""
    domains = {f"domain:{p.rsplit('@', 1)[1]}" for p in principals
               if p.startswith("user:") and p.count("@") == 1 and p.rsplit("@", 1)[1]}
    return principals | domains if domains else principals


def audience_meta(audience: Audience) -> dict[str, str]:
    return {AUDIENCE_META: audience.key}


def cited_in(messages: Iterable[Any]) -> set[str]:
    """The documents the answers among ``messages`` cite (``CITED_META``)."""
    return {str(d) for m in messages for d in (m.meta or {}).get(CITED_META) or ()}


def visible_history(messages: Iterable[Any], audience: Audience,
                    readable: Callable[[str], bool] | None = None) -> list[Any]:
    """The thread's turns written for this same audience: an answer written for other readers (a DM's,
    or a channel's before someone joined) may hold what this audience may not read. With ``readable``
    (whether the audience may read a document now), also only turns whose answer cites nothing it may no
    longer read (a grant withdrawn since), nor leaves unsaid what it cited (written before that was kept)."""
    turns: list[list[Any]] = []
    for message in messages:
        if (message.meta or {}).get(AUDIENCE_META) != audience.key:
            continue
        if message.role.value == "user":
            turns.append([message])
        elif turns:  # an answer whose question was dropped is dropped with it
            turns[-1].append(message)

    def still_readable(turn: list[Any]) -> bool:
        answers = [m.meta or {} for m in turn if m.role.value != "user"]
        return all(CITED_META in a and all(readable(str(d)) for d in a[CITED_META]) for a in answers)

    return [m for turn in turns if readable is None or still_readable(turn) for m in turn]


@dataclass
class UnmappedNotice:
    """Tells an asker who cannot be mapped, once (per ``ttl_s``), that they get public documents only."""

    claim: Any  # async (key, ttl_s) -> bool: True the first time (``bot.state.Idempotency.claim``)
    ttl_s: float = 30 * 86400
    told: set[str] = field(default_factory=set)

    async def first_time(self, inquiry: Inquiry) -> bool:
        key = f"permissions:unmapped:{inquiry.platform}:{inquiry.tenant}:{inquiry.user_id}"
        try:
            return bool(await self.claim(key, self.ttl_s))
        except Exception:  # noqa: BLE001 - the state store is out: tell this process's askers once
            if key in self.told:
                return False
            self.told.add(key)
            return True
