"""The admin page's charts as inline SVG, drawn on the server (no JavaScript, no chart library)."""

from __future__ import annotations

from html import escape
from typing import Any

#: Outcome -> (label, colour); the order is the stacking order, bottom up.
OUTCOME_COLOURS = {
    "answered": ("answered", "#2f855a"),
    "cached": ("approved answer", "#68d391"),
    "clarify": ("clarify", "#3182ce"),
    "not_found": ("not found", "#dd6b20"),
    "off_topic": ("off topic", "#a0aec0"),
    "error": ("failed", "#c53030"),
}

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 640, 200, 36, 24, 10


def _frame(body: str, title: str, height: int = HEIGHT) -> str:
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{body}</svg>')


def _axis(top_value: float, label: Any = lambda v: f"{v:g}") -> str:
    plot_h = HEIGHT - BOTTOM - TOP
    lines = []
    for frac in (0, 0.5, 1):
        y = TOP + plot_h * (1 - frac)
        lines.append(f'<line x1="{LEFT}" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{label(top_value * frac)}</text>')
    return "".join(lines)


def _day_labels(days: list[str], step: float) -> str:
    every = max(1, len(days) // 10)
    return "".join(f'<text x="{LEFT + step * (i + 0.5):.1f}" y="{HEIGHT - 6}" text-anchor="middle">{d[5:]}</text>'
                   for i, d in enumerate(days) if i % every == 0)


def stacked_days(per_day: list[dict[str, Any]], series: dict[str, tuple[str, str]], title: str) -> str:
    """One bar per day, stacked by ``series`` (key -> (label, colour))."""
    days = [d["day"] for d in per_day]
    totals = [sum(int(d.get(k, 0)) for k in series) for d in per_day]
    top_value = max([*totals, 1])
    top_value += top_value % 2  # an even top keeps the middle grid line on a whole number
    step = (WIDTH - LEFT) / max(len(days), 1)
    plot_h = HEIGHT - BOTTOM - TOP
    bars = []
    for i, day in enumerate(per_day):
        y = TOP + plot_h
        for key, (label, colour) in series.items():
            n = int(day.get(key, 0))
            if not n:
                continue
            h = plot_h * n / top_value
            y -= h
            bars.append(f'<rect x="{LEFT + step * i + step * 0.15:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" '
                        f'height="{h:.1f}" fill="{colour}"><title>{escape(day["day"])}: {n} {escape(label)}'
                        f'</title></rect>')
    return _frame(_axis(top_value, lambda v: f"{v:.0f}") + "".join(bars) + _day_labels(days, step), title)


def rate_line(per_day: list[dict[str, Any]], numerator: tuple[str, ...], denominator: tuple[str, ...] | None,
              title: str, colour: str = "#2b6cb0") -> str:
    """A line of ``sum(numerator) / sum(denominator)`` per day (0–100 %); days without turns are gaps."""
    days = [d["day"] for d in per_day]
    step = (WIDTH - LEFT) / max(len(days), 1)
    plot_h = HEIGHT - BOTTOM - TOP
    points = []
    for i, day in enumerate(per_day):
        keys = denominator if denominator is not None else tuple(k for k in day if k != "day")
        total = sum(int(day.get(k, 0)) for k in keys)
        if total:
            rate = sum(int(day.get(k, 0)) for k in numerator) / total
            points.append((LEFT + step * (i + 0.5), TOP + plot_h * (1 - rate), day["day"], rate))
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{escape(d)}: '
                   f'{r * 100:.0f}%</title></circle>' for x, y, d, r in points)
    line = f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>' if len(points) > 1 else ""
    return _frame(_axis(1.0, lambda v: f"{v * 100:.0f}%") + line + dots + _day_labels(days, step), title)


def legend(series: dict[str, tuple[str, str]]) -> str:
    return "".join(f'<span class="key"><i style="background:{colour}"></i>{escape(label)}</span>'
                   for label, colour in series.values())
