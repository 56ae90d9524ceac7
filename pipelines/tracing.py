"""Per-turn stage timings from Haystack's tracing hooks.

Haystack has one process-wide tracer; concurrent turns each need their own timings, so the
tracer writes into whatever ``StageTimings`` the current asyncio task (or the thread it
handed work to) has activated through a context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from typing import Any

from haystack import tracing
from haystack.tracing import Span, Tracer

_current: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("kbbot_stage_timings", default=None)
#: Told each component's name as it starts (the HTTP API's progress events); may run in a worker thread.
_on_stage: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("kbbot_on_stage",
                                                                                         default=None)


class _TimingSpan(Span):
    def __init__(self) -> None:
        self.tags: dict[str, Any] = {}

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value


class StageTimer(Tracer):
    """Records each component run's wall time (ms) under its component name."""

    @contextlib.contextmanager
    def trace(self, operation_name: str, tags: dict[str, Any] | None = None,
              parent_span: Span | None = None) -> Iterator[Span]:
        span = _TimingSpan()
        name = (tags or {}).get("haystack.component.name")
        on_stage = _on_stage.get()
        if on_stage is not None and operation_name == "haystack.component.run" and name:
            on_stage(name)
        started = time.perf_counter()
        try:
            yield span
        finally:
            timings = _current.get()
            if timings is not None and operation_name == "haystack.component.run" and name:
                timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started) * 1000

    def current_span(self) -> Span | None:
        return None


_installed = False


def install_stage_timer() -> None:
    """Route Haystack's tracer to ``StageTimer`` unless the operator configured another tracer."""
    global _installed
    if not _installed and not tracing.is_tracing_enabled():
        tracing.enable_tracing(StageTimer())
        _installed = True


@contextlib.contextmanager
def record_stages(into: dict[str, float], on_stage: Callable[[str], None] | None = None
                  ) -> Iterator[dict[str, float]]:
    token, observer = _current.set(into), _on_stage.set(on_stage)
    try:
        yield into
    finally:
        _on_stage.reset(observer)
        _current.reset(token)
