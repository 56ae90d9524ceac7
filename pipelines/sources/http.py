"""What every HTTP source kind shares: when to try a throttled call again, which hosts a redirect or a
download URL may go to, and how a transport failure reads in the refresh summary. The network guard
itself (public addresses only) is ``pipelines.netguard``; each kind's client keeps its own auth,
paging and status mapping."""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.netguard import normalise_host, refusal
from pipelines.sources.kind import SourceError

log = logging.getLogger("pipelines.sources")


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds to wait: a number of seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    return max(0.0, moment.timestamp() - now)


class RetryPolicy:
    """When a throttled call (``statuses``; or a 403 whose reason is one of ``reasons``, Drive's way of
    saying "rate limited") is tried again: after ``Retry-After`` when the service gives one, else after
    exponential backoff with jitter (1-2 s, 2-3 s, 4-5 s ... up to 32 s, Google's advice); never
    more than ``max_retries`` times nor longer than ``max_wait_s`` at once: past that ``error`` is raised
    with a reason for the operator. ``paused_until`` is the moment the last throttle ends, for a client
    whose calls run side by side (Graph asks an app it throttles to pause every call)."""

    def __init__(self, service: str, *, max_retries: int = 5, max_wait_s: float = 120,
                 statuses: Collection[int] = (429, 503), reasons: Collection[str] = (),
                 error: type[SourceError] = SourceError):
        self.service = service
        self.max_retries = max_retries
        self.max_wait_s = max_wait_s
        self.statuses = frozenset(statuses)
        self.reasons = frozenset(reasons)
        self.error = error
        self.paused_until = 0.0  # time.monotonic()
        #: Throttled answers waited out, for the run's log line and the bench.
        self.throttled = 0

    def applies(self, status: int, reason: str = "") -> bool:
        return status in self.statuses or (status == 403 and reason in self.reasons)

    def pause_left(self) -> float:
        return max(0.0, self.paused_until - time.monotonic())

    def wait_s(self, tries: list[float], status: int, retry_after: str | None, what: str, reason: str = "") -> float:
        """How long to wait before the next try of a call whose waits so far are ``tries`` (appended to)."""
        asked = retry_after_s(retry_after)
        wait = asked if asked is not None else min(2.0 ** len(tries), 32.0) + random.uniform(0, 1)  # noqa: S311
        if len(tries) >= self.max_retries or wait > self.max_wait_s:
            raise self.error(f"HTTP {status}{' ' + reason if reason else ''} for {what}: rate limited (throttled by "
                             f"{self.service}); gave up after {len(tries) + 1} tries and {sum(tries):.0f} s of "
                             f"waiting (next wait {wait:.0f} s, longest allowed {self.max_wait_s:g} s)")
        tries.append(wait)
        self.throttled += 1
        self.paused_until = max(self.paused_until, time.monotonic() + wait)
        log.info("%s: HTTP %d %s, waiting %.1f s", self.service, status, reason, wait)
        return wait


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.netloc or '').lower()}"


def on_hosts(url: str, hosts: Collection[str], exact: Collection[str] = ()) -> bool:
    """``url`` is http(s) on one of ``hosts`` or below one (``contoso.sharepoint.com`` is below
    ``sharepoint.com``), or on one of ``exact`` itself: where a redirect or a download URL may go."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    name = normalise_host(parts.hostname)
    return (name in {normalise_host(h) for h in exact}
            or any(name == h or name.endswith("." + h) for h in (normalise_host(h) for h in hosts)))


@contextmanager
def reaching(url: str, error: type[SourceError], refused: type[SourceError], what: str = "") -> Iterator[None]:
    """A timeout or a connection failure while talking to ``url`` as ``error``; a connection the network
    guard refused as ``refused`` (a version indexed earlier is revoked, as for a page that is gone)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise error(f"no answer from {origin(url)} in time ({type(exc).__name__})") from exc
    except httpx.TransportError as exc:
        reason = refusal(exc)
        if reason is not None:
            raise refused(f"{what}: {reason}" if what else str(reason)) from exc
        raise error(f"cannot reach {origin(url)} ({type(exc).__name__}: {exc})") from exc


def too_large(what: str, limit: int, error: type[SourceError] = SourceError) -> SourceError:
    return error(f"{what}: larger than the {limit / 1e6:.1f} MB download limit (refresh.max_bytes); not downloaded")


def read_capped(response: httpx.Response, limit: int, what: str, error: type[SourceError]) -> bytes:
    body = bytearray()
    for chunk in response.iter_bytes():
        body.extend(chunk)
        if len(body) > limit:
            raise too_large(what, limit, error)
    return bytes(body)


async def aread_capped(response: httpx.Response, limit: int, what: str, error: type[SourceError]) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body.extend(chunk)
        if len(body) > limit:
            raise too_large(what, limit, error)
    return bytes(body)


def json_object(body: bytes, what: str, error: type[SourceError], question: str) -> dict[str, Any]:
    """``body`` as a JSON object; else ``error``, asking ``question`` (is this URL the service's?)."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise error(f"{what}: not a JSON answer; {question}") from exc
    if not isinstance(data, dict):
        raise error(f"{what}: unexpected answer ({type(data).__name__})")
    return data
