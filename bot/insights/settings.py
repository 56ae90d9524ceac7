"""The ``insights:`` settings: how long turn records are kept, how questions are grouped, the digest."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DigestSettings:
    #: Crontab line of the weekly digest (in ``refresh.timezone``); null: no digest. Name the weekday:
    #: APScheduler counts numeric weekdays from Monday = 0, unlike crontab.
    cron: str | None = "0 9 * * mon"
    #: Where it goes: a Slack channel id (the Slack bot must be in it) and/or a Telegram chat id.
    slack_channel: str | None = None
    telegram_chat: str | None = None
    #: Question groups and 👎 answers listed.
    top: int = 5

    @property
    def enabled(self) -> bool:
        return bool(self.cron and (self.slack_channel or self.telegram_chat))


@dataclass
class InsightsSettings:
    #: Keep a record of every turn (question, outcome, answer, trace, feedback, approval).
    enabled: bool = True
    retention_days: float = 90
    #: Store user ids as keyed hashes (``KBBOT_USER_ID_KEY`` is the key) instead of as given.
    hash_user_ids: bool = False
    #: Two not-found questions whose embeddings are at least this similar count as one gap.
    group_similarity: float = 0.9
    #: The admin page's public address (linked from the digest), e.g. https://kbbot.example.com/admin.
    admin_url: str | None = None
    #: How long an admin page login lasts.
    session_hours: float = 12
    digest: DigestSettings = field(default_factory=DigestSettings)
    #: From the environment only: ``KBBOT_ADMIN_TOKEN`` (the admin page is off without it) and
    #: ``KBBOT_USER_ID_KEY``.
    admin_token: str | None = field(default=None, repr=False)
    user_id_key: str | None = field(default=None, repr=False)

    def apply_env(self, env: dict[str, str]) -> None:
        self.admin_token = env.get("KBBOT_ADMIN_TOKEN") or None
        self.user_id_key = env.get("KBBOT_USER_ID_KEY") or None

    def problems(self) -> list[str]:
        out = []
        if self.retention_days <= 0:
            out.append("insights.retention_days must be positive")
        if not 0 < self.group_similarity <= 1:
            out.append("insights.group_similarity must be in (0, 1]")
        if self.session_hours <= 0:
            out.append("insights.session_hours must be positive")
        if self.admin_token is not None and len(self.admin_token) < 16:
            out.append("KBBOT_ADMIN_TOKEN must be at least 16 characters (e.g. `openssl rand -hex 24`)")
        if self.hash_user_ids and not self.user_id_key:
            out.append("insights.hash_user_ids needs KBBOT_USER_ID_KEY (a secret of your own) in the environment")
        if self.digest.top < 1:
            out.append("insights.digest.top must be at least 1")
        if self.digest.cron:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(str(self.digest.cron), timezone="UTC")
            except ValueError as exc:
                out.append(f"insights.digest.cron {self.digest.cron!r} is not a crontab line: {exc}")
        return out
