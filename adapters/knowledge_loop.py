"""Where the knowledge loop (``bot/knowledge_loop``) reaches reviewers: the ``ReviewerDesk`` of ``kbbot serve``.

A re-checked approval goes to the platform it was approved on: on Slack to ``approvals.reviewers_channel``
when set and every reader there may read what both answers cite, else to the reviewer who approved it (a
DM: ``chat.postMessage`` to the user id); on Telegram to that reviewer while still in ``telegram.reviewers``,
else to every reviewer there who may read it, else to the approver (``RecheckRequest.may_post``). Plain
messages (golden set failures) go to the reviewers channel or every Slack reviewer, and every Telegram
reviewer.
"""

from __future__ import annotations

import logging
from typing import Any

from adapters.slack.platform import SlackAdapter
from adapters.telegram.platform import TelegramAdapter
from bot.knowledge_loop.recheck import RecheckRequest
from bot.types import Inquiry

log = logging.getLogger("kbbot.loop")


def _slack_reviewers(slack: SlackAdapter) -> list[str]:
    reviewers = slack.settings.reviewers
    if isinstance(reviewers, dict):
        return sorted({user for users in reviewers.values() for user in users})
    return list(reviewers)


class ReviewerMessages:
    def __init__(self, adapters: list[Any], settings: Any):
        self.slack = next((a for a in adapters if isinstance(a, SlackAdapter)), None)
        self.telegram = next((a for a in adapters if isinstance(a, TelegramAdapter)), None)
        self.settings = settings

    async def ask_recheck(self, request: RecheckRequest) -> bool:
        tenant = request.tenant.partition(":")[2]
        if request.platform == "slack" and self.slack is not None:
            channel = self.settings.approvals.reviewers_channel
            if channel and not await request.may_post(self._place("slack", tenant, channel, request, private=False)):
                log.info("turn %s: its re-check cites what not every reader of %s may read: sent to its approver",
                         request.turn_id, channel)
                channel = ""
            channel = channel or request.approved_by
            return bool(channel) and await self.slack.post_recheck(channel, request)
        if request.platform == "telegram" and self.telegram is not None:
            reviewers = list(self.telegram.settings.reviewers)
            chats = [request.approved_by] if request.approved_by in reviewers else \
                [r for r in reviewers if await request.may_post(self._place("telegram", tenant, r, request, private=True,
                                                                             user=r))]
            sent = [await self.telegram.post_recheck(chat, request) for chat in chats or [request.approved_by]]
            return any(sent)
        log.warning("turn %s: approved on %s, which this process does not serve", request.turn_id,
                    request.tenant or "?")
        return False

    @staticmethod
    def _place(platform: str, tenant: str, channel: str, request: RecheckRequest, *, private: bool,
               user: str = "") -> Inquiry:
        """A turn-less inquiry standing for a place a re-check could be posted in (its readers decide)."""
        return Inquiry(platform=platform, tenant=tenant, channel=channel, thread_key=f"recheck:{request.turn_id}",
                       user_id=user or request.approved_by, text="", private=private)

    async def tell(self, text: str) -> bool:
        sent = []
        if self.slack is not None:
            channel = self.settings.approvals.reviewers_channel
            for target in [channel] if channel else _slack_reviewers(self.slack):
                sent.append(await self.slack.post_text(target, text))
        if self.telegram is not None:
            for chat in self.telegram.settings.reviewers:
                sent.append(await self.telegram.post_text(chat, text))
        if not sent:
            log.warning("no reviewer to tell (approvals.reviewers_channel, slack.reviewers, telegram.reviewers): %s",
                        text.splitlines()[0] if text else "")
        return any(sent)
