"""Where the knowledge loop reaches reviewers: the ``ReviewerDesk`` of ``kbbot serve``, over the platform registry.

A re-checked approval goes to the platform it was approved on (``RecheckRequest.tenant``): to that
platform's reviewers' channel when it has one and every reader there may read what both answers cite,
else to the reviewer who approved it while still a reviewer there, else to every reviewer there who may
read it, else to the approver (``RecheckRequest.may_post``: whoever approved it read it). Plain messages
(golden set failures) go to each platform's reviewers' channel, else to each of its reviewers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from bot.knowledge_loop.recheck import RecheckRequest
from bot.platform import Platform
from bot.types import Inquiry

log = logging.getLogger("kbbot.loop")


class ReviewerMessages:
    def __init__(self, platforms: Iterable[Platform]):
        self.platforms = {platform.name: platform for platform in platforms}

    async def ask_recheck(self, request: RecheckRequest) -> bool:
        platform = self.platforms.get(request.platform)
        if platform is None:
            log.warning("turn %s: approved on %s, which this process does not serve", request.turn_id,
                        request.tenant or "?")
            return False
        return any([await platform.post_recheck(to, request) for to in await self._places(platform, request)])

    async def _places(self, platform: Platform, request: RecheckRequest) -> list[str]:
        tenant = request.tenant.partition(":")[2]
        approver, reviewers = request.approved_by, platform.reviewers
        if reviewers.place:
            if await request.may_post(_place(platform.name, tenant, reviewers.place, request, private=False)):
                return [reviewers.place]
            log.info("turn %s: its re-check cites what not every reader of %s may read: sent to its approver",
                     request.turn_id, reviewers.place)
            return [approver] if approver else []
        if approver in reviewers.users:
            return [approver]
        readable = [r for r in reviewers.users
                    if await request.may_post(_place(platform.name, tenant, r, request, private=True, user=r))]
        return readable or ([approver] if approver else [])

    async def tell(self, text: str) -> bool:
        sent = []
        for platform in self.platforms.values():
            places = [platform.reviewers.place] if platform.reviewers.place else platform.reviewers.users
            sent += [await platform.send_note(to, text) for to in places]
        if not sent:
            log.warning("no reviewer to tell (approvals.reviewers_channel, slack.reviewers, telegram.reviewers): %s",
                        text.splitlines()[0] if text else "")
        return any(sent)


def _place(platform: str, tenant: str, channel: str, request: RecheckRequest, *, private: bool,
           user: str = "") -> Inquiry:
    """A turn-less inquiry standing for a place a re-check could be posted in (its readers decide)."""
    return Inquiry(platform=platform, tenant=tenant, channel=channel, thread_key=f"recheck:{request.turn_id}",
                   user_id=user or request.approved_by, text="", private=private)
