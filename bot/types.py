"""The core types every adapter and the turn service share."""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


class Outcome(str, enum.Enum):
    ANSWERED = "answered"
    NOT_FOUND = "not_found"
    OFF_TOPIC = "off_topic"
    CACHED = "cached"
    CLARIFY = "clarify"
    ERROR = "error"


@dataclass(frozen=True)
class Inquiry:
    """One question as it arrived, whatever the platform.

    ``thread_key`` is stable per conversation: ``slack:{team}:{channel}:{thread_ts}``,
    ``telegram:{bot}:{chat_id}``, ``console:{name}``.
    """

    platform: str
    tenant: str
    channel: str
    thread_key: str
    user_id: str
    text: str
    received_at: float = field(default_factory=time.time)
    spaces: tuple[str, ...] = ("default",)
    #: Only the asker sees the answer (a DM, a private chat, an API caller, an ephemeral reply): the
    #: asker's own access applies; otherwise everyone of the channel's (``bot.permissions``).
    private: bool = False
    #: Where a later message about this question goes (the adapter's reply target, as it rebuilds a reply
    #: from it: ``bot.delivery.Platform.reply_to``); None where nothing can be posted later (console, HTTP).
    reply_to: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Citation:
    index: int
    doc_id: str
    version: int
    position: int
    title: str
    source: str
    #: Where in the document the cited chunk is: ``p. 14``, ``slide 3``, ``sheet Parts`` or its section.
    locator: str = ""
    #: The PDF page of the cited chunk (1-based), which a link to a URL source points at.
    page: int | None = None

    @classmethod
    def of_chunk(cls, index: int, meta: dict[str, Any]) -> Citation:
        """The citation of a chunk, from its meta (as the indexing pipeline wrote it)."""
        page = _int(meta.get("page"))
        slide = _int(meta.get("slide"))
        if page is not None:
            locator = f"p. {page}"
        elif slide is not None:
            locator = f"slide {slide}"
        elif meta.get("sheet"):
            locator = f"sheet {meta['sheet']}"
        else:
            locator = str(meta.get("header") or "")
        return cls(index=index, doc_id=str(meta.get("doc_id", "")), version=int(meta.get("version", 0)),
                   position=int(meta.get("position", 0)),
                   # An e-mail's attachment is its own document to the reader, under its file name.
                   title=str(meta.get("attachment") or meta.get("title") or meta.get("source") or ""),
                   source=str(meta.get("source") or ""), locator=locator, page=page)

    @property
    def label(self) -> str:
        """What a sources block shows: ``manual.pdf, p. 14``."""
        title = (self.title or self.source or self.doc_id).strip() or f"source {self.index}"
        locator = self.locator
        if locator.startswith(f"{title} > "):  # a Markdown file's heading path opens with its own title
            locator = locator[len(title) + 3:]
        return f"{title}, {locator}" if locator and locator != title else title

    @property
    def url(self) -> str | None:
        """The link of a URL source, at the cited page of a PDF (``#page=14``, which PDF viewers open)."""
        if not self.source.startswith(("http://", "https://")):
            return None
        if self.page is not None and "#" not in self.source:
            return f"{self.source}#page={self.page}"
        return self.source

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any) -> int | None:
    # Weaviate's auto-schema stores numbers as floats: 14.0 is page 14.
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


@dataclass
class Trace:
    turn_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    stages: dict[str, float] = field(default_factory=dict)
    first_token_ms: float | None = None
    history_turns: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    query: str | None = None  # the search query the question became (rewritten on follow-ups)
    steps: list[dict[str, Any]] = field(default_factory=list)  # what rewrite/guard/grade/... decided
    model_calls: int = 0  # helper calls and answers, regeneration included
    regenerated: bool = False  # a cited document changed while the answer was written
    ranked: list[dict[str, Any]] = field(default_factory=list)  # the ranked chunks and scores (turn records)
    left_out: int = 0  # sentences the sentence gate kept from the user: no source they cite holds them

    def to_dict(self) -> dict[str, Any]:
        return {
            "turn_id": self.turn_id,
            "stages": {k: round(v, 1) for k, v in self.stages.items()},
            "first_token_ms": None if self.first_token_ms is None else round(self.first_token_ms, 1),
            "history_turns": self.history_turns,
            "query": self.query,
            "steps": self.steps,
            "model_calls": self.model_calls,
            "regenerated": self.regenerated,
            "left_out": self.left_out,
        }


@dataclass
class Answer:
    text: str
    outcome: Outcome
    citations: list[Citation] = field(default_factory=list)
    trace: Trace = field(default_factory=Trace)
    #: Offered to the answer cache under ``trace.turn_id``: a reviewer may approve it.
    approvable: bool = False
    #: A cached answer: the turn whose approval it is (what withdrawing names).
    approved_turn_id: str | None = None
    #: A cached answer: who approved it (a display name, else the platform's user id) and when (epoch s).
    approved_by: str = ""
    approved_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.text,
            "outcome": self.outcome.value,
            "citations": [c.to_dict() for c in self.citations],
            "trace": self.trace.to_dict(),
        }


class Reply(Protocol):
    """How an adapter shows one answer as it is produced."""

    async def start(self) -> None:
        """The turn began (show a status or typing indicator)."""

    async def push(self, delta: str) -> None:
        """More answer text arrived; render it (adapters throttle as their platform requires)."""

    async def finish(self, answer: Answer) -> None:
        """The final answer with its sources; must never be lost."""

    async def fail(self, message: str) -> None:
        """The turn failed; show the user ``message`` (never a stack trace)."""


@runtime_checkable
class Acknowledges(Protocol):
    """A ``Reply`` that shows at once that its question was taken, before the turn waits for its
    thread's lock or a free slot (in a burst of questions that wait can be long)."""

    async def acknowledge(self) -> None:
        """The question was accepted; ``start`` follows when its turn begins."""


@runtime_checkable
class ShowsProgress(Protocol):
    """A ``Reply`` that also shows which stage of the pipeline a turn is in (the HTTP API's events)."""

    def progress(self, stage: str) -> None:
        """A pipeline stage (component) started; may be called from a worker thread."""
