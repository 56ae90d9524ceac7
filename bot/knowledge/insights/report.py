"""The report on a window of turn records: ``kbbot report``, the admin page and the digest read it.

Gaps (not-found and off-topic questions) are grouped by meaning with the bot's own text embedder:
a question joins the group whose centroid it is most similar to, if that similarity reaches
``insights.group_similarity``, else it starts a group. Near-duplicates and paraphrases (even in
the other language) land together; each group shows its most central question.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from bot.knowledge.refresh import FileRunLog, RedisRunLog, iso, next_due, parse_iso, schedule_zone
from bot.knowledge.status import knowledge_status
from bot.settings import Settings
from bot.state.turn_log.records import GAP_OUTCOMES, TurnRecord

Embed = Callable[[list[str]], Sequence[Sequence[float]]]

#: A scheduled run later than this is overdue: the source is stale.
STALE_GRACE = timedelta(hours=1)


def embedder_function(text_embedder: Any) -> Embed:
    """``texts -> vectors`` from a Haystack text embedder (the one the pipeline uses)."""
    return lambda texts: [text_embedder.run(text=t)["embedding"] for t in texts]


@dataclass
class Gap:
    representative: str
    records: list[TurnRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        questions = list(dict.fromkeys(r.question for r in self.records))
        shared = [r for r in self.records if not r.in_private]
        return {"representative": self.representative, "count": len(self.records), "questions": questions,
                # What may be shown where others read (the digest's channel): not what was asked in private.
                "shared_questions": list(dict.fromkeys(r.question for r in shared)),
                "shared_channels": sorted({f"{r.platform}:{r.channel}" for r in shared}),
                "outcomes": dict(Counter(r.outcome for r in self.records)),
                "channels": sorted({f"{r.platform}:{r.channel}" for r in self.records}),
                "last_at": max(r.at for r in self.records), "turn_ids": [r.turn_id for r in self.records],
                "nearest": nearest_chunks(self.records)}


def nearest_chunks(records: list[TurnRecord], limit: int = 3) -> list[dict[str, Any]]:
    """The passages that came closest to the group's questions (their turns' ranked chunks), best
    first, one per document: the first is the gap's nearest document."""
    chunks = sorted((c for r in records for c in r.ranked[:limit]), key=lambda c: -(c.get("score") or 0.0))
    seen: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        seen.setdefault(chunk.get("doc_id") or chunk.get("source") or "", chunk)
    return list(seen.values())[:limit]


def group_by_meaning(records: list[TurnRecord], embed: Embed, threshold: float) -> list[Gap]:
    """Groups of records whose questions mean the same, largest first."""
    if not records:
        return []
    ordered = sorted(records, key=lambda r: r.at)
    texts = list(dict.fromkeys(r.question for r in ordered))
    vectors = np.asarray(embed(texts), dtype=np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    vector_of = dict(zip(texts, vectors))
    members: list[list[str]] = []  # distinct questions per group
    sums: list[np.ndarray] = []
    for text in texts:
        v = vector_of[text]
        best, best_sim = -1, threshold
        for i, total in enumerate(sums):
            sim = float(v @ (total / np.linalg.norm(total)))
            if sim >= best_sim:
                best, best_sim = i, sim
        if best < 0:
            members.append([text])
            sums.append(v.copy())
        else:
            members[best].append(text)
            sums[best] += v
    group_of = {t: i for i, texts_ in enumerate(members) for t in texts_}
    gaps = []
    for i, texts_ in enumerate(members):
        centroid = sums[i] / np.linalg.norm(sums[i])
        representative = max(texts_, key=lambda t: float(vector_of[t] @ centroid))
        gaps.append(Gap(representative, [r for r in ordered if group_of[r.question] == i]))
    gaps.sort(key=lambda g: (-len(g.records), -max(r.at for r in g.records)))
    return gaps


def source_health(settings: Settings, status: dict[str, Any], zone: Any,
                  now: datetime | None = None) -> list[dict[str, Any]]:
    """Each configured source with ``health``: ok, failing (its last run failed, or documents did),
    stale (a scheduled run is overdue) or never_run."""
    now = now or datetime.now(UTC)
    schedules = {s.name: s for s in settings.sources}
    out = []
    for src in status.get("sources", []):
        last = src.get("last_run")
        health = "ok"
        if last is None:
            health = "never_run"
        elif not last.get("ok") or last.get("failed"):
            health = "failing"
        elif src["name"] in schedules:
            due = next_due(schedules[src["name"]], parse_iso(last["started_at"]), zone, now)
            if due + STALE_GRACE < now:
                health = "stale"
        out.append({**src, "health": health})
    return out


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d")


def build_report(records: list[TurnRecord], *, since: float, until: float, embed: Embed | None = None,
                 threshold: float = 0.9, sources: list[dict[str, Any]] | None = None,
                 top: int | None = None) -> dict[str, Any]:
    """Everything ``kbbot report`` prints, as one JSON-ready dict."""
    by_outcome = Counter(r.outcome for r in records)
    by_platform: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        by_platform[r.platform][r.outcome] += 1
    answered = by_outcome["answered"] + by_outcome["cached"]
    ups, downs = sum(r.ups for r in records), sum(r.downs for r in records)
    latencies = [r.first_text_ms for r in records if r.first_text_ms is not None and r.outcome != "error"]
    days: dict[str, Counter[str]] = {}
    day = datetime.fromtimestamp(since, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    while day.timestamp() < until:
        days[day.strftime("%Y-%m-%d")] = Counter()
        day += timedelta(days=1)
    votes: dict[str, Counter[str]] = {d: Counter() for d in days}
    for r in records:
        days.setdefault(_day(r.at), Counter())[r.outcome] += 1
        votes.setdefault(_day(r.at), Counter()).update(up=r.ups, down=r.downs)
    # A question a refresh has since answered where it was asked is no longer missing: it is a gap closed.
    gaps = [g.to_dict() for g in group_by_meaning([r for r in records if r.outcome in GAP_OUTCOMES
                                                   and not r.gap_closed], embed, threshold)] if embed is not None else []
    closed = gaps_closed(records)
    disliked = sorted((r for r in records if r.downs), key=lambda r: (-r.downs, -r.at))
    return {
        "since": iso(datetime.fromtimestamp(since, UTC)),
        "until": iso(datetime.fromtimestamp(until, UTC)),
        "turns": len(records),
        "by_outcome": dict(by_outcome),
        "by_platform": {p: dict(c) for p, c in sorted(by_platform.items())},
        "answer_rate": round(answered / len(records), 3) if records else None,
        "feedback": {"up": ups, "down": downs,
                     "up_rate": round(ups / (ups + downs), 3) if ups + downs else None},
        "first_text_ms": {"p50": _percentile(latencies, 50), "p95": _percentile(latencies, 95)},
        "per_day": [{"day": d, **dict(c)} for d, c in sorted(days.items())],
        "feedback_per_day": [{"day": d, "up": c["up"], "down": c["down"]} for d, c in sorted(votes.items())],
        "gaps": gaps[:top] if top else gaps,
        "disliked": [{"turn_id": r.turn_id, "at": r.at, "platform": r.platform, "channel": r.channel,
                      "question": r.question, "answer": r.answer, "citations": r.citations, "up": r.ups,
                      "down": r.downs, "private": r.in_private} for r in (disliked[:top] if top else disliked)],
        "sources": sources or [],
        "gaps_closed": {"count": len(closed), "items": closed[:top] if top else closed},
    }


def gaps_closed(records: list[TurnRecord]) -> list[dict[str, Any]]:
    """The questions a refresh answered after kbbot could not (``bot.knowledge.loop.followups``), latest
    first: when asked, when answered, by which source's refresh, citing what."""
    out = []
    for r in records:
        if not r.gap_closed:
            continue
        follow = r.follow_up or {}
        citations = follow.get("citations") or []
        out.append({"turn_id": r.turn_id, "at": r.at, "closed_at": follow.get("at"), "platform": r.platform,
                    "channel": r.channel, "question": r.question, "outcome": r.outcome,
                    "refresh": follow.get("refresh"), "same_as": follow.get("same_as"),
                    "sources": [str(c.get("source") or "") for c in citations],
                    "titles": [str(c.get("title") or c.get("source") or "") for c in citations]})
    out.sort(key=lambda g: -(g["closed_at"] or 0))
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def format_report(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    lines = [f"kbbot report {report['since']} – {report['until']}", ""]
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report["by_outcome"].items(), key=lambda kv: -kv[1]))
    lines.append(f"Turns: {report['turns']}" + (f" ({outcomes})" if outcomes else ""))
    for platform, counts in report["by_platform"].items():
        lines.append(f"  {platform}: {sum(counts.values())} ("
                     + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")")
    fb = report["feedback"]
    lines.append(f"Answer rate: {_pct(report['answer_rate'])}    Feedback: {fb['up']} 👍 / {fb['down']} 👎 "
                 f"({_pct(fb['up_rate'])} positive)")
    lat = report["first_text_ms"]
    lines.append(f"First text: p50 {_ms(lat['p50'])}, p95 {_ms(lat['p95'])}")
    lines += ["", f"Unanswered questions, grouped by meaning ({len(report['gaps'])} groups):"]
    if not report["gaps"]:
        lines.append("  none")
    for gap in report["gaps"]:
        lines.append(f"  {gap['count']:>3} × {gap['representative']}   [{', '.join(gap['channels'])}]")
        for other in gap["questions"]:
            if other != gap["representative"]:
                lines.append(f"        ~ {other}")
    lines += ["", f"👎 answers ({len(report['disliked'])}):"]
    if not report["disliked"]:
        lines.append("  none")
    for item in report["disliked"]:
        sources = ", ".join(c["title"] for c in item["citations"]) or "no sources"
        lines.append(f"  {_when(item['at'])} {item['platform']}:{item['channel']}  {item['question']}  "
                     f"({item['down']} 👎, {item['up']} 👍; {sources}; turn {item['turn_id']})")
    closed = report.get("gaps_closed") or {"count": 0, "items": []}
    lines += ["", f"Gaps closed by a refresh ({closed['count']}):"]
    if not closed["items"]:
        lines.append("  none")
    for item in closed["items"]:
        lines.append(f"  {_when(item['closed_at'] or item['at'])} {item['platform']}:{item['channel']}  {item['question']}  "
                     f"(asked {_when(item['at'])}; answered from {', '.join(item['titles']) or '–'}; "
                     f"refresh of {item['refresh']}; turn {item['turn_id']})")
    problems = [s for s in report["sources"] if s["health"] != "ok"]
    lines += ["", f"Sources needing attention ({len(problems)} of {len(report['sources'])}):"]
    if not problems:
        lines.append("  none")
    for src in problems:
        last = src.get("last_run") or {}
        detail = last.get("error") or (f"{len(last['failed'])} documents failed" if last.get("failed") else "")
        lines.append(f"  {src['name']}: {src['health']}; last run {last.get('started_at') or 'never'}, "
                     f"next {src.get('next_run') or '–'}" + (f"; {detail}" if detail else ""))
    return "\n".join(lines)


async def report_of(runtime: Any, *, since: float, until: float, status: dict[str, Any] | None = None,
                    top: int | None = None) -> dict[str, Any]:
    """The report on a started runtime's turn records; ``status`` is ``knowledge_status`` (read
    here when not given)."""
    if runtime.turns is None:
        raise ValueError("turn records are off (insights.enabled: false)")
    settings = runtime.settings
    if status is None:
        runs = (RedisRunLog(runtime.redis, settings.redis_prefix) if runtime.redis is not None
                else FileRunLog(settings.data_dir / "refresh.json"))
        status = await knowledge_status(settings, store=runtime.store, runs=runs, redis=runtime.redis)
    records = await runtime.turns.log.window(since, until)
    embed = embedder_function(runtime.text_embedder)
    sources = source_health(settings, status, schedule_zone(settings))
    return await asyncio.to_thread(build_report, records, since=since, until=until, embed=embed,
                                   threshold=settings.insights.group_similarity, sources=sources, top=top)
