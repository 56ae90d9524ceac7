"""Settings of the chat platforms: the ``slack:`` and ``telegram:`` sections of ``config/kbbot.yaml`` plus environment.

Tokens and the signing secret come only from the environment (``apply_env`` overwrites whatever
a file said) and are kept out of ``repr``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bot.errors import SettingsError

STREAM_MODES = ("native", "edit")


class _Checked:
    """``problems()`` lists what is wrong, one line each naming the setting; ``validate()`` raises the first."""

    def problems(self, *, serving: bool = True) -> list[str]:
        raise NotImplementedError

    def validate(self, *, serving: bool = True) -> None:
        problems = self.problems(serving=serving)
        if problems:
            raise SettingsError(problems[0])


def _stream_problems(section: str, mode: str, modes: tuple[str, ...], length_name: str, length: int,
                     max_length: int, intervals: Mapping[str, float]) -> list[str]:
    """The checks both platforms' streaming settings share."""
    found = []
    if mode not in modes:
        found.append(f"{section}.stream_mode is {mode!r}; expected one of {', '.join(modes)}")
    if not 1 <= length <= max_length:
        found.append(f"{section}.{length_name} must be between 1 and {max_length}")
    if any(value < 0 for value in intervals.values()):
        found.append(" and ".join(f"{section}.{name}" for name in intervals) + " must not be negative")
    return found


@dataclass
class SlackSettings(_Checked):
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
    #: Emoji name (no colons) put on a question when its status cannot be set at once (the status
    #: tier is spent), removed when the answer is shown; "" never reacts.
    ack_reaction: str = "eyes"
    #: How long a delivered event id is remembered (Slack retries within minutes).
    dedupe_ttl_s: float = 3600
    #: While its turn runs, an event's claim lasts this long and is renewed: a replica that dies
    #: mid-turn frees the event for Slack's next retry (1 and 5 minutes after a missed ack).
    claim_lease_s: float = 30
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
    #: User ids allowed to run ``/kbbot status`` and ``/kbbot refresh [SOURCE]``.
    admins: list[str] = field(default_factory=list)
    #: Who may approve answers (and withdraw approvals): user ids, the same in every workspace, or a
    #: mapping team id -> user ids (one list per workspace).
    reviewers: list[str] | dict[str, list[str]] = field(default_factory=list)
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

    def reviewers_of(self, team: str) -> list[str]:
        if isinstance(self.reviewers, dict):
            return list(self.reviewers.get(team) or [])
        return list(self.reviewers or [])

    def is_reviewer(self, team: str, user: str) -> bool:
        return bool(user) and user in self.reviewers_of(team)

    def apply_env(self, env: Mapping[str, str]) -> SlackSettings:
        self.bot_token = env.get("SLACK_BOT_TOKEN") or None
        self.signing_secret = env.get("SLACK_SIGNING_SECRET") or None
        self.app_token = env.get("SLACK_APP_TOKEN") or None
        if env.get("SLACK_API_URL"):
            self.api_url = env["SLACK_API_URL"]
        self.channel_spaces = {str(k): v for k, v in (self.channel_spaces or {}).items()}
        self.admins = _str_list(self.admins)
        if isinstance(self.reviewers, dict):
            self.reviewers = {str(k): _str_list(v) if isinstance(v, (list, tuple, str)) else v
                              for k, v in self.reviewers.items()}
        elif isinstance(self.reviewers, (list, tuple, str)) or self.reviewers is None:
            self.reviewers = _str_list(self.reviewers)
        return self

    def problems(self, *, serving: bool = True) -> list[str]:
        """What is wrong, one line each, naming the setting (empty when valid).

        ``serving=False`` checks only the file's values: ``kbbot ask`` must not fail because the
        environment holds a Slack token without its signing secret.
        """
        found = _stream_problems("slack", self.stream_mode, STREAM_MODES, "max_message_chars", self.max_message_chars,
                                 12000, {"stream_interval_s": self.stream_interval_s,
                                         "edit_interval_s": self.edit_interval_s})
        if self.buffer_size < 1:
            found.append("slack.buffer_size must be at least 1")
        if not re.fullmatch(r"[a-z0-9_+'-]*", self.ack_reaction or ""):
            found.append(f"slack.ack_reaction must be an emoji name without colons, e.g. eyes, "
                         f"not {self.ack_reaction!r}")
        if not 0 < self.claim_lease_s <= self.dedupe_ttl_s:
            found.append("slack.claim_lease_s must be positive and at most slack.dedupe_ttl_s")
        found += _space_problems("slack", self.default_spaces, self.channel_spaces, "channel_spaces")
        for method, per_minute in self.rate_limits.items():
            if not isinstance(per_minute, (int, float)) or per_minute <= 0:
                found.append(f"slack.rate_limits.{method} must be a positive number of calls per minute")
        if not _user_ids(self.reviewers) and not (
                isinstance(self.reviewers, dict) and all(_user_ids(v) for v in self.reviewers.values())):
            found.append("slack.reviewers must be a list of user ids, or a mapping team id -> list of user ids")
        if not serving:
            return found
        if self.enabled and not self.socket_mode and not self.signing_secret:
            found.append("SLACK_BOT_TOKEN is set but SLACK_SIGNING_SECRET is not (needed for the Events API; "
                         "or set SLACK_APP_TOKEN for Socket Mode)")
        if self.app_token and not self.app_token.startswith("xapp-"):
            found.append("SLACK_APP_TOKEN must be an app-level token (xapp-…)")
        return found


TELEGRAM_STREAM_MODES = ("draft", "edit")
_WEBHOOK_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_BOT_TOKEN = re.compile(r"^\d+:[A-Za-z0-9_-]+$")


@dataclass
class TelegramSettings(_Checked):
    #: draft: sendMessageDraft previews in private chats, then sendMessage; edit: sendMessage +
    #: editMessageText. Groups (and chats that refuse drafts) always use edit.
    stream_mode: str = "draft"
    #: Answer in groups and supergroups (only when mentioned or replied to).
    groups_enabled: bool = False
    #: User ids allowed to ask (private chats and groups); empty = everyone.
    allowed_users: list[str] = field(default_factory=list)
    #: Group chat ids kbbot answers in; empty = every group (when groups_enabled).
    allowed_chats: list[str] = field(default_factory=list)
    #: Chat id -> knowledge spaces searched for questions asked there.
    chat_spaces: dict[str, list[str]] = field(default_factory=dict)
    #: Spaces for chats without a mapping.
    default_spaces: list[str] = field(default_factory=lambda: ["default"])
    #: Edit mode: minimum seconds between two editMessageText of one answer (Telegram: about 1/s per chat).
    edit_interval_s: float = 1.0
    #: Draft mode: minimum seconds between two sendMessageDraft of one answer.
    draft_interval_s: float = 0.5
    #: Longest message in UTF-16 code units after entity parsing (Telegram: 4096); longer answers are split.
    max_message_units: int = 4096
    #: How long a delivered update id is remembered.
    dedupe_ttl_s: float = 86400
    #: 👍/👎 buttons under each answer.
    feedback: bool = True
    #: getUpdates long-polling timeout in seconds.
    polling_timeout_s: int = 30
    #: Bot API server base URL (env TELEGRAM_API_URL), e.g. a self-hosted telegram-bot-api or a test server.
    api_url: str | None = None
    #: Public HTTPS URL of the webhook (env TELEGRAM_WEBHOOK_URL); its path is served by kbbot serve.
    webhook_url: str | None = None
    #: User ids allowed to run ``/status`` and ``/refresh [SOURCE]``.
    admins: list[str] = field(default_factory=list)
    #: User ids who may approve answers (and withdraw approvals) with the buttons under them.
    reviewers: list[str] = field(default_factory=list)
    # Secrets: environment only.
    token: str | None = field(default=None, repr=False)
    webhook_secret: str | None = field(default=None, repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.token)

    @property
    def webhook_mode(self) -> bool:
        return bool(self.webhook_url)

    @property
    def webhook_path(self) -> str:
        return urlsplit(self.webhook_url or "").path or "/telegram/webhook"

    def spaces_for(self, chat_id: str) -> tuple[str, ...]:
        return tuple(self.chat_spaces.get(str(chat_id)) or self.default_spaces)

    def is_reviewer(self, user: str) -> bool:
        return bool(user) and user in self.reviewers

    def apply_env(self, env: Mapping[str, str]) -> TelegramSettings:
        self.token = env.get("TELEGRAM_BOT_TOKEN") or None
        self.webhook_secret = env.get("TELEGRAM_WEBHOOK_SECRET") or None
        if env.get("TELEGRAM_API_URL"):
            self.api_url = env["TELEGRAM_API_URL"]
        if env.get("TELEGRAM_WEBHOOK_URL"):
            self.webhook_url = env["TELEGRAM_WEBHOOK_URL"]
        self.allowed_users = _str_list(self.allowed_users)
        self.allowed_chats = _str_list(self.allowed_chats)
        self.admins = _str_list(self.admins)
        if isinstance(self.reviewers, (list, tuple, str)) or self.reviewers is None:
            self.reviewers = _str_list(self.reviewers)
        self.chat_spaces = {str(k): v for k, v in (self.chat_spaces or {}).items()}
        return self

    def problems(self, *, serving: bool = True) -> list[str]:
        """What is wrong, one line each, naming the setting (empty when valid)."""
        found = _stream_problems("telegram", self.stream_mode, TELEGRAM_STREAM_MODES, "max_message_units",
                                 self.max_message_units, 4096, {"edit_interval_s": self.edit_interval_s,
                                                                 "draft_interval_s": self.draft_interval_s})
        if self.dedupe_ttl_s <= 0:
            found.append("telegram.dedupe_ttl_s must be positive")
        found += _space_problems("telegram", self.default_spaces, self.chat_spaces, "chat_spaces")
        if not 0 <= self.polling_timeout_s <= 50:
            found.append("telegram.polling_timeout_s must be between 0 and 50")
        if not _user_ids(self.reviewers) or not all(str(v).strip().isdigit() for v in self.reviewers):
            found.append("telegram.reviewers must be a list of user ids (numbers)")
        if not serving:
            return found
        if self.token and not _BOT_TOKEN.match(self.token):
            found.append("TELEGRAM_BOT_TOKEN does not look like a bot token (123456:ABC…)")
        if self.webhook_url:
            if not self.webhook_url.startswith("https://"):
                found.append("TELEGRAM_WEBHOOK_URL must be an https:// URL (Telegram only calls HTTPS webhooks)")
            if not self.webhook_secret:
                found.append("TELEGRAM_WEBHOOK_URL is set but TELEGRAM_WEBHOOK_SECRET is not "
                             "(every webhook request is checked against it)")
        if self.webhook_secret and not _WEBHOOK_SECRET.match(self.webhook_secret):
            found.append("TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
        return found


def _space_problems(section: str, default_spaces: Any, mapped: Mapping[str, Any], mapping_name: str) -> list[str]:
    """``default_spaces`` and every mapped list must be a non-empty list of space names: an empty list
    would switch the space filter off (every space searchable) and a plain string would be read as
    one space per character."""
    found = []
    for where, value in [(f"{section}.default_spaces", default_spaces),
                         *((f"{section}.{mapping_name}.{k}", v) for k, v in (mapped or {}).items())]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            found.append(f"{where} must be a non-empty list of knowledge space names, e.g. [default]; got {value!r}")
    return found


def _user_ids(value: Any) -> bool:
    """A list of user ids (strings or numbers), as ``admins`` and ``reviewers`` hold."""
    return isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip()
                                           for v in value)


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in (value or [])]
