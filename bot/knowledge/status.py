"""The knowledge status: version, each source's documents, last and next run, services; and its text."""

from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime
from typing import Any

from bot.knowledge.loop.golden import golden_line, golden_results
from bot.knowledge.refresh.runs import RunLog, RunRecord
from bot.knowledge.refresh.schedule import iso, next_due, permissions_run_name, schedule_zone
from bot.messages import say
from bot.settings import Settings
from bot.state.health import check_redis, check_store
from pipelines.records import NOBODY
from pipelines.store import KnowledgeStore

log = logging.getLogger("kbbot.refresh")


async def knowledge_status(settings: Settings, *, store: KnowledgeStore | None, runs: RunLog | None,
                           redis: Any = None, store_error: str | None = None, redis_error: str | None = None,
                           next_runs: dict[str, datetime | None] | None = None,
                           timeout_s: float = 10.0) -> dict[str, Any]:
    """``{"knowledge_version", "sources": [{"name", "documents", "chunks", "held", "held_reasons",
    "last_run", "next_run", "last_permissions_run"}],
    "services": {"weaviate": {...}, "redis": {...}}}``; a service that is down is reported, not raised."""
    weaviate, read = await check_store(settings, store, lambda s: (s.knowledge_version, s.records()),
                                       timeout_s=timeout_s, error=store_error)
    version, records = read if read is not None else (None, None)
    redis_status = await check_redis(settings, redis, timeout_s=timeout_s, error=redis_error)
    zone = schedule_zone(settings)
    sources = []
    for src in settings.sources:
        last: RunRecord | None = None
        permissions: RunRecord | None = None
        if runs is not None and redis_status["status"] != "down":
            try:
                last = await runs.last_run(src.name)
                permissions = await runs.last_run(permissions_run_name(src.name))
            except Exception as exc:  # noqa: BLE001
                log.warning("cannot read the last run of %s: %s", src.name, exc)
        documents = chunks = held = None
        if records is not None:
            roots = set(src.kind.roots(src))
            mine = [r for r in records.values() if r.root in roots]
            documents, chunks = len(mine), sum(r.chunks for r in mine)
            held = sum(1 for r in mine if r.readers == [NOBODY])
        # Why, as the latest run of either kind found it (a permissions-only run reads them again).
        latest = max((r for r in (last, permissions) if r is not None), key=lambda r: r.started, default=None)
        if next_runs is not None and src.name in next_runs:
            upcoming = next_runs[src.name]
        else:
            upcoming = next_due(src, last.started if last else None, zone)
        sources.append({"name": src.name, "documents": documents, "chunks": chunks, "held": held,
                        "held_reasons": dict(latest.held) if latest is not None else {},
                        "last_run": last.to_dict() if last else None, "next_run": iso(upcoming),
                        "last_permissions_run": permissions.to_dict() if permissions else None})
    golden = None
    if redis_status["status"] != "down":
        try:
            last = await golden_results(redis, settings.redis_prefix, settings.data_dir).last()
            golden = asdict(last) if last is not None else None
        except Exception as exc:  # noqa: BLE001 - the status says what it can
            log.warning("cannot read the last golden replay: %s", exc)
    golden_file = settings.resolve(settings.approvals.golden_file)
    return {"knowledge_version": version, "sources": sources,
            "services": {"weaviate": weaviate, "redis": redis_status}, "golden": golden,
            "golden_file": str(golden_file) if golden_file.exists() else None}


def format_status(status: dict[str, Any], *, max_failures: int = 5, language: str = "en") -> str:
    """The status for people (terminal, Slack, Telegram): a few lines per source, in ``language``."""
    services = status["services"]
    version = status["knowledge_version"] if status["knowledge_version"] is not None else "?"
    parts = [say("status_version", language, version=version)]
    for name, label in (("weaviate", "Weaviate"), ("redis", "Redis")):
        svc = services[name]
        parts.append(f"{label} {svc['status']}" + (f" ({svc['error']})" if svc.get("error") else ""))
    lines = [" · ".join(parts)]
    if not status["sources"]:
        lines.append(say("status_no_sources", language))
    for src in status["sources"]:
        docs = "?" if src["documents"] is None else src["documents"]
        chunks = "?" if src["chunks"] is None else src["chunks"]
        line = say("status_source", language, name=src["name"], documents=docs, chunks=chunks)
        run = src["last_run"]
        if run:
            when = run["started_at"].replace("T", " ").replace("Z", " UTC")
            record = RunRecord.from_dict(run)
            line += say("status_last_run", language, when=when, trigger=run["trigger"],
                        outcome=record.outcome(language))
        else:
            line += say("status_never_refreshed", language)
        if src["next_run"]:
            line += say("status_next_run", language, when=src["next_run"].replace("T", " ").replace("Z", " UTC"))
        lines.append(line)
        if src.get("held"):
            lines.append(say("status_held", language, count=src["held"]) + (":" if src.get("held_reasons") else ""))
            lines.extend(f"      {n}: {why}" for why, n in sorted(src.get("held_reasons", {}).items()))
        if src.get("last_permissions_run"):
            again = RunRecord.from_dict(src["last_permissions_run"])
            when = again.started_at.replace("T", " ").replace("Z", " UTC")
            lines.append(say("status_permissions_run", language, when=when, trigger=again.trigger,
                             outcome=again.outcome(language)))
        if run and run["failed"]:
            lines.extend(failure_lines(run["failed"], max_failures, language))
    if "golden" in status:
        lines.append(golden_line(status["golden"], status.get("golden_file"), language))
    return "\n".join(lines)



def failure_lines(failed: list[dict[str, str]], shown: int = 5, language: str = "en") -> list[str]:
    """A run's failures, indented under its line: the first ``shown``, then how many more."""
    lines = [say("failed_line", language, source=f["source"], reason=f["reason"]) for f in failed[:shown]]
    if len(failed) > shown:
        lines.append(say("failed_more", language, count=len(failed) - shown))
    return lines
