"""kbbot's own words (``bot.messages``): every message in English and Chinese, each filled in alike."""

from __future__ import annotations

import string

import pytest

from bot.knowledge.insights.digest import digest_text
from bot.knowledge.loop.owners import owner_text
from bot.knowledge.status import format_status
from bot.messages import MESSAGES, say


def fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


@pytest.mark.parametrize("key", sorted(MESSAGES))
def test_every_message_is_in_english_and_chinese_and_fills_in(key: str):
    table = MESSAGES[key]
    assert set(table) == {"en", "zh"}
    assert all(text.strip() for text in table.values())
    values = dict.fromkeys(fields(table["en"]) | fields(table["zh"]), 1)
    for language in ("en", "zh"):
        assert say(key, language, **values)


def test_chinese_has_no_english_sentence_of_its_own():
    """A Chinese text is not a copy of the English one (a key added with only one language filled in twice)."""
    copies = [key for key, table in MESSAGES.items() if table["zh"] == table["en"]]
    assert copies == []


def test_status_digest_and_owners_lists_speak_the_asked_language():
    status = {"knowledge_version": 3, "services": {"weaviate": {"status": "ok"}, "redis": {"status": "ok"}},
              "sources": [{"name": "docs", "documents": 2, "chunks": 5, "last_run": None, "next_run": None}]}
    assert format_status(status) == "Knowledge version 3 · Weaviate ok · Redis ok\n• docs: 2 documents, 5 chunks; " \
                                    "never refreshed"
    assert format_status(status, language="zh") == "知识版本 3 · Weaviate ok · Redis ok\n• docs：2 个文档，5 个分块；从未刷新"
    report = {"since": "2024-01-01T00", "until": "2024-01-08T00", "answer_rate": 0.5, "feedback": {"up": 1, "down": 0},
              "turns": 4, "gaps": [], "disliked": []}
    assert digest_text(report, language="zh").splitlines()[:4] == [
        "kbbot 每周摘要（2024-01-01 – 2024-01-08）", "共 4 个问题，已回答 50%，1 👍 / 0 👎。", "", "本周所有问题都已回答。"]
    gaps = [{"representative": "q", "count": 2, "questions": ["q"], "nearest": [{"withheld": True}]}]
    assert owner_text(gaps, since="2024-01-01", until="2024-01-08", language="zh").splitlines()[2:] == [
        "1. q — 被问 2 次", "   最接近：一份您无权阅读的文档（已隐去）"]
