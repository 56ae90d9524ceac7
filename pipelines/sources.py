"""URL sources: single pages and sitemaps, fetched with conditional requests.

``UrlSource`` is a ``pipelines.indexing.Source``: a refresh reads it as ``SourceItem`` s, one per page.

- A URL whose path ends in ``.xml`` or ``.xml.gz`` is a sitemap (``<urlset>``, or a ``<sitemapindex>``
  of further sitemaps, up to ``MAX_SITEMAP_DEPTH`` deep); its ``<loc>`` pages join the source.
- Each URL is fetched with ``If-None-Match`` / ``If-Modified-Since`` from the validators (ETag,
  Last-Modified) of its last download, but only while the store still holds the version that download
  produced (same content hash, space and root): a 304 then costs no download, no conversion and no
  embedding. Without that version the request is unconditional, so a lost store heals itself.
- Bounded: ``connect_timeout_s`` to connect, ``timeout_s`` per URL in all (headers and body), at most
  ``max_bytes`` per body (refused from ``Content-Length`` before reading, else cut while reading and
  decompressing; a gzipped sitemap likewise while it is inflated), ``max_urls`` pages and
  ``max_sitemaps`` sitemap requests per source.
- Only public addresses (``pipelines.netguard``, checked at connect time after DNS resolution, so on
  every redirect hop) unless the host is in ``allow_hosts``; a sitemap lists pages and sitemaps of its
  own host only. A refused URL is reported with its reason and treated as gone (``Refused``).
- Every failure is one reason per URL: HTTP status, timeout, connection error, too large, unsupported
  content type, not a sitemap. A page that failed keeps its previous version; a page answering 404 or
  410 is gone and is revoked; a sitemap that failed still yields the pages it listed last time, so
  its pages are neither lost nor revoked because of it.

- robots.txt (RFC 9309) is read once per host and run (``Robots``, unless the source opts out with
  ``respect_robots: false``), with the fetcher's user agent (its product token, e.g. ``kbbot``, picks
  the group; else ``*``). A page it disallows is not fetched: it counts as ``disallowed`` and, if it
  was indexed, is revoked like a page that is gone. A disallowed sitemap is a sitemap that failed.
  ``Crawl-delay`` spaces the requests to that host (at most ``MAX_CRAWL_DELAY_S`` apart). A robots.txt
  answering 4xx means no restrictions; one that cannot be had (5xx, 429, timeout, connection error)
  makes the whole host disallowed for this run, but nothing of it is revoked: its URLs fail with the
  reason and keep their versions (``UrlSource.robots_unreachable``).

``states`` (url -> ``FetchState``) are what the caller keeps between refreshes (Redis or a file, see
``bot.refresh``); ``updated_states`` after a scan holds the ones to keep next time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import xml.etree.ElementTree as ET
import zlib
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx
from protego import Protego

from pipelines.components.converter import HTML_SUFFIXES, PDF_SUFFIXES, TEXT_SUFFIXES
from pipelines.indexing import SourceItem, content_hash
from pipelines.netguard import guarded_transport, normalise_host, refusal
from pipelines.store import DocRecord

log = logging.getLogger(__name__)

MAX_SITEMAP_DEPTH = 3
MAX_REDIRECTS = 5
RAW_CHUNK = 65_536
GONE_STATUSES = (404, 410)
_CONTENT_TYPES = {
    "text/html": ".html", "application/xhtml+xml": ".html",
    "text/markdown": ".md", "text/x-markdown": ".md",
    "text/plain": ".txt",
    "application/pdf": ".pdf",
}
_KNOWN_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


class FetchError(Exception):
    """One URL could not be fetched; the message is the reason shown to the operator."""


class Gone(FetchError):
    """The server says the URL no longer exists (404, 410)."""


class Refused(FetchError):
    """kbbot must not fetch the URL (an internal address, or a redirect robots.txt disallows): like a page
    that is gone, a version indexed earlier is revoked."""


@dataclass
class FetchState:
    """What the last download of one URL left for the next refresh."""

    etag: str | None = None
    last_modified: str | None = None
    content_hash: str | None = None  # of the page's body (pages only)
    urls: list[str] = field(default_factory=list)  # the pages a sitemap listed (sitemaps only)
    sitemaps: list[str] = field(default_factory=list)  # the sitemaps a sitemap index listed

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FetchState:
        return cls(etag=raw.get("etag"), last_modified=raw.get("last_modified"),
                   content_hash=raw.get("content_hash"), urls=list(raw.get("urls") or []),
                   sitemaps=list(raw.get("sitemaps") or []))


@dataclass
class Fetched:
    status: int  # 200 or 304
    body: bytes = b""
    content_type: str = ""
    etag: str | None = None
    last_modified: str | None = None


def is_sitemap(url: str) -> bool:
    path = urlsplit(url).path.lower()
    return path.endswith(".xml") or path.endswith(".xml.gz")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class Fetcher:
    """Conditional GETs with bounded time and size (``httpx`` sync client; thread-safe).

    Every connection passes ``pipelines.netguard``: a host resolving to a loopback, private,
    link-local or multicast address is refused unless it is in ``allow_hosts``. Redirects are
    followed here, hop by hop (at most ``MAX_REDIRECTS``), so each target can be checked as well
    (``fetch``'s ``hop_check``: robots.txt of the target's host)."""

    def __init__(self, *, timeout_s: float = 30, connect_timeout_s: float = 10, max_bytes: int = 20_000_000,
                 user_agent: str = "kbbot", transport: httpx.BaseTransport | None = None,
                 allow_hosts: Collection[str] = ()):
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.user_agent = user_agent
        self.allow_hosts = frozenset(normalise_host(h) for h in allow_hosts)
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            follow_redirects=True, max_redirects=MAX_REDIRECTS, headers={"User-Agent": user_agent},
            transport=transport or guarded_transport(self.allow_hosts),
        )
        self.downloaded_bytes = 0

    def close(self) -> None:
        self.client.close()

    def fetch(self, url: str, state: FetchState | None = None,
              hop_check: Callable[[str], str | None] | None = None) -> Fetched:
        """A 200 with the body, or a 304 (only when ``state`` carried validators); else ``FetchError``.
        ``hop_check(target)`` is asked before each redirect is followed: a reason refuses it."""
        headers = {"Accept-Encoding": "gzip, deflate"}
        if state is not None and state.etag:
            headers["If-None-Match"] = state.etag
        if state is not None and state.last_modified:
            headers["If-Modified-Since"] = state.last_modified
        deadline = time.monotonic() + self.timeout_s
        try:
            for _hop in range(MAX_REDIRECTS + 1):
                with self.client.stream("GET", url, headers=headers, follow_redirects=False) as response:
                    if response.has_redirect_location:
                        url = self._next_hop(url, response, hop_check)
                        continue
                    return self._fetched(response, state, deadline)
            raise FetchError("too many redirects")
        except FetchError:
            raise
        except httpx.HTTPError as exc:
            raise (Refused if refusal(exc) else FetchError)(self.reason(exc)) from None

    def _next_hop(self, url: str, response: httpx.Response, hop_check: Callable[[str], str | None] | None) -> str:
        target = normalise_url(urljoin(url, response.headers.get("Location", "")))
        if urlsplit(target).scheme not in ("http", "https"):
            raise FetchError(f"redirected to {target!r}, which is not an http(s) URL")
        problem = hop_check(target) if hop_check is not None else None
        if problem:
            raise Refused(f"redirected to {target}: {problem}")
        return target

    def _fetched(self, response: httpx.Response, state: FetchState | None, deadline: float) -> Fetched:
        if response.status_code == 304:
            return Fetched(304, etag=response.headers.get("ETag") or (state.etag if state else None),
                           last_modified=response.headers.get("Last-Modified")
                           or (state.last_modified if state else None))
        if response.status_code in GONE_STATUSES:
            raise Gone(f"HTTP {response.status_code} {response.reason_phrase}: the page is gone")
        if response.status_code != 200:
            raise FetchError(f"HTTP {response.status_code} {response.reason_phrase or ''}".rstrip())
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchError(f"too large ({_mb(int(declared))} > {_mb(self.max_bytes)} limit); not downloaded")
        body, cut = self._read(response, self.max_bytes, deadline)
        if cut:
            raise FetchError(f"too large (over the {_mb(self.max_bytes)} limit); download stopped")
        return Fetched(200, body, response.headers.get("Content-Type", ""),
                       response.headers.get("ETag"), response.headers.get("Last-Modified"))

    def _read(self, response: httpx.Response, limit: int, deadline: float) -> tuple[bytes, bool]:
        """The body decoded (gzip, deflate) up to ``limit`` bytes, and whether there was more. The cap
        holds while decoding: a small compressed body never grows past ``limit`` in memory."""
        decoder = BoundedDecoder(response.headers.get("Content-Encoding", ""))
        body = bytearray()
        try:
            for raw in response.iter_raw(RAW_CHUNK):
                body += decoder.decode(raw, limit - len(body) + 1)
                if len(body) > limit or decoder.overflowed:
                    return bytes(body[:limit]), True
                if time.monotonic() > deadline:
                    raise FetchError(f"no complete answer within {self.timeout_s:g} s")
            body += decoder.flush(limit - len(body) + 1)
        finally:
            self.downloaded_bytes += response.num_bytes_downloaded
        return (bytes(body[:limit]), True) if len(body) > limit or decoder.overflowed else (bytes(body), False)

    def reason(self, exc: httpx.HTTPError) -> str:
        """What went wrong with a request, for people."""
        refused = refusal(exc)
        if refused is not None:
            return str(refused)
        if isinstance(exc, httpx.TimeoutException):
            what = "to connect" if isinstance(exc, httpx.ConnectTimeout) else "for an answer"
            return f"timed out after {self.timeout_s:g} s waiting {what}"
        if isinstance(exc, httpx.TooManyRedirects):
            return "too many redirects"
        if isinstance(exc, httpx.ConnectError):
            return f"cannot connect ({_short(exc)})"
        return f"{type(exc).__name__}: {_short(exc)}"

    def fetch_robots(self, url: str) -> tuple[int, bytes]:
        """The status and (for a 2xx) the first ``ROBOTS_MAX_BYTES`` of a robots.txt; ``FetchError``
        when no answer came at all. More than five redirects answer 310 (RFC 9309: unavailable)."""
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.client.stream("GET", url, headers={"Accept-Encoding": "gzip, deflate"}) as response:
                if not 200 <= response.status_code < 300:
                    return response.status_code, b""
                # What follows the first ROBOTS_MAX_BYTES is not read (RFC 9309 2.5).
                return response.status_code, self._read(response, ROBOTS_MAX_BYTES, deadline)[0]
        except httpx.TooManyRedirects:
            return 310, b""
        except httpx.HTTPError as exc:
            raise FetchError(self.reason(exc)) from None


class BoundedDecoder:
    """Content-Encoding gzip / deflate / identity, never producing more than it is asked for at once."""

    def __init__(self, encoding: str):
        coding = encoding.strip().lower()
        if coding in ("", "identity"):
            self._zlib = None
        elif coding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS)
        else:
            raise FetchError(f"unsupported Content-Encoding {encoding!r}")
        self._raw_deflate = coding == "deflate"
        self._started = False
        self.overflowed = False

    def decode(self, data: bytes, room: int) -> bytes:
        if self._zlib is None:
            return data
        try:
            out = self._zlib.decompress(data, max(room, 1))
        except zlib.error as exc:
            if not (self._raw_deflate and not self._started):
                raise FetchError(f"the compressed body is broken ({exc})") from None
            # Some servers send raw deflate without the zlib header (as httpx also tolerates).
            self._zlib, self._raw_deflate = zlib.decompressobj(-zlib.MAX_WBITS), False
            return self.decode(data, room)
        self._started = True
        if self._zlib.unconsumed_tail:  # more output was waiting than there was room for
            self.overflowed = True
        return out

    def flush(self, room: int) -> bytes:
        if self._zlib is None or self.overflowed:
            return b""
        out = self._zlib.flush()
        if len(out) > room:
            self.overflowed = True
        return out[:room]


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def page_suffix(url: str, content_type: str) -> str:
    """The converter a page needs: from its Content-Type, else its URL's extension; '' if unsupported."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind in _CONTENT_TYPES:
        return _CONTENT_TYPES[kind]
    suffix = PurePosixPath(urlsplit(url).path).suffix.lower()
    if suffix in _KNOWN_SUFFIXES and kind in ("", "application/octet-stream", "binary/octet-stream"):
        return suffix
    return ""


def gunzip(data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed, refusing (``FetchError``) as soon as it grows past ``max_bytes``."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise FetchError(f"not a sitemap: the gzip data is broken ({exc})") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise FetchError(f"too large: the gzipped sitemap decompresses to more than {_mb(max_bytes)} "
                         "(refresh.max_download_mb); not read")
    if not inflater.eof:
        raise FetchError("not a sitemap: the gzip data is cut short")
    return out


def sitemap_urls(body: bytes, max_bytes: int = 20_000_000) -> tuple[list[str], list[str]]:
    """(pages, nested sitemaps) listed by a sitemap body (plain or gzipped, at most ``max_bytes``
    either way); ``FetchError`` if it is none."""
    if body[:2] == b"\x1f\x8b":
        body = gunzip(body, max_bytes)
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise FetchError(f"not a sitemap: invalid XML ({exc})") from None
    tag = root.tag.rsplit("}", 1)[-1]
    if tag not in ("urlset", "sitemapindex"):
        raise FetchError(f"not a sitemap: the root element is <{tag}>, expected <urlset> or <sitemapindex>")
    locs = [(el.text or "").strip() for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "loc"]
    locs = [loc for loc in locs if loc]
    return (locs, []) if tag == "urlset" else ([], locs)


def normalise_url(url: str) -> str:
    return urldefrag(url.strip())[0]


# --- robots.txt (RFC 9309) ------------------------------------------------------------------------
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
            status, body = self.fetcher.fetch_robots(url)
        except FetchError as exc:
            log.warning("robots.txt %s is unreachable (%s): the host is treated as disallowed this run and keeps "
                        "its indexed pages", url, exc)
            return HostRobots(key, None, unreachable=str(exc))
        except Exception as exc:  # noqa: BLE001 - a surprise is no permission
            log.exception("reading %s failed", url)
            return HostRobots(key, None, unreachable=f"{type(exc).__name__}: {_short(exc)}")
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


class _UrlScan:
    def __init__(self, source: UrlSource, pages: list[str], current: dict[str, DocRecord], space: str, *,
                 failures: list[tuple[str, str]]):
        self.source = source
        self.pages = pages
        self.current = current
        self.space = space
        self.failures = failures

    @property
    def total(self) -> int:
        return len(self.failures) + len(self.pages)

    def _validators(self, url: str) -> FetchState | None:
        """The stored validators of ``url``, if the store still holds what they describe."""
        state = self.source.states.get(url)
        record = self.current.get(url)
        if (state is None or record is None or state.content_hash != record.content_hash
                or record.space != self.space or record.root != self.source.root):
            return None
        return state

    def _item(self, url: str) -> SourceItem:
        src = self.source
        path = PurePosixPath(urlsplit(url).path)
        item = SourceItem(doc_id=url, source=url, root=src.root, name=path.stem or urlsplit(url).hostname or "page")
        if src.robots is not None:
            host = src.robots.host(url)
            if host.unreachable:
                item.error = host.skip_reason()
                return item
            if not host.allows(url):
                log.info("robots.txt of %s disallows %s for %s: skipped%s", host.origin, url, src.robots.token,
                         " (its indexed version is revoked)" if url in self.current else "")
                src.disallowed.append(url)
                item.gone = True  # like a page that is gone: revoked if it was indexed, else nothing
                return item
            host.wait_turn()
        state = self._validators(url)
        try:
            got = src.fetcher.fetch(url, state, hop_check=src.hop_check)
        except (Gone, Refused) as exc:
            item.gone = True
            item.error = str(exc)
            return item
        except FetchError as exc:
            item.error = str(exc)
            return item
        except Exception as exc:  # noqa: BLE001 - one URL's surprise must not end the others
            log.exception("fetching %s failed", url)
            item.error = f"{type(exc).__name__}: {_short(exc)}"
            return item
        if got.status == 304:
            item.not_modified = True
            src.updated_states[url] = FetchState(got.etag, got.last_modified, state.content_hash if state else None)
            return item
        suffix = page_suffix(url, got.content_type)
        if not suffix:
            item.error = f"unsupported content type {got.content_type or '(none)'}"
            return item
        item.suffix, item.data = suffix, got.body
        src.updated_states[url] = FetchState(got.etag, got.last_modified, content_hash(got.body))
        return item

    def __iter__(self) -> Iterator[SourceItem]:
        src = self.source
        for url, reason in self.failures:  # sitemaps that could not be read
            yield SourceItem(doc_id=f"sitemap:{url}", source=url, root=None, error=reason)
        # Fetched ahead, at most ``concurrency`` at once, yielded in order.
        with ThreadPoolExecutor(max_workers=src.concurrency, thread_name_prefix="kb-fetch") as pool:
            window: deque[Future[SourceItem]] = deque()
            pending = iter(self.pages)
            try:
                for url in pending:
                    window.append(pool.submit(self._item, url))
                    if len(window) >= src.concurrency:
                        yield window.popleft().result()
                while window:
                    yield window.popleft().result()
            finally:
                for future in window:
                    future.cancel()


class UrlSource:
    """Pages and sitemaps as one source; ``root`` (``urls:<name>``) scopes revocation to it."""

    def __init__(self, name: str, urls: list[str], fetcher: Fetcher, *, states: dict[str, FetchState] | None = None,
                 concurrency: int = 4, max_urls: int = 10000, max_sitemaps: int = 100, robots: Robots | None = None):
        self.name = name
        self.urls = [normalise_url(u) for u in urls]
        self.fetcher = fetcher
        self.states = dict(states or {})
        self.updated_states: dict[str, FetchState] = {}
        self.concurrency = max(1, concurrency)
        self.max_urls = max_urls
        self.max_sitemaps = max_sitemaps
        self.sitemaps_read = 0
        self.overflow = 0  # pages listed past max_urls (not kept)
        #: Sitemap failures met while listing the pages (reported with the pages' own).
        self.listing_failures: list[tuple[str, str]] = []
        #: URLs a sitemap listed on another host (reported; not a failure of the listing).
        self.refused: list[tuple[str, str]] = []
        #: robots.txt of each host (None: robots.txt is not read for this source).
        self.robots = robots
        #: Pages robots.txt kept this run from fetching.
        self.disallowed: list[str] = []

    def hop_check(self, target: str) -> str | None:
        """Why a redirect to ``target`` must not be followed (its host's robots.txt), else None."""
        if self.robots is None:
            return None
        host = self.robots.host(target)
        if host.unreachable:
            return f"the robots.txt of {host.origin} is unreachable ({host.unreachable})"
        if not host.allows(target):
            return f"disallowed by the robots.txt of {host.origin} for {self.robots.token}"
        host.wait_turn()
        return None

    def _foreign(self, sitemap: str, listed: str) -> str | None:
        """Why ``listed`` (a page or sitemap a sitemap names) is refused: on another host than the
        sitemap and not in ``refresh.allow_hosts``. A sitemap speaks for its own host only
        (sitemaps.org), so it cannot steer the crawler to another one."""
        host, own = urlsplit(listed).hostname, urlsplit(sitemap).hostname
        if host is None or host == own or normalise_host(host) in self.fetcher.allow_hosts:
            return None
        return (f"listed by the sitemap {sitemap}, which may only list pages of {own}; not fetched "
                f"(add {host} to refresh.allow_hosts to allow it)")

    @property
    def robots_unreachable(self) -> dict[str, str]:
        """origin -> reason, for the hosts whose robots.txt could not be had this run (nothing fetched there)."""
        return self.robots.unreachable() if self.robots is not None else {}

    @property
    def listed_completely(self) -> bool:
        """Whether this run knows every page the source lists (no sitemap failed, no host was skipped)."""
        return not self.listing_failures and not self.robots_unreachable

    @property
    def root(self) -> str:
        return f"urls:{self.name}"

    @property
    def roots(self) -> list[str]:
        return [self.root]

    def _expand_sitemap(self, url: str, pages: dict[str, None], depth: int) -> None:
        state = self.states.get(url)
        known = state is not None and bool(state.urls or state.sitemaps)
        try:
            if depth > MAX_SITEMAP_DEPTH:
                raise FetchError(f"sitemaps nested more than {MAX_SITEMAP_DEPTH} deep")
            # Fan-out is bounded in requests, not only in pages: an index of empty sitemaps costs
            # nothing in max_urls but one download each.
            if self.sitemaps_read >= self.max_sitemaps:
                raise FetchError(f"not read: this source already read {self.max_sitemaps} sitemaps "
                                 "(refresh.max_sitemaps); a listing from an earlier run is kept")
            if len(pages) >= self.max_urls:
                raise FetchError(f"not read: {self.max_urls} pages (refresh.max_urls) are already listed; "
                                 "a listing from an earlier run is kept")
            self.sitemaps_read += 1
            if self.robots is not None:
                host = self.robots.host(url)
                if host.unreachable:
                    raise FetchError(host.skip_reason("a listing from an earlier run is kept"))
                if not host.allows(url):
                    raise FetchError(f"disallowed by the robots.txt of {host.origin} for {self.robots.token}; "
                                     "a listing from an earlier run is kept")
                host.wait_turn()
            got = self.fetcher.fetch(url, state if known else None, hop_check=self.hop_check)
            if got.status == 304 and state is not None:
                listed, nested = list(state.urls), list(state.sitemaps)
                self.updated_states[url] = state
            else:
                listed, nested = sitemap_urls(got.body, self.fetcher.max_bytes)
                self.updated_states[url] = FetchState(got.etag, got.last_modified, urls=listed, sitemaps=nested)
        except FetchError as exc:
            self.listing_failures.append((url, str(exc)))
            if state is None or not known:
                return
            # Last time's pages stay listed: a sitemap outage neither deletes nor freezes them.
            self.updated_states[url] = state
            listed, nested = list(state.urls), list(state.sitemaps)
        for page in listed:
            page = normalise_url(page)
            if urlsplit(page).scheme not in ("http", "https") or page in pages:
                continue
            refused = self._foreign(url, page)
            if refused:
                self.refused.append((page, refused))
            elif len(pages) < self.max_urls:
                pages[page] = None
            else:
                self.overflow += 1
        for child in nested:
            child = normalise_url(child)
            refused = self._foreign(url, child)
            if refused:
                self.refused.append((child, refused))
            else:
                self._expand_sitemap(child, pages, depth + 1)

    def scan(self, current: dict[str, DocRecord], space: str) -> _UrlScan:
        pages: dict[str, None] = {}
        for url in self.urls:
            if is_sitemap(url):
                self._expand_sitemap(url, pages, 1)
            elif len(pages) < self.max_urls:
                pages.setdefault(url, None)
            else:
                self.overflow += 1
        if self.overflow:
            self.listing_failures.append((self.name, f"{len(pages) + self.overflow} pages listed; only the first "
                                                     f"{self.max_urls} (refresh.max_urls) are kept"))
        return _UrlScan(self, list(pages), current, space, failures=self.listing_failures + self.refused)
