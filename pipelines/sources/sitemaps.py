"""Sitemaps: ``<urlset>`` pages and ``<sitemapindex>`` sitemaps, plain or gzipped, bounded in size."""

from __future__ import annotations

import xml.etree.ElementTree as ET
import zlib
from urllib.parse import urlsplit

from pipelines.sources.fetcher import FetchError, mb_text

MAX_SITEMAP_DEPTH = 3


def is_sitemap(url: str) -> bool:
    path = urlsplit(url).path.lower()
    return path.endswith(".xml") or path.endswith(".xml.gz")



def gunzip(data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed, refusing (``FetchError``) as soon as it grows past ``max_bytes``."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise FetchError(f"not a sitemap: the gzip data is broken ({exc})") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise FetchError(f"too large: the gzipped sitemap decompresses to more than {mb_text(max_bytes)} "
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
