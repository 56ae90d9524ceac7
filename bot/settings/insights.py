"""The ``insights:`` settings: how long turn records are kept, how questions are grouped, the digest."""

from __future__ import annotations

from typing import Annotated

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field, SecretStr, StrictBool, field_validator, model_validator

from bot.settings.base import Env, Problem, Section, reveal


def check_crontab(line: str | None, timezone: str = "UTC") -> str | None:
    """``line`` when APScheduler reads it as a crontab line, else a ``ValueError`` quoting it."""
    if line is not None:
        try:
            CronTrigger.from_crontab(str(line), timezone=timezone)
        except ValueError as exc:
            raise ValueError(f"{line!r} is not a crontab line (minute hour day month weekday): {exc}") from None
    return line


class DigestSettings(Section):
    #: Crontab line of the weekly digest (in ``refresh.timezone``); null: no digest. Name the weekday:
    #: APScheduler counts numeric weekdays from Monday = 0, unlike crontab.
    cron: str | None = "0 9 * * mon"
    # Where it goes is each chat platform's ``digest_to`` (``bot.settings.platforms``).
    #: Question groups and 👎 answers listed.
    top: int = Field(5, ge=1)

    @field_validator("cron")
    @classmethod
    def _crontab(cls, line: str | None) -> str | None:
        return check_crontab(line)


class InsightsSettings(Section):
    #: Keep a record of every turn (question, outcome, answer, trace, feedback, approval).
    enabled: StrictBool = True
    retention_days: float = Field(90, gt=0)
    #: Store user ids as keyed hashes (``KBBOT_USER_ID_KEY`` is the key) instead of as given.
    hash_user_ids: StrictBool = False
    #: Two not-found questions whose embeddings are at least this similar count as one gap.
    group_similarity: float = Field(0.9, gt=0, le=1)
    #: The admin page's public address (linked from the digest), e.g. https://kbbot.example.com/admin.
    admin_url: str | None = None
    #: How long an admin page login lasts.
    session_hours: float = Field(12, gt=0)
    digest: DigestSettings = Field(default_factory=DigestSettings)
    #: After a refresh that adds or changes documents, questions of this many past days that ended
    #: not found or got a 👎 are answered again; those now answered are posted where they were asked.
    #: 0: never.
    reanswer_days: float = Field(14, ge=0)
    #: At most this many follow-ups posted per refresh (the rest wait for the next one).
    reanswer_max_per_refresh: int = Field(20, ge=0)
    #: The source (its ``name`` under ``sources``) an expert's reply is written to when a reviewer clicks
    #: "Add to the knowledge base": a folder source gets a Markdown file, a Confluence source a draft
    #: page. Null: the button is not offered.
    capture_source: str | None = None
    #: The admin page is off without it.
    admin_token: Annotated[SecretStr | None, Env("KBBOT_ADMIN_TOKEN", only=True)] = None
    user_id_key: Annotated[SecretStr | None, Env("KBBOT_USER_ID_KEY", only=True)] = None

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(reveal(token)) < 16:
            raise ValueError("must be at least 16 characters (e.g. `openssl rand -hex 24`)")
        return token

    @model_validator(mode="after")
    def _key_to_hash_with(self) -> InsightsSettings:
        if self.hash_user_ids and self.user_id_key is None:
            raise Problem("needs KBBOT_USER_ID_KEY (a secret of your own) in the environment", at=("hash_user_ids",))
        return self
