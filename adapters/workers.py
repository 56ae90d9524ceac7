"""``kbbot serve --workers N``: N serving processes behind one port, so that a host's cores all answer.

One interpreter runs one turn's Python at a time: in a burst of fifty questions the fiftieth waited for
the other forty-nine's retrieval, checks and model clients on one core while the others idled (issue 44).
So ``serve`` runs as many workers as the host has cores to use (``bot.turn.capacity.usable_cores``:
affinity and container quota), each an ordinary ``kbbot serve`` process:

- **One port.** Each worker binds ``KBBOT_PORT`` with ``SO_REUSEPORT``, and the kernel spreads the
  incoming connections over them: Slack's Events API, Telegram's webhook, the HTTP API, the admin page.
- **One receiver where a platform allows one connection.** Telegram answers a second ``getUpdates`` with
  409 Conflict, so worker 0 alone polls and hands each update to the workers through that port, a new
  connection each (the kernel spreads connections, not requests), at ``HANDED_PATH`` with a secret of
  this start; the polling offset moves on once a worker accepted the update, as it would for a webhook.
  Slack spreads Socket Mode events over an app's connections (up to ten), so each worker opens its own.
- **Everything they share is in Redis already**, as between replicas: history, dedupe claims, pending
  turns and their leases, the rate budgets. A worker that dies is started again, and the others take over
  its turns when their leases lapse (``bot.delivery.pending``), as they would a dead replica's.
- **Once per host**: only worker 0 runs the refresh scheduler and the weekly digest.

With the embedded defaults (the in-memory store, no ``REDIS_URL``) there is one worker: the store, the
history and the claims live in the process, and a second process would neither see nor share them.

The supervisor is this module's ``supervise``: it starts the workers, restarts one that exits (after a
pause that doubles while they keep failing at once), and passes SIGTERM/SIGINT on; it exits with a
worker's code when the workers cannot start (a settings error stops every one alike).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.errors import SettingsError
from bot.turn.capacity import usable_cores

log = logging.getLogger("kbbot.workers")

#: Where worker 0 hands the Telegram updates it polled to the workers (``adapters.telegram``).
HANDED_PATH = "/telegram/handed"
#: A worker's index and the number of workers (absent: ``serve`` runs alone).
WORKER_ENV, WORKERS_ENV, SECRET_ENV = "KBBOT_WORKER", "KBBOT_WORKERS", "KBBOT_WORKER_SECRET"
#: A worker that exits sooner than this after its start failed to start; this many such exits in a row
#: stop the supervisor (a worker that ran a while is restarted however often it ends).
EARLY_EXIT_S, EARLY_EXITS = 20.0, 5


@dataclass(frozen=True)
class Worker:
    """What a ``serve`` process is told of its place: ``index`` of ``count``, and the secret that admits
    the updates worker 0 hands on."""

    index: int = 0
    count: int = 1
    secret: str = ""
    #: The port they all listen on (worker 0 hands Telegram's updates to it).
    port: int = 0

    @property
    def alone(self) -> bool:
        return self.count == 1

    @property
    def first(self) -> bool:
        """Worker 0 runs what runs once per host: Telegram's polling, the scheduler, the digest."""
        return self.index == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Worker:
        env = os.environ if env is None else env
        if WORKERS_ENV not in env:
            return cls()
        return cls(int(env.get(WORKER_ENV, "0")), int(env[WORKERS_ENV]), env.get(SECRET_ENV, ""),
                   int(env.get("KBBOT_PORT", "0")))


def shares_state(settings: object) -> str | None:
    """None when workers can share everything (Redis and Weaviate), else why not."""
    missing = [name for name, ok in (("REDIS_URL", bool(getattr(settings, "redis_url", None))),
                                     ("WEAVIATE_URL", getattr(settings, "store_kind", "") == "weaviate")) if not ok]
    if not missing:
        return None
    return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: the embedded store, "
            "history and claims live in one process, which a second worker would neither see nor share")


def worker_count(requested: int | None, settings: object, env: Mapping[str, str] | None = None) -> int:
    """``--workers`` (else ``$KBBOT_WORKERS``, else the usable cores when the state is shared, else 1)."""
    env = os.environ if env is None else env
    if requested is None and env.get(WORKERS_ENV) and WORKER_ENV not in env:
        try:
            requested = int(env[WORKERS_ENV])
        except ValueError:
            raise SettingsError(f"{WORKERS_ENV} must be a number of workers, got {env[WORKERS_ENV]!r}") from None
    if requested is not None and requested < 1:
        raise SettingsError(f"--workers must be at least 1, got {requested}")
    why_not = shares_state(settings)
    if why_not is not None:
        if requested is not None and requested > 1:
            raise SettingsError(f"--workers {requested} needs shared state: {why_not}")
        return 1
    return requested if requested is not None else usable_cores()


def _end_with_parent() -> None:
    """In a worker, before it runs: SIGTERM when the supervisor dies, however it died (Linux's
    ``PR_SET_PDEATHSIG``), so that a killed supervisor leaves no worker behind holding the port."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def supervise(argv: Sequence[str], count: int, port: int, env: Mapping[str, str] | None = None) -> int:
    """Run ``count`` workers (``python -m adapters.cli`` + ``argv`` each) on ``port`` until SIGTERM/SIGINT;
    0, or the exit code of workers that could not start."""
    base = dict(os.environ if env is None else env)
    base.update({WORKERS_ENV: str(count), SECRET_ENV: secrets.token_hex(24), "KBBOT_PORT": str(port)})
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signum)

    def start(index: int) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-m", "adapters.cli", *argv], env={**base, WORKER_ENV: str(index)},
                                   preexec_fn=_end_with_parent)
        started[index] = time.monotonic()
        log.info("worker %d of %d started (pid %d)", index, count, process.pid)
        return process

    started: dict[int, float] = {}
    processes: dict[int, subprocess.Popen[bytes]] = {}
    #: Workers that exited, and when each starts again: the loop keeps watching the others (and a stop)
    #: while one waits out its pause, and a stop meanwhile starts nothing.
    restart_at: dict[int, float] = {}
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    early, pause, code = 0, 1.0, 0
    try:
        for index in range(count):
            processes[index] = start(index)
        while not stopping:
            time.sleep(0.2)
            for index, process in list(processes.items()):
                if stopping:
                    break
                if index in restart_at:
                    if time.monotonic() >= restart_at[index]:
                        del restart_at[index]
                        processes[index] = start(index)
                    continue
                if process.poll() is None:
                    continue
                ran = time.monotonic() - started[index]
                early = early + 1 if ran < EARLY_EXIT_S else 0
                log.error("worker %d (pid %d) exited with %s after %.0f s", index, process.pid, process.returncode, ran)
                if early >= EARLY_EXITS or process.returncode == 2:  # 2: settings or usage, the same for all
                    log.error("workers keep failing to start; stopping (see the worker's log above)")
                    code = process.returncode or 1
                    stop(signal.SIGTERM, None)
                    break
                restart_at[index] = time.monotonic() + (pause if early else 0)
                pause = min(pause * 2, 30.0) if early else 1.0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for process in processes.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return code
