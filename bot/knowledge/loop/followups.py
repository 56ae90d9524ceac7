"""Gaps answered when the knowledge arrives.

A ``Refresher.after_change`` hook: after a run that added or changed documents, the turn records of the
last ``insights.reanswer_days`` that ended ``not_found`` or got a 👎, asked in the space the run refreshed,
are answered again by ``Answerer.rerun`` (the same pipeline and checks: answerability, each sentence's
support; nothing shown, nothing kept). One that is now answered, citing a document this run added or
changed, is posted once where it was asked, through its platform's delivery layer (the final answer's
rendering and rate budgets), under a first line saying the knowledge base now covers it.

Once only, whichever replica refreshes: before posting, the turn's record is claimed (``TurnLog
.claim_follow_up``: HSETNX on Redis); a post that fails gives the claim back, so the next refresh tries
again; a claim left by a replica that died while posting stays (a missed follow-up rather than two).

Not re-asked: questions of askers who muted follow-ups (``prefs followups off [here]``), records without
a place to post to (console and HTTP API turns, records made with hashed user ids, older records without
their spaces), and questions of another space. At most ``insights.reanswer_max_per_refresh`` are posted
per run, and at most five times that many answered again (each costs model calls).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from haystack.dataclasses import ChatMessage

from bot.knowledge.refresh import RefreshChanges
from bot.messages import say
from bot.permissions import Audience
from bot.state.history import HistoryStore
from bot.state.preferences import PreferenceStore
from bot.state.turn_log.records import TurnRecord
from bot.state.turn_log.store import TurnLog
from bot.types import Answer, Inquiry, Outcome
from pipelines.text import detect_language

log = logging.getLogger("kbbot.followups")

#: Answered again per refresh, as a multiple of the posts allowed: the rest wait for the next refresh.
REHEARSALS_PER_POST = 5


class Poster(Protocol):
    """A chat platform's delivery layer (``bot.delivery.Delivery``) as the follow-ups use it."""

    name: str

    async def post_answer(self, target: dict[str, Any], answer: Answer) -> Any: ...


class Reruns(Protocol):
    """``bot.turn.answering.Answerer`` as the follow-ups use it."""

    async def audience(self, inquiry: Inquiry) -> Audience: ...

    async def rerun(self, question: str, inquiry: Inquiry, audience: Audience | None = None) -> Answer: ...


@dataclass
class FollowUp:
    """One question a refresh answered, and what became of it."""

    turn_id: str
    platform: str
    channel: str
    question: str
    posted: bool
    why: str = ""  # when not posted: muted, not answered, cites nothing new, claimed, failed


def wanted(record: TurnRecord) -> bool:
    """A question worth answering again: not found, or answered and disliked."""
    return record.outcome == "not_found" or record.downs > 0


class GapFollowUps:
    def __init__(self, answerer: Reruns, turns: TurnLog, history: HistoryStore, *,
                 preferences: PreferenceStore | None = None, days: float = 14, max_per_refresh: int = 20,
                 clock: Callable[[], float] = time.time):
        self.answerer = answerer
        self.turns = turns
        self.history = history
        self.preferences = preferences
        self.days = days
        self.max_per_refresh = max_per_refresh
        self.clock = clock
        self.posters: dict[str, Poster] = {}

    def serve(self, poster: Poster) -> None:
        """Post follow-ups of ``poster``'s platform (the composition root registers each chat platform's)."""
        self.posters[poster.name] = poster

    async def after_refresh(self, changes: RefreshChanges) -> list[FollowUp]:
        """The ``Refresher.after_change`` hook (see the module)."""
        fresh = changes.new_or_changed
        if not fresh or self.days <= 0 or self.max_per_refresh <= 0 or not self.posters:
            return []
        now = self.clock()
        records = await self.turns.window(now - self.days * 86400, now)
        groups = self._candidates(records, changes.space)
        done: list[FollowUp] = []
        posted = rehearsed = 0
        for newest, same in groups:
            if posted >= self.max_per_refresh or rehearsed >= self.max_per_refresh * REHEARSALS_PER_POST:
                log.info("refresh of %s: %d follow-ups posted, the rest wait for the next refresh", changes.source,
                         posted)
                break
            if await self._muted(newest):
                done.append(self._outcome(newest, False, "muted"))
                continue
            rehearsed += 1
            result = await self._follow_up(newest, same, changes, fresh, now)
            done.append(result)
            posted += result.posted
        if done:
            log.info("refresh of %s: %d of %d questions answered again were posted", changes.source, posted,
                     len(done))
        return done

    def _candidates(self, records: list[TurnRecord], space: str) -> list[tuple[TurnRecord, list[TurnRecord]]]:
        """Questions to answer again, oldest first: one per thread and question (its newest record), with
        the other records of the same question in that thread (closed by the same post)."""
        groups: dict[tuple[str, str], list[TurnRecord]] = {}
        for r in sorted(records, key=lambda r: r.at, reverse=True):
            if not wanted(r) or r.follow_up is not None or not r.reply_to or not r.spaces:
                continue
            if space not in r.spaces or r.platform not in self.posters:
                continue
            groups.setdefault((r.thread_key, " ".join(r.question.casefold().split())), []).append(r)
        ordered = sorted(groups.values(), key=lambda rs: rs[-1].at)
        return [(rs[0], rs[1:]) for rs in ordered]

    async def _muted(self, record: TurnRecord) -> bool:
        if self.preferences is None:
            return False
        try:
            prefs = await self.preferences.load(record.platform, record.tenant, record.user)
        except Exception:  # noqa: BLE001 - unsure whether the asker wants it: not posted this time
            log.exception("turn %s: could not read the asker's preferences; no follow-up this time", record.turn_id)
            return True
        return not prefs.wants_follow_ups(record.channel)

    @staticmethod
    def _outcome(record: TurnRecord, posted: bool, why: str = "") -> FollowUp:
        return FollowUp(record.turn_id, record.platform, record.channel, record.question, posted, why)

    async def _follow_up(self, record: TurnRecord, same: list[TurnRecord], changes: RefreshChanges,
                         fresh: frozenset[str], now: float) -> FollowUp:
        try:
            # Asked again as where it was first asked: the same spaces, and only what the readers there may
            # read (the thread's, as a channel's audience: never more than the question's own turn).
            inquiry = Inquiry(record.platform, record.tenant, record.channel, record.thread_key, record.user,
                              record.question, spaces=tuple(record.spaces))
            answer = await self.answerer.rerun(record.question, inquiry, await self.answerer.audience(inquiry))
        except Exception as exc:  # noqa: BLE001 - one question's failure; the next refresh tries it again
            log.warning("turn %s: answering it again failed (%s: %s)", record.turn_id, type(exc).__name__, exc)
            return self._outcome(record, False, "failed")
        if answer.outcome is not Outcome.ANSWERED:
            return self._outcome(record, False, "not answered")
        new = [c for c in answer.citations if c.source in fresh]
        if not new:  # answered as before: nothing the refresh brought
            return self._outcome(record, False, "cites nothing new")
        claim = {"state": "posting", "at": now, "refresh": changes.source}
        if not await self.turns.claim_follow_up(record.turn_id, claim):
            return self._outcome(record, False, "claimed")
        poster = self.posters[record.platform]
        language = detect_language(record.question)
        when = datetime.fromtimestamp(record.at, UTC).strftime("%Y-%m-%d")
        answer.text = f"{say('gap_closed', language, date=when, question=record.question)}\n\n{answer.text}"
        try:
            await poster.post_answer(dict(record.reply_to or {}), answer)
        except Exception as exc:  # noqa: BLE001 - given back: the next refresh tries again
            log.warning("turn %s: the follow-up could not be posted in %s (%s: %s)", record.turn_id,
                        record.thread_key, type(exc).__name__, exc)
            await self.turns.set_follow_up(record.turn_id, None)
            return self._outcome(record, False, "failed")
        closed = {"state": "posted", "at": self.clock(), "refresh": changes.source,
                  "knowledge_version": changes.knowledge_version, "answer_turn": answer.trace.turn_id,
                  "citations": [c.to_dict() for c in answer.citations]}
        await self.turns.set_follow_up(record.turn_id, closed)
        for other in same:
            await self.turns.claim_follow_up(other.turn_id, {**closed, "same_as": record.turn_id})
        try:  # the thread goes on from the answer it now shows
            await self.history.append(record.thread_key, [ChatMessage.from_user(record.question),
                                                          ChatMessage.from_assistant(answer.text,
                                                                                     meta={"outcome": "answered"})])
        except Exception:  # noqa: BLE001 - the answer is posted; only its place in the history is missing
            log.exception("turn %s: the follow-up is not in the thread's history", record.turn_id)
        log.info("turn %s: gap closed by the refresh of %s; follow-up posted in %s (cites %s)", record.turn_id,
                 changes.source, record.thread_key, ", ".join(sorted({c.source for c in new})))
        return self._outcome(record, True)
