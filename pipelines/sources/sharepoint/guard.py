"""``pipelines.netguard`` for ``httpx.AsyncClient``: the same check (public addresses only, unless the host
is allowed by name), made where an async connection is opened. The name is resolved in a worker thread,
as the blocking resolver would otherwise stall every download of the run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from pipelines.netguard import GuardedBackend


class AsyncGuardedBackend(httpcore.AsyncNetworkBackend):
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
    """As ``pipelines.netguard.guarded_transport``, for async clients (no environment proxies either)."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    transport._pool._network_backend = AsyncGuardedBackend(allow_hosts)  # noqa: SLF001 - see guarded_transport
    return transport
