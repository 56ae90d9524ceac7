"""The clients of one Weaviate knowledge store, and what "cannot reach Weaviate" means.

A call that finds the server unreachable raises ``WeaviateUnavailable`` (naming the URL, never its
password) and marks the clients stale: the next call connects anew, because a gRPC channel that
failed keeps answering "unavailable" for its reconnect backoff (up to two minutes) even once the
server is back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import weaviate
import weaviate.exceptions as wexc
from haystack.utils import Secret
from haystack_integrations.document_stores.weaviate.auth import AuthApiKey
from weaviate.classes.config import ConsistencyLevel
from weaviate.classes.init import Auth
from weaviate.config import AdditionalConfig, GrpcConfig, Timeout

from pipelines.errors import StoreUnavailable, one_line
from pipelines.redact import redact_url, scrub
from pipelines.weaviate_store.integration import ChunkDocumentStore, with_consistency

_UNREACHABLE = (
    wexc.WeaviateConnectionError,
    wexc.WeaviateStartUpError,
    wexc.WeaviateGRPCUnavailableError,
    wexc.WeaviateTimeoutError,
    wexc.WeaviateRetryError,
    wexc.WeaviateClosedClientError,
    ConnectionError,
    TimeoutError,
)
_UNREACHABLE_MARKERS = ("unavailable", "connection refused", "failed to connect", "deadline exceeded",
                        "connect error", "connection reset", "socket closed")
# gRPC shares subchannels (and their reconnect backoff, up to two minutes) between all channels to
# one address, so even a new client keeps failing for a while after Weaviate comes back. A
# subchannel pool of its own per client and a short backoff make a restarted server usable at once.
_GRPC_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 250),
                         ("grpc.max_reconnect_backoff_ms", 2000)]


class WeaviateUnavailable(StoreUnavailable, wexc.WeaviateBaseError):
    """Weaviate could not be reached (or stopped answering); the message names the URL and the cause.

    A ``StoreUnavailable`` (the CLI reports it in one line at start; in a turn the user reads that the
    knowledge base cannot be reached) and a ``WeaviateBaseError`` (what the client's callers catch).
    """

    reason = "connection lost"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, _UNREACHABLE):
        return True
    if isinstance(exc, wexc.WeaviateBaseError):
        text = str(exc).lower()
        return any(marker in text for marker in _UNREACHABLE_MARKERS)
    return False


class Connection:
    """The sync clients (through ``document_store``) and one async client per event loop, for a chunk
    collection and its manifest collection, reconnected after the server was found unreachable.

    :param timeout_s: the client's query timeout (insert: at least 60 s).
    """

    def __init__(self, url: str, grpc_port: int, collection_settings: dict[str, Any], manifest_name: str, *,
                 timeout_s: float, api_key: str | None, consistency: ConsistencyLevel | None):
        self.url = url
        self.shown_url = redact_url(url)  # what messages say: no password
        self.grpc_port = grpc_port
        self.collection_name = collection_settings["class"]
        self.manifest_name = manifest_name
        self.consistency = consistency
        # WEAVIATE_API_KEY: the client sends it as a bearer token on HTTP and gRPC alike.
        self._auth = Auth.api_key(api_key) if api_key else None
        self._config = AdditionalConfig(timeout=Timeout(init=5, query=timeout_s, insert=max(timeout_s, 60)),
                                        grpc_config=GrpcConfig(channel_options=_GRPC_CHANNEL_OPTIONS))
        self.document_store = ChunkDocumentStore(
            url=url, collection_settings=collection_settings, grpc_port=grpc_port, additional_config=self._config,
            auth_client_secret=AuthApiKey(Secret.from_token(api_key)) if api_key else None, consistency=consistency,
        )
        self._collection: Any = None
        self._manifest: Any = None
        self._async: tuple[asyncio.AbstractEventLoop, Any, Any] | None = None
        self._connecting: asyncio.Task[Any] | None = None
        self._stale_sync = self._stale_async = False
        self._connect_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The sync client (connects, and creates the chunk collection, on first use)."""
        return self.document_store.client

    def connect(self) -> None:
        """Opens the sync client and both collections' handles (the manifest collection must exist)."""
        with self.guard():
            self._collection = self.document_store.collection
            self._manifest = with_consistency(self.client.collections.get(self.manifest_name), self.consistency)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turns 'cannot reach the server' into WeaviateUnavailable (and connects anew on the next
        call); other errors pass unchanged."""
        try:
            yield
        except WeaviateUnavailable:
            self._stale_sync = self._stale_async = True
            raise
        except Exception as exc:  # noqa: BLE001 - reclassified or re-raised below
            if is_unreachable(exc) or is_unreachable(exc.__cause__ or exc):
                self._stale_sync = self._stale_async = True
                raise WeaviateUnavailable(f"cannot reach Weaviate at {self.shown_url}: "
                                          f"{scrub(one_line(exc), self.url)}") from exc
            raise

    def _reconnect_sync(self) -> None:
        with self._connect_lock:
            if not self._stale_sync:
                return
            self.document_store.close()  # the next .client / .collection opens a new connection
            self.connect()
            self._stale_sync = False

    @property
    def collection(self) -> Any:
        """The chunk collection (sync client)."""
        if self._stale_sync:
            self._reconnect_sync()
        return self._collection

    @property
    def manifest(self) -> Any:
        """The manifest collection (sync client)."""
        if self._stale_sync:
            self._reconnect_sync()
        return self._manifest

    async def async_collection(self) -> Any:
        """The chunk collection on an async client bound to the running event loop.

        One client per loop, and one attempt at a time to connect it: the questions of a burst that find
        no client all wait for that attempt, and share its failure when Weaviate is down. (Each used to
        connect a client of its own, and all but the last leaked: the first 50 questions after a start
        paid 50 TLS contexts and version checks on the event loop, ~2.9 s of it, issue 44.)"""
        loop = asyncio.get_running_loop()
        current = self._async
        if current is not None and not self._stale_async and current[0] is loop:
            return current[2]
        attempt = self._connecting
        if attempt is None or attempt.done() or attempt.get_loop() is not loop:
            attempt = self._connecting = loop.create_task(self._connect_async(loop), name="weaviate connect")
        return await asyncio.shield(attempt)  # a caller that gives up leaves the attempt to the others

    async def _connect_async(self, loop: asyncio.AbstractEventLoop) -> Any:
        current = self._async
        if current is not None and self._stale_async:
            self._async = None
            if current[0] is loop:
                with suppress(Exception):  # the old channel is broken anyway
                    await current[1].close()
            current = None
        self._stale_async = False
        if current is not None and current[0] is loop:
            return current[2]
        with self.guard():
            client = weaviate.WeaviateAsyncClient(
                connection_params=weaviate.connect.base.ConnectionParams.from_url(self.url, self.grpc_port),
                additional_config=self._config, auth_client_secret=self._auth,
            )
            await client.connect()
        self._async = (loop, client, with_consistency(client.collections.get(self.collection_name), self.consistency))
        return self._async[2]

    def close(self) -> None:
        self.document_store.close()
        self._async = None

    async def close_async(self) -> None:
        if self._async is not None and self._async[0] is asyncio.get_running_loop():
            await self._async[1].close()
        self._async = None
