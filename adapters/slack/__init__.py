"""Slack: mentions, thread follow-ups and DMs in; streamed, cited answers out (``platform``: events, clicks,
commands; ``reply``: its messages and rate tiers; ``text``: blocks and escaping; ``loop``: re-check messages;
``directory``: who may read a channel; ``http``: its webhook checks and call metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.slack.platform import SlackAdapter


def build(runtime: Any, conversations: Any) -> SlackAdapter | None:
    """Slack on ``runtime``'s settings (None when ``SLACK_BOT_TOKEN`` is not set); its directory of
    channels and user groups registered for permissions."""
    s = runtime.settings
    if not s.slack.enabled:
        return None
    # The SDK loads here, for ``kbbot serve``: the registry, which imports this package, is read by every command.
    from adapters.slack.directory import SlackDirectory
    from adapters.slack.platform import SlackAdapter
    from adapters.slack.reply import make_rates

    s.slack.check_serving()
    # With Redis every replica draws from the same rate buckets: Slack limits the app, not a process.
    platform = SlackAdapter(conversations, s.slack, rates=make_rates(s.slack, runtime.redis, s.redis_prefix),
                            reviewers_channel=s.approvals.reviewers_channel,
                            digest_to=s.slack.digest_to or "")
    runtime.audiences.register("slack", SlackDirectory(platform.client, cache_s=s.permissions.cache_s,
                                                       groups=s.permissions.slack_groups))
    return platform
