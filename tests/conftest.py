"""Shared fixtures: settings on a temporary data directory, and one indexed sample KB per session."""

from __future__ import annotations

import os

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from adapters.platforms import Settings, load_settings  # noqa: E402
from bot.runtime import build_runtime  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "kb"
SHARED_EVAL = REPO.parent / "shared" / "eval"


def make_settings(data_dir: Path, **env: str) -> Settings:
    """Settings from the repository's config file, isolated from the caller's environment."""
    base = {"KBBOT_DATA_DIR": str(data_dir)}
    return load_settings(REPO / "config" / "kbbot.yaml", env={**base, **env})


def settings_with_source(tmp_path: Path, entry: dict) -> Settings:
    """The repository's settings with ``entry`` as their one source, checked as at start (``SettingsError``)."""
    import yaml

    raw = yaml.safe_load((REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8"))
    raw["sources"] = [{"interval": "1h", **entry}]
    path = tmp_path / "kbbot.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path)})


def break_retrieval(runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the runtime's retriever fail as an unreachable Weaviate would."""
    from weaviate.exceptions import WeaviateConnectionError

    def unreachable(*args: object, **kwargs: object) -> None:
        raise WeaviateConnectionError("connection refused")

    retriever = runtime.answerer.pipeline.get_component("retrieve")
    monkeypatch.setattr(retriever, "run", unreachable)
    if hasattr(retriever, "run_async"):
        monkeypatch.setattr(retriever, "run_async", unreachable)


@pytest.fixture(scope="session")
def kb_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding the sample knowledge base, indexed once per test session."""
    data_dir = tmp_path_factory.mktemp("kb")
    runtime = build_runtime(make_settings(data_dir))
    report = runtime.indexer.index([EXAMPLES])
    assert not report.failed, report.failed
    return data_dir


@pytest.fixture
async def claude(kb_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(the fake Anthropic server seen through its answer requests, started runtime answering with
    Claude through it). Helper calls (rewrite, guard, grade, reformulate) get sensible defaults from
    ``tests.model_router``; ``fake.router`` scripts them."""
    from tests.fakes.anthropic_server import FakeAnthropic
    from tests.model_router import AnswerView, ModelRouter

    async with FakeAnthropic() as server:
        fake = AnswerView(server, ModelRouter())
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        settings = make_settings(kb_data_dir, ANTHROPIC_API_KEY="sk-test")
        settings.generator.max_retries = 0
        settings.generator.timeout_s = 30
        settings.generator.max_tokens = 8192  # the fake stops at max_tokens like the real API
        runtime = build_runtime(settings)
        runtime.settings.data_dir = tmp_path
        await runtime.start()
        yield fake, runtime
        await runtime.close()


@pytest.fixture
async def kb_runtime(kb_data_dir: Path, tmp_path: Path):
    """The indexed sample KB, started, with a history file of this test's own."""
    settings = make_settings(kb_data_dir)
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path  # history goes to this test's folder; the store is already open
    await runtime.start()
    yield runtime
    await runtime.close()
