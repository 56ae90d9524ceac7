"""Scripts the fake Anthropic server per kind of request kbbot makes in one turn.

kbbot's helper calls start their system prompt with ``Task: <kind>`` (rewrite, guard, grade,
reformulate); everything else is an answer. ``ModelRouter`` answers each kind with a queued
reply or a default that behaves like a sensible model, and records which kinds were asked.
``AnswerView`` gives tests written against the bare fake (``enqueue``, ``responder``,
``last_request``, ``requests``) the same interface, restricted to answer requests.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from pipelines.grounding import is_claim
from pipelines.text import split_sentences
from tests.fakes.anthropic_server import FakeAnthropic, RecordedRequest, Script, _text_of, default_responder

KINDS = ("rewrite", "guard", "grade", "reformulate", "preferences")
_TASK = re.compile(r"^Task: (\w+)")


def kind_of(system: str) -> str:
    match = _TASK.match(system or "")
    return match.group(1) if match and match.group(1) in KINDS else "answer"


def _last_user(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _between(text: str, tag: str) -> str:
    match = re.search(f"<{tag}>\\n(.*?)\\n</{tag}>", text, re.S)
    return match.group(1) if match else ""


def default_reply(kind: str, body: dict[str, Any]) -> Script | str:
    user = _last_user(body)
    if kind == "rewrite":
        return json.dumps({"query": _between(user, "last_message")})
    if kind == "guard":
        return json.dumps({"on_topic": True, "confidence": 0.95})
    if kind == "grade":
        return json.dumps({"relevant": [int(n) for n in re.findall(r'<passage id="(\d+)"', user)], "answerable": True})
    if kind == "reformulate":
        tried = _between(user, "earlier_queries").count("\n") + 1
        return json.dumps({"query": f"{_between(user, 'question')} (other words {tried})"})
    return default_responder(body)


def source_claims(body: dict[str, Any], number: int) -> list[str]:
    """The sentences of the prompt's source ``number`` that state something (table rows left out),
    without their closing full stop."""
    found = re.search(rf'<source id="{number}" title="[^"]*">\n(.*?)\n</source>', _last_user(body), re.S)
    text = found.group(1) if found else ""
    return [s.rstrip("。.") for s in split_sentences("\n".join(text.split("\n")[1:])) if is_claim(s) and "|" not in s]


def quoting(number: int = 1, sentences: int = 1) -> Callable[[dict[str, Any]], str]:
    """An answer responder that writes what a faithful model would: the first ``sentences`` sentences
    of source ``number`` that state something, each cited ``[number]`` (the sentence gate shows only
    what a cited source holds, so a scripted answer about nothing in the sources shows nothing)."""
    def respond(body: dict[str, Any]) -> str:
        picked = source_claims(body, number)
        return " ".join(f"{s} [{number}]." for s in picked[:sentences]) or "(no source)"

    return respond


def steps(body: dict[str, Any], count: int = 0, number: int = 1, per_paragraph: int = 3, chars: int = 0) -> str:
    """A long faithful answer: ``count`` sentences (or as many as make ``chars`` characters)
    "Step i: <a sentence of source ``number``> [number].", going round the source's sentences,
    ``per_paragraph`` to a paragraph. Each step's number makes its sentence a new one (the gate shows
    a sentence said before once) and a step number is no value the source must hold."""
    claims = source_claims(body, number) or ["(no source)"]
    said: list[str] = []
    while len(said) < count or sum(len(s) + 1 for s in said) < chars:
        said.append(f"Step {len(said) + 1}: {claims[len(said) % len(claims)]} [{number}].")
    return "\n\n".join(" ".join(said[i:i + per_paragraph]) for i in range(0, len(said), per_paragraph))


class ModelRouter:
    """The fake's responder: per-kind queues, then per-kind responders, then ``default_reply``."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[Script | str]] = defaultdict(deque)
        self.responders: dict[str, Callable[[dict[str, Any]], Script | str]] = {}
        self.kinds: list[str] = []

    def enqueue(self, kind: str, *replies: Script | str) -> None:
        self.queues[kind].extend(replies)

    def __call__(self, body: dict[str, Any]) -> Script | str:
        kind = kind_of(_text_of(body.get("system")))
        self.kinds.append(kind)
        if self.queues[kind]:
            return self.queues[kind].popleft()
        if kind in self.responders:
            return self.responders[kind](body)
        return default_reply(kind, body)


class AnswerView:
    """The fake Anthropic server as seen by tests that only script answers."""

    def __init__(self, fake: FakeAnthropic, router: ModelRouter):
        self.fake = fake
        self.router = router
        fake.responder = router

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def enqueue(self, *scripts: Script | str) -> None:
        self.router.enqueue("answer", *scripts)

    @property
    def responder(self) -> Callable[[dict[str, Any]], Script | str] | None:
        return self.router.responders.get("answer")

    @responder.setter
    def responder(self, value: Callable[[dict[str, Any]], Script | str]) -> None:
        self.router.responders["answer"] = value

    @property
    def requests(self) -> list[RecordedRequest]:
        return [r for r in self.fake.requests if kind_of(r.system) == "answer"]

    @property
    def last_request(self) -> RecordedRequest:
        answers = self.requests
        if not answers:
            raise AssertionError("the fake Anthropic server has received no answer request")
        return answers[-1]
