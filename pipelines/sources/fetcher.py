"""``Fetcher``: conditional GETs with bounded time and size, through ``pipelines.netguard``; one reason per failure."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx

from pipelines.errors import one_line
from pipelines.netguard import guarded_transport, normalise_host, refusal

MAX_REDIRECTS = 5
RAW_CHUNK = 65_536
GONE_STATUSES = (404, 410)


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
    #: Where the page's redirects ended (pages only): the URL its ``acl`` readers are matched on.
    final_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FetchState:
        return cls(etag=raw.get("etag"), last_modified=raw.get("last_modified"),
                   content_hash=raw.get("content_hash"), urls=list(raw.get("urls") or []),
                   sitemaps=list(raw.get("sitemaps") or []), final_url=raw.get("final_url"))


@dataclass
class Fetched:
    status: int  # 200 or 304
    body: bytes = b""
    content_type: str = ""
    etag: str | None = None
    last_modified: str | None = None
    url: str = ""  # where the redirects ended: what was fetched


def mb_text(n: int) -> str:
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
                    fetched = self._fetched(response, state, deadline)
                    fetched.url = url
                    return fetched
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
            raise FetchError(f"too large ({mb_text(int(declared))} > {mb_text(self.max_bytes)} limit); not downloaded")
        body, cut = self._read(response, self.max_bytes, deadline)
        if cut:
            raise FetchError(f"too large (over the {mb_text(self.max_bytes)} limit); download stopped")
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
            return f"cannot connect ({short_reason(exc)})"
        return f"{type(exc).__name__}: {short_reason(exc)}"

    def fetch_robots(self, url: str, max_bytes: int) -> tuple[int, bytes]:
        """The status and (for a 2xx) the first ``max_bytes`` of a robots.txt; ``FetchError`` when no
        answer came at all. More than five redirects answer 310 (RFC 9309: unavailable)."""
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.client.stream("GET", url, headers={"Accept-Encoding": "gzip, deflate"}) as response:
                if not 200 <= response.status_code < 300:
                    return response.status_code, b""
                # What follows the first max_bytes is not read (RFC 9309 2.5).
                return response.status_code, self._read(response, max_bytes, deadline)[0]
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



def short_reason(exc: BaseException) -> str:
    return one_line(exc, 200)


def normalise_url(url: str) -> str:
    """``url`` without surrounding space and fragment: the form URLs are compared and kept in."""
    return urldefrag(url.strip())[0]
