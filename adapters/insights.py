"""Wires the insights into ``kbbot serve``: the admin page and the weekly digest's delivery.

The digest goes out through the platforms (``bot.platform.Platform.send_note`` to each one's ``digest_to``,
the ``digest_to`` of its settings section), inside their rate budgets; owners get their lists on the
platform whose user they are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from adapters.admin import AdminSite
from bot.knowledge.insights.digest import WeeklyDigest
from bot.knowledge.insights.report import report_of
from bot.knowledge.loop.owners import owners_resolver
from bot.knowledge.refresh import schedule_zone
from bot.permissions import Audience
from bot.platform import Platform
from bot.settings.base import reveal
from pipelines.filters import PUBLIC

log = logging.getLogger("kbbot.insights")


def digest_poster(platforms: Iterable[Platform], settings: Any) -> Any:
    """``post(text)`` to every platform's digest destination (``Platform.digest_to``); raises when a
    destination is configured for a platform that is not."""
    served = {p.name for p in platforms}
    for name, section in settings.platform_sections.items():
        if section.digest_to and name not in served:
            raise ValueError(f"{name}.digest_to is set but {name} is not configured")
    destinations = [p for p in platforms if p.digest_to]

    async def post(text: str) -> None:
        for platform in destinations:
            if not await platform.send_note(platform.digest_to, text):
                raise RuntimeError(f"the digest could not be posted on {platform.name}")

    return post


def owner_teller(platforms: Iterable[Platform]) -> Any:
    """``tell(owner, text) -> bool``: a direct message on the platform whose user ``owner`` is."""
    platforms = list(platforms)

    async def tell(owner: str, text: str) -> bool:
        platform = next((p for p in platforms if p.owns(owner)), None)
        return platform is not None and await platform.send_note(owner, text)

    return tell


def make_digest(runtime: Any, platforms: Iterable[Platform], post: Any) -> WeeklyDigest:
    """The weekly digest of a started runtime, posting with ``post``; the gaps of documents with owners
    (``owners:`` of a source) go to those owners through the ``adapters``."""
    i = runtime.settings.insights

    async def build(since: float, until: float) -> dict[str, Any]:
        return await report_of(runtime, since=since, until=until)  # every gap: the owners get theirs

    async def may_read(owner: str, readers: list[str]) -> bool:
        """Whether ``owner`` (who gets the list in private) may read a document of ``readers``."""
        platform = next((p for p in platforms if p.owns(owner)), None)
        if platform is None:
            return False
        principals = await runtime.audiences.principals_of(platform.name, platform.tenant, owner)
        return Audience(private=True, everyone=frozenset({PUBLIC, *(principals or ())})).admits({"readers": readers})

    settings = runtime.settings
    owners = owners_resolver(settings.sources, settings.resolve) if any(s.owners for s in settings.sources) else None
    return WeeklyDigest(str(i.digest.cron or "0 9 * * mon"), schedule_zone(settings), build=build, post=post,
                        claim=runtime.idempotency.claim, top=i.digest.top, admin_url=i.admin_url, owners=owners,
                        tell=owner_teller(platforms), may_read=may_read)


def start_digest(runtime: Any, platforms: Iterable[Platform]) -> WeeklyDigest | None:
    """The weekly digest job, started; None when it is not configured."""
    i = runtime.settings.insights
    sections = runtime.settings.platform_sections.values()
    if not (i.enabled and i.digest.cron and any(s.digest_to for s in sections)):
        return None
    try:
        post = digest_poster(platforms, runtime.settings)
    except ValueError as exc:
        log.error("weekly digest off: %s", exc)
        return None

    digest = make_digest(runtime, platforms, post)
    digest.start()
    return digest


def start_follow_ups(runtime: Any, knowledge: Any, platforms: Iterable[Platform]) -> Any:
    """Gaps answered when the knowledge arrives: the chat platforms post the follow-ups, the refresher of
    ``serve`` (scheduled runs, admins' refreshes) runs them after each run that changed documents. The
    ``GapFollowUps``, or None when turn records are off."""
    follow_ups = runtime.gap_follow_ups()
    if follow_ups is None:
        return None
    for platform in platforms:
        if platform.delivery is not None:
            follow_ups.serve(platform.delivery)
    knowledge.refresher.after_change.append(follow_ups.after_refresh)
    return follow_ups


def mount_admin(app: web.Application, runtime: Any, knowledge: Any) -> Any:
    """The admin page at ``/admin`` when ``KBBOT_ADMIN_TOKEN`` is set; the ``AdminSite`` or None."""
    token = reveal(runtime.settings.insights.admin_token)
    if not token:
        log.info("admin page off: set KBBOT_ADMIN_TOKEN to serve /admin")
        return None
    if runtime.turns is None:
        log.warning("admin page off: turn records are off (insights.enabled: false)")
        return None
    site = AdminSite(runtime, knowledge, token=token)
    site.mount(app)
    return site
