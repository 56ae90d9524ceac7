"""Approved answers: a reviewer marks an answer correct, and the same question gets it at once.

The server, not the button, holds the answer being approved: every final answer that could be
approved is *offered* under its turn id (kept ``pending_ttl_s``), and an approval names only the
turn id, so an old button can never approve different text. The cache key covers the question
(trimmed and case-folded, nothing more: no similarity matching), the knowledge spaces, the
knowledge version, the model and a policy version from config; entries of older knowledge
versions stop matching at once and are purged on the next lookup.

Redis keys (``prefix`` is ``redis_prefix``, default ``kbbot:``):

| key | holds | expiry |
| --- | --- | --- |
| ``{prefix}answers:pending:{turn_id}`` | JSON: cache key fields and the answer | ``pending_ttl_s`` |
| ``{prefix}answers:approved:{version}:{digest}`` | JSON: the approved answer, reviewer, time | purged when the version advances |
| ``{prefix}answers:turn:{turn_id}`` | the approved key of that turn (for withdrawal) | 90 days |
| ``{prefix}answers:purged_below`` | the knowledge version below which entries are gone | none |
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from bot.messages import say
from bot.types import Answer, Citation

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

    @classmethod
    def of(cls, question: str, spaces: list[str] | tuple[str, ...], knowledge_version: int, model: str,
           policy: str) -> CacheKey:
        return cls(normalise_question(question), tuple(sorted(spaces)), knowledge_version, model, policy)

    @property
    def digest(self) -> str:
        payload = json.dumps([self.question, self.spaces, self.model, self.policy], ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()[:32]



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

    def to_answer(self) -> Answer:
        from bot.types import Outcome, Trace

        return Answer(text=self.text, outcome=Outcome.CACHED, citations=[Citation(**c) for c in self.citations],
                      trace=Trace(), approved_turn_id=self.turn_id,
                      approved_by=self.approver_name or self.approved_by, approved_at=self.approved_at)


class AnswerCache(Protocol):
    async def offer(self, turn_id: str, key: CacheKey, answer: Answer) -> None:
        """Keep ``answer`` so that a reviewer may approve turn ``turn_id`` later."""

    async def approve(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        """The offered answer of ``turn_id`` becomes the cached one; None if nothing was offered
        (expired, or a turn that cannot be cached)."""

    async def withdraw(self, turn_id: str) -> bool:
        """Removes the approval of ``turn_id``; False if there was none."""

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None: ...


def _entry(turn_id: str, key: CacheKey, answer: Answer) -> dict[str, Any]:
    return {"key": asdict(key), "answer": {"text": answer.text, "citations": [c.to_dict() for c in answer.citations],
                                           "question": key.question, "knowledge_version": key.knowledge_version,
                                           "turn_id": turn_id}}


class MemoryAnswerCache:
    """In-process cache for embedded defaults (one process)."""

    def __init__(self, pending_ttl_s: float = 7 * 86400):
        self.pending_ttl_s = pending_ttl_s
        self._pending: dict[str, tuple[float, dict[str, Any]]] = {}
        self._approved: dict[tuple[int, str], ApprovedAnswer] = {}
        self._by_turn: dict[str, tuple[int, str]] = {}

    async def offer(self, turn_id: str, key: CacheKey, answer: Answer) -> None:
        now = time.monotonic()
        self._pending = {t: v for t, v in self._pending.items() if v[0] > now}
        self._pending[turn_id] = (now + self.pending_ttl_s, _entry(turn_id, key, answer))

    async def approve(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        held = self._pending.get(turn_id)
        if held is None or held[0] <= time.monotonic():
            return None
        key = CacheKey(**{**held[1]["key"], "spaces": tuple(held[1]["key"]["spaces"])})
        approved = ApprovedAnswer(**held[1]["answer"], approved_by=reviewer, approver_name=name)
        slot = (key.knowledge_version, key.digest)
        self._approved[slot] = approved
        self._by_turn[turn_id] = slot
        return approved

    async def withdraw(self, turn_id: str) -> bool:
        slot = self._by_turn.pop(turn_id, None)
        return slot is not None and self._approved.pop(slot, None) is not None

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None:
        for slot in [s for s in self._approved if s[0] < key.knowledge_version]:
            del self._approved[slot]
        return self._approved.get((key.knowledge_version, key.digest))


class RedisAnswerCache:
    """The cache in Redis, shared by replicas; see the module docstring for the keys."""

    def __init__(self, redis: Any, prefix: str = "kbbot:", pending_ttl_s: float = 7 * 86400):
        self.redis = redis
        self.prefix = prefix
        self.pending_ttl_s = int(pending_ttl_s)

    def _k(self, *parts: object) -> str:
        return self.prefix + "answers:" + ":".join(str(p) for p in parts)

    async def offer(self, turn_id: str, key: CacheKey, answer: Answer) -> None:
        await self.redis.set(self._k("pending", turn_id), json.dumps(_entry(turn_id, key, answer), ensure_ascii=False),
                             ex=self.pending_ttl_s)

    async def approve(self, turn_id: str, reviewer: str, name: str = "") -> ApprovedAnswer | None:
        raw = await self.redis.get(self._k("pending", turn_id))
        if raw is None:
            return None
        held = json.loads(raw)
        key = CacheKey(**{**held["key"], "spaces": tuple(held["key"]["spaces"])})
        approved = ApprovedAnswer(**held["answer"], approved_by=reviewer, approver_name=name)
        slot = self._k("approved", key.knowledge_version, key.digest)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(slot, json.dumps(asdict(approved), ensure_ascii=False))
            pipe.set(self._k("turn", turn_id), slot, ex=90 * 86400)
            await pipe.execute()
        return approved

    async def withdraw(self, turn_id: str) -> bool:
        slot = await self.redis.get(self._k("turn", turn_id))
        if slot is None:
            return False
        removed = await self.redis.delete(slot if isinstance(slot, str) else slot.decode())
        await self.redis.delete(self._k("turn", turn_id))
        return bool(removed)

    async def _purge_below(self, version: int) -> None:
        marker = self._k("purged_below")
        done = int(await self.redis.get(marker) or 0)
        if done >= version:
            return
        stale = []
        async for name in self.redis.scan_iter(match=self._k("approved", "*"), count=500):
            name = name if isinstance(name, str) else name.decode()
            if int(name[len(self._k("approved", "")):].split(":", 1)[0]) < version:
                stale.append(name)
        if stale:
            await self.redis.delete(*stale)
        await self.redis.set(marker, version)

    async def lookup(self, key: CacheKey) -> ApprovedAnswer | None:
        await self._purge_below(key.knowledge_version)
        raw = await self.redis.get(self._k("approved", key.knowledge_version, key.digest))
        return ApprovedAnswer(**json.loads(raw)) if raw is not None else None
