"""Settings of the chat platforms: the ``slack:`` and ``telegram:`` sections of ``config/kbbot.yaml`` plus environment.

Tokens and the signing secret come only from the environment (a file holding one is refused) and
are ``SecretStr``: never in a repr or a log.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, SecretStr, StrictBool, field_validator, model_validator

from bot.errors import SettingsError
from bot.settings.base import Env, Ids, Problem, Section, Spaces, as_ids, reveal

_WEBHOOK_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_BOT_TOKEN = re.compile(r"^\d+:[A-Za-z0-9_-]+$")

Seconds = Annotated[float, Field(ge=0)]


def _keys_as_text(value: Any) -> Any:
    """Chat and channel ids are YAML numbers or strings as keys; the settings look them up as text."""
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


#: Chat or channel id -> the knowledge spaces searched for questions asked there.
SpacesByChat = Annotated[dict[str, Spaces], BeforeValidator(_keys_as_text)]


class _Platform(Section):
    def problems(self) -> list[str]:
        """What the environment got wrong for serving, one line each naming the variable (empty when
        valid). Not checked when the settings load: ``kbbot ask`` must not fail because the
        environment holds a Slack token without its signing secret."""
        raise NotImplementedError

    def check_serving(self) -> None:
        problems = self.problems()
        if problems:
            raise SettingsError(problems[0])


class SlackSettings(_Platform):
    #: native: chat.startStream/appendStream/stopStream; edit: chat.postMessage + chat.update.
    #: native falls back to edit by itself where Slack refuses streaming.
    stream_mode: Literal["native", "edit"] = "native"
    #: Answer un-mentioned messages in threads kbbot already answered in.
    follow_ups: StrictBool = True
    #: Answer direct messages (message.im).
    direct_messages: StrictBool = True
    #: Workspaces (team ids) and channels kbbot answers in; empty = all. DMs are not channels here.
    allowed_teams: Ids = []
    allowed_channels: Ids = []
    #: Channel id -> knowledge spaces searched for questions asked there.
    channel_spaces: SpacesByChat = {}
    #: Spaces for channels without a mapping, and for DMs.
    default_spaces: Spaces = ["default"]
    #: Native streaming: characters gathered before a chat.appendStream (AsyncChatStream buffer_size).
    buffer_size: int = Field(256, ge=1)
    #: Native streaming: minimum seconds between two stream calls of one answer.
    stream_interval_s: Seconds = 1.0
    #: Edit fallback: minimum seconds between two chat.update calls of one answer.
    edit_interval_s: Seconds = 1.2
    #: Longest Markdown text per message (Slack: 12,000 per markdown_text); longer answers are split.
    max_message_chars: int = Field(12000, ge=1, le=12000)
    #: assistant.threads.setStatus text while an answer is being looked up.
    status: str = "Searching the knowledge base…"
    #: Emoji name (no colons) put on a question when its status cannot be set at once (the status
    #: tier is spent), removed when the answer is shown; "" never reacts.
    ack_reaction: str = "eyes"
    #: How long a delivered event id is remembered (Slack retries within minutes).
    dedupe_ttl_s: float = Field(3600, gt=0)
    #: While its turn runs, an event's claim lasts this long and is renewed: a replica that dies
    #: mid-turn frees the event for Slack's next retry (1 and 5 minutes after a missed ack).
    claim_lease_s: float = Field(30, gt=0)
    #: How long this process remembers a thread it answered in (follow-ups; history is the lasting record).
    thread_memory_s: Seconds = 86400
    #: Retries of a 429 inside the Slack client (AsyncRateLimitErrorRetryHandler) before our writer waits.
    retry_429: int = Field(1, ge=0)
    #: Calls per minute per workspace, by Web API method, overriding the built-in tier table.
    rate_limits: dict[str, Annotated[float, Field(gt=0)]] = {}
    #: Feedback buttons under each answer.
    feedback: StrictBool = True
    #: Web API base URL, e.g. an Enterprise proxy or a test server.
    api_url: Annotated[str | None, Env("SLACK_API_URL")] = None
    #: User ids allowed to run ``/kbbot status`` and ``/kbbot refresh [SOURCE]``.
    admins: Ids = []
    #: Who may approve answers (and withdraw approvals): user ids, the same in every workspace, or a
    #: mapping team id -> user ids (one list per workspace).
    reviewers: Ids | dict[str, Ids] = []
    bot_token: Annotated[SecretStr | None, Env("SLACK_BOT_TOKEN", only=True)] = None
    signing_secret: Annotated[SecretStr | None, Env("SLACK_SIGNING_SECRET", only=True)] = None
    app_token: Annotated[SecretStr | None, Env("SLACK_APP_TOKEN", only=True)] = None

    @field_validator("ack_reaction")
    @classmethod
    def _emoji_name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9_+'-]*", value):
            raise ValueError(f"must be an emoji name without colons, e.g. eyes, not {value!r}")
        return value

    @field_validator("reviewers", mode="before")
    @classmethod
    def _reviewers(cls, value: Any) -> Any:
        # One message for both shapes: the union would report each shape's failure separately.
        try:
            if isinstance(value, dict):
                return {str(team): as_ids(users) for team, users in value.items()}
            return as_ids(value)
        except ValueError:
            raise ValueError("must be a list of user ids, or a mapping team id -> list of user ids") from None

    @model_validator(mode="before")
    @classmethod
    def _no_replica_share(cls, value: Any) -> Any:
        # A setting that went away must not be kept in a file believing it still divides the rates.
        if isinstance(value, dict) and "replicas" in value:
            raise Problem("is no longer a setting: replicas share Slack's rate budgets in Redis (REDIS_URL) "
                          "whatever their number; remove it", at=("replicas",))
        return value

    @model_validator(mode="after")
    def _lease_within_dedupe(self) -> SlackSettings:
        if self.claim_lease_s > self.dedupe_ttl_s:
            raise Problem("must be at most slack.dedupe_ttl_s", at=("claim_lease_s",))
        return self

    @property
    def enabled(self) -> bool:
        return self.bot_token is not None

    @property
    def socket_mode(self) -> bool:
        return self.app_token is not None

    def spaces_for(self, channel: str) -> tuple[str, ...]:
        return tuple(self.channel_spaces.get(channel) or self.default_spaces)

    def reviewers_of(self, team: str) -> list[str]:
        if isinstance(self.reviewers, dict):
            return list(self.reviewers.get(team) or [])
        return list(self.reviewers)

    def is_reviewer(self, team: str, user: str) -> bool:
        return bool(user) and user in self.reviewers_of(team)

    def all_reviewers(self) -> list[str]:
        """Every workspace's reviewers."""
        if isinstance(self.reviewers, dict):
            return sorted({user for users in self.reviewers.values() for user in users})
        return list(self.reviewers)

    def problems(self) -> list[str]:
        found = []
        if self.enabled and not self.socket_mode and self.signing_secret is None:
            found.append("SLACK_BOT_TOKEN is set but SLACK_SIGNING_SECRET is not (needed for the Events API; "
                         "or set SLACK_APP_TOKEN for Socket Mode)")
        if self.app_token is not None and not reveal(self.app_token).startswith("xapp-"):
            found.append("SLACK_APP_TOKEN must be an app-level token (xapp-…)")
        return found


class TelegramSettings(_Platform):
    #: draft: sendMessageDraft previews in private chats, then sendMessage; edit: sendMessage +
    #: editMessageText. Groups (and chats that refuse drafts) always use edit.
    stream_mode: Literal["draft", "edit"] = "draft"
    #: Answer in groups and supergroups (only when mentioned or replied to).
    groups_enabled: StrictBool = False
    #: User ids allowed to ask (private chats and groups); empty = everyone.
    allowed_users: Ids = []
    #: Group chat ids kbbot answers in; empty = every group (when groups_enabled).
    allowed_chats: Ids = []
    #: Chat id -> knowledge spaces searched for questions asked there.
    chat_spaces: SpacesByChat = {}
    #: Spaces for chats without a mapping.
    default_spaces: Spaces = ["default"]
    #: Edit mode: minimum seconds between two editMessageText of one answer (Telegram: about 1/s per chat).
    edit_interval_s: Seconds = 1.0
    #: Draft mode: minimum seconds between two sendMessageDraft of one answer.
    draft_interval_s: Seconds = 0.5
    #: A reaction put on a private question as it is taken (next to "typing…", which lasts 5 s and is
    #: renewed only with budget to spare), taken back when the answer is shown; "" never reacts.
    #: Telegram accepts only its reaction emoji (👀 👍 🤔 …).
    ack_reaction: str = Field("", max_length=8)
    #: Longest message in UTF-16 code units after entity parsing (Telegram: 4096); longer answers are split.
    max_message_units: int = Field(4096, ge=1, le=4096)
    #: How long a delivered update id is remembered.
    dedupe_ttl_s: float = Field(86400, gt=0)
    #: While its turn runs, an update's claim lasts this long and is renewed: a process that dies
    #: mid-turn (a replica, or the one long-polling reader restarting before it confirmed the
    #: update) lets the update be answered when it comes again, instead of after ``dedupe_ttl_s``.
    claim_lease_s: float = Field(30, gt=0)
    #: 👍/👎 buttons under each answer.
    feedback: StrictBool = True
    #: getUpdates long-polling timeout in seconds.
    polling_timeout_s: int = Field(30, ge=0, le=50)
    #: Bot API server base URL, e.g. a self-hosted telegram-bot-api or a test server.
    api_url: Annotated[str | None, Env("TELEGRAM_API_URL")] = None
    #: Public HTTPS URL of the webhook; its path is served by kbbot serve.
    webhook_url: Annotated[str | None, Env("TELEGRAM_WEBHOOK_URL")] = None
    #: User ids allowed to run ``/status`` and ``/refresh [SOURCE]``.
    admins: Ids = []
    #: User ids who may approve answers (and withdraw approvals) with the buttons under them.
    reviewers: Ids = []
    token: Annotated[SecretStr | None, Env("TELEGRAM_BOT_TOKEN", only=True)] = None
    webhook_secret: Annotated[SecretStr | None, Env("TELEGRAM_WEBHOOK_SECRET", only=True)] = None

    @field_validator("reviewers")
    @classmethod
    def _numeric_reviewers(cls, value: list[str]) -> list[str]:
        if not all(v.isdigit() for v in value):
            raise ValueError("must be a list of user ids (numbers)")
        return value

    @model_validator(mode="after")
    def _lease_within_dedupe(self) -> TelegramSettings:
        if self.claim_lease_s > self.dedupe_ttl_s:
            raise Problem("must be at most telegram.dedupe_ttl_s", at=("claim_lease_s",))
        return self

    @property
    def enabled(self) -> bool:
        return self.token is not None

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

    def problems(self) -> list[str]:
        found = []
        if self.token is not None and not _BOT_TOKEN.match(reveal(self.token)):
            found.append("TELEGRAM_BOT_TOKEN does not look like a bot token (123456:ABC…)")
        if self.webhook_url:
            if not self.webhook_url.startswith("https://"):
                found.append("TELEGRAM_WEBHOOK_URL must be an https:// URL (Telegram only calls HTTPS webhooks)")
            if self.webhook_secret is None:
                found.append("TELEGRAM_WEBHOOK_URL is set but TELEGRAM_WEBHOOK_SECRET is not "
                             "(every webhook request is checked against it)")
        if self.webhook_secret is not None and not _WEBHOOK_SECRET.match(reveal(self.webhook_secret)):
            found.append("TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z, a-z, 0-9, _ and -")
        return found
