"""What ``kbbot serve``'s HTTP server enforces before any route sees a request.

Every route is open to the network, several of them before authentication (Slack's events, the
Telegram webhook, the admin login), so the server itself bounds what a stranger can hold or break:

- **connections**: one client (an IPv4 address; an IPv6 /64, ``server.ipv6_client_prefix``, as a host
  may use any address of its /64) holds at most ``server.max_connections_per_client`` open connections
  (more are answered 429 and closed), all clients together at most ``server.max_connections`` (more
  are answered 503 and closed), and a new connection must have sent its first
  request's line and headers within ``server.header_timeout_s`` (else 408 and closed). aiohttp has
  no such bound of its own; its keep-alive timer (``server.keepalive_timeout_s``) closes a connection
  that idles, or sends its next request slowly, after a response. A trusted proxy's connections are
  not counted per address: they carry many clients, whom the proxy limits (docs/deploy.md).
- **bodies**: a request's body must arrive within ``server.body_timeout_s`` (else 408); it is read
  once here, so Bolt, aiogram and the API handlers read it from memory. Its size is aiohttp's
  ``client_max_size`` (1 MiB, or ``api.max_body_kb`` when larger).
- **input no handler expects**: JSON nested deeper than Python's parser goes (it raises
  ``RecursionError`` in whichever handler parses it), a body that is no text in its charset, or an
  unknown charset, is a 400, not a 500 with a traceback.
- **forwarded requests**: from a ``server.trusted_proxies`` address, ``X-Forwarded-Proto`` and
  ``X-Forwarded-For`` say the request's scheme and client (so the admin cookie is ``Secure`` behind
  a TLS-terminating proxy); from anyone else they are ignored.

Each refusal is one log line (at most one a minute per client address, kind and route, so a flood
does not flood the log).
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from collections import Counter
from typing import Any

from aiohttp import web

from bot.settings.server import ServerSettings

log = logging.getLogger("kbbot.server")

_DEFAULT_MAX_BODY = 1024**2  # aiohttp's own client_max_size
_SCHEMES = ("http", "https")


class RefusalLog:
    """One warning per (kind, client address) per ``interval_s``; the rest are counted into the next."""

    def __init__(self, interval_s: float = 60.0, clock: Any = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._quiet: Counter[tuple[str, str]] = Counter()

    def warn(self, kind: str, address: str, message: str, *args: Any) -> None:
        key, now = (kind, address), self.clock()
        if now - self._last.get(key, -self.interval_s) < self.interval_s:
            self._quiet[key] += 1
            return
        self._last[key] = now
        if len(self._last) > 10_000:  # many addresses: forget the old ones rather than grow
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            self._quiet = Counter({k: n for k, n in self._quiet.items() if k in self._last})
        quiet = self._quiet.pop(key, 0)
        log.warning(message + (f" (and {quiet} more like it since the last line)" if quiet else ""), *args)


# --- connections ----------------------------------------------------------------------------------
def _response(status: str, text: str = "") -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


_PER_CLIENT = ("429 Too Many Requests",
               "Too many open connections from your network (server.max_connections_per_client).\n")
_ALL = ("503 Service Unavailable", "The server holds all the connections it takes (server.max_connections); "
        "try again shortly.\n")


class ClientConnections:
    """The open connections of each client (``ServerSettings.client``) and of all, across the server's sites."""

    def __init__(self, settings: ServerSettings, refusals: RefusalLog | None = None):
        self.settings = settings
        self.refusals = refusals or RefusalLog()
        self.open: Counter[str] = Counter()
        self.total = 0

    def admit(self, address: str) -> tuple[str, str] | None:
        """None when a new connection from ``address`` is admitted (``release`` it when it closes), else the
        status and text it is refused with."""
        if self.total >= self.settings.max_connections:
            self.refusals.warn("all connections", "", "server: refused a connection from %s: %d open, as many as "
                               "all clients may hold (server.max_connections)", address, self.total)
            return _ALL
        if not self.settings.trusts(address):
            client = self.settings.client(address)
            if self.open[client] >= self.settings.max_connections_per_client:
                self.refusals.warn("connections", client, "server: refused a connection from %s: %s holds %d "
                                   "already (server.max_connections_per_client)", address, client, self.open[client])
                return _PER_CLIENT
            self.open[client] += 1
        self.total += 1
        return None

    def release(self, address: str) -> None:
        self.total = max(0, self.total - 1)
        if self.settings.trusts(address):
            return
        client = self.settings.client(address)
        if self.open[client] > 0:
            self.open[client] -= 1
            if not self.open[client]:
                del self.open[client]


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted by ``ClientConnections`` and closed when its
    first request's headers do not arrive in time."""

    def __init__(self, inner: Any, connections: ClientConnections):
        self.inner = inner
        self.connections = connections
        self.address: str | None = None  # set once admitted
        self.transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen while waiting for the end of the headers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        refused = self.connections.admit(address)
        if refused is not None:
            transport.write(_response(*refused))
            transport.close()
            return
        self.address = address
        self._deadline = asyncio.get_running_loop().call_later(self.connections.settings.header_timeout_s,
                                                               self._headers_late)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.address is None:
            return
        if self._deadline is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self._deadline.cancel()
                self._deadline = None
            else:
                self._tail = seen[-3:]
        self.inner.data_received(data)

    def _headers_late(self) -> None:
        self._deadline = None
        assert self.transport is not None and self.address is not None
        self.connections.refusals.warn("headers", self.address, "server: closed a connection from %s: no request "
                                       "headers within %g s (server.header_timeout_s)", self.address,
                                       self.connections.settings.header_timeout_s)
        self.transport.write(_response("408 Request Timeout"))
        self.transport.close()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.address is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self.address is not None:
            self.connections.release(self.address)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.address is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.address is not None:
            self.inner.resume_writing()


class _GuardedServer:
    """aiohttp's ``Server`` (the protocol factory a site listens with), each protocol guarded."""

    def __init__(self, server: web.Server, connections: ClientConnections):
        self._server = server
        self._connections = connections

    def __call__(self) -> _GuardedConnection:
        return _GuardedConnection(self._server(), self._connections)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` whose sites (``web.TCPSite`` and the like take the runner's ``server`` as the
    protocol factory) admit connections through ``ClientConnections``."""

    def __init__(self, app: web.Application, settings: ServerSettings, **kwargs: Any):
        super().__init__(app, keepalive_timeout=settings.keepalive_timeout_s, **kwargs)
        self.connections = ClientConnections(settings)

    @property
    def server(self) -> Any:
        server = super().server
        return None if server is None else _GuardedServer(server, self.connections)


# --- requests -------------------------------------------------------------------------------------
def max_body_bytes(api_max_body_kb: int | None) -> int:
    """aiohttp's ``client_max_size`` for the web app: its own 1 MiB, or the API's larger limit."""
    return max(_DEFAULT_MAX_BODY, (api_max_body_kb or 0) * 1024)


def _route(request: web.Request) -> str:
    """The route's pattern (``/v1/ask``, ``/admin/turns/{turn_id}``), so a refusal is logged once a
    minute per route and client however the path is spelled; "unrouted" for a path of no route."""
    resource = getattr(getattr(request.match_info, "route", None), "resource", None)
    return resource.canonical if resource is not None else "unrouted"


def _known_charset(name: str) -> bool:
    try:
        codecs.lookup(name)
    except LookupError:
        return False
    return True


def _forwarded_client(request: web.Request, settings: ServerSettings) -> str | None:
    """The client a trusted proxy forwarded the request for: the last ``X-Forwarded-For`` address
    that is no trusted proxy itself (the ones before it are the client's to write)."""
    chain = [a.strip() for value in request.headers.getall("X-Forwarded-For", []) for a in value.split(",")]
    for address in reversed([a for a in chain if a]):
        if not settings.trusts(address):
            return address
    return None


def middlewares(settings: ServerSettings, refusals: RefusalLog | None = None) -> list[Any]:
    """The web app's outermost middlewares, in order: forwarded requests, then bodies and bad input."""
    refusals = refusals or RefusalLog()

    @web.middleware
    async def forwarded(request: web.Request, handler: Any) -> web.StreamResponse:
        if not settings.trusts(request.remote):
            return await handler(request)
        changes: dict[str, str] = {}
        scheme = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
        if scheme in _SCHEMES:
            changes["scheme"] = scheme
        client = _forwarded_client(request, settings)
        if client:
            changes["remote"] = client
        return await handler(request.clone(**changes) if changes else request)

    def refuse(request: web.Request, kind: str, problem: str) -> None:
        refusals.warn(f"{kind} {_route(request)}", request.remote or "", "server: refused %s %s from %s: %s",
                      request.method, request.path, request.remote, problem)

    @web.middleware
    async def bounded(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.body_exists:
            try:
                async with asyncio.timeout(settings.body_timeout_s):
                    await request.read()  # kept: the handler's read() returns it
            except web.HTTPRequestEntityTooLarge:
                refuse(request, "size", f"the body is larger than {request.client_max_size} bytes")
                raise
            except TimeoutError:
                refuse(request, "slow", f"the body did not arrive within {settings.body_timeout_s:g} s "
                                        "(server.body_timeout_s)")
                raise web.HTTPRequestTimeout(text="The request body did not arrive in time.\n",
                                             headers={"Connection": "close"}) from None
        try:
            if request.charset and not _known_charset(request.charset):
                raise UnicodeError(f"unknown charset {request.charset[:40]!r}")
            return await handler(request)
        except RecursionError:
            kind, problem = "nesting", "its JSON nests too deeply"
        except UnicodeError as exc:  # the body is no text in its charset (handlers decode it to parse it)
            kind, problem = "text", f"its body is not readable text ({str(exc)[:80]})"
        refuse(request, kind, problem)
        raise web.HTTPBadRequest(text=f"Bad request: {problem}.\n")

    return [forwarded, bounded]
