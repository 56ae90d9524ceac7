"""The deployment files: the image's entry command and health check, run as the Dockerfile states
them in this checkout's venv (no container daemon here), and the compose file's shape (plus
``docker compose config`` where that CLI exists)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.ports import free_port

DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "compose.yaml"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        current += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def exec_form(args: str) -> list[str]:
    command = json.loads(args)
    assert isinstance(command, list) and all(isinstance(a, str) for a in command), args
    return command


def image_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in stage:
        if op == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_the_image_runs_as_a_user_on_locked_dependencies_with_the_model_inside():
    steps = instructions(DOCKERFILE)
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "uv sync --frozen --no-dev" in runs  # uv.lock, exactly
    assert "load_e5().encode" in runs  # the bundled embedding model loads at build time, offline
    stage = final_stage(DOCKERFILE)
    users = [args for op, args in stage if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any(op == "HEALTHCHECK" and "/healthz" in args for op, args in stage)


@pytest.mark.timeout(600)
def test_the_entry_command_serves_and_the_health_check_passes(kb_data_dir: Path, tmp_path: Path):
    stage = final_stage(DOCKERFILE)
    command = exec_form(next(args for op, args in stage if op == "CMD"))
    health = next(args for op, args in stage if op == "HEALTHCHECK")
    check = exec_form(health.split("CMD", 1)[1].strip())
    env = image_env(stage)
    port = free_port()
    data = tmp_path / "data"
    shutil.copytree(kb_data_dir, data)  # indexed already: the start does not wait for a first refresh
    venv_bin = Path(sys.executable).parent
    # The image's environment, not the caller's: no Redis, Weaviate or tokens (embedded defaults).
    env.update(PATH=f"{venv_bin}:{os.environ['PATH']}", HOME=str(tmp_path), KBBOT_DATA_DIR=str(data),
               KBBOT_PORT=str(port))
    server = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"{command} exited {server.returncode}:\n{server.stdout.read()[-3000:]}"
            if subprocess.run(check, cwd=REPO, env=env, capture_output=True, timeout=30).returncode == 0:
                break
            assert time.monotonic() < deadline, "the health check did not pass within 300 s"
            time.sleep(1)
        server.send_signal(signal.SIGTERM)  # what `docker stop` sends
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stdout.close()


def test_the_health_check_fails_when_nothing_answers():
    stage = final_stage(DOCKERFILE)
    check = exec_form(next(args for op, args in stage if op == "HEALTHCHECK").split("CMD", 1)[1].strip())
    env = {**os.environ, "KBBOT_PORT": str(free_port())}
    assert subprocess.run(check, env=env, capture_output=True, timeout=30).returncode != 0


def test_compose_runs_replicas_on_one_redis_and_one_weaviate():
    spec = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = spec["services"]
    kbbot = services["kbbot"]
    assert kbbot["build"] == "." and kbbot["deploy"]["replicas"] >= 2
    env = kbbot["environment"]
    assert env["REDIS_URL"].startswith("redis://redis:") and env["WEAVIATE_URL"].startswith("http://weaviate:")
    assert {name: dep["condition"] for name, dep in kbbot["depends_on"].items()} == {
        "redis": "service_healthy", "weaviate": "service_healthy"}
    assert "healthcheck" in services["redis"] and "healthcheck" in services["weaviate"]
    # The Weaviate in compose is the version the tests build and run.
    version = next(line.split("=", 1)[1] for line in (REPO / "scripts" / "services.sh").read_text().splitlines()
                   if line.startswith("WEAVIATE_VERSION="))
    assert services["weaviate"]["image"].endswith(f":{version.lstrip('v')}")


@pytest.mark.skipif(subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0
                    if shutil.which("docker") else True, reason="no `docker compose` CLI on this machine")
def test_docker_compose_accepts_the_file():
    subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], check=True, timeout=60)
