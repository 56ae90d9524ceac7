"""Telegram's settings: the ``telegram:`` section of ``config/kbbot.yaml`` plus environment.

The token and the webhook secret come only from the environment (a file holding one is refused) and
are ``SecretStr``: never in a repr or a log.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, StrictBool, field_validator

from bot.settings.base import Env, Ids, Spaces, reveal
from bot.settings.platforms import PlatformSettings, Seconds, SpacesByChat

_WEBHOOK_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_BOT_TOKEN = re.compile(r"^\d+:[A-Za-z0-9_-]+$")


class TelegramSettings(PlatformSettings):
    """The ``telegram:`` section."""

    SECTION = "telegram"

    #: ``insights.digest.telegram_chat`` was the digest's Telegram chat before ``digest_to``.
    OLDER_KEYS = {"insights.digest.telegram_chat": "digest_to"}

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
