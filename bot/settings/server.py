"""Settings of ``kbbot serve``'s one HTTP server (``server:`` in ``config/kbbot.yaml``): how long a
client may take to send a request, how many connections one client and all may hold, and which reverse
proxies are believed about the client they forward."""

from __future__ import annotations

import ipaddress

from pydantic import Field, IPvAnyNetwork

from bot.settings.base import Section


class ServerSettings(Section):
    #: Addresses or networks (``10.0.0.0/8``) of the reverse proxies in front: only from them are
    #: ``X-Forwarded-Proto`` (https: the admin cookie is ``Secure``) and ``X-Forwarded-For`` believed.
    trusted_proxies: list[IPvAnyNetwork] = []
    #: A new connection must have sent its first request's line and headers within this many seconds.
    header_timeout_s: float = Field(10, gt=0)
    #: A request's body must have arrived within this many seconds of its headers.
    body_timeout_s: float = Field(30, gt=0)
    #: An idle kept-alive connection (or one slowly sending its next request) is closed after this;
    #: keep it above the idle timeout of the proxy in front, which reuses connections.
    keepalive_timeout_s: float = Field(75, gt=0)
    #: Open connections one client may hold (``client``: an IPv4 address, or an IPv6 /64); more are refused
    #: (429) until some close. A trusted proxy's connections are not counted: it speaks for many clients and
    #: limits them itself.
    max_connections_per_client: int = Field(32, ge=1)
    #: The IPv6 prefix one client is counted by: a host is given a whole /64 (SLAAC, privacy addresses),
    #: so it can connect from as many addresses as it likes within it.
    ipv6_client_prefix: int = Field(64, ge=16, le=128)
    #: Open connections of every client together, a trusted proxy's too; more are refused (503) until
    #: some close: clients spread over many networks cannot hold every file descriptor.
    max_connections: int = Field(1024, ge=1)

    def trusts(self, address: str | None) -> bool:
        """Whether ``address`` (a peer's IP address) is one of the trusted proxies."""
        ip = _ip(address) if self.trusted_proxies else None
        return ip is not None and any(ip in ipaddress.ip_network(network) for network in self.trusted_proxies)

    def client(self, address: str | None) -> str:
        """Who ``address`` (a peer's IP address) counts as for ``max_connections_per_client``: an IPv4
        address itself (one mapped into IPv6, ``::ffff:192.0.2.7``, as its IPv4), an IPv6 address as its
        ``ipv6_client_prefix`` network (``2001:db8:1:2::/64``); anything else as written."""
        ip = _ip(address)
        if ip is None:
            return str(address or "")
        if isinstance(ip, ipaddress.IPv4Address):
            return str(ip)
        return str(ipaddress.IPv6Network((ip, self.ipv6_client_prefix), strict=False))


def _ip(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A peer's address (``[::1]``, ``fe80::1%eth0``), an IPv4-mapped IPv6 address as its IPv4; None if none."""
    try:
        ip = ipaddress.ip_address((address or "").strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
