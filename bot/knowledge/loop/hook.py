"""``KnowledgeLoop.after_refresh(changes)``: what runs after a refresh that changed documents.

The refresher calls it once per run (``Refresher.after_change``); a failure here is logged and never
fails the refresh, which has already published its knowledge.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from bot.knowledge.loop.golden import GoldenError, GoldenReplay, GoldenResults, Rerun, load_golden, replay
from bot.knowledge.loop.recheck import ApprovalRecheck, RecheckRequest, ReviewerDesk
from bot.knowledge.refresh import RefreshChanges
from bot.messages import say

log = logging.getLogger("kbbot.loop")


class KnowledgeLoop:
    def __init__(self, rerun: Rerun, results: GoldenResults, *, recheck: ApprovalRecheck | None,
                 golden_file: Path | None, default_space: str = "default", desk: ReviewerDesk | None = None,
                 knowledge_version: Callable[[], int] | None = None):
        self.rerun = rerun
        self.results = results
        self.recheck = recheck
        self.golden_file = golden_file
        self.default_space = default_space
        self.desk = desk
        self.knowledge_version = knowledge_version

    async def after_refresh(self, changes: RefreshChanges) -> None:
        if not changes.any:
            return
        try:
            if self.recheck is not None:
                await self.recheck.run(changes)
        except Exception:  # noqa: BLE001 - the refresh is done; the next one re-checks again
            log.exception("re-checking approved answers after the refresh of %s failed", changes.source)
        try:
            await self.replay_golden(changes.knowledge_version)
        except Exception:  # noqa: BLE001 - as above
            log.exception("replaying the golden set after the refresh of %s failed", changes.source)

    async def replay_golden(self, knowledge_version: int = 0) -> GoldenReplay | None:
        """Replays the golden set now, keeps the result and tells the reviewers of failures; None
        without a golden file."""
        if self.golden_file is None:
            return None
        try:
            cases = load_golden(self.golden_file)
        except GoldenError as exc:
            result = GoldenReplay(0, 0, 1, [{"question": "(the golden file)", "why": str(exc)}], knowledge_version)
            cases = None
        if cases == []:
            return None
        if cases is not None:
            result = await replay(cases, self.rerun, default_space=self.default_space,
                                  knowledge_version=knowledge_version)
        result.at = result.at or time.time()
        previous = await self.results.last()
        await self.results.save(result)
        log.info("golden set: %d passed, %d failed", result.passed, result.failed)
        # Reviewers hear of failures when they change, not again after every refresh that keeps them.
        if result.failed and self.desk is not None and (previous is None or previous.failures != result.failures):
            await self.desk.tell(say("golden_alert", "en", summary=result.summary()))  # reviewers: no one language
        return result


__all__ = ["KnowledgeLoop", "RecheckRequest"]
