"""Teams text: answers and kbbot's words as Teams messages, and the cards with buttons.

- Teams reads a message's ``text`` as Markdown with some HTML. Whatever a document, the model or a person
  wrote is escaped (``neutralise``): ``&`` and ``<`` as entities, so no tag (``<at>``, ``<img>``, a link)
  is ever made of it; a mention needs an entity, and kbbot adds none;
- an answer's last message carries its sources as Teams citations (``[n]`` in the text, a citation
  entity per source: at most 20, name 80 and abstract 160 characters), the "AI generated" label when a
  model had a hand in it, and the feedback loop (👍/👎, answered by a ``message/submitAction`` invoke);
- reviewers' buttons (approving an answer, an expert's reply, a re-checked approval) are an Adaptive Card with
  ``Action.Execute`` buttons whose verb names the action and whose data names only the reply or turn
  (``card_action`` reads them back), under the message's escaped text.
"""

from __future__ import annotations

from typing import Any

from microsoft_teams.api import MessageActivityInput
from microsoft_teams.api.models import Attachment
from microsoft_teams.api.models.entity import CitationAppearance

from bot.delivery.reply import split_message
from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say
from bot.types import Answer, Citation, Outcome
from pipelines.text import detect_language

MAX_CITATIONS = 20
#: Adaptive Card action verbs (``adaptiveCard/action``): what a reviewer's button does.
EXPERT_APPROVE = "kbbot.expert.approve"
EXPERT_CAPTURE = "kbbot.expert.capture"
RECHECK_KEEP = "kbbot.recheck.keep"
RECHECK_RETIRE = "kbbot.recheck.retire"
REVIEW_APPROVE = "kbbot.review.approve"
REVIEW_WITHDRAW = "kbbot.review.withdraw"
CARD = "application/vnd.microsoft.card.adaptive"


def language_of(locale: str | None, text: str = "") -> str:
    if (locale or "").lower().startswith("zh"):
        return "zh"
    return detect_language(text) if text.strip() else "en"


def neutralise(text: str) -> str:
    """``text`` as Teams shows it literally: no HTML tag and no entity can be made of it."""
    return text.replace("&", "&amp;").replace("<", "&lt;")


def plain_parts(text: str, limit: int) -> list[str]:
    """kbbot's words (or a document's) escaped and split into messages of at most ``limit`` characters."""
    return split_message(neutralise(text), limit)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def appearance(citation: Citation) -> CitationAppearance:
    """A source as Teams shows it under ``[n]``: its title, where in it, and its link when it has one."""
    where = " · ".join(p for p in (citation.locator, citation.source) if p)
    url = citation.source if citation.source.startswith(("https://", "http://")) else None
    return CitationAppearance(name=_clip(citation.title or citation.source or "?", 80),
                              abstract=_clip(where or citation.title or "?", 160), url=url)


def answer_message(text: str, answer: Answer | None, *, last: bool, feedback: bool, review: bool = False,
                   language: str = "en") -> MessageActivityInput:
    """One message of an answer (``text`` already escaped); the last carries the citations, the AI label,
    the feedback loop and, for reviewers (``review``), "✅ Approve" under an answer offered to the answer
    cache or "↩️ Withdraw approval" under one served from it."""
    message = MessageActivityInput(text=text)
    if not last or answer is None:
        return message
    if review and answer.approvable:
        message.attachments = [buttons(review_actions(answer.trace.turn_id, approved=False, language=language))]
    elif review and answer.outcome is Outcome.CACHED and answer.approved_turn_id:
        message.attachments = [buttons(review_actions(answer.approved_turn_id, approved=True, language=language))]
    cited = sorted({c.index: c for c in answer.citations}.values(), key=lambda c: c.index)[:MAX_CITATIONS]
    for citation in cited:
        message.add_citation(citation.index, appearance(citation))
    if answer.outcome is Outcome.ANSWERED and answer.trace.model_calls:  # not passages quoted without a model
        message.add_ai_generated()
    if feedback and answer.outcome is not Outcome.ERROR and answer.trace.turn_id:
        message.add_feedback()
    return message


Actions = list[tuple[str, str, dict[str, str]]]


def card(actions: Actions, note: str = "") -> dict[str, Any]:
    """An Adaptive Card of buttons, ``(title, verb, data)`` each, under ``note`` (kbbot's words only: a
    card's text is Markdown of another kind, escaped another way)."""
    body = [{"type": "TextBlock", "text": note, "wrap": True}] if note else []
    return {"type": "AdaptiveCard", "version": "1.4", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "body": body, "actions": [{"type": "Action.Execute", "title": title, "verb": verb, "data": data}
                                      for title, verb, data in actions]}


def buttons(actions: Actions, note: str = "") -> Attachment:
    return Attachment(content_type=CARD, content=card(actions, note))


def card_message(text: str, actions: Actions) -> MessageActivityInput:
    """``text`` (escaped) and, under it, a card of its buttons."""
    message = MessageActivityInput(text=text)
    message.attachments = [buttons(actions)]
    return message


def review_actions(turn_id: str, *, approved: bool, language: str = "en") -> Actions:
    """"✅ Approve" or "↩️ Withdraw approval"; the data names only the turn."""
    if approved:
        return [(say("withdraw", language), REVIEW_WITHDRAW, {"turn": turn_id})]
    return [(say("approve", language), REVIEW_APPROVE, {"turn": turn_id})]


def expert_actions(reply_id: str, *, approve: bool, capture: bool, language: str) -> Actions:
    actions = []
    if approve:
        actions.append((say("expert_approve", language), EXPERT_APPROVE, {"reply": reply_id}))
    if capture:
        actions.append((say("expert_capture", language), EXPERT_CAPTURE, {"reply": reply_id}))
    return actions


def recheck_actions(turn_id: str, *, answered: bool, language: str = "en") -> Actions:
    actions = [(say("retire", language), RECHECK_RETIRE, {"turn": turn_id})]
    if answered:
        actions.insert(0, (say("keep_approved", language), RECHECK_KEEP, {"turn": turn_id}))
    return actions


def card_action(value: Any) -> tuple[str, dict[str, Any]]:
    """(verb, data) of an ``adaptiveCard/action`` invoke's value; ("", {}) when it has none."""
    action = getattr(value, "action", None)
    if action is None and isinstance(value, dict):
        action = value.get("action")
    if isinstance(action, dict):
        verb, data = action.get("verb"), action.get("data")
    else:
        verb, data = getattr(action, "verb", None), getattr(action, "data", None)
    return str(verb or ""), data if isinstance(data, dict) else {}


def recheck_text(request: RecheckRequest, language: str = "en") -> str:
    """A re-checked approval as reviewers read it (plain: escaped by whoever sends it)."""
    def sources(citations: list[Citation]) -> str:
        names = list(dict.fromkeys(c.label for c in citations))
        return (say("sources", language) + ": " + "; ".join(names)) if names else ""

    who = request.approver_name or request.approved_by or "?"
    lines = [say("recheck_head", language, question=_clip(request.question, 500)), "",
             say("recheck_old", language, who=who), request.old_text.strip()[:1500]]
    if old := sources(request.old_citations):
        lines.append(old)
    lines.append("")
    if request.answered:
        lines += [say("recheck_new", language, version=request.knowledge_version or "?"), request.new.text.strip()[:1500]]
        if new := sources(request.new.citations):
            lines.append(new)
    else:
        lines.append(say("recheck_unanswered", language, outcome=request.new.outcome.value))
    return "\n".join(lines)
