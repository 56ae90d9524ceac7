"""Where a knowledge refresh may connect: public addresses only, unless the host is allowed by name.

A URL source fetches what its sitemaps list and wherever its pages redirect, so without a check a
planted ``<loc>`` or a redirect could make kbbot read an internal service (a cloud metadata endpoint,
an admin page on localhost) and index it for every chat user. The check sits where sockets are
opened: the host is resolved once, every address it resolves to must be public, and the connection
goes to that vetted address. Redirect hops, robots.txt and sitemap requests all pass here, and a name
that resolves differently a moment later (DNS rebinding) cannot slip through between check and use.

``allow_hosts`` (``refresh.allow_hosts``) lists host names or address literals that may be anything,
e.g. an intranet wiki; the tests' local servers on 127.0.0.1 are allowed this way.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def address_kind(ip: Address) -> str | None:
    """Why ``ip`` is no public address ("loopback", "private", ...), or None when it is one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "multicast", "unspecified", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:  # shared address space (100.64/10), documentation ranges, ...
        return "non-public"
    return None


def normalise_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


class AddressRefused(httpcore.ConnectError):
    """A connection to a host that resolves to an address kbbot must not fetch from."""


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, connecting only to public addresses or to hosts in ``allow_hosts``."""

    def __init__(self, allow_hosts: Iterable[str] = ()):
        self.allow_hosts = frozenset(normalise_host(h) for h in allow_hosts)

    def vet(self, host: str, port: int) -> str:
        """The address to connect to for ``host``; ``AddressRefused`` when any of its addresses is not public."""
        name = normalise_host(host)
        if name in self.allow_hosts:
            return host
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {name} ({exc.strerror or exc})") from None
        addresses = list(dict.fromkeys(info[4][0].split("%", 1)[0] for info in infos))
        for text in addresses:
            kind = address_kind(ipaddress.ip_address(text))
            if kind is not None:
                raise AddressRefused(f"refused: {name} resolves to {text}, a {kind} address (add the host to "
                                     "refresh.allow_hosts to fetch it)")
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {name} (no address)")
        return addresses[0]

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        # TLS still checks the certificate against the URL's host name: httpcore passes the origin's
        # name as server_hostname, whatever address the socket was opened to.
        return super().connect_tcp(self.vet(host, port), port, timeout=timeout, local_address=local_address,
                                   socket_options=socket_options)


def guarded_transport(allow_hosts: Iterable[str] = ()) -> httpx.HTTPTransport:
    """An ``httpx`` transport whose every connection passes ``GuardedBackend``. (httpx takes no network
    backend of its own, so the pool it builds gets ours; environment proxies are not used, since a
    proxy would open the connection where no check can see it.)"""
    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool._network_backend = GuardedBackend(allow_hosts)  # noqa: SLF001 - see the docstring
    return transport


class AsyncGuardedBackend(httpcore.AsyncNetworkBackend):
    """``GuardedBackend`` for ``httpx.AsyncClient``; the name is resolved in a worker thread, as the
    blocking resolver would otherwise stall every download of the run."""

    def __init__(self, allow_hosts: Iterable[str] = ()):
        self._guard = GuardedBackend(allow_hosts)
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        address = await asyncio.to_thread(self._guard.vet, host, port)
        return await self._backend.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                               socket_options=socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not a source's to open")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def guarded_async_transport(allow_hosts: Iterable[str] = ()) -> httpx.AsyncHTTPTransport:
    """As ``guarded_transport``, for async clients."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    transport._pool._network_backend = AsyncGuardedBackend(allow_hosts)  # noqa: SLF001 - see guarded_transport
    return transport


def refusal(exc: BaseException) -> AddressRefused | None:
    """The ``AddressRefused`` behind an httpx error, if that is what stopped it."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        if isinstance(cause, AddressRefused):
            return cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


def host_allowed(host: str | None, allow_hosts: Iterable[str]) -> bool:
    return host is not None and normalise_host(host) in {normalise_host(h) for h in allow_hosts}
