"""What one turn may still spend, and the one way our components consult the language model.

A ``TurnLedger`` is made per turn and made current for it (``TurnLedger.running``: a context
variable, so every component of the turn's pipeline run sees it, in the asyncio tasks and worker
threads Haystack runs them in, while concurrent turns each see their own). It is no pipeline input:
Haystack deep-copies every input, and one turn must have one ledger. It caps the model calls of the
whole turn (keeping ``reserved`` of them for the answer itself) and its wall-clock time, and records
what each step decided, which becomes the turn's trace. Components never fail a turn because a helper
call failed: ``consult`` returns None and the component falls back to what it can do without a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from haystack.dataclasses import ChatMessage

log = logging.getLogger("kbbot.turn")

_running: contextvars.ContextVar[TurnLedger | None] = contextvars.ContextVar("kbbot_turn_ledger", default=None)


@dataclass
class TurnLedger:
    """Model calls and time left in one turn, and the record of what each step decided."""

    max_model_calls: int = 8
    deadline: float | None = None  # time.monotonic() by which the turn must be done
    retries_left: int = 2
    reserved: int = 1  # calls kept for generating the answer
    calls: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, *, max_model_calls: int = 8, timeout_s: float | None = None, max_retries: int = 2,
              reserved: int = 1) -> TurnLedger:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return cls(max_model_calls=max_model_calls, deadline=deadline, retries_left=max_retries, reserved=reserved)

    @contextlib.contextmanager
    def running(self) -> Iterator[TurnLedger]:
        """This ledger as the current turn's (``current_ledger``) inside the block: a pipeline run started
        in it (``run`` or ``run_async``) spends from it and notes in it."""
        token = _running.set(self)
        try:
            yield self
        finally:
            _running.reset(token)

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def take(self, kind: str) -> bool:
        """Spend one helper call of ``kind``; False (and noted) when the cap or the clock says no."""
        if len(self.calls) >= self.max_model_calls - self.reserved:
            self.note(kind, skipped="model-call cap reached")
            return False
        left = self.seconds_left()
        if left is not None and left < 1:
            self.note(kind, skipped="turn time almost up")
            return False
        self.calls.append(kind)
        return True

    def spent(self, kind: str) -> None:
        """A call made from what ``reserved`` kept (the answer's own): counted, never refused."""
        self.calls.append(kind)

    def note(self, step: str, **details: Any) -> None:
        self.steps.append({"step": step, **details})


def current_ledger() -> TurnLedger:
    """The running turn's ledger; outside a turn (a component run on its own, as tests do) a fresh one with
    the default caps, whose notes nobody reads."""
    ledger = _running.get()
    return ledger if ledger is not None else TurnLedger()


# Full-width forms small models write in Chinese context: ｛"on_topic"：true，"confidence"：０.９｝
_FULL_WIDTH = str.maketrans({"｛": "{", "｝": "}", "：": ":", "，": ",", "“": '"', "”": '"', "＂": '"',
                             "［": "[", "］": "]", "【": "[", "】": "]", "．": "."}
                            | {chr(0xFF10 + d): str(d) for d in range(10)})
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)
_DECODER = json.JSONDecoder()


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The first JSON object in a model reply. Models wrap JSON in code fences or prose, write
    full-width punctuation, or add a second object; the first object that parses is taken."""
    if not text:
        return None
    text = text.translate(_FULL_WIDTH)
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        for start in (i for i, ch in enumerate(candidate) if ch == "{"):
            try:
                value, _ = _DECODER.raw_decode(candidate, start)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def parse_confidence(value: Any) -> float:
    """A confidence from 0 to 1 as models write it (0.8, "0.8", "80%", 80); 1.0 when absent or unreadable."""
    if isinstance(value, str):
        text = value.strip().rstrip("%")
        try:
            number = float(text) / (100 if value.strip().endswith("%") else 1)
        except ValueError:
            return 1.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        return 1.0
    return number / 100 if 1 < number <= 100 else min(max(number, 0.0), 1.0)


def parse_numbers(value: Any) -> list[int] | None:
    """Passage numbers as models write them ([1, 3], ["1", "3"], "1, 3", 2); None when unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        found = re.findall(r"\d+", value)
        return [int(n) for n in found] if found or not value.strip() else None
    if isinstance(value, list):
        numbers = []
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool):
                numbers.append(item)
            elif isinstance(item, str) and item.strip().isdigit():
                numbers.append(int(item.strip()))
            else:
                return None
        return numbers
    return None


def parse_bool(value: Any) -> bool | None:
    """true / false, also as the strings models sometimes write ("true", "yes", "否")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in {"true", "yes", "是"}:
            return True
        if word in {"false", "no", "否"}:
            return False
    return None


def _messages(system: str, user: str) -> list[ChatMessage]:
    return [ChatMessage.from_system(system), ChatMessage.from_user(user)]


def _reply_text(result: dict[str, Any]) -> str | None:
    replies = result.get("replies") or []
    return (replies[0].text or "").strip() or None if replies else None


async def consult(generator: Any, kind: str, system: str, user: str, *,
                  ledger: TurnLedger | None = None) -> str | None:
    """One helper call to the model: its text, or None (no model, no call left, error or timeout).

    ``generator`` is a chat generator made for helper calls (a small ``max_tokens``: they answer
    in a few dozen tokens); the call is spent from ``ledger``, by default the running turn's."""
    ledger = ledger or current_ledger()
    if generator is None or not ledger.take(kind):
        return None
    left = ledger.seconds_left()
    try:
        run = generator.run_async(messages=_messages(system, user))
        result = await (asyncio.wait_for(run, left) if left is not None else run)
    except Exception as exc:  # noqa: BLE001 - a helper step degrades, the turn goes on
        log.warning("%s: model call failed (%s); going on without it", kind, type(exc).__name__)
        ledger.note(kind, error=type(exc).__name__)
        return None
    return _reply_text(result)


def consult_sync(generator: Any, kind: str, system: str, user: str) -> str | None:
    """``consult`` for synchronous pipeline runs."""
    ledger = current_ledger()
    if generator is None or not ledger.take(kind):
        return None
    try:
        result = generator.run(messages=_messages(system, user))
    except Exception as exc:  # noqa: BLE001 - see consult
        log.warning("%s: model call failed (%s); going on without it", kind, type(exc).__name__)
        ledger.note(kind, error=type(exc).__name__)
        return None
    return _reply_text(result)
