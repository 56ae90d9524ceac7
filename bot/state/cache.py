"""Approved answers: a reviewer marks an answer correct, and the same question gets it at once.

The server, not the button, holds the answer being approved: every final answer that could be
approved is *offered* under its turn id (kept ``pending_ttl_s``), and an approval names only the
turn id, so an old button can never approve different text. The cache key covers the tenant (platform
and workspace: one team's reviewers approve for that team only), the question (trimmed and
case-folded, nothing more: no similarity matching), the knowledge spaces, the model and a policy version
from config. A refresh does not retire approvals wholesale: an approved answer is served only while
every document it cites is still the version it cited (the ``Answerer`` checks), and one whose sources
changed is *held* with a re-run answer until a reviewer keeps the new answer or retires it
(``bot/knowledge/loop/recheck.py``). An approval is refused when it comes from another tenant than the
answer's, or after the knowledge changed since the answer was offered. Withdrawing turn A's approval removes
the entry only while it is still A's (compare-and-delete): a later approval of the same question stays.

Redis keys (``prefix`` is ``redis_prefix``, default ``kbbot:``):

| key | holds | expiry |
| --- | --- | --- |
| ``{prefix}answers:pending:{turn_id}`` | JSON: cache key fields and the answer | ``pending_ttl_s`` |
| ``{prefix}answers:approved:{digest}`` | JSON: the approved answer, reviewer, time, a held re-check | until withdrawn or retired |
| ``{prefix}answers:turn:{turn_id}`` | the approved key of that turn (for withdrawal, keep, retire) | 90 days |
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from bot.messages import say
from bot.permissions import Audience
from bot.types import Answer, Citation, Inquiry, Outcome, Trace

log = logging.getLogger(__name__)

FRESH_PREFIX = "!fresh"


def normalise_question(text: str) -> str:
    return text.strip().casefold()


def wants_fresh(text: str) -> tuple[bool, str]:
    """(bypass the cache, the question without the prefix) for ``!fresh How long ...``."""
    stripped = text.strip()
    if stripped.casefold().startswith(FRESH_PREFIX):
        return True, stripped[len(FRESH_PREFIX):].strip()
    return False, text


@dataclass(frozen=True)
class CacheKey:
    question: str  # normalised
    spaces: tuple[str, ...]
    knowledge_version: int
    model: str
    policy: str
    tenant: str = ""  # "slack:T123", "telegram:<bot id>", "console"
    #: What the asking audience may read (``bot.permissions.Audience.key``): an answer approved for one
    #: audience is served only to the same one.
    audience: str = ""

    @classmethod
    def of(cls, question: str, spaces: list[str] | tuple[str, ...], knowledge_version: int, model: str,
           policy: str, tenant: str = "", audience: str = "") -> CacheKey:
        return cls(normalise_question(question), tuple(sorted(spaces)), knowledge_version, model, policy, tenant,
                   audience)

    @property
    def digest(self) -> str:
        payload = json.dumps([self.question, self.spaces, self.model, self.policy, self.tenant, self.audience],
                             ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]



def tenant_of(inquiry: Inquiry) -> str:
    """Whose cache an inquiry reads: its platform and workspace (Slack team, Telegram bot)."""
    return f"{inquiry.platform}:{inquiry.tenant}" if inquiry.tenant else inquiry.platform


def cached_label(answer: Answer, language: str) -> str:
    """The line above an answer served from the cache: that a reviewer approved it, who and when."""
    who = " ".join(answer.approved_by.split())[:60]
    if not who:
        return say("cached_label", language)
    when = time.strftime("%Y-%m-%d", time.gmtime(answer.approved_at)) if answer.approved_at else "?"
    return say("cached_label_by", language, who=who, date=when)

@dataclass
class ApprovedAnswer:
    text: str
    citations: list[dict[str, Any]]
    question: str
    knowledge_version: int
    turn_id: str
    approved_by: str = ""
    approved_at: float = field(default_factory=time.time)
    #: The reviewer's display name at approval time (shown with the cached answer); "" if unknown.
    approver_name: str = ""
    #: Where it was asked: what a re-check runs it in again.
    spaces: list[str] = field(default_factory=list)
    tenant: str = ""
    asked: str = ""  # the question as written (``question`` is normalised)
    #: A re-check after its sources changed, waiting for a reviewer: {"text", "citations", "outcome",
    #: "knowledge_version", "at"}. While held the answer is not served.
    held: dict[str, Any] | None = None
    #: Who it was written for (``audience_record``): what a re-check answers it for again. None (approvals
    #: kept before it was stored): the public.
    audience: dict[str, Any] | None = None
    #: Who may read its own text, beyond what it cites: an expert's reply is read where it was said
    #: (``bot.knowledge.loop.expert``). None: what it cites decides.
    readers: list[str] | None = None

    def written_for(self) -> Audience:
        """The audience it was approved for; the public's when not kept."""
        a = self.audience
        if not a:
            return Audience.public(private=False)
        return Audience(private=bool(a.get("private")), everyone=frozenset(a.get("everyone") or ()),
                        each=tuple(frozenset(m) for m in a.get("each") or ()), channel=str(a.get("channel") or ""))

    def to_answer(self) -> Answer:
        return Answer(text=self.text, outcome=Outcome.CACHED, citations=[Citation(**c) for c in self.citations],
                      trace=Trace(), approved_turn_id=self.turn_id,
                      approved_by=self.approver_name or self.approved_by, approved_at=self.approved_at)


class AnswerCache(Protocol):
    async def offer(self, turn_id: str, key: CacheKey, answer: Answer, asked: str = "", *,
                    audience: dict[str, Any] | None = None, readers: list[str] | None = None) -> None:
        """Keep ``answer`` so that a reviewer may approve turn ``turn_id`` later (``asked``: the question
        as it was written, which a re-check asks again and shows its reviewer; ``audience``: who it was
        written for, ``audience_record``; ``readers``: see ``ApprovedAnswer.readers``)."""

    async def approve(self, turn_id: str, reviewer: str, name: str = "", tenant: str | None = None
                      ) -> ApprovedAnswer | None:
        """The offered answer of ``turn_id`` becomes the cached one; None if nothing was offered
        (expired, or a turn that cannot be cached), if it was offered in another tenant than
        ``tenant`` (when given), or if the knowledge changed since."""

    async def withdraw(self, turn_id: str) -> bool:
        """Removes the approval of ``turn_id``; False if there was none."""

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None:
        """The approved answer of ``key``'s question; None if none, or if it is held for a re-check."""

    async def entries(self) -> list[ApprovedAnswer]:
        """Every approved answer, held ones too (what a re-check goes through)."""

    async def hold(self, turn_id: str, recheck: dict[str, Any]) -> bool:
        """Holds the approval of ``turn_id`` with a re-check's answer; False if it is gone."""

    async def keep(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        """The held re-check's answer becomes the approved one (by ``reviewer``, now); None if
        nothing of ``turn_id`` is held."""

    async def retire(self, turn_id: str) -> bool:
        """Withdraws the approval of ``turn_id`` while it is held for a re-check; False otherwise (a
        decision already taken stands)."""


def audience_record(audience: Audience) -> dict[str, Any]:
    """``audience`` as an approval keeps it (JSON): what it may read, not who asked."""
    return {"private": audience.private, "everyone": sorted(audience.everyone),
            "each": sorted(sorted(m) for m in set(audience.each)), "channel": audience.channel}


def _kept(entry: ApprovedAnswer, reviewer: str, name: str) -> ApprovedAnswer | None:
    held = entry.held
    if held is None or held.get("outcome") != "answered":
        return None
    return ApprovedAnswer(text=held["text"], citations=held["citations"], question=entry.question,
                          knowledge_version=held["knowledge_version"], turn_id=entry.turn_id, approved_by=reviewer,
                          approver_name=name, spaces=entry.spaces, tenant=entry.tenant, asked=entry.asked,
                          audience=entry.audience, readers=entry.readers)


def _key(held: dict[str, Any]) -> CacheKey:
    return CacheKey(**{**held["key"], "spaces": tuple(held["key"]["spaces"])})


async def _approvable(key: CacheKey, tenant: str | None, knowledge_version: Callable[[], int] | None) -> bool:
    if tenant is not None and key.tenant != tenant:
        log.warning("refused an approval from tenant %s of an answer given in %s", tenant, key.tenant or "?")
        return False
    if knowledge_version is not None and key.knowledge_version < await asyncio.to_thread(knowledge_version):
        log.info("refused an approval of an answer of knowledge version %d: the knowledge changed since",
                 key.knowledge_version)
        return False
    return True


def _entry(turn_id: str, key: CacheKey, answer: Answer, asked: str, audience: dict[str, Any] | None,
           readers: list[str] | None) -> dict[str, Any]:
    return {"key": asdict(key), "answer": {"text": answer.text, "citations": [c.to_dict() for c in answer.citations],
                                           "question": key.question, "knowledge_version": key.knowledge_version,
                                           "turn_id": turn_id, "spaces": list(key.spaces), "tenant": key.tenant,
                                           "asked": asked, "audience": audience, "readers": readers}}


class MemoryAnswerCache:
    """In-process cache for embedded defaults (one process)."""

    def __init__(self, pending_ttl_s: float = 7 * 86400, knowledge_version: Callable[[], int] | None = None):
        self.pending_ttl_s = pending_ttl_s
        self.knowledge_version = knowledge_version
        self._pending: dict[str, tuple[float, dict[str, Any]]] = {}
        self._approved: dict[str, ApprovedAnswer] = {}
        self._by_turn: dict[str, str] = {}

    async def offer(self, turn_id: str, key: CacheKey, answer: Answer, asked: str = "", *,
                    audience: dict[str, Any] | None = None, readers: list[str] | None = None) -> None:
        now = time.monotonic()
        self._pending = {t: v for t, v in self._pending.items() if v[0] > now}
        self._pending[turn_id] = (now + self.pending_ttl_s, _entry(turn_id, key, answer, asked, audience, readers))

    async def approve(self, turn_id: str, reviewer: str, name: str = "", tenant: str | None = None
                      ) -> ApprovedAnswer | None:
        held = self._pending.get(turn_id)
        if held is None or held[0] <= time.monotonic():
            return None
        key = _key(held[1])
        if not await _approvable(key, tenant, self.knowledge_version):
            return None
        approved = ApprovedAnswer(**held[1]["answer"], approved_by=reviewer, approver_name=name)
        slot = key.digest
        self._approved[slot] = approved
        self._by_turn[turn_id] = slot
        return approved

    async def withdraw(self, turn_id: str) -> bool:
        slot = self._by_turn.pop(turn_id, None)
        if slot is None or slot not in self._approved or self._approved[slot].turn_id != turn_id:
            return False  # a later approval of the same question holds the slot now: it stays
        del self._approved[slot]
        return True

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None:
        found = self._approved.get(key.digest)
        return found if found is not None and found.held is None else None

    async def entries(self) -> list[ApprovedAnswer]:
        return list(self._approved.values())

    def _of_turn(self, turn_id: str) -> str | None:
        slot = self._by_turn.get(turn_id)
        return slot if slot is not None and slot in self._approved and self._approved[slot].turn_id == turn_id else None

    async def hold(self, turn_id: str, recheck: dict[str, Any]) -> bool:
        slot = self._of_turn(turn_id)
        if slot is None:
            return False
        self._approved[slot].held = recheck
        return True

    async def keep(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        slot = self._of_turn(turn_id)
        kept = _kept(self._approved[slot], reviewer, name) if slot is not None else None
        if kept is not None:
            self._approved[slot] = kept
        return kept

    async def retire(self, turn_id: str) -> bool:
        slot = self._of_turn(turn_id)
        return slot is not None and self._approved[slot].held is not None and await self.withdraw(turn_id)


class RedisAnswerCache:
    """The cache in Redis, shared by replicas; see the module docstring for the keys."""

    #: Deletes KEYS[1] only while it holds the approval of turn ARGV[1]; KEYS[2] (the turn's pointer) always.
    _COMPARE_AND_DELETE = """
local raw = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[2])
if raw and cjson.decode(raw)['turn_id'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

    def __init__(self, redis: Any, prefix: str = "kbbot:", pending_ttl_s: float = 7 * 86400,
                 knowledge_version: Callable[[], int] | None = None):
        self.redis = redis
        self.prefix = prefix
        self.pending_ttl_s = int(pending_ttl_s)
        self.knowledge_version = knowledge_version

    def _k(self, *parts: object) -> str:
        return self.prefix + "answers:" + ":".join(str(p) for p in parts)

    async def offer(self, turn_id: str, key: CacheKey, answer: Answer, asked: str = "", *,
                    audience: dict[str, Any] | None = None, readers: list[str] | None = None) -> None:
        entry = _entry(turn_id, key, answer, asked, audience, readers)
        await self.redis.set(self._k("pending", turn_id), json.dumps(entry, ensure_ascii=False), ex=self.pending_ttl_s)

    async def approve(self, turn_id: str, reviewer: str, name: str = "", tenant: str | None = None
                      ) -> ApprovedAnswer | None:
        raw = await self.redis.get(self._k("pending", turn_id))
        if raw is None:
            return None
        held = json.loads(raw)
        key = _key(held)
        if not await _approvable(key, tenant, self.knowledge_version):
            return None
        approved = ApprovedAnswer(**held["answer"], approved_by=reviewer, approver_name=name)
        slot = self._k("approved", key.digest)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(slot, json.dumps(asdict(approved), ensure_ascii=False))
            pipe.set(self._k("turn", turn_id), slot, ex=90 * 86400)
            await pipe.execute()
        return approved

    async def withdraw(self, turn_id: str) -> bool:
        slot = await self.redis.get(self._k("turn", turn_id))
        if slot is None:
            return False
        slot = slot if isinstance(slot, str) else slot.decode()
        return bool(await self.redis.eval(self._COMPARE_AND_DELETE, 2, slot, self._k("turn", turn_id), turn_id))

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None:
        raw = await self.redis.get(self._k("approved", key.digest))
        found = ApprovedAnswer(**json.loads(raw)) if raw is not None else None
        return found if found is not None and found.held is None else None

    async def entries(self) -> list[ApprovedAnswer]:
        names = [name async for name in self.redis.scan_iter(match=self._k("approved", "*"), count=500)]
        raws = await self.redis.mget(names) if names else []
        return [ApprovedAnswer(**json.loads(raw)) for raw in raws if raw is not None]

    async def _of_turn(self, turn_id: str) -> tuple[str, ApprovedAnswer] | None:
        slot = await self.redis.get(self._k("turn", turn_id))
        if slot is None:
            return None
        slot = slot if isinstance(slot, str) else slot.decode()
        raw = await self.redis.get(slot)
        entry = ApprovedAnswer(**json.loads(raw)) if raw is not None else None
        return (slot, entry) if entry is not None and entry.turn_id == turn_id else None

    async def hold(self, turn_id: str, recheck: dict[str, Any]) -> bool:
        found = await self._of_turn(turn_id)
        if found is None:
            return False
        slot, entry = found
        entry.held = recheck
        await self.redis.set(slot, json.dumps(asdict(entry), ensure_ascii=False))
        return True

    async def keep(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        found = await self._of_turn(turn_id)
        kept = _kept(found[1], reviewer, name) if found is not None else None
        if found is not None and kept is not None:
            await self.redis.set(found[0], json.dumps(asdict(kept), ensure_ascii=False))
        return kept

    async def retire(self, turn_id: str) -> bool:
        found = await self._of_turn(turn_id)
        return found is not None and found[1].held is not None and await self.withdraw(turn_id)
