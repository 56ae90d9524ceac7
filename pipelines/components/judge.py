"""A yes/no answerability judgement by the answer's own model, read from its token probabilities.

A small local model asked "do these sources answer the question?" in words answers yes to almost
anything, and a free-text verdict has nothing to weigh. Its first token's probabilities do: the
share of "yes" against "no" (in any case and in Chinese) is a score a threshold can be set on.

The judgement is the answer prompt itself with one instruction appended to its last message, so the
two requests share their whole prefix (system prompt, sources, history, question) and llama.cpp's
prompt cache makes the judgement cost the instruction's few dozen tokens and one generated token;
the answer that follows re-reads only the last message's end (``cache_n`` in the server's timings:
docs/evaluation-answers.md).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from haystack import component
from haystack.dataclasses import ChatMessage

from pipelines.components.turn import current_ledger

log = logging.getLogger("kbbot.judge")

INSTRUCTION = ("Before answering: do the sources above contain the answer to the question? "
               "Reply with one word: yes or no.")
ALTERNATIVES = 10  # top_logprobs asked for: "yes", "Yes", "no", "No" and their kin are among them
YES = frozenset({"yes", "是", "有", "对", "能"})
NO = frozenset({"no", "否", "不", "没", "没有"})


def yes_probability(logprobs: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) over the first generated token's alternatives (OpenAI's ``logprobs``
    as Haystack keeps it in a reply's meta); None when neither word is among them."""
    try:
        first = logprobs["content"][0]
        alternatives = first.get("top_logprobs") or [first]
    except (KeyError, IndexError, TypeError):
        return None
    yes = no = 0.0
    for alt in alternatives:
        word = str(alt.get("token", "")).strip().lower()
        p = math.exp(float(alt.get("logprob", -math.inf)))
        if word in YES:
            yes += p
        elif word in NO:
            no += p
    return yes / (yes + no) if yes + no > 0 else None


def judge_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The answer prompt with ``INSTRUCTION`` appended to its last (user) message: same prefix."""
    *head, last = messages
    return [*head, ChatMessage.from_user(f"{last.text or ''}\n\n{INSTRUCTION}")]


@component
class AnswerabilityJudge:
    """``messages`` on when the model's P(yes) reaches ``threshold``, else ``not_found`` (the P(yes)).

    ``generator``: a chat generator on the answer's model that returns ``logprobs`` (one token,
    ``top_logprobs``). None, or a reply without usable probabilities, lets the answer go on (logged):
    the sentence gate still stands between the model and the user.
    """

    def __init__(self, generator: Any | None, *, threshold: float = 0.5):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"the answerability threshold is {threshold}; expected a number from 0 to 1")
        self.generator = generator
        self.threshold = threshold

    @staticmethod
    def _note(**details: Any) -> None:
        current_ledger().note("judge", **details)

    def _decide(self, messages: list[ChatMessage], result: dict[str, Any] | None) -> dict[str, Any]:
        replies = (result or {}).get("replies") or []
        p_yes = yes_probability((replies[0].meta or {}).get("logprobs")) if replies else None
        if p_yes is None:
            log.warning("answerability judgement without usable probabilities; answering")
            self._note(error="no probabilities", fallback="answer")
            return {"messages": messages}
        answerable = p_yes >= self.threshold
        self._note(p_yes=round(p_yes, 4), answerable=answerable)
        return {"messages": messages} if answerable else {"not_found": p_yes}

    def _take(self) -> bool:
        return self.generator is not None and current_ledger().take("judge")

    @component.output_types(messages=list[ChatMessage], not_found=float)
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        if not self._take():
            return {"messages": messages}
        try:
            result = self.generator.run(messages=judge_messages(messages))
        except Exception as exc:  # noqa: BLE001 - the judgement degrades; the gate still checks the answer
            log.warning("answerability judgement failed (%s); answering", type(exc).__name__)
            self._note(error=type(exc).__name__)
            return {"messages": messages}
        return self._decide(messages, result)

    @component.output_types(messages=list[ChatMessage], not_found=float)
    async def run_async(self, messages: list[ChatMessage]) -> dict[str, Any]:
        if not self._take():
            return {"messages": messages}
        try:
            result = await self.generator.run_async(messages=judge_messages(messages))
        except Exception as exc:  # noqa: BLE001 - see run
            log.warning("answerability judgement failed (%s); answering", type(exc).__name__)
            self._note(error=type(exc).__name__)
            return {"messages": messages}
        return self._decide(messages, result)
