"""A started runtime on one folder source, its state in memory or in Redis: the world of the knowledge
loop's security tests (expert replies, re-checks), written once."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from adapters.platforms import Settings
from bot.runtime import Runtime, build_runtime
from tests.conftest import make_settings
from tests.refresh_helpers import REDIS_URL
from tests.test_approvals import started


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> str:
    if request.param == "redis" and not REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    return request.param


@contextlib.asynccontextmanager
async def folder_runtime(state: str, tmp_path: Path, files: dict[str, str],
                         configure: Callable[[Settings, Path], None]) -> AsyncIterator[tuple[Runtime, Path]]:
    """``files`` (relative path -> text) written to ``tmp_path/docs``; ``configure(settings, docs)`` names
    the source ``docs`` and whatever else the test needs; the runtime is started and ``docs`` refreshed
    once (every file indexed)."""
    docs = tmp_path / "docs"
    for name, text in files.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text, encoding="utf-8")
    settings = make_settings(tmp_path / "kb", **({"REDIS_URL": REDIS_URL or ""} if state == "redis" else {}))
    settings.redis_prefix = f"kbbot-test:{uuid.uuid4().hex[:12]}:"
    configure(settings, docs)
    runtime = build_runtime(settings)
    async with started(settings, tmp_path / "state", runtime):
        assert (runtime.redis is not None) == (state == "redis")
        record = await runtime.refresher().run("docs")
        assert record.ok and record.added == len(files)
        yield runtime, docs
