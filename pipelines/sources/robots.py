"""robots.txt (RFC 9309, read by ``protego``): per host and run, with the crawl delay that paces our requests."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from protego import Protego

from pipelines.sources.fetcher import Fetcher, FetchError, short_reason

log = logging.getLogger("pipelines.sources")

#: RFC 9309 2.5: a crawler parses at least the first 500 KiB; what follows is not read.
ROBOTS_MAX_BYTES = 512_000
#: The most a robots.txt ``Crawl-delay`` may space our requests to one host (seconds).
MAX_CRAWL_DELAY_S = 5.0


def product_token(user_agent: str) -> str:
    """The name robots.txt groups are matched against: ``kbbot`` of ``kbbot/0.1 (knowledge refresh)``."""
    words = user_agent.split()
    return words[0].split("/", 1)[0].lower() if words else ""


@dataclass
class RobotsRules:
    """The rules of a robots.txt for one product token, and its crawl delay (None when it sets none)."""

    parsed: Protego
    token: str

    @property
    def crawl_delay_s(self) -> float | None:
        delay = self.parsed.crawl_delay(self.token or "*")
        return float(delay) if delay is not None and math.isfinite(delay) and delay >= 0 else None

    def allows(self, url: str) -> bool:
        """RFC 9309 2.2.2: the longest matching rule decides, an allow winning a tie; no match allows."""
        return self.parsed.can_fetch(url, self.token or "*")


def parse_robots(text: str, token: str) -> RobotsRules:
    """The rules of ``text`` for the product token ``token``: the groups naming it (merged), else the
    ``*`` groups, else none; lines it does not understand are skipped, as RFC 9309 asks.

    ``protego`` reads it (wildcards, ``$``, the longest match, ``Crawl-delay``); Python's
    ``urllib.robotparser`` knows no wildcards and lets the first matching rule win instead of the
    longest one, so it would fetch pages a site disallows."""
    return RobotsRules(Protego.parse(text), token)


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.netloc or '').lower()}"


class HostRobots:
    """What one host's robots.txt says for this run, and the pacing of our requests to it."""

    def __init__(self, origin: str, rules: RobotsRules | None, *, unreachable: str | None = None,
                 delay_s: float = 0.0, last_request: float | None = None):
        self.origin = origin
        self.rules = rules
        #: Why the robots.txt could not be had (the host is then disallowed for this run), else None.
        self.unreachable = unreachable
        self.delay_s = delay_s
        self._next = (last_request or time.monotonic()) + delay_s
        self._lock = threading.Lock()

    def allows(self, url: str) -> bool:
        return self.unreachable is None and (self.rules is None or self.rules.allows(url))

    def skip_reason(self, kept: str = "the indexed version is kept") -> str:
        """Why a URL of an unreachable host was not fetched."""
        return (f"not fetched: the robots.txt of {self.origin} is unreachable ({self.unreachable}), so the host "
                f"is treated as disallowed this run; {kept}")

    def wait_turn(self) -> None:
        """Blocks until this request may start: ``delay_s`` after the previous one to this host."""
        if self.delay_s <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.delay_s
        if start > now:
            time.sleep(start - now)


class Robots:
    """robots.txt per host, fetched once per run (an instance lives for one run); thread-safe."""

    def __init__(self, fetcher: Fetcher, *, max_crawl_delay_s: float = MAX_CRAWL_DELAY_S):
        self.fetcher = fetcher
        self.token = product_token(fetcher.user_agent)
        self.max_crawl_delay_s = max_crawl_delay_s
        self._hosts: dict[str, HostRobots] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._mutex = threading.Lock()

    def host(self, url: str) -> HostRobots:
        key = origin(url)
        with self._mutex:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one fetch per host; the other threads wait for its answer
            if key not in self._hosts:
                self._hosts[key] = self._load(key)
            return self._hosts[key]

    def unreachable(self) -> dict[str, str]:
        """origin -> why its robots.txt could not be had, for the hosts this run was kept from."""
        with self._mutex:
            return {o: h.unreachable for o, h in self._hosts.items() if h.unreachable}

    def _load(self, key: str) -> HostRobots:
        url = key + "/robots.txt"
        started = time.monotonic()
        try:
            status, body = self.fetcher.fetch_robots(url, ROBOTS_MAX_BYTES)
        except FetchError as exc:
            log.warning("robots.txt %s is unreachable (%s): the host is treated as disallowed this run and keeps "
                        "its indexed pages", url, exc)
            return HostRobots(key, None, unreachable=str(exc))
        except Exception as exc:  # noqa: BLE001 - a surprise is no permission
            log.exception("reading %s failed", url)
            return HostRobots(key, None, unreachable=f"{type(exc).__name__}: {short_reason(exc)}")
        if status == 429 or status >= 500:
            # RFC 9309 2.3.1.4 (server errors: assume complete disallow); a 429 asks us to back off, likewise.
            reason = f"HTTP {status}"
            log.warning("robots.txt %s answered %s: the host is treated as disallowed this run and keeps its "
                        "indexed pages", url, reason)
            return HostRobots(key, None, unreachable=reason)
        if not 200 <= status < 300:  # RFC 9309 2.3.1.3: unavailable (4xx, endless redirects): no restrictions
            log.info("robots.txt %s answered HTTP %d: no restrictions", url, status)
            return HostRobots(key, None)
        rules = parse_robots(body.decode("utf-8", errors="replace"), self.token)
        delay = 0.0
        if rules.crawl_delay_s:
            delay = min(rules.crawl_delay_s, self.max_crawl_delay_s)
            if delay < rules.crawl_delay_s:
                log.info("robots.txt %s asks for a crawl delay of %g s; %g s is used", url, rules.crawl_delay_s, delay)
        log.info("robots.txt %s read for %s, crawl delay %g s", url, self.token or "*", delay)
        return HostRobots(key, rules, delay_s=delay, last_request=started)
