"""Slack's settings: the ``slack:`` section of ``config/kbbot.yaml`` plus environment.

The tokens and the signing secret come only from the environment (a file holding one is refused) and
are ``SecretStr``: never in a repr or a log.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, StrictBool, field_validator, model_validator

from bot.settings.base import Env, Ids, Problem, Spaces, as_ids, reveal
from bot.settings.platforms import PlatformSettings, Seconds, SpacesByChat


class SlackSettings(PlatformSettings):
    """The ``slack:`` section."""

    SECTION = "slack"

    #: ``insights.digest.slack_channel`` was the digest's Slack channel before ``digest_to``.
    OLDER_KEYS = {"insights.digest.slack_channel": "digest_to"}

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
    #: Slack retries an event within minutes: its ids are remembered for an hour.
    dedupe_ttl_s: float = Field(3600, gt=0)
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
