"""Where the knowledge loop (``bot/knowledge_loop``) reaches reviewers: the ``ReviewerDesk`` of ``kbbot serve``.

A re-checked approval goes to the platform it was approved on: on Slack to ``approvals.reviewers_channel``
when set, else to the reviewer who approved it (a DM: ``chat.postMessage`` to the user id); on Telegram
to that reviewer while still in ``telegram.reviewers``, else to every reviewer there. Plain messages
(golden set failures) go to the reviewers channel or every Slack reviewer, and every Telegram reviewer.
"""

from __future__ import annotations

import logging
from typing import Any

from adapters.slack import SlackAdapter
from adapters.telegram import TelegramAdapter
from bot.knowledge_loop.recheck import RecheckRequest

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
        if request.platform == "slack" and self.slack is not None:
            channel = self.settings.approvals.reviewers_channel or request.approved_by
            return bool(channel) and await self.slack.post_recheck(channel, request)
        if request.platform == "telegram" and self.telegram is not None:
            reviewers = list(self.telegram.settings.reviewers)
            chats = [request.approved_by] if request.approved_by in reviewers else reviewers
            sent = [await self.telegram.post_recheck(chat, request) for chat in chats]
            return any(sent)
        log.warning("turn %s: approved on %s, which this process does not serve", request.turn_id,
                    request.tenant or "?")
        return False

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
