"""URL sources: single pages and sitemaps, fetched with conditional requests.

``UrlSource`` is a ``pipelines.indexing.Source``: a refresh reads it as ``SourceItem`` s, one per page.

- A URL whose path ends in ``.xml`` or ``.xml.gz`` is a sitemap (``<urlset>``, or a ``<sitemapindex>``
  of further sitemaps, up to ``MAX_SITEMAP_DEPTH`` deep); its ``<loc>`` pages join the source.
- Each URL is fetched with ``If-None-Match`` / ``If-Modified-Since`` from the validators (ETag,
  Last-Modified) of its last download, but only while the store still holds the version that download
  produced (same content hash, space and root): a 304 then costs no download, no conversion and no
  embedding. Without that version the request is unconditional, so a lost store heals itself.
- Bounded: ``connect_timeout_s`` to connect, ``timeout_s`` per URL in all (headers and body), at most
  ``max_bytes`` per body (refused from ``Content-Length`` before reading, else cut while reading).
- Every failure is one reason per URL: HTTP status, timeout, connection error, too large, unsupported
  content type, not a sitemap. A page that failed keeps its previous version; a page answering 404 or
  410 is gone and is revoked; a sitemap that failed still yields the pages it listed last time, so
  its pages are neither lost nor revoked because of it.

``states`` (url -> ``FetchState``) are what the caller keeps between refreshes (Redis or a file, see
``bot.refresh``); ``updated_states`` after a scan holds the ones to keep next time.
"""

from __future__ import annotations

import gzip
import logging
import time
import xml.etree.ElementTree as ET
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urldefrag, urlsplit

import httpx

from pipelines.components.converter import HTML_SUFFIXES, PDF_SUFFIXES, TEXT_SUFFIXES
from pipelines.indexing import SourceItem, content_hash
from pipelines.store import DocRecord

log = logging.getLogger(__name__)

MAX_SITEMAP_DEPTH = 3
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
    """Conditional GETs with bounded time and size (``httpx`` sync client; thread-safe)."""

    def __init__(self, *, timeout_s: float = 30, connect_timeout_s: float = 10, max_bytes: int = 20_000_000,
                 user_agent: str = "kbbot", transport: httpx.BaseTransport | None = None):
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            follow_redirects=True, max_redirects=5, headers={"User-Agent": user_agent}, transport=transport,
        )
        self.downloaded_bytes = 0

    def close(self) -> None:
        self.client.close()

    def fetch(self, url: str, state: FetchState | None = None) -> Fetched:
        """A 200 with the body, or a 304 (only when ``state`` carried validators); else ``FetchError``."""
        headers = {"Accept-Encoding": "gzip, deflate"}
        if state is not None and state.etag:
            headers["If-None-Match"] = state.etag
        if state is not None and state.last_modified:
            headers["If-Modified-Since"] = state.last_modified
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.client.stream("GET", url, headers=headers) as response:
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
                body = bytearray()
                # iter_bytes decodes gzip/deflate: the cap applies to what would be indexed.
                for chunk in response.iter_bytes():
                    body.extend(chunk)
                    if len(body) > self.max_bytes:
                        raise FetchError(f"too large (over the {_mb(self.max_bytes)} limit); download stopped")
                    if time.monotonic() > deadline:
                        raise FetchError(f"no complete answer within {self.timeout_s:g} s")
                self.downloaded_bytes += response.num_bytes_downloaded
                return Fetched(200, bytes(body), response.headers.get("Content-Type", ""),
                               response.headers.get("ETag"), response.headers.get("Last-Modified"))
        except FetchError:
            raise
        except httpx.TimeoutException as exc:
            what = "to connect" if isinstance(exc, httpx.ConnectTimeout) else "for an answer"
            raise FetchError(f"timed out after {self.timeout_s:g} s waiting {what}") from None
        except httpx.TooManyRedirects:
            raise FetchError("too many redirects") from None
        except httpx.ConnectError as exc:
            raise FetchError(f"cannot connect ({_short(exc)})") from None
        except httpx.HTTPError as exc:
            raise FetchError(f"{type(exc).__name__}: {_short(exc)}") from None


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


def sitemap_urls(body: bytes) -> tuple[list[str], list[str]]:
    """(pages, nested sitemaps) listed by a sitemap body (plain or gzipped); ``FetchError`` if it is none."""
    if body[:2] == b"\x1f\x8b":
        try:
            body = gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise FetchError(f"not a sitemap: the gzip data is broken ({exc})") from None
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
        state = self._validators(url)
        try:
            got = src.fetcher.fetch(url, state)
        except Gone as exc:
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
                 concurrency: int = 4, max_urls: int = 10000):
        self.name = name
        self.urls = [normalise_url(u) for u in urls]
        self.fetcher = fetcher
        self.states = dict(states or {})
        self.updated_states: dict[str, FetchState] = {}
        self.concurrency = max(1, concurrency)
        self.max_urls = max_urls
        #: Sitemap failures met while listing the pages (reported with the pages' own).
        self.listing_failures: list[tuple[str, str]] = []

    @property
    def listed_completely(self) -> bool:
        """Whether this run knows every page the source lists (no sitemap failed)."""
        return not self.listing_failures

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
            got = self.fetcher.fetch(url, state if known else None)
            if got.status == 304 and state is not None:
                listed, nested = list(state.urls), list(state.sitemaps)
                self.updated_states[url] = state
            else:
                listed, nested = sitemap_urls(got.body)
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
            if urlsplit(page).scheme in ("http", "https"):
                pages.setdefault(page, None)
        for child in nested:
            self._expand_sitemap(normalise_url(child), pages, depth + 1)

    def scan(self, current: dict[str, DocRecord], space: str) -> _UrlScan:
        pages: dict[str, None] = {}
        for url in self.urls:
            if is_sitemap(url):
                self._expand_sitemap(url, pages, 1)
            else:
                pages.setdefault(url, None)
        listed = list(pages)
        if len(listed) > self.max_urls:
            self.listing_failures.append((self.name, f"{len(listed)} pages listed; only the first {self.max_urls} "
                                                     "(refresh.max_urls) are kept"))
            listed = listed[: self.max_urls]
        return _UrlScan(self, listed, current, space, failures=list(self.listing_failures))
