"""URL sources: single pages and sitemaps, fetched with conditional requests.

``UrlSource`` is a ``Source`` (``pipelines.sources.kind``): a refresh reads it as ``SourceItem`` s, one per
page. Kind ``urls`` (``URLS``): ``urls``, ``respect_robots``, ``acl``; its root is ``urls:<name>``.

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

Modules: ``fetcher`` (HTTP with its bounds), ``sitemaps``, ``robots``, and this one (``UrlSource``).

``states`` (url -> ``FetchState``) are what the caller keeps between refreshes (Redis or a file, see
``bot.knowledge.refresh``); ``updated_states`` after a scan holds the ones to keep next time.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from pydantic import StrictBool, field_validator

from pipelines.acl import Acl, readers_for
from pipelines.components.converter import HTML_SUFFIXES, PDF_SUFFIXES, TEXT_SUFFIXES
from pipelines.netguard import normalise_host
from pipelines.records import content_hash
from pipelines.sections import Texts
from pipelines.sources.fetcher import Fetcher, FetchError, FetchState, Gone, Refused, normalise_url, short_reason
from pipelines.sources.kind import AclOnlySource, ConfiguredSource, SourceContext, SourceEntry, SourceItem, named_root
from pipelines.sources.robots import Robots
from pipelines.sources.sitemaps import MAX_SITEMAP_DEPTH, is_sitemap, sitemap_urls
from pipelines.store import DocRecord

log = logging.getLogger("pipelines.sources")

_CONTENT_TYPES = {
    "text/html": ".html", "application/xhtml+xml": ".html",
    "text/markdown": ".md", "text/x-markdown": ".md",
    "text/plain": ".txt",
    "application/pdf": ".pdf",
}
_KNOWN_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES


def page_suffix(url: str, content_type: str) -> str:
    """The converter a page needs: from its Content-Type, else its URL's extension; '' if unsupported."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind in _CONTENT_TYPES:
        return _CONTENT_TYPES[kind]
    suffix = PurePosixPath(urlsplit(url).path).suffix.lower()
    if suffix in _KNOWN_SUFFIXES and kind in ("", "application/octet-stream", "binary/octet-stream"):
        return suffix
    return ""



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
            item.error = f"{type(exc).__name__}: {short_reason(exc)}"
            return item
        # Who may read it follows from where its content came from: a listed /go/x redirected to /hr/x
        # is an /hr/ page.
        item.readers = readers_for(src.acl, got.url)
        if got.status == 304:
            item.not_modified = True
            src.updated_states[url] = FetchState(got.etag, got.last_modified, state.content_hash if state else None,
                                                 final_url=got.url)
            return item
        suffix = page_suffix(url, got.content_type)
        if not suffix:
            item.error = f"unsupported content type {got.content_type or '(none)'}"
            return item
        item.suffix, item.data = suffix, got.body
        src.updated_states[url] = FetchState(got.etag, got.last_modified, content_hash(got.body), final_url=got.url)
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


class UrlSource(ConfiguredSource):
    """Pages and sitemaps as one source; ``root`` (``urls:<name>``) scopes revocation to it."""

    def __init__(self, name: str, urls: list[str], fetcher: Fetcher, *, states: dict[str, FetchState] | None = None,
                 concurrency: int = 4, max_urls: int = 10000, max_sitemaps: int = 100, robots: Robots | None = None,
                 acl: dict[str, list[str]] | None = None):
        self.name = name
        #: URL prefix -> who may read its pages (``pipelines.acl``, matched on the URL a page's redirects
        #: end at); a page no prefix covers is public to the space.
        self.acl = dict(acl or {})
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

    def run_error(self) -> str | None:
        unreachable = self.robots_unreachable
        if not unreachable:
            return None
        return ("; ".join(f"robots.txt of {host} unreachable ({why})" for host, why in unreachable.items())
                + ": not fetched this run, its pages keep their indexed versions")

    def close(self) -> None:
        self.fetcher.close()

    @property
    def root(self) -> str:
        return named_root(URLS.name, self.name)

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


class UrlSettings(SourceEntry):
    #: Pages and sitemaps (a URL ending in .xml or .xml.gz is read as a sitemap).
    urls: Texts = []
    #: Read each host's robots.txt and keep to it (Disallow, Crawl-delay); false only for hosts you own.
    respect_robots: StrictBool = True
    #: Who may read what: a URL prefix -> principals (see ``FolderSettings.acl``).
    acl: Acl = {}

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f": {url!r} is not an http:// or https:// URL")
        return urls


class UrlKind:
    name = "urls"
    label = "urls (pages and sitemaps)"
    settings = UrlSettings
    named_roots = True
    keeps_states = True

    def selected(self, entry: UrlSettings) -> bool:
        return bool(entry.urls)

    def roots(self, entry: UrlSettings) -> list[str]:
        return [named_root(self.name, entry.name)]

    def build(self, entry: UrlSettings, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> ConfiguredSource:
        if permissions_only:  # the settings' acl is all there is to read: nothing is fetched
            def page_readers(record: DocRecord) -> list[str] | None:
                state = states.get(record.doc_id)
                return readers_for(entry.acl, state.final_url) if state is not None and state.final_url else None

            # A page is matched where its redirects ended, which only a fetch tells: until a refresh has
            # fetched it since kbbot recorded that, nobody reads it.
            return AclOnlySource(self.roots(entry), page_readers,
                                 unknown="the URL its redirects end at is not known yet (the next refresh of its "
                                         "source fetches it)")
        fetcher = Fetcher(timeout_s=context.fetch_timeout_s, connect_timeout_s=context.connect_timeout_s,
                          max_bytes=context.max_bytes, user_agent=context.user_agent,
                          allow_hosts=list(context.allow_hosts))
        return UrlSource(entry.name, entry.urls, fetcher, states=states, concurrency=context.concurrency,
                         max_urls=context.max_urls, max_sitemaps=context.max_sitemaps,
                         robots=Robots(fetcher) if entry.respect_robots else None, acl=entry.acl)

    def claims(self, entry: UrlSettings, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]:
        """Its pages, configured or from its sitemaps' last listings: a page's doc id is its URL."""
        listed = {u for u in map(normalise_url, entry.urls) if not is_sitemap(u)}
        for url, state in states.items():
            listed.add(url)
            listed.update(map(normalise_url, state.urls))
        return listed & set(doc_ids)

    def capture(self, entry: UrlSettings, context: SourceContext) -> None:
        return None


URLS = UrlKind()
