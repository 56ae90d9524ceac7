"""The preference commands both chat adapters offer, in the user's words: ``prefs``, ``remember``, ``forget``.

Slack spells them ``/kbbot prefs …``, Telegram ``/prefs …``; the adapter passes its spelling as
``prefix``. Replies are in the user's preferred language when they set one, else in the language
the platform reports for them. Nothing here logs preference values: only ids reach the logs.
"""

from __future__ import annotations

import logging

from bot.messages import say
from bot.state.preferences import PreferenceError, Preferences, PreferenceStore, apply_command
from bot.state.turn_log.recorder import TurnRecorder

log = logging.getLogger("kbbot.preferences")

VERBS = ("prefs", "remember", "forget")

_DESCRIBE = {
    "en": {"style": "style", "language": "language", "steps": "step numbers", "learning": "learning from your messages",
           "follow_ups": "follow-ups when the knowledge base learns an answer",
           "concise": "concise", "detailed": "detailed", "default": "default", "auto": "as asked",
           "lang_en": "English", "lang_zh": "Chinese", "on": "on", "off": "off", "sep": "; ", "colon": ": "},
    "zh": {"style": "风格", "language": "语言", "steps": "步骤编号", "learning": "从消息中学习偏好",
           "follow_ups": "知识库补充后回复之前未答的问题",
           "concise": "简洁", "detailed": "详细", "default": "默认", "auto": "随提问", "lang_en": "英文",
           "lang_zh": "中文", "on": "开", "off": "关", "sep": "；", "colon": "："},
}


def describe(prefs: Preferences, language: str) -> str:
    """The user's effective preferences in their language (learned values included)."""
    words = _DESCRIBE.get(language, _DESCRIBE["en"])
    values = prefs.effective()
    style = words.get(values.get("style") or "default", words["default"])
    lang = words[f"lang_{values['language']}"] if values.get("language") in ("en", "zh") else words["auto"]
    steps = {True: words["on"], False: words["off"]}.get(values.get("step_numbers"), words["default"])
    learning = words["on"] if prefs.remember else words["off"]
    follow = words["on"] if prefs.follow_ups.get("*", True) else words["off"]
    c = words["colon"]
    return words["sep"].join([f"{words['style']}{c}{style}", f"{words['language']}{c}{lang}",
                              f"{words['steps']}{c}{steps}", f"{words['learning']}{c}{learning}",
                              f"{words['follow_ups']}{c}{follow}"])


async def run_command(store: PreferenceStore | None, platform: str, tenant: str, user: str, words: list[str], *,
                      prefix: str, language: str = "en", turns: TurnRecorder | None = None, channel: str = "") -> str:
    """Applies one ``prefs``/``remember``/``forget`` command of ``user`` and says what changed.

    ``language`` is the platform's hint; a language the user chose wins. ``forget`` also deletes
    the user's turn records (``turns``). ``channel`` is where the command was given: ``prefs followups
    off here`` mutes follow-ups (``bot.knowledge.loop``) there only.
    """
    if store is None:
        return say("prefs_unavailable", language)
    try:
        before = await store.load(platform, tenant, user)
        language = before.effective().get("language") or language
        after, _ = apply_command(before, list(words), channel=channel)
        await store.save(platform, tenant, user, after)
        if words[0].lower() == "forget" and turns is not None:
            forgotten = await turns.forget(platform, tenant, user)
            log.info("%s user %s: %d turn records deleted", platform, user, forgotten)
    except PreferenceError:
        return say("prefs_usage", language, prefix=prefix)
    except Exception:
        log.exception("%s user %s: the preferences command failed", platform, user)
        return say("prefs_failed", language)
    verb = words[0].lower()
    language = after.effective().get("language") or language
    log.info("%s user %s: %s command applied", platform, user, verb)
    if verb == "forget":
        return say("prefs_forgot", language)
    if verb == "remember":
        return say("prefs_remember_on" if after.remember else "prefs_remember_off", language, prefix=prefix)
    if len(words) > 2 and words[1].lower() in ("followups", "follow-ups"):
        here = [w.lower() for w in words[3:]] == ["here"]
        key = ("prefs_follow_ups_on" if after.wants_follow_ups(channel if here else "*") else "prefs_follow_ups_off")
        return say(key + ("_here" if here else ""), language, prefix=prefix)
    return say("prefs_now", language, described=describe(after, language))
