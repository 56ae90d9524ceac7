"""When a source is due: interval or cron arithmetic in the refresh time zone, from its last run's start."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import tzlocal
from apscheduler.triggers.cron import CronTrigger

from bot.settings import Settings, SourceSettings

#: Clock skew between replicas tolerated when deciding whether a run is still due.
DUE_TOLERANCE_S = 30.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z") if moment else None


def parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def schedule_zone(settings: Settings) -> Any:
    return ZoneInfo(settings.refresh.timezone) if settings.refresh.timezone else tzlocal.get_localzone()


def _cron_after(source: SourceSettings, moment: datetime, zone: Any) -> datetime:
    trigger = CronTrigger.from_crontab(str(source.cron), timezone=zone)
    fire = trigger.get_next_fire_time(None, moment.astimezone(zone) + timedelta(seconds=1))
    return fire.astimezone(UTC)


def permissions_run_name(source: str) -> str:
    """The run log's name for the permissions-only runs of ``source`` (their own schedule and record;
    a source name holds no ``/``, so it names no source)."""
    return f"{source}/permissions"


def _every_s(source: SourceSettings, permissions: bool) -> float | None:
    return source.permissions_interval_s if permissions else source.interval_s


def next_due(source: SourceSettings, last_started: datetime | None, zone: Any, now: datetime | None = None,
             *, permissions: bool = False) -> datetime:
    """When ``source`` should run next: at once if it never ran, else one interval (or the next cron
    time) after its last run started, whichever replica or command ran it. May be in the past (overdue).
    ``permissions``: its permissions-only run, one ``permissions_interval`` after the last run that read
    them (either kind)."""
    now = now or utcnow()
    if last_started is None:
        return now
    if permissions or source.interval:
        return last_started + timedelta(seconds=_every_s(source, permissions) or 0)
    return _cron_after(source, last_started, zone)


def is_due(source: SourceSettings, last_started: datetime | None, zone: Any, now: datetime | None = None,
           *, permissions: bool = False) -> bool:
    now = now or utcnow()
    if last_started is None:
        return True
    tolerance = min(DUE_TOLERANCE_S, (_every_s(source, permissions) or 3600) * 0.05)
    return next_due(source, last_started, zone, now, permissions=permissions) <= now + timedelta(seconds=tolerance)
