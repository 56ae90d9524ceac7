"""Slack's part of the knowledge loop (``bot/knowledge/loop``): a re-checked approval as a message with "Keep
approved" and "Retire" (Block Kit buttons, like the approval buttons: the value is only the turn id,
the server holds both answers), and plain messages to the reviewers (golden set failures).

Everything shown from a document or a model (question, answers, source titles) is escaped for mrkdwn
and its mentions made inert.
"""

from __future__ import annotations

from typing import Any

from adapters.slack.text import mrkdwn_escape, neutralise, review_note, sources_block
from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say

KEEP_ACTION = "kbbot_recheck_keep"
RETIRE_ACTION = "kbbot_recheck_retire"
RECHECK_BLOCK = "kbbot_recheck"
#: Each answer shown in full up to this (a section holds 3000 characters).
ANSWER_CHARS = 2400


def _safe(text: str, limit: int = ANSWER_CHARS) -> str:
    text = text.strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return mrkdwn_escape(neutralise(text))


def recheck_buttons(turn_id: str, *, keepable: bool, language: str = "en") -> dict[str, Any]:
    retire = {"type": "button", "action_id": RETIRE_ACTION, "value": turn_id, "style": "danger",
              "text": {"type": "plain_text", "text": say("retire", language), "emoji": True}}
    keep = {"type": "button", "action_id": KEEP_ACTION, "value": turn_id, "style": "primary",
            "text": {"type": "plain_text", "text": say("keep_approved", language), "emoji": True}}
    return {"type": "actions", "block_id": RECHECK_BLOCK, "elements": [keep, retire] if keepable else [retire]}


def recheck_blocks(request: RecheckRequest, language: str = "en") -> list[dict[str, Any]]:
    """The question, the approved answer with its sources, the new one with its sources, the buttons."""
    def section(text: str) -> dict[str, Any]:
        return {"type": "section", "text": {"type": "mrkdwn", "text": text}}

    who = _safe(request.approver_name or request.approved_by, 80) or "?"
    blocks = [section(say("recheck_head", language, question=f"*{_safe(request.question, 500)}*")),
              section(f"*{say('recheck_old', language, who=who)}*\n{_safe(request.old_text)}")]
    if (old_sources := sources_block(request.old_citations)) is not None:
        blocks.append(old_sources)
    version = request.knowledge_version or "?"
    if request.answered:
        blocks.append(section(f"*{say('recheck_new', language, version=version)}*\n{_safe(request.new.text)}"))
        if (new_sources := sources_block(request.new.citations)) is not None:
            blocks.append(new_sources)
    else:
        blocks.append(section(say("recheck_unanswered", language, outcome=request.new.outcome.value)))
    blocks.append(recheck_buttons(request.turn_id, keepable=request.answered, language=language))
    return blocks


def decided_blocks(current: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """The message after a decision: the buttons replaced by who decided what."""
    return [*[b for b in current if b.get("block_id") != RECHECK_BLOCK], review_note(note)]


def recheck_text(request: RecheckRequest, language: str = "en") -> str:
    """The notification's plain text (what a push notification shows)."""
    return say("recheck_notice", language, question=neutralise(request.question)[:200])
