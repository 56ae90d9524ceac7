"""A private ``redis-server`` for tests that stop, restart or password-protect Redis (the shared
one the other tests use is left alone)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.ports import free_port


class PrivateRedis:
    def __init__(self, directory: Path, password: str | None = None):
        self.directory = directory
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", str(self.directory)]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def private_redis(tmp_path: Path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
