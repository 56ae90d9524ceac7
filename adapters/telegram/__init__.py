"""Telegram: direct messages (and groups that address the bot) in; streamed, cited answers out
(``platform``: updates, clicks, commands; ``reply``: its messages and rate tiers; ``text``: entities;
``loop``: re-check messages; ``session``: its webhook check and the Bot API session's middlewares)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.telegram.platform import TelegramAdapter


def build(runtime: Any, conversations: Any) -> TelegramAdapter | None:
    """Telegram on ``runtime``'s settings (None when ``TELEGRAM_BOT_TOKEN`` is not set)."""
    s = runtime.settings
    if not s.telegram.enabled:
        return None
    # The SDK loads here, for ``kbbot serve``: the registry, which imports this package, is read by every command.
    from adapters.telegram.platform import TelegramAdapter
    from adapters.telegram.reply import make_rates
    from adapters.telegram.session import instrument
    from adapters.workers import Worker

    s.telegram.check_serving()
    platform = TelegramAdapter(conversations, s.telegram, rates=make_rates(s.telegram, runtime.redis, s.redis_prefix),
                               digest_to=s.telegram.digest_to or "", worker=Worker.from_env())
    instrument(platform.bot)
    return platform
