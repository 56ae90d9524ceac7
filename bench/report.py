"""How every benchmark prints its result: a Markdown table, or with ``--json`` one JSON object."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float, ndigits: int | None = None) -> float | None:
    """The nearest-rank ``q`` quantile (0-1) of ``values``, rounded to ``ndigits`` when given; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    value = ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
    return value if ndigits is None else round(value, ndigits)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None,
          headers: Sequence[str] | None = None) -> str:
    """Rows (dicts with the same keys) as a Markdown table; ``columns`` picks and orders the keys."""
    keys = list(columns or (rows[0] if rows else []))
    head = list(headers or keys)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(row.get(k)) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def figures(result: Mapping[str, Any]) -> str:
    """One result's figures as a two-column table (figure, value)."""
    return table([{"figure": key, "value": value} for key, value in result.items()])


def emit(result: Mapping[str, Any], as_json: bool) -> None:
    """Print ``result``: one JSON object, or its figures as a table."""
    print(json.dumps(result, ensure_ascii=False) if as_json else figures(result))


def emit_laid_out(result: Mapping[str, Any], as_json: bool, lay_out: Callable[[Any], None]) -> None:
    """Print ``result``: one JSON object, or as ``lay_out`` prints it."""
    if as_json:
        print(json.dumps(result))
    else:
        lay_out(result)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:g}"
    return str(value)
