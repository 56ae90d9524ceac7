"""The weekly digest: the week's top unanswered question groups and 👎 answers, posted to the admins.

An APScheduler cron job (``insights.digest.cron``, in ``refresh.timezone``) builds the report on
the past seven days and hands the text to ``post`` (the adapters send it to a Slack channel and/or
a Telegram chat). With several replicas each runs the job; a claim on the week's key in the shared
``Idempotency`` store lets one of them post it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from bot.knowledge.loop.owners import Owners, owner_text, split_by_owner
from bot.messages import say

log = logging.getLogger("kbbot.digest")

WEEK_S = 7 * 86400


def digest_text(report: dict[str, Any], *, top: int = 5, admin_url: str | None = None, language: str = "en") -> str:
    """Plain text that reads well in Slack and Telegram alike."""
    rate = report["answer_rate"]
    fb = report["feedback"]
    lines = [say("digest_head", language, since=report["since"][:10], until=report["until"][:10]),
             say("digest_counts", language, turns=report["turns"], rate="–" if rate is None else f"{rate * 100:.0f}%",
                 up=fb["up"], down=fb["down"]), ""]
    # A channel's readers see only what was asked where others saw it: a group asked only in direct
    # messages is counted, and its words are not shown (nor the direct messages it came from).
    shown = [g for g in report["gaps"] if g.get("shared_questions")]
    private = len(report["gaps"]) - len(shown)
    gaps = shown[:top]
    sent = report.get("gaps_to_owners") or 0
    lines.append(say("digest_top" if gaps else "digest_no_other" if sent or private else "digest_all_answered",
                     language))
    for i, gap in enumerate(gaps, 1):
        questions = gap["shared_questions"]
        first = gap["representative"] if gap["representative"] in questions else questions[0]
        others = len(questions) - 1
        similar = say("digest_similar", language, count=others) if others > 0 else ""
        lines.append(say("digest_gap", language, number=i, question=first, count=gap["count"], similar=similar,
                         channels=", ".join(gap["shared_channels"])))
    if private:
        lines.append(say("digest_private", language, count=private, s="s" if private != 1 else ""))
    if sent:
        lines.append(say("digest_to_owners", language, count=sent))
    closed = (report.get("gaps_closed") or {}).get("count") or 0
    if closed:
        lines.append(say("digest_closed", language, count=closed, s="s" if closed != 1 else ""))
    disliked = [d for d in report["disliked"] if not d.get("private", True)][:top]
    if disliked:
        lines += ["", say("digest_disliked", language)]
        for item in disliked:
            lines.append(f"• {item['question']} ({item['down']} 👎)")
    bad = [s for s in report.get("sources", []) if s.get("health") not in (None, "ok")]
    if bad:
        lines += ["", say("digest_sources", language, sources=", ".join(f"{s['name']} ({s['health']})" for s in bad))]
    if admin_url:
        lines += ["", say("digest_details", language, url=f"{admin_url.rstrip('/')}/gaps?days=7")]
    return "\n".join(lines)


class WeeklyDigest:
    """``build(since, until) -> report``, ``post(text)``; ``claim(key, ttl_s) -> bool`` (optional).

    With ``owners`` (``bot/knowledge/loop/owners.py``: nearest chunk -> owner ids) and ``tell(owner, text) -> bool``,
    each gap whose nearest document has owners goes to them, one list per owner; the digest keeps the
    gaps nobody owns, and those of an owner who could not be reached."""

    def __init__(self, cron: str, zone: Any, *, build: Callable[[float, float], Awaitable[dict[str, Any]]],
                 post: Callable[[str], Awaitable[None]], claim: Callable[[str, float], Awaitable[bool]] | None = None,
                 top: int = 5, admin_url: str | None = None, clock: Callable[[], float] = time.time,
                 owners: Owners | None = None, tell: Callable[[str, str], Awaitable[bool]] | None = None,
                 may_read: Callable[[str, list[str]], Awaitable[bool]] | None = None):
        self.trigger = CronTrigger.from_crontab(cron, timezone=zone)
        self.scheduler = AsyncIOScheduler(timezone=zone)
        self.build, self.post, self.claim = build, post, claim
        self.top, self.admin_url, self.clock = top, admin_url, clock
        self.owners, self.tell = owners, tell
        #: Whether an owner may read a document of these readers (their principals, ``bot.permissions``):
        #: a restricted one they may not read is named in their list by neither title nor source. None:
        #: no restricted document is named.
        self.may_read = may_read

    async def _readable(self, owner: str, gaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``gaps`` with the nearest passages ``owner`` may not read withheld."""
        out = []
        for gap in gaps:
            nearest = []
            for chunk in gap.get("nearest") or []:
                readers = chunk.get("readers")  # only a restricted passage's record keeps them
                hidden = readers is not None and (self.may_read is None or not await self.may_read(owner, readers))
                nearest.append({"withheld": True} if hidden else chunk)
            out.append({**gap, "nearest": nearest})
        return out

    async def _to_owners(self, report: dict[str, Any]) -> dict[str, Any]:
        """Sends each owner their gaps; the report with the gaps left for the digest."""
        if self.owners is None or self.tell is None or not report["gaps"]:
            return report
        mine, left = split_by_owner(report["gaps"], self.owners)
        undelivered: list[dict[str, Any]] = []
        for owner, gaps in mine.items():
            text = owner_text(await self._readable(owner, gaps), since=report["since"], until=report["until"])
            try:
                delivered = await self.tell(owner, text)
            except Exception:  # noqa: BLE001 - their gaps stay in the digest
                log.exception("the gaps of owner %s could not be sent", owner)
                delivered = False
            log.info("digest: %d gap groups %s owner %s", len(gaps), "sent to" if delivered else "NOT sent to", owner)
            if not delivered:
                undelivered += [g for g in gaps if g not in undelivered]
        kept = [g for g in report["gaps"] if g in left or g in undelivered]
        return {**report, "gaps": kept, "gaps_to_owners": len(report["gaps"]) - len(kept)}

    async def send(self) -> str | None:
        """Builds and posts this week's digest now; its text, or None if another replica sent it."""
        until = self.clock()
        week = datetime.fromtimestamp(until, UTC).strftime("%G-W%V")
        if self.claim is not None and not await self.claim(f"digest:{week}", WEEK_S / 2):
            log.info("digest %s: another replica sends it", week)
            return None
        report = await self._to_owners(await self.build(until - WEEK_S, until))
        text = digest_text(report, top=self.top, admin_url=self.admin_url)
        await self.post(text)
        log.info("digest %s posted (%d turns, %d gap groups)", week, report["turns"], len(report["gaps"]))
        return text

    async def _job(self) -> None:
        try:
            await self.send()
        except Exception:  # noqa: BLE001 - next week's run tries again
            log.exception("the weekly digest failed")

    def start(self) -> None:
        self.scheduler.add_job(self._job, trigger=self.trigger, id="digest", name="weekly digest",
                               max_instances=1, coalesce=True, misfire_grace_time=3600)
        self.scheduler.start()
        log.info("weekly digest: next at %s", self.next_run())

    def next_run(self) -> datetime | None:
        job = self.scheduler.get_job("digest")
        return job.next_run_time if job is not None else None

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
