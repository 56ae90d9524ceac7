"""A withdrawn grant and a live ``kbbot serve`` on the embedded store (issue 39, item 3).

The server keeps the embedded store in memory. ``kbbot refresh --permissions-only`` run beside it in
another process used to save the new readers where the server never looked: the caller whose group lost
the folder was still answered from it. Now the command refuses while a server holds the store, changes
nothing, and says how to do it; stopped, refreshed and started again, the server answers by the new
readers. A real ``kbbot serve`` process, the embedded store, no Redis or Weaviate.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from adapters.cli import embedded_store_held, main
from adapters.platforms import load_settings
from tests.conftest import REPO
from tests.ports import free_port

TOKEN = "embedded-store-token"
QUESTION = "Which pay scale are HL-M300 technicians paid on?"


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    docs = tmp_path / "docs"
    (docs / "hr").mkdir(parents=True)
    (docs / "hr" / "pay.txt").write_text("Pay scale\nHL-M300 technicians are paid on scale T4.\n", encoding="utf-8")
    (docs / "grease.txt").write_text("Bearing grease\nRegrease the HL-M300 bearings with 20 g of grease every "
                                     "3,000 hours.\n", encoding="utf-8")
    shutil.copytree(REPO / "config", tmp_path / "config")
    config = tmp_path / "config" / "kbbot.yaml"
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["store"]["kind"] = "memory"
    raw["sources"] = [{"name": "docs", "path": str(docs), "interval": "6h", "acl": {"hr/": ["group:hr"]}}]
    raw["permissions"]["principals"] = {"api:default": ["group:hr"]}
    config.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    for name in ("REDIS_URL", "WEAVIATE_URL", "ANTHROPIC_API_KEY", "SLACK_BOT_TOKEN", "TELEGRAM_BOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KBBOT_CONFIG", str(config))
    monkeypatch.setenv("KBBOT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KBBOT_API_TOKEN", TOKEN)
    return {"config": config, "data": tmp_path / "data", "log": tmp_path / "serve.log"}


@contextmanager
def serving(log: Path) -> Iterator[str]:
    """``kbbot serve`` in a process of its own (this test's environment), until it listens."""
    port = free_port()
    with log.open("a") as out:
        process = subprocess.Popen([sys.executable, "-m", "adapters.cli", "serve"], cwd=REPO,
                                   env={**os.environ, "KBBOT_PORT": str(port)}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, log.read_text(encoding="utf-8")[-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "kbbot serve did not start listening"
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ask(url: str, conversation: str) -> str:
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=120, headers={"Authorization": f"Bearer {TOKEN}"},
                       json={"model": "kbbot", "stream": False, "conversation_id": conversation,
                             "messages": [{"role": "user", "content": QUESTION}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_a_refresh_beside_a_live_server_is_refused_and_the_way_through_takes_effect(deployment, capsys):
    assert main(["refresh"]) == 0
    capsys.readouterr()
    manifest = deployment["data"] / "store" / "manifest.json"
    with serving(deployment["log"]) as url:
        before = ask(url, "c1")
        assert "T4" in before and "Pay scale" in before, before

        # The hr group loses the folder; the permissions are refreshed from another process.
        raw = yaml.safe_load(deployment["config"].read_text(encoding="utf-8"))
        raw["sources"][0]["acl"] = {"hr/": ["group:payroll"]}
        deployment["config"].write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
        saved = manifest.read_bytes()
        assert main(["refresh", "docs", "--permissions-only"]) == 2
        error = capsys.readouterr().err
        assert "kbbot serve is running on the embedded store in" in error and "nothing was changed" in error, error
        assert "/kbbot refresh [SOURCE]" in error and "/admin/sources" in error and "stop it, run this command" in error
        assert manifest.read_bytes() == saved, "the store the server holds is untouched"
        assert main(["index", str(deployment["config"].parent)]) == 2
        assert "kbbot serve is running" in capsys.readouterr().err

    # The way the message gives: stopped, refreshed, started again.
    assert main(["refresh", "docs", "--permissions-only"]) == 0
    assert "1 with new permissions" in capsys.readouterr().out
    with serving(deployment["log"]) as url:
        for conversation in ("c2", "c1"):  # a new conversation, and the one that had the answer
            after = ask(url, conversation)
            assert "T4" not in after and "Pay scale" not in after, (conversation, after)


def test_a_server_or_a_second_refresh_does_not_start_while_a_refresh_changes_the_store(deployment, capsys):
    settings = load_settings()
    with embedded_store_held(settings, "refresh"):
        assert main(["serve"]) == 2
        assert "kbbot refresh or index is changing the embedded store" in capsys.readouterr().err
        assert main(["refresh"]) == 2
        assert "another kbbot refresh or index is changing the embedded store" in capsys.readouterr().err
    with embedded_store_held(settings, "serve"), embedded_store_held(settings, "serve"):
        pass  # servers share it
