"""Wires the insights into ``kbbot serve``: the admin page and the weekly digest's delivery.

The digest goes out through the adapters' own clients: Slack's ``chat.postMessage`` to
``insights.digest.slack_channel``, Telegram's ``sendMessage`` to ``insights.digest.telegram_chat``.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from adapters.admin import AdminSite
from adapters.slack.platform import SlackAdapter
from adapters.telegram.platform import TelegramAdapter
from bot.insights.digest import WeeklyDigest
from bot.insights.report import report_of
from bot.knowledge_loop.owners import owners_resolver
from bot.permissions import Audience
from bot.refresh import schedule_zone
from bot.settings_base import reveal
from bot.streaming import split_message
from pipelines.filters import PUBLIC

log = logging.getLogger("kbbot.insights")

TELEGRAM_MAX_CHARS = 4000


def digest_poster(adapters: list[Any], settings: Any) -> Any:
    """``post(text)`` to every configured digest destination; raises when one is configured but
    its platform is not."""
    d = settings.insights.digest
    slack = next((a for a in adapters if isinstance(a, SlackAdapter)), None)
    telegram = next((a for a in adapters if isinstance(a, TelegramAdapter)), None)
    if d.slack_channel and slack is None:
        raise ValueError("insights.digest.slack_channel is set but Slack is not configured")
    if d.telegram_chat and telegram is None:
        raise ValueError("insights.digest.telegram_chat is set but Telegram is not configured")

    async def post(text: str) -> None:
        if d.slack_channel and slack is not None:
            await slack.client.chat_postMessage(channel=d.slack_channel, text=text, unfurl_links=False)
        if d.telegram_chat and telegram is not None:
            for part in split_message(text, TELEGRAM_MAX_CHARS):
                await telegram.bot.send_message(chat_id=d.telegram_chat, text=part,
                                                disable_web_page_preview=True)

    return post


def owner_teller(adapters: list[Any]) -> Any:
    """``tell(owner, text) -> bool``: a DM on Slack (a ``U…``/``W…`` id), a message on Telegram (a number)."""
    slack = next((a for a in adapters if isinstance(a, SlackAdapter)), None)
    telegram = next((a for a in adapters if isinstance(a, TelegramAdapter)), None)

    async def tell(owner: str, text: str) -> bool:
        if owner.isdigit():
            return telegram is not None and await telegram.post_text(owner, text)
        return slack is not None and await slack.post_text(owner, text)

    return tell


def make_digest(runtime: Any, adapters: list[Any], post: Any) -> WeeklyDigest:
    """The weekly digest of a started runtime, posting with ``post``; the gaps of documents with owners
    (``owners:`` of a source) go to those owners through the ``adapters``."""
    i = runtime.settings.insights

    async def build(since: float, until: float) -> dict[str, Any]:
        return await report_of(runtime, since=since, until=until)  # every gap: the owners get theirs

    async def may_read(owner: str, readers: list[str]) -> bool:
        """Whether ``owner`` (who gets the list in private) may read a document of ``readers``."""
        platform = "telegram" if owner.isdigit() else "slack"
        tenant = next((str(a.bot_id) for a in adapters if isinstance(a, TelegramAdapter)), "") \
            if platform == "telegram" else ""
        principals = await runtime.audiences.principals_of(platform, tenant, owner)
        return Audience(private=True, everyone=frozenset({PUBLIC, *(principals or ())})).admits({"readers": readers})

    settings = runtime.settings
    owners = owners_resolver(settings.sources, settings.resolve) if any(s.owners for s in settings.sources) else None
    return WeeklyDigest(str(i.digest.cron or "0 9 * * mon"), schedule_zone(settings), build=build, post=post,
                        claim=runtime.idempotency.claim, top=i.digest.top, admin_url=i.admin_url, owners=owners,
                        tell=owner_teller(adapters), may_read=may_read)


def start_digest(runtime: Any, adapters: list[Any]) -> WeeklyDigest | None:
    """The weekly digest job, started; None when it is not configured."""
    i = runtime.settings.insights
    if not (i.enabled and i.digest.enabled):
        return None
    try:
        post = digest_poster(adapters, runtime.settings)
    except ValueError as exc:
        log.error("weekly digest off: %s", exc)
        return None

    digest = make_digest(runtime, adapters, post)
    digest.start()
    return digest


def start_follow_ups(runtime: Any, knowledge: Any, adapters: list[Any]) -> Any:
    """Gaps answered when the knowledge arrives: the chat platforms post the follow-ups, the refresher of
    ``serve`` (scheduled runs, admins' refreshes) runs them after each run that changed documents. The
    ``GapFollowUps``, or None when turn records are off."""
    follow_ups = runtime.gap_follow_ups()
    if follow_ups is None:
        return None
    for adapter in adapters:
        if isinstance(adapter, (SlackAdapter, TelegramAdapter)):
            follow_ups.serve(adapter.delivery)
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
