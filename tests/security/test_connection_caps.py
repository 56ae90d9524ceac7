"""Issue 39, finding 14: the connection cap of ``kbbot serve`` counted each exact address, so a client with
an IPv6 /64 (every host is given one) opened as many connections as it had addresses, and clients spread
over many networks had no bound at all. One client is now an IPv4 address or an IPv6 /64
(``server.ipv6_client_prefix``; an IPv4-mapped address counts as its IPv4), and all clients together hold
at most ``server.max_connections`` (503). Real ``serve()``; traffic to loopback only (127.0.0.0/8 gives
distinct client addresses, ::1 one IPv6 client)."""

from __future__ import annotations

import asyncio
import logging
import socket

import httpx
import pytest

from adapters.web_guard import ClientConnections
from bot.settings.server import ServerSettings
from tests.security.test_server_guards import HALF_HEADERS, _answer, served


async def _connect(host: str, port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    writer.write(HALF_HEADERS)
    await writer.drain()
    return reader, writer


def test_a_client_is_an_ipv4_address_or_an_ipv6_64():
    settings = ServerSettings()
    assert settings.client("2001:db8:1:2::1") == settings.client("2001:db8:1:2:ffff:ffff:ffff:9") == "2001:db8:1:2::/64"
    assert settings.client("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert settings.client("::ffff:198.51.100.7") == settings.client("198.51.100.7") == "198.51.100.7"
    assert settings.client("[fe80::1%eth0]") == "fe80::/64"
    assert ServerSettings(ipv6_client_prefix=48).client("2001:db8:1:2::1") == "2001:db8:1::/48"

    connections = ClientConnections(ServerSettings(max_connections_per_client=3))
    same_64 = [f"2001:db8:1:2::{n:x}" for n in range(1, 5)]
    assert [connections.admit(a) for a in same_64[:3]] == [None] * 3
    assert connections.admit(same_64[3])[0] == "429 Too Many Requests", "a fourth address of the /64"
    assert connections.admit("2001:db8:1:3::1") is None, "another /64 is another client"
    assert [connections.admit(a) for a in ("198.51.100.7", "::ffff:198.51.100.7", "198.51.100.7")] == [None] * 3
    assert connections.admit("::ffff:198.51.100.7")[0] == "429 Too Many Requests"
    connections.release(same_64[0])
    assert connections.admit(same_64[3]) is None, "a closed connection frees its place"


async def test_all_clients_together_hold_at_most_max_connections(kb_data_dir, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kbbot.server")
    async with served(kb_data_dir, tmp_path, header_timeout_s=8, max_connections_per_client=3,
                      max_connections=5) as site:
        first = [await _connect("127.0.0.1", site.port, "127.0.0.2") for _ in range(3)]
        reader, extra = await _connect("127.0.0.1", site.port, "127.0.0.2")  # kept: a dropped writer closes
        assert await _answer(reader, 5) == "HTTP/1.1 429 Too Many Requests"
        second = [await _connect("127.0.0.1", site.port, "127.0.0.3") for _ in range(2)]
        reader, late = await _connect("127.0.0.1", site.port, "127.0.0.4")
        refused = await asyncio.wait_for(reader.read(), 5)
        assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert refused.endswith(b"The server holds all the connections it takes (server.max_connections); "
                                b"try again shortly.\n")
        assert [await _answer(r, 0.2) for r, _ in first + second] == ["open"] * 5, "the five admitted are held"
        second[0][1].close()
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.4")) as http:
            for _ in range(50):  # the server sees the close a moment later
                try:
                    if (await http.get(f"{site.url}/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail("a place freed by a closed connection is not taken")
        for writer in [w for _, w in first + second[1:]] + [extra, late]:
            writer.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("as many as all clients may hold (server.max_connections)" in m for m in messages) >= 1
    assert sum("refused a connection from 127.0.0.2: 127.0.0.2 holds 3 already" in m for m in messages) == 1


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine cannot bind ::1")
async def test_an_ipv6_client_is_capped_by_its_64_on_a_real_server(kb_data_dir, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kbbot.server")
    async with served(kb_data_dir, tmp_path, host="::1", header_timeout_s=8, max_connections_per_client=2) as site:
        held = [await _connect("::1", site.port, "::1") for _ in range(3)]
        assert await _answer(held[2][0], 5) == "HTTP/1.1 429 Too Many Requests"
        for _, writer in held:
            writer.close()
    assert any("refused a connection from ::1: ::/64 holds 2 already" in r.getMessage() for r in caplog.records)
