"""Telegram text: model Markdown as Telegram messages, the buttons under them, and kbbot's own texts.

- model Markdown converted to plain text + entities (``telegramify_markdown``; offsets in UTF-16
  units), never ``parse_mode``; partial markup stays literal; split at paragraph boundaries into
  messages of at most ``max_message_units`` UTF-16 units (``render_parts``; ``plain_parts`` for plain
  text such as the admin commands' results);
- the final parts (``final_parts``): sources ``[n] title`` (linked when the source is a URL) appended
  to the last message, or after it when they do not fit;
- inline buttons: 👍/👎 carrying the turn id, and for reviewers "✅ Approve" (an answer offered to the
  answer cache) or "↩️ Withdraw approval" (one served from it); the callback data names only the turn;
- kbbot's texts (help, refusals, feedback and review notices) in English and Chinese, and the
  language to use with a user (``user_language``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import telegramify_markdown
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup, MessageEntity

from bot.streaming import cut_point
from bot.types import Answer, Citation, Outcome
from pipelines.text import detect_language, web_link_host

FEEDBACK_PREFIX = "kbfb"
APPROVE_PREFIX = "kbap"  # callback data: "kbap:{turn_id}" approves, "kbwd:{turn_id}" withdraws
WITHDRAW_PREFIX = "kbwd"

TEXTS: dict[str, dict[str, str]] = {
    "help": {
        "en": ("Hi! I am kbbot. I answer questions from the company knowledge base: products and models, "
               "fault codes, installation, maintenance, spare parts and warranty. Every answer lists its "
               "sources; when the knowledge base does not cover a question I say so instead of guessing.\n\n"
               "Ask in English or Chinese, e.g. “What does fault E-004 mean?”. I remember this "
               "conversation for follow-up questions; /new starts a fresh one. "
               "Rate answers with 👍 / 👎.\n\n"
               "How I answer you: /prefs concise|detailed|default, /prefs lang en|zh|auto, "
               "/prefs steps on|off|default (/prefs alone shows them). /remember on lets me pick up "
               "preferences you state in your messages (/remember off stops that); /forget clears them all."),
        "zh": ("你好！我是 kbbot，根据公司知识库回答问题：产品与型号、故障代码、安装、维护保养、备件和保修。"
               "每个回答都会列出来源；知识库中没有的内容我会直接说明，不会猜测。\n\n"
               "可以用中文或英文提问，例如“故障代码 E-004 是什么意思？”。我会记住本次对话以便追问；"
               "发送 /new 开始新的对话。可以用 👍 / 👎 评价回答。\n\n"
               "回答方式：/prefs concise|detailed|default（简洁/详细/默认）、/prefs lang en|zh|auto、"
               "/prefs steps on|off|default（单独发送 /prefs 查看当前设置）。/remember on 允许我从您的消息中记下"
               "您明确提出的偏好（/remember off 停止）；/forget 全部清除。"),
    },
    "new": {
        "en": "Started a new conversation: earlier questions are forgotten.",
        "zh": "已开始新的对话，之前的问题不再作为上下文。",
    },
    "refused": {
        "en": "Sorry, you are not on the list of people kbbot may answer. Please ask your administrator for access.",
        "zh": "抱歉，您不在 kbbot 的可用用户名单中，请联系管理员开通权限。",
    },
    "sources": {"en": "Sources", "zh": "来源"},
    "thanks": {"en": "Thanks for the feedback!", "zh": "感谢您的反馈！"},
    "not_admin": {"en": "Sorry, /status and /refresh are for kbbot admins only. Please ask whoever runs kbbot "
                        "to add your user id to telegram.admins.",
                  "zh": "抱歉，/status 和 /refresh 仅供 kbbot 管理员使用。如需权限，请联系 kbbot 的管理员将您的用户 ID "
                        "加入 telegram.admins。"},
    "no_admin": {"en": "Knowledge refresh is not available in this kbbot process.",
                 "zh": "此 kbbot 进程不支持知识库刷新。"},
    "refreshing": {"en": "Refreshing {what} now; the result follows.", "zh": "正在刷新 {what}，完成后会发送结果。"},
    "admin_failed": {"en": "Sorry, that failed. The logs have the details.", "zh": "抱歉，操作失败，详情见日志。"},
    "feedback_failed": {"en": "Sorry, the feedback could not be saved.", "zh": "抱歉，反馈未能保存。"},
    "approve": {"en": "✅ Approve", "zh": "✅ 批准"},
    "withdraw": {"en": "↩️ Withdraw approval", "zh": "↩️ 撤销批准"},
    "approved": {"en": "✅ Approved: the same question now gets this answer at once.",
                 "zh": "✅ 已批准：之后相同的问题会直接得到这个回答。"},
    "withdrawn": {"en": "Approval withdrawn: the question is answered afresh again.",
                  "zh": "已撤销批准：相同的问题将重新生成回答。"},
    "not_reviewer": {"en": "Sorry, only kbbot reviewers can approve answers or withdraw approvals.",
                     "zh": "抱歉，只有 kbbot 审核人可以批准回答或撤销批准。"},
    "expired": {"en": "This answer can no longer be approved (approval is open for a limited time, and only "
                      "for a conversation's first answer). Ask again to get a new one.",
                "zh": "这个回答已无法批准（仅在有限时间内、且仅对对话中的第一个回答开放）。请重新提问。"},
    "nothing_to_withdraw": {"en": "There is no approval of this answer to withdraw.",
                            "zh": "这个回答没有可撤销的批准。"},
    "approvals_off": {"en": "Approved answers are turned off.", "zh": "已关闭批准回答功能。"},
    "review_failed": {"en": "Sorry, that could not be saved right now. Please try again.",
                      "zh": "抱歉，暂时无法保存，请重试。"},
    "crashed": {"en": "Something went wrong while answering. Please try again.",
                "zh": "回答时出现错误，请重试。"},
}


def text_for(key: str, language: str) -> str:
    table = TEXTS[key]
    return table.get(language, table["en"])


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
    heading = text_for("sources", language)
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


def feedback_markup(turn_id: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(inline_keyboard=[feedback_row(turn_id)])


def feedback_row(turn_id: str) -> list[InlineKeyboardButton]:
    return [InlineKeyboardButton(text="👍", callback_data=f"{FEEDBACK_PREFIX}:up:{turn_id}"),
            InlineKeyboardButton(text="👎", callback_data=f"{FEEDBACK_PREFIX}:down:{turn_id}")]


def review_row(turn_id: str, *, approved: bool, language: str = "en") -> list[InlineKeyboardButton]:
    """"✅ Approve" or "↩️ Withdraw approval"; the callback data names only the turn."""
    if approved:
        return [InlineKeyboardButton(text=text_for("withdraw", language), callback_data=f"{WITHDRAW_PREFIX}:{turn_id}")]
    return [InlineKeyboardButton(text=text_for("approve", language), callback_data=f"{APPROVE_PREFIX}:{turn_id}")]


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
