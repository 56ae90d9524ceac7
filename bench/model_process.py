"""The fake model (Anthropic's wire format) served from a process of its own, for benchmarks.

A hosted model streams from someone else's machine: its work costs kbbot's process nothing. Served
from a thread of kbbot's process instead, the fake's HTTP and SSE work takes kbbot's interpreter lock
and charges the model's side to the turns being timed (at 50 answers streaming at once it was most of
a core). Spawned, not forked: the child imports only the fake, not the bot.

``requests()`` reads back what the fake saw (each request's last user text and its first and last
token times, ``time.monotonic()``, which is one clock for every process of the machine).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelRequest:
    last_user_text: str
    first_token_at: float | None
    last_token_at: float | None


def scripted_router(answer: str, tokens_per_second: float | None, first_token_delay: float,
                    helper_delay: float = 0.0) -> Any:
    """The fake model's replies: ``answer`` streamed after ``first_token_delay``; the helper calls (rewrite,
    guard, grade, reformulate) as ``tests.model_router`` answers them, after ``helper_delay`` seconds (a
    hosted model answers a short JSON request in 0.3-1 s; 0: at once, as this benchmark did before)."""
    from tests.fakes.anthropic_server import Script
    from tests.model_router import KINDS, ModelRouter, default_reply

    router = ModelRouter()
    router.responders["answer"] = lambda body: Script(answer, tokens_per_second=tokens_per_second,
                                                      first_token_delay=first_token_delay)
    if helper_delay:
        for kind in KINDS:
            router.responders[kind] = lambda body, kind=kind: Script(str(default_reply(kind, body)),
                                                                     first_token_delay=helper_delay)
    return router


def _serve(conn: Any, answer: str, tokens_per_second: float | None,
           first_token_delay: float, helper_delay: float = 0.0) -> None:  # pragma: no cover - child process
    from tests.fakes.anthropic_server import FakeAnthropic

    router = scripted_router(answer, tokens_per_second, first_token_delay, helper_delay)
    with FakeAnthropic(router).run_in_thread() as fake:
        conn.send(fake.base_url)
        while True:
            command = conn.recv()
            if command == "requests":
                conn.send([ModelRequest(getattr(r, "last_user_text", ""), r.first_token_at, r.last_token_at)
                           for r in list(fake.requests)])
            elif command == "clear":
                fake.requests.clear()
                conn.send(None)
            else:
                return


class ModelProcess:
    """``with ModelProcess(answer, ...) as model:`` ``model.base_url``, ``model.requests()``, ``model.clear()``."""

    def __init__(self, answer: str, *, tokens_per_second: float | None = None, first_token_delay: float = 0.0,
                 helper_delay: float = 0.0):
        self.args = (answer, tokens_per_second, first_token_delay, helper_delay)
        self.base_url = ""
        self._conn: Any = None
        self._process: Any = None

    def __enter__(self) -> ModelProcess:
        spawn = multiprocessing.get_context("spawn")
        self._conn, child = spawn.Pipe()
        self._process = spawn.Process(target=_serve, args=(child, *self.args), daemon=True)
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the fake model process did not start within 60 s")
        self.base_url = self._conn.recv()
        return self

    @property
    def pid(self) -> int:
        """The model process's id (``bench.cpu``)."""
        return self._process.pid

    def _ask(self, command: str) -> Any:
        self._conn.send(command)
        return self._conn.recv()

    def requests(self) -> list[ModelRequest]:
        return self._ask("requests")

    def clear(self) -> None:
        self._ask("clear")

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):  # the child is gone already
            self._conn.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
