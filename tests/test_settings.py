"""Settings on pydantic-settings: the same file and variables as before, each mistake one line naming its key."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from adapters.platforms import Settings, load_settings
from bot.settings import MEMORY_SPLIT, SettingsError
from tests.conftest import REPO

FIXTURES = Path(__file__).parent / "fixtures" / "settings"
#: The environment the snapshot below was taken with: every variable the settings read.
ENV = {"KBBOT_DATA_DIR": "/srv/kbbot", "WEAVIATE_URL": "https://weaviate.example:8080",
       "WEAVIATE_REPLICATION_FACTOR": "3", "WEAVIATE_CONSISTENCY": "QUORUM",
       "REDIS_SENTINELS": "10.0.0.1:26379,10.0.0.2:26379", "REDIS_MASTER_NAME": "prod",
       "SLACK_API_URL": "https://slack.example/api/", "TELEGRAM_API_URL": "https://tg.example",
       "TELEGRAM_WEBHOOK_URL": "https://kbbot.example/telegram/hook", "KBBOT_GENERATOR": "extractive",
       "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s" * 32, "TELEGRAM_BOT_TOKEN": "1:AB",
       "TELEGRAM_WEBHOOK_SECRET": "hook", "KBBOT_ADMIN_TOKEN": "a" * 24, "ANTHROPIC_API_KEY": "sk-1",
       "WEAVIATE_API_KEY": "wk", "KBBOT_API_TOKEN": "api-1"}
SECRETS = ("xoxb-1", "s" * 32, "1:AB", "a" * 24, "sk-1", "wk", "api-1")


def plain(value: Any) -> Any:
    """A settings value as JSON would hold it, secrets revealed (to compare them with the snapshot)."""
    if isinstance(value, BaseModel):
        return {name: plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return str(value) if isinstance(value, Path) else value


def contained(old: Any, new: Any, where: str = "") -> list[str]:
    """Where ``new`` differs from ``old`` on the keys ``old`` has (new keys are allowed)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{where}: {new!r} is not a mapping"]
        return [d for key, value in old.items()
                for d in (contained(value, new[key], f"{where}.{key}") if key in new else [f"{where}.{key}: missing"])]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):  # e.g. sources, each a mapping
        return [d for i, (o, n) in enumerate(zip(old, new, strict=True)) for d in contained(o, n, f"{where}[{i}]")]
    return [] if old == new else [f"{where}: {old!r} before, {new!r} now"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kbbot.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(tmp_path: Path, text: str, **env: str) -> str:
    with pytest.raises(SettingsError) as error:
        load_settings(write(tmp_path, text), env={"KBBOT_DATA_DIR": str(tmp_path), **env})
    return str(error.value)


def test_mains_settings_file_and_variables_load_as_they_did():
    """``kbbot-main.json`` is what the hand-written loader (main at f1b9907, before pydantic-settings)
    made of ``kbbot-main.yaml`` (main's config/kbbot.yaml) and ``ENV``, with dataclasses.asdict."""
    before = json.loads((FIXTURES / "kbbot-main.json").read_text(encoding="utf-8")
                        .replace("<fixtures>", str(FIXTURES.parent.resolve())))
    for key, value in before.pop("memory").items():  # the section since split: the same values, renamed
        section, new = MEMORY_SPLIT[key]
        before.setdefault(section, {})[new] = value
    for name, section in Settings().platform_sections.items():  # keys a platform's section took over
        for old, new in section.OLDER_KEYS.items():
            *parents, key = old.split(".")
            node = before
            for parent in parents:
                node = node[parent]
            before[name][new] = node.pop(key)
    settings = load_settings(FIXTURES / "kbbot-main.yaml", env=ENV)
    now = plain(settings) | {"anthropic_key_set": settings.anthropic_key_set}
    assert contained(before, now) == []
    assert [c.name for c in settings.api.callers] == ["default"]


def test_an_older_memory_section_is_read_as_approvals_and_preferences(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture):
    text = "memory:\n  approved_answers: false\n  policy_version: 2\n  preferences_ttl_days: 5\n"
    with caplog.at_level(logging.WARNING, logger="kbbot.settings"):
        settings = load_settings(write(tmp_path, text), env={"KBBOT_DATA_DIR": str(tmp_path)})
    assert (settings.approvals.enabled, settings.approvals.policy_version) == (False, "2")
    assert settings.approvals.pending_days == 7 and settings.preferences.ttl_days == 5
    assert "memory.approved_answers -> approvals.enabled" in caplog.text
    assert "memory.pending_days and approvals.pending_days both given" in refused(
        tmp_path, "memory:\n  pending_days: 3\napprovals:\n  pending_days: 4\n")
    assert "unknown setting memory.colour" in refused(tmp_path, "memory:\n  colour: red\n")


def test_an_older_files_digest_destinations_are_read_as_the_platforms(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture):
    text = "insights:\n  digest:\n    slack_channel: C0ADMINS\n    telegram_chat: -1001234\n    top: 3\n"
    with caplog.at_level(logging.WARNING, logger="kbbot.settings"):
        settings = load_settings(write(tmp_path, text), env={"KBBOT_DATA_DIR": str(tmp_path)})
    assert (settings.slack.digest_to, settings.telegram.digest_to, settings.insights.digest.top) == (
        "C0ADMINS", "-1001234", 3)
    assert "insights.digest.slack_channel -> slack.digest_to" in caplog.text
    assert "insights.digest.telegram_chat -> telegram.digest_to" in caplog.text
    assert "insights.digest.slack_channel and slack.digest_to both given; keep slack.digest_to" in refused(
        tmp_path, "insights:\n  digest:\n    slack_channel: C1\nslack:\n  digest_to: C2\n")
    assert "unknown setting insights.digest.teams_channel" in refused(
        tmp_path, "insights:\n  digest:\n    teams_channel: C1\n")


def test_bot_settings_alone_have_no_platform_section_and_read_no_platform_variable(tmp_path: Path):
    """``bot/`` knows no platform: the registry (``adapters.platforms``) adds their sections and variables."""
    from bot.settings import Settings as CoreSettings
    from bot.settings import load_settings as load_core

    assert CoreSettings.model_validate({}).platform_sections == {}
    assert set(Settings().platform_sections) == {"slack", "telegram", "teams"}
    core = load_core(write(tmp_path, ""), env={"SLACK_BOT_TOKEN": "xoxb-1", "KBBOT_DATA_DIR": str(tmp_path)})
    assert not hasattr(core, "slack")
    with pytest.raises(SettingsError, match="unknown setting slack"):
        load_core(write(tmp_path, "slack: {}\n"), env={})


def test_the_repositorys_file_loads_and_every_default_is_valid():
    assert Settings.model_validate({}).retrieval.top_k == 8
    settings = load_settings(REPO / "config" / "kbbot.yaml", env={})
    assert settings.data_dir == Path(".kbbot") and settings.store_kind == "memory" and settings.redis_url is None
    assert settings.redis_replica_acks == 0 and settings.generator_kind == "extractive"


def test_secrets_stay_out_of_repr_str_dumps_and_logs(caplog: pytest.LogCaptureFixture):
    settings = load_settings(FIXTURES / "kbbot-main.yaml", env=ENV)
    logging.getLogger("kbbot.test").warning("settings: %s / %r", settings, settings.slack)
    shown = [repr(settings), str(settings), settings.model_dump_json(), caplog.text]
    for secret in SECRETS:
        assert not any(secret in text for text in shown), secret
    assert settings.slack.bot_token.get_secret_value() == "xoxb-1"
    assert "redis+sentinel" not in repr(settings), "a Redis URL may hold a password"


@pytest.mark.parametrize(("text", "env", "message"), [
    ("insights:\n  retention: 3\n", {}, "unknown setting insights.retention (did you mean retention_days?)"),
    ("retrieval:\n  topk: 3\n", {}, "unknown setting retrieval.topk (did you mean top_k?)"),
    ("colour: red\n", {}, "unknown setting colour"),
    ("default_sources: [examples]\n", {}, "default_sources was replaced by sources:"),
    ("slack:\n  bot_token: xoxb-in-the-file\n", {},
     "slack.bot_token is read only from the environment: remove it from the file and set SLACK_BOT_TOKEN"),
    ("redis_url: redis://h:6379/0\n", {}, "redis_url is read only from the environment: remove it from the file and set REDIS_URL"),
    ("retrieval:\n  fusion: dbsf\n", {"WEAVIATE_URL": "http://127.0.0.1:1"},
     "retrieval.fusion dbsf (distribution-based score fusion) is the embedded store's; with Weaviate use"),
])
def test_a_misspelt_moved_or_secret_key_is_named_with_the_fix(tmp_path: Path, text: str, env: dict, message: str):
    assert message in refused(tmp_path, text, **env)


@pytest.mark.parametrize(("text", "env", "message"), [
    ("retrieval:\n  top_k: 0\n", {}, "retrieval.top_k must be at least 1, got 0"),
    ("retrieval:\n  top_k: many\n", {}, "retrieval.top_k must be a whole number, got 'many'"),
    ("retrieval:\n  alpha: 2\n", {}, "retrieval.alpha is 2; expected \"auto\" or a number from 0"),
    ("retrieval:\n  mode: fuzzy\n", {}, "retrieval.mode is 'fuzzy'; expected one of hybrid, bm25, vector"),
    ("indexing:\n  ocr:\n    dpi: 1200\n", {}, "indexing.ocr.dpi must be at most 600, got 1200"),
    ("generator:\n  temperature: -1\n", {}, "generator.temperature must be at least 0, got -1"),
    ("limits:\n  window_s: 0\n", {}, "limits.window_s must be positive, got 0"),
    ("slack:\n  follow_ups: 'no'\n", {}, "slack.follow_ups must be true or false, got 'no'"),
    ("slack:\n  default_spaces: drives\n", {}, "slack.default_spaces must be a non-empty list of knowledge space names"),
    ("slack:\n  claim_lease_s: 7200\n", {}, "slack.claim_lease_s must be at most slack.dedupe_ttl_s"),
    ("slack:\n  ack_reaction: ':eyes:'\n", {}, "slack.ack_reaction must be an emoji name without colons, e.g. eyes"),
    ("telegram:\n  claim_lease_s: 90000\n", {}, "telegram.claim_lease_s must be at most telegram.dedupe_ttl_s"),
    ("slack:\n  replicas: 3\n", {}, "slack.replicas is no longer a setting: replicas share Slack's rate budgets"),
    ("telegram:\n  polling_timeout_s: 90\n", {}, "telegram.polling_timeout_s must be at most 50, got 90"),
    ("ranker:\n  kind: rerank_http\n", {}, "ranker.url is required with kind rerank_http"),
    ("refresh:\n  timezone: Mars/Olympus\n", {}, "refresh.timezone 'Mars/Olympus' is not a known time zone"),
    ("", {"KBBOT_GENERATOR": "gpt"}, "KBBOT_GENERATOR is 'gpt'; expected one of auto, anthropic, openai, local, extractive"),
    ("", {"WEAVIATE_URL": "ftp://user:pw@h"}, "WEAVIATE_URL must be an http:// or https:// URL, got 'ftp://user:***@h'"),
    ("store:\n  kind: weaviate\n", {}, "store.kind is weaviate but WEAVIATE_URL is not set"),
    ("", {"KBBOT_ADMIN_TOKEN": "short"}, "KBBOT_ADMIN_TOKEN must be at least 16 characters"),
])
def test_a_bad_value_fails_in_one_line_naming_its_key_or_variable(tmp_path: Path, text: str, env: dict, message: str):
    error = refused(tmp_path, text, **env)
    assert message in error and "\n" not in error and "pydantic" not in error


def test_a_rejected_secret_is_never_quoted(tmp_path: Path):
    error = refused(tmp_path, "", KBBOT_ADMIN_TOKEN="tiny-secret")
    assert "KBBOT_ADMIN_TOKEN" in error and "tiny-secret" not in error
    assert "pw" not in refused(tmp_path, "", REDIS_URL="http://user:pw@h:6379")


def test_every_mistake_is_listed_not_only_the_first(tmp_path: Path):
    error = refused(tmp_path, "retrieval:\n  top_k: 0\n  candidates: 0\nhistory:\n  max_turns: 0\n")
    assert error.splitlines() == ["retrieval.top_k must be at least 1, got 0",
                                  "retrieval.candidates must be at least 1, got 0",
                                  "history.max_turns must be at least 1, got 0"]


def test_the_environment_overrides_the_file_and_an_empty_variable_is_unset(tmp_path: Path):
    path = write(tmp_path, "data_dir: from-file\nstore:\n  weaviate_url: http://file:8080\n"
                           "weaviate:\n  replication_factor: 2\ngenerator:\n  kind: openai\n  base_url: http://file:11434/v1\n"
                           "telegram:\n  api_url: https://file.example\n")
    from_file = load_settings(path, env={})
    assert (from_file.data_dir, from_file.store.weaviate_url, from_file.weaviate.replication_factor,
            from_file.generator.kind, from_file.telegram.api_url) == (
        Path("from-file"), "http://file:8080", 2, "openai", "https://file.example")
    over = load_settings(path, env={"KBBOT_DATA_DIR": "/env", "WEAVIATE_URL": "http://env:8080",
                                    "WEAVIATE_REPLICATION_FACTOR": "3", "KBBOT_GENERATOR": "extractive",
                                    "TELEGRAM_API_URL": "  "})
    assert (over.data_dir, over.store.weaviate_url, over.weaviate.replication_factor, over.generator.kind,
            over.telegram.api_url) == (Path("/env"), "http://env:8080", 3, "extractive", "https://file.example")


def test_load_settings_reads_only_the_environment_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-process")
    monkeypatch.setenv("KBBOT_DATA_DIR", "/process")
    isolated = load_settings(write(tmp_path, ""), env={})
    assert isolated.slack.bot_token is None and isolated.data_dir == Path(".kbbot")
    ambient = load_settings(write(tmp_path, ""))
    assert ambient.slack.bot_token.get_secret_value() == "xoxb-process"
    assert Settings().data_dir == Path("/process"), "Settings() is the defaults plus os.environ"


def test_assignments_are_checked_and_secrets_stay_secret():
    settings = Settings.model_validate({})
    settings.insights.admin_token = "t" * 24
    assert isinstance(settings.insights.admin_token, SecretStr) and "t" * 24 not in repr(settings)
    with pytest.raises(ValueError, match="top_k"):
        settings.retrieval.top_k = 0
