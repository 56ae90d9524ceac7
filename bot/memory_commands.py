"""The preference commands both chat adapters offer, in the user's words: ``prefs``, ``remember``, ``forget``.

Slack spells them ``/kbbot prefs …``, Telegram ``/prefs …``; the adapter passes its spelling as
``prefix``. Replies are in the user's preferred language when they set one, else in the language
the platform reports for them. Nothing here logs preference values: only ids reach the logs.
"""

from __future__ import annotations

import logging
from typing import Any

from bot.insights.recorder import TurnRecorder
from bot.preferences import PreferenceError, Preferences, PreferenceStore, apply_command

log = logging.getLogger("kbbot.preferences")

VERBS = ("prefs", "remember", "forget")

TEXTS: dict[str, dict[str, str]] = {
    "now": {
        "en": "Your answering preferences (for your questions in every thread here): {described}.",
        "zh": "您的回答偏好（适用于您在这里所有对话中的提问）：{described}。",
    },
    "remember_on": {
        "en": "OK: from now on I may pick up answering preferences you state in your messages "
              "(for example “please keep it short”). {prefix}remember off stops that and clears what I learned.",
        "zh": "好的：今后我会从您的消息中记下您明确提出的回答偏好（例如“请简短回答”）。"
              "发送 {prefix}remember off 可停止并清除已记下的内容。",
    },
    "remember_off": {
        "en": "OK: I stopped learning from your messages and cleared what I had learned. "
              "Preferences you set with {prefix}prefs stay.",
        "zh": "好的：已停止从您的消息中学习，并清除了已记下的偏好。用 {prefix}prefs 设置的偏好仍然保留。",
    },
    "forgot": {
        "en": "Done: I forgot your answering preferences and everything I had learned about them, "
              "and deleted the record of your questions.",
        "zh": "已完成：您的回答偏好以及从消息中学到的内容都已清除，您提问的记录也已删除。",
    },
    "usage": {
        "en": "Usage: {prefix}prefs concise|detailed|default · {prefix}prefs lang en|zh|auto · "
              "{prefix}prefs steps on|off|default · {prefix}remember on|off · {prefix}forget",
        "zh": "用法：{prefix}prefs concise|detailed|default（简洁/详细/默认）· {prefix}prefs lang en|zh|auto"
              "（英文/中文/随提问）· {prefix}prefs steps on|off|default（步骤编号）· "
              "{prefix}remember on|off（是否从消息中学习偏好）· {prefix}forget（全部清除）",
    },
    "failed": {
        "en": "Sorry, your preferences could not be saved right now. Please try again in a minute.",
        "zh": "抱歉，暂时无法保存您的偏好，请稍后再试。",
    },
    "unavailable": {
        "en": "Answering preferences are not available in this kbbot process.",
        "zh": "此 kbbot 进程不支持回答偏好设置。",
    },
}

_DESCRIBE = {
    "en": {"style": "style", "language": "language", "steps": "step numbers", "learning": "learning from your messages",
           "concise": "concise", "detailed": "detailed", "default": "default", "auto": "as asked",
           "lang_en": "English", "lang_zh": "Chinese", "on": "on", "off": "off", "sep": "; ", "colon": ": "},
    "zh": {"style": "风格", "language": "语言", "steps": "步骤编号", "learning": "从消息中学习偏好",
           "concise": "简洁", "detailed": "详细", "default": "默认", "auto": "随提问", "lang_en": "英文",
           "lang_zh": "中文", "on": "开", "off": "关", "sep": "；", "colon": "："},
}


def text_for(key: str, language: str, **values: Any) -> str:
    table = TEXTS[key]
    return table.get(language, table["en"]).format(**values)


def describe(prefs: Preferences, language: str) -> str:
    """The user's effective preferences in their language (learned values included)."""
    words = _DESCRIBE.get(language, _DESCRIBE["en"])
    values = prefs.effective()
    style = words.get(values.get("style") or "default", words["default"])
    lang = words[f"lang_{values['language']}"] if values.get("language") in ("en", "zh") else words["auto"]
    steps = {True: words["on"], False: words["off"]}.get(values.get("step_numbers"), words["default"])
    learning = words["on"] if prefs.remember else words["off"]
    c = words["colon"]
    return words["sep"].join([f"{words['style']}{c}{style}", f"{words['language']}{c}{lang}",
                              f"{words['steps']}{c}{steps}", f"{words['learning']}{c}{learning}"])


async def run_command(store: PreferenceStore | None, platform: str, tenant: str, user: str, words: list[str], *,
                      prefix: str, language: str = "en", turns: TurnRecorder | None = None) -> str:
    """Applies one ``prefs``/``remember``/``forget`` command of ``user`` and says what changed.

    ``language`` is the platform's hint; a language the user chose wins. ``forget`` also deletes
    the user's turn records (``turns``).
    """
    if store is None:
        return text_for("unavailable", language)
    try:
        before = await store.load(platform, tenant, user)
        language = before.effective().get("language") or language
        after, _ = apply_command(before, list(words))
        await store.save(platform, tenant, user, after)
        if words[0].lower() == "forget" and turns is not None:
            forgotten = await turns.forget(platform, tenant, user)
            log.info("%s user %s: %d turn records deleted", platform, user, forgotten)
    except PreferenceError:
        return text_for("usage", language, prefix=prefix)
    except Exception:
        log.exception("%s user %s: the preferences command failed", platform, user)
        return text_for("failed", language)
    verb = words[0].lower()
    language = after.effective().get("language") or language
    log.info("%s user %s: %s command applied", platform, user, verb)
    if verb == "forget":
        return text_for("forgot", language)
    if verb == "remember":
        return text_for("remember_on" if after.remember else "remember_off", language, prefix=prefix)
    return text_for("now", language, described=describe(after, language))
