"""One turn as it is kept for admins: what was asked, what kbbot did and why, and what people said.

A record is written once, when the turn ends; feedback clicks and approvals are added to it later
under its turn id. User ids are kept as given or, with ``insights.hash_user_ids``, as an HMAC
keyed by ``KBBOT_USER_ID_KEY`` (so ``forget`` still finds a user's records, but a leaked
record names nobody).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from haystack import Document

from bot.state.cache import wants_fresh
from bot.types import Answer, Inquiry

#: Outcomes the report counts as gaps of the knowledge base.
GAP_OUTCOMES = ("not_found", "off_topic")


def user_key(user_id: str, hash_key: str | None) -> str:
    """The user id as stored: the id itself, or ``h:`` and a keyed hash when a key is given."""
    if not hash_key:
        return user_id
    return "h:" + hmac.new(hash_key.encode(), user_id.encode(), hashlib.sha256).hexdigest()[:32]


def ranked_chunks(documents: list[Document] | None) -> list[dict[str, Any]]:
    """The ranked chunks of a turn as the trace shows them: where each came from and its score."""
    out = []
    for doc in documents or []:
        meta = doc.meta or {}
        readers = sorted(map(str, meta.get("readers") or ["public"]))
        restricted = readers != ["public"]
        out.append({"doc_id": str(meta.get("doc_id", "")), "version": int(meta.get("version", 0)),
                    "position": int(meta.get("position", 0)),
                    "title": str(meta.get("title") or meta.get("source") or ""),
                    "source": str(meta.get("source") or ""),
                    "score": None if doc.score is None else round(float(doc.score), 4),
                    # A restricted passage's text is not kept: turn records are read on the admin page
                    # and in reports by people its readers may not include.
                    "excerpt": "" if restricted else (doc.content or "")[:240],
                    **({"readers": readers} if restricted else {}),
                    # Who owns the document, where its source says (the digest's lists per owner).
                    **{k: str(meta[k]) for k in ("author", "confluence_space") if meta.get(k)}})
    return out


@dataclass
class TurnRecord:
    """One turn as the turn log keeps it (``insights``): what was asked, where, and what became of it.
    Not ``bot.conversation.HandledTurn`` (an event's turn, for observers) nor ``pipelines.answer_eval.EvalTurn``."""

    turn_id: str
    at: float  # when the question arrived (epoch seconds)
    platform: str
    tenant: str  # Slack workspace / Telegram bot
    channel: str
    thread_key: str
    user: str  # see ``user_key``
    question: str
    outcome: str
    answer: str
    query: str | None = None  # the search query the question became
    citations: list[dict[str, Any]] = field(default_factory=list)  # with the document versions cited
    ranked: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)  # rewrite, guard, grade (the verdict), ...
    stages: dict[str, float] = field(default_factory=dict)  # ms per pipeline stage
    first_text_ms: float | None = None
    model_calls: int = 0
    left_out: int = 0  # sentences of the model's answer no cited source held (not shown)
    approvable: bool = False
    feedback: dict[str, str] = field(default_factory=dict)  # user (as stored) -> "up" | "down"
    approval: dict[str, Any] | None = None  # {"by", "at"} while approved
    spaces: list[str] = field(default_factory=list)  # the knowledge spaces the question was asked in
    #: Where a follow-up goes (``Inquiry.reply_to``); None with hashed user ids: a record names nobody.
    reply_to: dict[str, Any] | None = None
    #: The gap's follow-up once a refresh answered it (``bot.knowledge.loop.followups``): {"state", "at", ...}.
    follow_up: dict[str, Any] | None = None
    #: Whether only the asker saw it (a direct message; API and console turns); None in records kept before
    #: it was (2026-12-04): ``in_private`` tells it from the channel, by the only two platforms there were.
    #: Those records expire ``insights.retention_days`` after; then the guess can go (None: private).
    private: bool | None = None

    @property
    def in_private(self) -> bool:
        if self.private is not None:
            return self.private
        if self.platform == "slack":
            return self.channel.startswith("D")
        if self.platform == "telegram":
            return not self.channel.startswith("-")  # groups have negative ids, private chats the user's
        return True

    @classmethod
    def of_turn(cls, inquiry: Inquiry, answer: Answer, *, hash_key: str | None = None) -> TurnRecord:
        trace = answer.trace
        total = trace.stages.get("total")
        # The first text a user saw: the first streamed token, else the whole reply at once.
        first = trace.first_token_ms if trace.first_token_ms is not None else total
        return cls(
            turn_id=trace.turn_id, at=inquiry.received_at, platform=inquiry.platform, tenant=inquiry.tenant,
            channel=inquiry.channel, thread_key=inquiry.thread_key, user=user_key(inquiry.user_id, hash_key),
            question=wants_fresh(inquiry.text.strip())[1], outcome=answer.outcome.value, answer=answer.text,
            query=trace.query, citations=[c.to_dict() for c in answer.citations], ranked=list(trace.ranked),
            steps=list(trace.steps), stages={k: round(v, 1) for k, v in trace.stages.items()},
            first_text_ms=None if first is None else round(first, 1), model_calls=trace.model_calls,
            left_out=trace.left_out, approvable=answer.approvable, spaces=list(inquiry.spaces),
            reply_to=None if hash_key else inquiry.reply_to, private=inquiry.private,
        )

    @property
    def verdict(self) -> str:
        """What the grader (or the guard) decided, in words."""
        for step in reversed(self.steps):
            if step.get("step") == "answerable" and step.get("answerable") is False:
                return f"passages do not answer it (answerability {step.get('score')})"
            if step.get("step") == "judge" and step.get("answerable") is False:
                return f"passages do not answer it (model: P(yes) {step.get('p_yes')})"
            if step.get("step") == "check" and not step.get("shown"):
                return f"no sentence of the answer was supported by its sources ({step.get('left_out')} left out)"
            if step.get("step") == "grade":
                if "relevant" in step:
                    of = f" of {step['of']}" if "of" in step else ""
                    best = f" (best similarity {step['best_similarity']})" if "best_similarity" in step else ""
                    return f"{step['relevant']}{of} passages relevant{best}"
                if "error" in step:
                    return f"grader: {step['error']}"
            if step.get("step") == "guard" and step.get("on_topic") is False:
                return "off topic (guard)"
        return {"answered": "passages relevant", "cached": "approved answer"}.get(self.outcome, self.outcome)

    @property
    def gap_closed(self) -> bool:
        """A refresh answered this question and the answer was posted where it was asked."""
        return bool(self.follow_up and self.follow_up.get("state") == "posted")

    @property
    def ups(self) -> int:
        return sum(1 for r in self.feedback.values() if r == "up")

    @property
    def downs(self) -> int:
        return sum(1 for r in self.feedback.values() if r == "down")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TurnRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

