"""Settings of the chat platforms: the ``slack:`` section of ``config/kbbot.yaml`` plus environment.

Tokens and the signing secret come only from the environment (``apply_env`` overwrites whatever
a file said) and are kept out of ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STREAM_MODES = ("native", "edit")


@dataclass
class SlackSettings:
    #: native: chat.startStream/appendStream/stopStream; edit: chat.postMessage + chat.update.
    #: native falls back to edit by itself where Slack refuses streaming.
    stream_mode: str = "native"
    #: Answer un-mentioned messages in threads kbbot already answered in.
    follow_ups: bool = True
    #: Answer direct messages (message.im).
    direct_messages: bool = True
    #: Workspaces (team ids) and channels kbbot answers in; empty = all. DMs are not channels here.
    allowed_teams: list[str] = field(default_factory=list)
    allowed_channels: list[str] = field(default_factory=list)
    #: Channel id -> knowledge spaces searched for questions asked there.
    channel_spaces: dict[str, list[str]] = field(default_factory=dict)
    #: Spaces for channels without a mapping, and for DMs.
    default_spaces: list[str] = field(default_factory=lambda: ["default"])
    #: Native streaming: characters gathered before a chat.appendStream (AsyncChatStream buffer_size).
    buffer_size: int = 256
    #: Native streaming: minimum seconds between two stream calls of one answer.
    stream_interval_s: float = 1.0
    #: Edit fallback: minimum seconds between two chat.update calls of one answer.
    edit_interval_s: float = 1.2
    #: Longest Markdown text per message (Slack: 12,000 per markdown_text); longer answers are split.
    max_message_chars: int = 12000
    #: assistant.threads.setStatus text while an answer is being looked up.
    status: str = "Searching the knowledge base…"
    #: How long a delivered event id is remembered (Slack retries within minutes).
    dedupe_ttl_s: float = 3600
    #: How long this process remembers a thread it answered in (follow-ups; history is the lasting record).
    thread_memory_s: float = 86400
    #: Retries of a 429 inside the Slack client (AsyncRateLimitErrorRetryHandler) before our writer waits.
    retry_429: int = 1
    #: Calls per minute per workspace, by Web API method, overriding the built-in tier table.
    rate_limits: dict[str, float] = field(default_factory=dict)
    #: Feedback buttons under each answer.
    feedback: bool = True
    #: Web API base URL (env SLACK_API_URL), e.g. an Enterprise proxy or a test server.
    api_url: str | None = None
    # Secrets: environment only.
    bot_token: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)
    app_token: str | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.bot_token)

    @property
    def socket_mode(self) -> bool:
        return bool(self.app_token)

    def spaces_for(self, channel: str) -> tuple[str, ...]:
        return tuple(self.channel_spaces.get(channel) or self.default_spaces)

    def apply_env(self, env: Mapping[str, str]) -> SlackSettings:
        self.bot_token = env.get("SLACK_BOT_TOKEN") or None
        self.signing_secret = env.get("SLACK_SIGNING_SECRET") or None
        self.app_token = env.get("SLACK_APP_TOKEN") or None
        if env.get("SLACK_API_URL"):
            self.api_url = env["SLACK_API_URL"]
        self.channel_spaces = {str(k): _str_list(v) for k, v in (self.channel_spaces or {}).items()}
        return self

    def problems(self, *, serving: bool = True) -> list[str]:
        """What is wrong, one line each, naming the setting (empty when valid).

        ``serving=False`` checks only the file's values: ``kbbot ask`` must not fail because the
        environment holds a Slack token without its signing secret.
        """
        found = []
        if self.stream_mode not in STREAM_MODES:
            found.append(f"slack.stream_mode is {self.stream_mode!r}; expected one of {', '.join(STREAM_MODES)}")
        if not 1 <= self.max_message_chars <= 12000:
            found.append("slack.max_message_chars must be between 1 and 12000")
        if self.buffer_size < 1:
            found.append("slack.buffer_size must be at least 1")
        if self.stream_interval_s < 0 or self.edit_interval_s < 0:
            found.append("slack.stream_interval_s and slack.edit_interval_s must not be negative")
        for method, per_minute in self.rate_limits.items():
            if not isinstance(per_minute, (int, float)) or per_minute <= 0:
                found.append(f"slack.rate_limits.{method} must be a positive number of calls per minute")
        if not serving:
            return found
        if self.enabled and not self.socket_mode and not self.signing_secret:
            found.append("SLACK_BOT_TOKEN is set but SLACK_SIGNING_SECRET is not (needed for the Events API; "
                         "or set SLACK_APP_TOKEN for Socket Mode)")
        if self.app_token and not self.app_token.startswith("xapp-"):
            found.append("SLACK_APP_TOKEN must be an app-level token (xapp-…)")
        return found

    def validate(self, *, serving: bool = True) -> None:
        from bot.settings import SettingsError  # here, not at import: bot.settings imports this module

        problems = self.problems(serving=serving)
        if problems:
            raise SettingsError(problems[0])


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in (value or [])]
