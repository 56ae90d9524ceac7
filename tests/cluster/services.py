"""Runs ``scripts/services.sh`` cluster commands for the marked cluster tests (``make test-cluster``).

Ports come from the caller's environment (``KBBOT_CLUSTER_WEAVIATE_*``, ``KBBOT_HA_REDIS_PORT``,
``KBBOT_STATE_DIR``), so parallel runs on one machine can keep apart.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import REPO

SERVICES = REPO / "scripts" / "services.sh"


def services(*command: str, timeout: float = 300) -> str:
    """Runs ``services.sh <command...>``; returns its stdout (the env lines), raises with its stderr."""
    done = subprocess.run(["bash", str(SERVICES), *command], env=dict(os.environ), capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"services.sh {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def env_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@contextmanager
def services_up(kind: str) -> Iterator[dict[str, str]]:
    """``services.sh <kind> start`` (``cluster`` or ``redis-ha``), its env lines while in use, then ``stop``."""
    env = env_lines(services(kind, "start"))
    try:
        yield env
    finally:
        services(kind, "stop")
