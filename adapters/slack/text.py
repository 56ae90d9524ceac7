"""Slack text and blocks: how kbbot reads a question and what it writes into the thread's messages.

- ``neutralise``: ``<!channel>``, ``<!here>``, ``<!everyone>``, group and user mentions written by the
  model are defused (still readable, never a ping); ``stable_prefix``: the part of a still-growing text
  that may be streamed (later tokens cannot turn it into a mention);
- ``question_text``: the question in a Slack message, the bot's mention removed and markup made plain;
- the final message's blocks (``final_blocks``): the sources as a context block numbered like the
  ``[n]`` markers, Slack's 👍/👎 feedback buttons, and for reviewers "✅ Approve" under an answer
  offered to the answer cache or "Withdraw approval" under one served from it (``reviewed_blocks``
  then shows who approved), in the words of the catalogue (``bot.messages``).
"""

from __future__ import annotations

import re
from typing import Any

from bot.conversation import ReviewStatus
from bot.messages import MESSAGES, say
from bot.types import Answer, Citation, Outcome

FEEDBACK_ACTION = "kbbot_feedback"
APPROVE_ACTION = "kbbot_approve"
WITHDRAW_ACTION = "kbbot_withdraw"
REVIEW_BLOCK = "kbbot_review"  # block ids of the review buttons and of the note saying who approved
REVIEW_NOTE_BLOCK = "kbbot_review_note"

_WORD_JOINER = "\u2060"  # invisible; keeps "@channel" from being read as a mention
_SPECIAL_MENTION = re.compile(r"<!(channel|here|everyone)(?:\|[^>]*)?>", re.IGNORECASE)
_GROUP_MENTION = re.compile(r"<!subteam\^[A-Za-z0-9]+(?:\|@?([^>]*))?>")
_USER_MENTION = re.compile(r"<@([UWB][A-Za-z0-9]+)(?:\|([^>]*))?>")
_BARE_MENTION = re.compile(r"(?<![\w@])@(channel|here|everyone)\b", re.IGNORECASE)
_OPEN_TAG = re.compile(r"<[^>\n]*$")
_OPEN_AT = re.compile(r"@\w*$")


def neutralise(text: str) -> str:
    """Model text with broadcast, group and user mentions made inert (still readable, never a ping)."""
    text = _SPECIAL_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1)}", text)
    text = _GROUP_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1) or 'group'}", text)
    text = _USER_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(2) or m.group(1)}", text)
    return _BARE_MENTION.sub(lambda m: f"@{_WORD_JOINER}{m.group(1)}", text)


def stable_prefix(text: str) -> str:
    """The part of a still-growing text that later tokens cannot turn into a mention.

    Streams are append-only, so what is sent must already be final: an unclosed ``<…`` or a trailing
    ``@word`` waits for more text, and the last character is always kept for the final call (which
    then never has an empty delta).
    """
    prefix = text[:-1]
    while True:
        cut = len(prefix)
        for pattern in (_OPEN_TAG, _OPEN_AT):
            found = pattern.search(prefix)
            if found:
                cut = min(cut, found.start())
        if cut == len(prefix):
            return prefix
        prefix = prefix[:cut]


def question_text(text: str, bot_user_id: str | None) -> str:
    """The question in a Slack message: the bot's mention removed, Slack markup made plain."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    text = re.sub(r"<(https?://[^|>]+)\|([^>]+)>", r"\2 (\1)", text)
    text = re.sub(r"<(https?://[^>]+)>", r"\1", text)
    text = re.sub(r"<#[A-Z0-9]+\|([^>]*)>", r"#\1", text)
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return re.sub(r"[ \t]+", " ", text).strip()


def mrkdwn_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def sources_block(citations: list[Citation], *, max_chars: int = 2900) -> dict[str, Any] | None:
    """The sources as one compact context block: ``[n] title`` linked when the source is a URL."""
    if not citations:
        return None
    elements: list[dict[str, Any]] = []
    current = "*Sources*"
    for c in citations:
        title = c.label
        if len(title) > 120:
            title = title[:119] + "…"
        title = mrkdwn_escape(title).replace("|", "¦")
        if c.url and "|" not in c.url and ">" not in c.url:
            entry = f"[{c.index}] <{c.url}|{title}>"
        else:
            entry = f"[{c.index}] {title}"
        candidate = f"{current}  ·  {entry}" if current != "*Sources*" else f"{current}  {entry}"
        if len(candidate) > max_chars and len(elements) < 9:
            elements.append({"type": "mrkdwn", "text": current})
            current = entry
        else:
            current = candidate
    elements.append({"type": "mrkdwn", "text": current[:max_chars]})
    return {"type": "context", "elements": elements[:10]}


def feedback_block(turn_id: str) -> dict[str, Any]:
    """Slack's native 👍/👎 feedback buttons; each click carries the turn id."""
    def button(emoji: str, label: str, value: str) -> dict[str, Any]:
        return {"text": {"type": "plain_text", "text": emoji, "emoji": True}, "accessibility_label": label,
                "value": f"{value}:{turn_id}"}

    return {"type": "context_actions", "elements": [{
        "type": "feedback_buttons", "action_id": FEEDBACK_ACTION,
        "positive_button": button("👍", "This answer helped", "up"),
        "negative_button": button("👎", "This answer did not help", "down"),
    }]}


def review_text(status: ReviewStatus, language: str = "en", **values: str) -> str:
    """The catalogue's words for a review's outcome; with ``user`` (a mention), the note under the
    answer that says who approved or withdrew it."""
    key = f"review_{status.value}"
    if "user" in values and f"{key}_by" in MESSAGES:
        key = f"{key}_by"
    return say(key, language, **values)


def review_block(turn_id: str, *, approved: bool, language: str = "en") -> dict[str, Any]:
    """"✅ Approve" (not yet approved) or "Withdraw approval"; the value is only the turn id."""
    if approved:
        button = {"type": "button", "action_id": WITHDRAW_ACTION, "value": turn_id, "style": "danger",
                  "text": {"type": "plain_text", "text": say("withdraw", language), "emoji": True}}
    else:
        button = {"type": "button", "action_id": APPROVE_ACTION, "value": turn_id, "style": "primary",
                  "text": {"type": "plain_text", "text": say("approve", language), "emoji": True}}
    return {"type": "actions", "block_id": REVIEW_BLOCK, "elements": [button]}


EXPERT_APPROVE_ACTION = "kbbot_expert_approve"
EXPERT_CAPTURE_ACTION = "kbbot_expert_capture"
EXPERT_BLOCK = "kbbot_expert"
#: What one section block's text may hold (Slack's limit).
SECTION_CHARS = 3000


def expert_blocks(reply: dict[str, Any], *, capture: bool, approve: bool, language: str = "en") -> list[dict[str, Any]]:
    """What a reviewer sees of an expert's reply: who answered which question, the reply (quoted, escaped:
    anyone wrote it), and "Save as approved answer" / "Add to the knowledge base" naming the reply's id."""
    head = say("expert_offer", language, author=f"<@{reply['author']}>",
               question=mrkdwn_escape(neutralise(" ".join(reply["question"].split())[:300])))
    # The whole reply, as it is kept (``ExpertReplies.kept_text``, at most ``MAX_REPLY_CHARS``): escaped it may
    # outgrow one section's 3,000 characters, so it takes as many as it needs.
    quoted = ["> " + line for line in mrkdwn_escape(neutralise(reply["text"])).splitlines()]
    sections = [head]
    for line in quoted:
        while len(line) > SECTION_CHARS:
            cut = SECTION_CHARS
            amp = line.rfind("&", cut - 5, cut)  # not inside an escape (&amp; &lt; &gt;)
            cut = amp if amp > 0 and ";" not in line[amp:cut] else cut
            sections.append(line[:cut])
            line = "> " + line[cut:]
        if len(sections[-1]) + 1 + len(line) > SECTION_CHARS:
            sections.append(line)
        else:
            sections[-1] += "\n" + line
    buttons = []
    if approve:
        buttons.append({"type": "button", "action_id": EXPERT_APPROVE_ACTION, "value": reply["id"], "style": "primary",
                        "text": {"type": "plain_text", "text": say("expert_approve", language), "emoji": True}})
    if capture:
        buttons.append({"type": "button", "action_id": EXPERT_CAPTURE_ACTION, "value": reply["id"],
                        "text": {"type": "plain_text", "text": say("expert_capture", language), "emoji": True}})
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}} for text in sections]
    if buttons:
        blocks.append({"type": "actions", "block_id": EXPERT_BLOCK, "elements": buttons})
    return blocks


def review_note(text: str) -> dict[str, Any]:
    return {"type": "context", "block_id": REVIEW_NOTE_BLOCK, "elements": [{"type": "mrkdwn", "text": text}]}


def final_blocks(answer: Answer, *, feedback: bool, review: bool = False) -> list[dict[str, Any]]:
    """Sources, 👍/👎, and for reviewers' workspaces (``review``) "✅ Approve" under an answer that was
    offered to the cache or "Withdraw approval" under one served from it."""
    blocks = []
    sources = sources_block(answer.citations)
    if sources:
        blocks.append(sources)
    if feedback and answer.outcome is not Outcome.ERROR:
        blocks.append(feedback_block(answer.trace.turn_id))
    if review and answer.approvable:
        blocks.append(review_block(answer.trace.turn_id, approved=False))
    elif review and answer.outcome is Outcome.CACHED and answer.approved_turn_id:
        blocks.append(review_block(answer.approved_turn_id, approved=True))
    return blocks


_CONTENT_BLOCKS = ("markdown", "rich_text", "section", "header")


def reviewed_blocks(current: list[dict[str, Any]], note: str, actions: dict[str, Any],
                    answer_text: str | None = None) -> list[dict[str, Any]] | None:
    """The message's blocks with the review buttons replaced by ``note`` and ``actions``.

    A streamed message's text is not among its blocks: ``answer_text`` (what the message shows)
    then becomes a markdown block, since a ``chat.update`` with blocks replaces the whole message.
    None when the message's text is unknown (it would be lost).
    """
    kept = [b for b in current if b.get("block_id") not in (REVIEW_BLOCK, REVIEW_NOTE_BLOCK)]
    if not any(b.get("type") in _CONTENT_BLOCKS for b in kept):
        if not answer_text:
            return None
        kept.insert(0, {"type": "markdown", "text": answer_text})
    return [*kept, review_note(note), actions]


def notification_text(markdown: str, limit: int = 300) -> str:
    flat = " ".join(markdown.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
