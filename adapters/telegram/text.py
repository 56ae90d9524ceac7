"""Telegram text: model Markdown as Telegram messages and the buttons under them.

- model Markdown converted to plain text + entities (``telegramify_markdown``; offsets in UTF-16
  units), never ``parse_mode``; partial markup stays literal; split at paragraph boundaries into
  messages of at most ``max_message_units`` UTF-16 units (``render_parts``; ``plain_parts`` for plain
  text such as the admin commands' results);
- the final parts (``final_parts``): sources ``[n] title`` (linked when the source is a URL) appended
  to the last message, or after it when they do not fit;
- inline buttons: 👍/👎 carrying the turn id, and for reviewers "✅ Approve" (an answer offered to the
  answer cache) or "↩️ Withdraw approval" (one served from it); the callback data names only the turn;
- the language to use with a user (``user_language``); kbbot's own words are the catalogue's
  (``bot.messages``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import telegramify_markdown
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup, MessageEntity

from bot.delivery.reply import cut_point
from bot.messages import say
from bot.types import Answer, Citation, Outcome
from pipelines.text import detect_language, web_link_host

FEEDBACK_PREFIX = "kbfb"
APPROVE_PREFIX = "kbap"  # callback data: "kbap:{turn_id}" approves, "kbwd:{turn_id}" withdraws
WITHDRAW_PREFIX = "kbwd"

def user_language(language_code: str | None, text: str = "") -> str:
    if (language_code or "").lower().startswith("zh"):
        return "zh"
    return detect_language(text) if text.strip() else "en"


# --- formatting --------------------------------------------------------------------------------
def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class Rendered:
    """One message as Telegram gets it: plain text and entities (dicts with UTF-16 offsets)."""

    text: str
    entities: tuple[dict[str, Any], ...] = ()

    @property
    def units(self) -> int:
        return utf16_len(self.text)

    def aiogram_entities(self) -> list[MessageEntity] | None:
        return [MessageEntity(**e) for e in self.entities] or None

    def joined(self, other: Rendered, separator: str = "\n\n") -> Rendered:
        shift = utf16_len(self.text + separator)
        moved = tuple({**e, "offset": e["offset"] + shift} for e in other.entities)
        return Rendered(self.text + separator + other.text, self.entities + moved)


def render(markdown: str) -> Rendered:
    """Model Markdown as plain text + entities; partial markup (``**Refu``) stays literal. A link
    that is not an absolute http(s) URL (``javascript:``, ``//host``, a relative path) keeps its text
    and loses its link: the answer's link filter judges hosts, this refuses what no host check covers."""
    text, entities = telegramify_markdown.convert(markdown)
    kept = [{k: v for k, v in e.to_dict().items() if v is not None} for e in entities]
    return Rendered(text, tuple(e for e in kept if e["type"] != "text_link" or web_link_host(e.get("url", ""))))


def _paragraphs(markdown: str) -> list[str]:
    """Paragraphs of ``markdown``; a fenced code block with blank lines stays one paragraph."""
    out: list[str] = []
    for piece in re.split(r"\n[ \t]*\n", markdown):
        if out and out[-1].count("```") % 2 == 1:
            out[-1] += "\n\n" + piece
        elif piece.strip():
            out.append(piece)
    return out


def _hard_split(paragraph: str, limit: int) -> list[str]:
    """A paragraph too long for one message, cut at lines, sentences or spaces."""
    pieces: list[str] = []
    rest = paragraph
    while rest and render(rest).units > limit:
        chars = min(len(rest), limit)
        while True:
            cut = cut_point(rest, chars)
            if render(rest[:cut]).units <= limit or chars < 16:
                break
            chars = int(chars * 0.9)
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest.strip():
        pieces.append(rest)
    return pieces


def render_parts(markdown: str, limit: int = 4096) -> list[Rendered]:
    """``markdown`` rendered as messages of at most ``limit`` UTF-16 units, split at paragraphs."""
    markdown = markdown.strip()
    if not markdown:
        return []
    whole = render(markdown)
    if whole.units <= limit:
        return [whole]
    parts: list[Rendered] = []
    current = ""
    for paragraph in _paragraphs(markdown):
        candidate = f"{current}\n\n{paragraph}" if current else paragraph
        if render(candidate).units <= limit:
            current = candidate
            continue
        if current:
            parts.append(render(current))
        current = ""
        if render(paragraph).units <= limit:
            current = paragraph
        else:
            pieces = _hard_split(paragraph, limit)
            parts.extend(render(p) for p in pieces[:-1])
            current = pieces[-1] if pieces else ""
    if current:
        parts.append(render(current))
    return parts


def plain_parts(text: str, limit: int = 4096) -> list[str]:
    """Plain text in messages of at most ``limit`` UTF-16 units, cut at line ends (long lines hard)."""
    parts: list[str] = []
    current = ""
    for line in text.splitlines():
        while utf16_len(line) > limit:
            cut = limit
            while utf16_len(line[:cut]) > limit:
                cut -= 1
            parts.extend([current] if current else [])
            current = ""
            parts.append(line[:cut])
            line = line[cut:]
        candidate = f"{current}\n{line}" if current else line
        if utf16_len(candidate) > limit:
            parts.append(current)
            candidate = line
        current = candidate
    if current.strip():
        parts.append(current)
    return parts


def sources_rendered(citations: list[Citation], language: str = "en") -> Rendered | None:
    """``Sources`` then one line per citation: ``[n] title``, the title linked when the source is a URL."""
    if not citations:
        return None
    heading = say("sources", language)
    text = heading
    entities: list[dict[str, Any]] = [{"type": "bold", "offset": 0, "length": utf16_len(heading)}]
    for c in citations:
        title = " ".join(c.label.split())
        if len(title) > 120:
            title = title[:119] + "…"
        line_start = utf16_len(text + "\n")
        label = f"[{c.index}] "
        text += f"\n{label}{title}"
        if c.url:
            entities.append({"type": "text_link", "offset": line_start + utf16_len(label),
                             "length": utf16_len(title), "url": c.url})
    return Rendered(text, tuple(entities))


def final_parts(answer_markdown: str, citations: list[Citation], limit: int, language: str) -> list[Rendered]:
    parts = render_parts(answer_markdown, limit) or [Rendered("…")]
    sources = sources_rendered(citations, language)
    if sources is not None:
        if sources.units > limit:
            sources = Rendered(sources.text[: limit - 1] + "…", ())
        combined = parts[-1].joined(sources)
        if combined.units <= limit:
            parts[-1] = combined
        else:
            parts.append(sources)
    return parts


def feedback_row(turn_id: str) -> list[InlineKeyboardButton]:
    return [InlineKeyboardButton(text="👍", callback_data=f"{FEEDBACK_PREFIX}:up:{turn_id}"),
            InlineKeyboardButton(text="👎", callback_data=f"{FEEDBACK_PREFIX}:down:{turn_id}")]


EXPERT_APPROVE_PREFIX = "kbxa"  # callback data: "kbxa:{reply id}" saves an expert reply as approved answer,
EXPERT_CAPTURE_PREFIX = "kbxc"  # "kbxc:{reply id}" adds it to the knowledge base


def expert_markup(reply_id: str, *, approve: bool, capture: bool, language: str = "en") -> InlineKeyboardMarkup | None:
    """"Save as approved answer" / "Add to the knowledge base" for a reviewer; the data names only the reply."""
    row = []
    if approve:
        row.append(InlineKeyboardButton(text=say("expert_approve", language),
                                        callback_data=f"{EXPERT_APPROVE_PREFIX}:{reply_id}"))
    if capture:
        row.append(InlineKeyboardButton(text=say("expert_capture", language),
                                        callback_data=f"{EXPERT_CAPTURE_PREFIX}:{reply_id}"))
    return InlineKeyboardMarkup(inline_keyboard=[row]) if row else None


def review_row(turn_id: str, *, approved: bool, language: str = "en") -> list[InlineKeyboardButton]:
    """"✅ Approve" or "↩️ Withdraw approval"; the callback data names only the turn."""
    if approved:
        return [InlineKeyboardButton(text=say("withdraw", language), callback_data=f"{WITHDRAW_PREFIX}:{turn_id}")]
    return [InlineKeyboardButton(text=say("approve", language), callback_data=f"{APPROVE_PREFIX}:{turn_id}")]


def answer_markup(answer: Answer, *, feedback: bool, review: bool, language: str = "en") -> InlineKeyboardMarkup | None:
    """👍/👎, and for reviewers "✅ Approve" (an answer offered to the cache) or "↩️ Withdraw approval"
    (an answer served from it)."""
    rows: list[list[InlineKeyboardButton]] = []
    if answer.outcome is Outcome.ERROR:
        return None
    if feedback:
        rows.append(feedback_row(answer.trace.turn_id))
    if review and answer.approvable:
        rows.append(review_row(answer.trace.turn_id, approved=False, language=language))
    elif review and answer.outcome is Outcome.CACHED and answer.approved_turn_id:
        rows.append(review_row(answer.approved_turn_id, approved=True, language=language))
    return InlineKeyboardMarkup(inline_keyboard=rows) if rows else None


def is_review_button(button: InlineKeyboardButton) -> bool:
    return (button.callback_data or "").startswith((f"{APPROVE_PREFIX}:", f"{WITHDRAW_PREFIX}:"))
