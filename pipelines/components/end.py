"""Where every branch of the query graph ends: one typed ``TurnEnd`` out of the pipeline."""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from haystack import Document, component
from haystack.core.component.types import Variadic
from haystack.dataclasses import ChatMessage

#: How a turn can end, in the order they win should two branches end it.
OUTCOMES = ("off_topic", "not_found", "clarify", "answered")


@dataclass(frozen=True)
class TurnEnd:
    """How a turn ended: ``outcome`` (one of ``OUTCOMES``); for ``answered`` the checked ``replies``;
    for ``clarify`` the ``candidates`` (model names) to ask between; ``sources``: the chunks the answer's
    prompt held, in the order of their ``[n]`` (empty when no prompt was made); ``draft``: the
    generator's own text before the sentence check (what evaluations compare), when it wrote one."""

    outcome: str
    replies: list[ChatMessage] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    sources: list[Document] = field(default_factory=list)
    draft: str = ""


def _given(values: Iterable[float] | None) -> bool:
    # An ending no branch took arrives as Haystack's default for a variadic socket: ``[None]``.
    return any(v is not None for v in values or ())


@component
class EndOfTurn:
    """``turn``: the ``TurnEnd`` of whichever branch ended the turn. Every ending output of the graph comes
    here: ``off_topic`` (the guard, the scope check), ``not_found`` (the scope check, reformulate, clarify,
    answerable, judge, the sentence check), ``clarify`` and the answer's ``replies``; ``sources`` and
    ``draft`` are what the answer was written from and as."""

    # ``Variadic[float] = None``: Haystack finds a variadic socket only in the bare, evaluated annotation
    # (``| None`` or ``from __future__ import annotations`` hide it); the default makes it optional.
    @component.output_types(turn=TurnEnd)
    def run(self, off_topic: Variadic[float] = None, not_found: Variadic[float] = None,
            clarify: list[str] | None = None, replies: list[ChatMessage] | None = None,
            sources: list[Document] | None = None, draft: str = "") -> dict[str, Any]:
        if _given(off_topic):
            outcome = "off_topic"
        elif _given(not_found):
            outcome = "not_found"
        elif clarify is not None:
            outcome = "clarify"
        else:
            outcome = "answered"
        return {"turn": TurnEnd(outcome, replies=list(replies or []) if outcome == "answered" else [],
                                candidates=list(clarify or []), sources=list(sources or []), draft=draft)}

    @component.output_types(turn=TurnEnd)
    async def run_async(self, off_topic: Variadic[float] = None, not_found: Variadic[float] = None,
                        clarify: list[str] | None = None, replies: list[ChatMessage] | None = None,
                        sources: list[Document] | None = None, draft: str = "") -> dict[str, Any]:
        """``run`` on the event loop (no work to speak of: less than a thread hop)."""
        return self.run(off_topic, not_found, clarify, replies, sources, draft)
