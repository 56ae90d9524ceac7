"""What every fake server shares: an aiohttp app on an ephemeral port of 127.0.0.1, started and
stopped explicitly or with ``async with``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from aiohttp import web


class LocalServer:
    """Subclasses add their routes in ``routes`` and may set ``path`` (the API's prefix in
    ``base_url``) and ``shutdown_timeout_s`` (how long a stop waits for requests in flight)."""

    path = ""
    shutdown_timeout_s = 0.5

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._root: str | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        if self._root is None:
            raise RuntimeError(f"{type(self).__name__} is not running; call start() first")
        return self._root

    @property
    def base_url(self) -> str:
        """The URL clients are pointed at: ``root_url`` plus ``path``."""
        return self.root_url + self.path

    async def start(self) -> str:
        """Listen on an ephemeral port and return ``base_url`` (again, when already listening)."""
        if self._runner is None:
            app = web.Application()
            self.routes(app)
            runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                   shutdown_timeout=self.shutdown_timeout_s)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runner = runner
            self._root = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self._root = None

    @contextlib.contextmanager
    def run_in_thread(self) -> Iterator[Any]:
        """Serve from a background thread with its own event loop.

        Sync callers (the CLI, haystack's blocking ``run``) would block the loop a same-thread server
        needs, and a benchmark should not charge the server's work to the loop it measures. Handlers
        and responders then run on that thread; keep them free of the caller's loop objects.
        """
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=serve, name=f"{type(self).__name__} server", daemon=True)
        thread.start()
        ready.wait()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)
            yield self
        finally:
            try:
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout=10)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=10)
                loop.close()

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
