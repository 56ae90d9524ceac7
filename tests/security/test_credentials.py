"""Credentials (issue 15, finding 6): Redis over TLS (``rediss://``) with a password, Weaviate reached with
a password in its URL, and neither password nor address in ``/healthz``; no password in ``kbbot status``,
the chat ``/status`` text or the start-up errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.server import health_report
from bot.knowledge.status import format_status, knowledge_status
from bot.runtime import build_runtime
from bot.settings import SettingsError
from bot.state.redis import RedisUnavailable, connect_redis
from pipelines.store import open_store
from tests.conftest import make_settings
from tests.ports import free_port

WEAVIATE_URL = os.environ.get("WEAVIATE_URL")
PASSWORD = "s3cret-Pa55"
needs_weaviate = pytest.mark.skipif(not WEAVIATE_URL, reason="WEAVIATE_URL is not set (make test starts Weaviate)")


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server of this test's own speaking TLS only, with a password: (port, CA file)."""
    server = shutil.which("redis-server")
    if server is None or shutil.which("openssl") is None:
        pytest.skip("redis-server and openssl are needed (scripts/services.sh installs redis)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    process = subprocess.Popen([server, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                                "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                                "--tls-auth-clients", "no", "--requirepass", PASSWORD, "--save", "",
                                "--appendonly", "no", "--dir", str(tmp_path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None:
                pytest.skip("this redis-server was built without TLS")
            import time

            time.sleep(0.05)
        yield port, cert
    finally:
        process.terminate()
        process.wait(5)


async def test_rediss_urls_connect_over_tls_and_errors_hide_the_password(tls_redis):
    port, ca = tls_redis
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    client = await connect_redis(url)
    try:
        assert await client.ping()
        assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        await client.aclose()
    with pytest.raises(RedisUnavailable) as refused:
        await connect_redis(f"rediss://:wrong-{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    assert PASSWORD not in str(refused.value) and "***" in str(refused.value)
    with pytest.raises(RedisUnavailable):  # plain redis:// to a TLS port is no connection
        await connect_redis(f"redis://:{PASSWORD}@127.0.0.1:{port}/0", connect_timeout=1, retries=0)


def test_urls_of_other_schemes_are_refused_without_their_password(tmp_path: Path):
    with pytest.raises(SettingsError, match=r"REDIS_URL must be a redis://, rediss:// \(TLS\)") as bad:
        make_settings(tmp_path, REDIS_URL=f"http://user:{PASSWORD}@redis.internal:6379")
    assert PASSWORD not in str(bad.value)
    with pytest.raises(SettingsError, match="WEAVIATE_URL must be an http:// or https:// URL") as bad:
        make_settings(tmp_path, WEAVIATE_URL=f"grpc://user:{PASSWORD}@weaviate.internal")
    assert PASSWORD not in str(bad.value)


@needs_weaviate
def test_the_start_up_error_of_an_unreachable_weaviate_hides_the_password():
    with pytest.raises(Exception) as unreachable:
        open_store("weaviate", url=f"http://admin:{PASSWORD}@127.0.0.1:9", collection="SecNever")
    assert "cannot reach Weaviate at http://admin:***@127.0.0.1:9" in str(unreachable.value)
    assert PASSWORD not in str(unreachable.value)


@needs_weaviate
async def test_healthz_says_up_or_down_without_addresses_and_status_hides_passwords(tls_redis, tmp_path: Path):
    port, ca = tls_redis
    weaviate = WEAVIATE_URL.replace("http://", f"http://admin:{PASSWORD}@")
    settings = make_settings(tmp_path, WEAVIATE_URL=weaviate,
                             REDIS_URL=f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    settings.store.collection = f"Sec{uuid.uuid4().hex[:8]}"
    runtime = build_runtime(settings)
    await runtime.start()
    try:
        status, body = await health_report([], runtime)
        shown = json.dumps(body)
        assert status == 200 and body["checks"]["redis"]["status"] == "up", body
        assert body["checks"]["weaviate"]["status"] == "up"
        assert PASSWORD not in shown and "127.0.0.1" not in shown and "url" not in shown, shown

        report = await knowledge_status(settings, store=runtime.store, runs=None,
                                        redis=runtime.redis)
        assert PASSWORD not in json.dumps(report) and PASSWORD not in format_status(report)
        assert report["services"]["weaviate"]["url"].startswith("http://admin:***@")

        await runtime.redis.aclose()  # Redis goes away: down, still no address
        runtime._redis = None
        status, body = await health_report([], runtime)
        assert status == 503 and body["checks"]["redis"]["status"] == "down"
        assert PASSWORD not in json.dumps(body) and "127.0.0.1" not in json.dumps(body)
    finally:
        runtime.store.drop()
        await asyncio.sleep(0)
        await runtime.close()


@pytest.fixture
def weaviate_with_api_key(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    """A second Weaviate of this test's own that admits only an API key: (url, grpc port, key)."""
    if not WEAVIATE_URL:
        pytest.skip("WEAVIATE_URL is not set (make test starts Weaviate; its binary is reused here)")
    key = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("WEAVIATE_URL", "WEAVIATE_GRPC_PORT", "REDIS_URL")}
    http, grpc = free_port(), free_port()
    env.update(KBBOT_STATE_DIR=str(tmp_path / "state"), KBBOT_WEAVIATE_PORT=str(http),
               KBBOT_WEAVIATE_GRPC_PORT=str(grpc), KBBOT_WEAVIATE_GOSSIP_PORT=str(free_port(2)),
               KBBOT_WEAVIATE_RAFT_PORT=str(free_port(2)), KBBOT_REDIS_PORT=str(free_port()),
               AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED="false", AUTHENTICATION_APIKEY_ENABLED="true",
               AUTHENTICATION_APIKEY_ALLOWED_KEYS=key, AUTHENTICATION_APIKEY_USERS="kbbot")
    script = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"
    started = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=240)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield f"http://127.0.0.1:{http}", grpc, key
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, timeout=120)


def test_weaviate_api_key_is_sent_and_required(weaviate_with_api_key, tmp_path: Path):
    url, grpc, key = weaviate_with_api_key
    with pytest.raises(Exception) as anonymous:
        open_store("weaviate", url=url, grpc_port=grpc, collection="SecAuth")
    assert "401" in str(anonymous.value) or "nauthori" in str(anonymous.value) or "anonymous" in str(anonymous.value)
    settings = make_settings(tmp_path, WEAVIATE_URL=url, WEAVIATE_API_KEY=key)
    assert key not in repr(settings) and settings.store.weaviate_api_key.get_secret_value() == key
    store = open_store("weaviate", url=url, grpc_port=grpc, collection="SecAuth", api_key=key)
    try:
        assert store.knowledge_version == 0
    finally:
        store.drop()
        store.close()
