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

Modules: ``fetcher`` (HTTP with its bounds), ``sitemaps``, ``robots``, ``urls`` (``UrlSource``).

``states`` (url -> ``FetchState``) are what the caller keeps between refreshes (Redis or a file, see
``bot.knowledge.refresh``); ``updated_states`` after a scan holds the ones to keep next time.
"""

from pipelines.sources.fetcher import Fetched, Fetcher, FetchError, FetchState, Gone, Refused, normalise_url
from pipelines.sources.robots import MAX_CRAWL_DELAY_S, HostRobots, Robots, RobotsRules, parse_robots, product_token
from pipelines.sources.sitemaps import MAX_SITEMAP_DEPTH, is_sitemap, sitemap_urls
from pipelines.sources.urls import UrlSource, page_suffix

__all__ = [
    "MAX_CRAWL_DELAY_S",
    "MAX_SITEMAP_DEPTH",
    "FetchError",
    "FetchState",
    "Fetched",
    "Fetcher",
    "Gone",
    "HostRobots",
    "Refused",
    "Robots",
    "RobotsRules",
    "UrlSource",
    "is_sitemap",
    "normalise_url",
    "page_suffix",
    "parse_robots",
    "product_token",
    "sitemap_urls",
]
