"""Settings of ``kbbot serve``'s one HTTP server (``server:`` in ``config/kbbot.yaml``): how long a
client may take to send a request, how many connections one address may hold, and which reverse
proxies are believed about the client they forward."""

from __future__ import annotations

import ipaddress

from pydantic import Field, IPvAnyNetwork

from bot.settings_base import Section


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
    #: Open connections one client address may hold; more are refused (429) until some close. A
    #: trusted proxy's connections are not counted: it speaks for many clients and limits them itself.
    max_connections_per_client: int = Field(32, ge=1)

    def trusts(self, address: str | None) -> bool:
        """Whether ``address`` (a peer's IP address) is one of the trusted proxies."""
        if not address or not self.trusted_proxies:
            return False
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]").split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in ipaddress.ip_network(network) for network in self.trusted_proxies)
