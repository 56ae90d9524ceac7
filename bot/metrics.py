"""Prometheus metrics of one kbbot process, served at ``/metrics`` by ``kbbot serve``.

=====================================================  =========  =================================================
metric                                                 type       labels / meaning
=====================================================  =========  =================================================
``kbbot_turns_total``                                  counter    platform, outcome (answered, not_found, off_topic,
                                                                  cached, clarify, error, rate_limited)
``kbbot_turns_in_progress``                            gauge      turns being answered now
``kbbot_turn_seconds``                                 histogram  stage (history, each pipeline component, total)
``kbbot_model_first_token_seconds``                    histogram  turn start to the model's first streamed text
``kbbot_first_visible_text_seconds``                   histogram  platform: first text from the model to the first
                                                                  send that showed it (the streaming lag)
``kbbot_model_tokens_total``                           counter    direction (input, output) of the answer calls
``kbbot_model_calls_total``                            counter    model calls (helpers and answers)
``kbbot_platform_api_calls_total``                     counter    platform, method
``kbbot_platform_api_rate_limited_total``              counter    platform, method (HTTP 429 / flood control)
``kbbot_platform_api_errors_total``                    counter    platform, method, status (5xx, network)
``kbbot_stream_retry_waits_total``                     counter    platform: Retry-After waits of stream writers
``kbbot_stream_deferred_total``                        counter    platform: answers posted and edited because no
                                                                  native stream could start at once
``kbbot_refresh_runs_total``                           counter    source, status (ok, error)
``kbbot_refresh_documents_total``                      counter    source, change (added, changed, removed,
                                                                  unchanged, failed, orphaned: revoked with a
                                                                  source no longer configured, disallowed:
                                                                  kept out by robots.txt)
``kbbot_refresh_seconds``                              histogram  source
``kbbot_rate_limit_refusals_total``                    counter    scope (user, channel, busy)
=====================================================  =========  =================================================

Everything lives in one ``CollectorRegistry`` per ``Metrics`` (``METRICS`` for the process), so
tests can make their own and nothing collides with a host application's default registry.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("kbbot.metrics")

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_STREAM = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
_REFRESH = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter("kbbot_turns", "Turns answered, by platform and outcome", ["platform", "outcome"],
                             registry=r)
        self.in_progress = Gauge("kbbot_turns_in_progress", "Turns being answered now", registry=r)
        self.stage_seconds = Histogram("kbbot_turn_seconds", "Turn latency by stage (total: the whole turn)",
                                       ["stage"], buckets=_LATENCY, registry=r)
        self.first_token = Histogram("kbbot_model_first_token_seconds",
                                     "Turn start to the model's first streamed text", buckets=_LATENCY, registry=r)
        self.first_visible = Histogram("kbbot_first_visible_text_seconds",
                                       "First text from the model to the first platform send that showed it",
                                       ["platform"], buckets=_STREAM, registry=r)
        self.tokens = Counter("kbbot_model_tokens", "Model tokens of answer calls", ["direction"], registry=r)
        self.model_calls = Counter("kbbot_model_calls", "Model calls (helpers and answers)", registry=r)
        self.api_calls = Counter("kbbot_platform_api_calls", "Chat platform API calls", ["platform", "method"],
                                 registry=r)
        self.api_429 = Counter("kbbot_platform_api_rate_limited", "Chat platform API calls answered 429",
                               ["platform", "method"], registry=r)
        self.api_errors = Counter("kbbot_platform_api_errors", "Chat platform API calls failing (5xx, network)",
                                  ["platform", "method", "status"], registry=r)
        self.stream_deferred = Counter("kbbot_stream_deferred",
                                       "Answers posted and edited because no native stream could start at once",
                                       ["platform"], registry=r)
        self.retry_waits = Counter("kbbot_stream_retry_waits", "Retry-After waits of stream writers",
                                   ["platform"], registry=r)
        self.refresh_runs = Counter("kbbot_refresh_runs", "Refresh runs by source and status", ["source", "status"],
                                    registry=r)
        self.refresh_documents = Counter("kbbot_refresh_documents", "Documents of refresh runs by change",
                                         ["source", "change"], registry=r)
        self.refresh_seconds = Histogram("kbbot_refresh_seconds", "Refresh run duration", ["source"],
                                         buckets=_REFRESH, registry=r)
        self.limit_refusals = Counter("kbbot_rate_limit_refusals", "Questions refused by a rate limit", ["scope"],
                                      registry=r)

    # --- observations ----------------------------------------------------------------------------
    def observe_turn(self, platform: str, outcome: str, trace: Any) -> None:
        self.turns.labels(platform or "unknown", outcome).inc()
        for stage, ms in (trace.stages or {}).items():
            self.stage_seconds.labels(stage).observe(max(ms, 0.0) / 1000)
        if trace.first_token_ms is not None:
            self.first_token.observe(trace.first_token_ms / 1000)
        usage = trace.usage or {}
        for direction, keys in (("input", ("input_tokens", "prompt_tokens")),
                                ("output", ("output_tokens", "completion_tokens"))):
            count = next((usage[k] for k in keys if isinstance(usage.get(k), (int, float))), 0)
            if count:
                self.tokens.labels(direction).inc(count)
        if trace.model_calls:
            self.model_calls.inc(trace.model_calls)

    def observe_api_call(self, platform: str, method: str, status: int | str | None) -> None:
        """One platform API call; ``status`` the HTTP status, or a short error name for a network failure."""
        self.api_calls.labels(platform, method).inc()
        if status == 429:
            self.api_429.labels(platform, method).inc()
        elif not isinstance(status, int) or status >= 500:
            self.api_errors.labels(platform, method, str(status)).inc()

    def observe_refresh(self, record: Any) -> None:
        source = record.source
        self.refresh_runs.labels(source, "ok" if record.ok else "error").inc()
        for change in ("added", "changed", "removed", "unchanged", "orphaned", "disallowed"):
            count = getattr(record, change, 0)
            if count:
                self.refresh_documents.labels(source, change).inc(count)
        if record.failed:
            self.refresh_documents.labels(source, "failed").inc(len(record.failed))
        self.refresh_seconds.labels(source).observe(max(record.duration_s, 0.0))

    # --- exposition ------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 when absent), e.g. ``value("kbbot_turns_total", outcome="answered")``;
        labels not given are summed over."""
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total


CONTENT_TYPE = CONTENT_TYPE_LATEST
METRICS = Metrics()
