"""Telegram's part of the knowledge loop (``bot/knowledge/loop``): a re-checked approval as a plain-text message
(never ``parse_mode``: a document's or model's markup stays literal) with an inline keyboard
"Keep approved" / "Retire" whose callback data carries only the turn id."""

from __future__ import annotations

from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup

from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say
from bot.types import Citation

KEEP_PREFIX = "kbkp"  # callback data: "kbkp:{turn_id}" keeps the re-checked answer, "kbrt:{turn_id}" retires
RETIRE_PREFIX = "kbrt"
ANSWER_CHARS = 1500


def _cut(text: str, limit: int = ANSWER_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sources(citations: list[Citation]) -> str:
    names = list(dict.fromkeys(c.label for c in citations))
    return ("Sources: " + "; ".join(names)) if names else ""


def recheck_text(request: RecheckRequest, language: str = "en") -> str:
    who = request.approver_name or request.approved_by or "?"
    lines = [say("recheck_head", language, question=_cut(request.question, 500)), "",
             say("recheck_old", language, who=who), _cut(request.old_text)]
    if old := _sources(request.old_citations):
        lines.append(old)
    lines.append("")
    if request.answered:
        lines += [say("recheck_new", language, version=request.knowledge_version or "?"), _cut(request.new.text)]
        if new := _sources(request.new.citations):
            lines.append(new)
    else:
        lines.append(say("recheck_unanswered", language, outcome=request.new.outcome.value))
    return "\n".join(lines)


def recheck_markup(request: RecheckRequest, language: str = "en") -> InlineKeyboardMarkup:
    row = [InlineKeyboardButton(text=say("retire", language), callback_data=f"{RETIRE_PREFIX}:{request.turn_id}")]
    if request.answered:
        row.insert(0, InlineKeyboardButton(text=say("keep_approved", language),
                                           callback_data=f"{KEEP_PREFIX}:{request.turn_id}"))
    return InlineKeyboardMarkup(inline_keyboard=[row])
