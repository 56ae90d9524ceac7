"""The kinds of source as plugins (``pipelines.sources``): an entry of ``sources:`` is read with the keys users
have always written, selects its kind by that key, and everything the refresh needs of it comes from the kind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters.platforms import load_settings
from bot.settings import SettingsError, SourceSettings
from pipelines.sources import SOURCE_KINDS
from pipelines.sources.folder import FolderCapture, FolderSource
from pipelines.sources.urls import UrlSource


def load(tmp_path: Path, sources: str) -> list[SourceSettings]:
    (tmp_path / "kb").mkdir(exist_ok=True)
    path = tmp_path / "kbbot.yaml"
    path.write_text(f"sources:\n{sources}", encoding="utf-8")
    return load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path / "data")}).sources


def test_each_kind_is_selected_by_its_own_key_with_the_keys_users_write(tmp_path: Path):
    docs, web, wiki = load(tmp_path, """
  - {name: docs, path: kb, include: ["*.md"], acl: {hr/: [group:hr]}, interval: 1h}
  - {name: web, urls: ["https://docs.example.com/a"], respect_robots: false, interval: 1h}
  - {name: wiki, confluence: {url: "https://wiki.example.com", spaces: [OPS]}, cron: "0 3 * * *"}
""")
    assert [s.kind for s in (docs, web, wiki)] == [SOURCE_KINDS["path"], SOURCE_KINDS["urls"],
                                                   SOURCE_KINDS["confluence"]]
    assert docs.kind.roots(docs) == [(tmp_path / "kb").resolve().as_posix()]
    assert web.kind.roots(web) == ["urls:web"] and wiki.kind.roots(wiki) == ["confluence:wiki"]
    assert docs.acl == {"hr/": ["group:hr"]} and web.respect_robots is False
    for kind in SOURCE_KINDS.values():  # a kind's keys are the entry's: its model joined SourceSettings
        assert kind.name in kind.settings.model_fields
        assert set(kind.settings.model_fields) <= set(SourceSettings.model_fields)


def test_an_entry_of_no_kind_or_two_is_refused_naming_every_kind(tmp_path: Path):
    labels = " or ".join(kind.label for kind in SOURCE_KINDS.values())
    with pytest.raises(SettingsError, match=re.escape(f"sources[0] (a) needs exactly one of {labels}")):
        load(tmp_path, "  - {name: a, interval: 1h}\n")
    with pytest.raises(SettingsError, match="needs exactly one of path"):
        load(tmp_path, "  - {name: a, path: kb, urls: ['https://x.example/'], interval: 1h}\n")


def test_the_kind_builds_what_a_run_reads_and_says_where_a_reply_is_captured(tmp_path: Path, monkeypatch):
    docs, web, wiki = load(tmp_path, """
  - {name: docs, path: kb, interval: 1h}
  - {name: web, urls: ["https://docs.example.com/a"], interval: 1h}
  - {name: wiki, confluence: {url: "https://wiki.example.com", cql: "label = faq", token_env: KB_TEST_NO_TOKEN}, interval: 1h}
""")
    context = load_settings(tmp_path / "kbbot.yaml", env={"KBBOT_DATA_DIR": str(tmp_path / "data")}).source_context
    assert isinstance(docs.kind.build(docs, context, {}), FolderSource)
    source = web.kind.build(web, context, {})
    assert isinstance(source, UrlSource) and source.roots == ["urls:web"]
    source.close()
    monkeypatch.delenv("KB_TEST_NO_TOKEN", raising=False)
    unread = wiki.kind.build(wiki, context, {})
    with pytest.raises(Exception, match="KB_TEST_NO_TOKEN .*is not set; nothing was read or revoked"):
        unread.scan({}, "default")
    assert isinstance(docs.kind.capture(docs, context), FolderCapture)
    assert web.kind.capture(web, context) is None
    assert wiki.kind.capture(wiki, context) is None  # selected by CQL: no space to write a draft to
