"""The golden set: questions whose answers must keep citing a source and/or saying certain words,
replayed after every refresh that changed the knowledge.

``config/golden.yaml`` (``approvals.golden_file``; no file, no replay)::

    - question: What does fault E-917 mean?
      cite: fault-e917.md          # a cited source must end with this (a path, a URL, a file name)
      words: [cooling fan]         # each must appear in the answer (case-insensitive)
      space: default               # optional; default: the first configured source's space

The last replay (when, passed / failed, the failures) is kept in memory or in Redis
(``{prefix}golden:last``), so ``kbbot status`` and every replica's ``/healthz`` detail show the same one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from bot.messages import say
from bot.types import Answer, Inquiry

#: ``question, inquiry -> answer``: the answering pipeline run quietly (``Answerer.rerun``).
Rerun = Callable[[str, Inquiry], Awaitable[Answer]]

log = logging.getLogger("kbbot.loop")


class GoldenError(ValueError):
    """The golden file cannot be read: where and why."""


@dataclass(frozen=True)
class GoldenCase:
    question: str
    cite: str = ""
    words: tuple[str, ...] = ()
    space: str = ""

    def failure(self, answer: Answer) -> str | None:
        """Why ``answer`` fails this case, or None."""
        if answer.outcome.value != "answered":
            return f"not answered ({answer.outcome.value})"
        reasons = []
        if self.cite and not any(c.source.endswith(self.cite) or c.doc_id.endswith(self.cite)
                                 for c in answer.citations):
            cited = ", ".join(sorted({c.source for c in answer.citations})) or "nothing"
            reasons.append(f"does not cite {self.cite} (cites {cited})")
        missing = [w for w in self.words if w.casefold() not in answer.text.casefold()]
        if missing:
            reasons.append("lacks " + ", ".join(repr(w) for w in missing))
        return "; ".join(reasons) or None


def load_golden(path: Path) -> list[GoldenCase]:
    """The cases of ``path``; [] when it does not exist. :raises GoldenError: what is wrong, and where."""
    if not path.exists():
        return []
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise GoldenError(f"{path}: cannot be read: {exc}") from None
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise GoldenError(f"{path}: must be a list of cases (- question: ..., cite: ..., words: [...])")
    cases = []
    for i, item in enumerate(raw, 1):
        where = f"{path}: case {i}"
        if not isinstance(item, dict) or not str(item.get("question") or "").strip():
            raise GoldenError(f"{where}: needs a question")
        unknown = set(item) - {"question", "cite", "words", "space"}
        if unknown:
            raise GoldenError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        words = item.get("words") or []
        if isinstance(words, str):
            words = [words]
        if not isinstance(words, list) or not all(isinstance(w, str | int | float) for w in words):
            raise GoldenError(f"{where}: words must be a list of words or phrases")
        if not item.get("cite") and not words:
            raise GoldenError(f"{where}: needs cite (a source that must be cited) and/or words")
        cases.append(GoldenCase(str(item["question"]).strip(), str(item.get("cite") or ""),
                                tuple(str(w) for w in words), str(item.get("space") or "")))
    return cases


@dataclass
class GoldenReplay:
    at: float
    passed: int
    failed: int
    failures: list[dict[str, str]] = field(default_factory=list)  # {"question", "why"}
    knowledge_version: int = 0

    def summary(self, language: str = "en", head: str = "golden_replayed") -> str:
        """The replay in ``language``: a head line (the message ``head``), then the failures."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.at))
        first = say(head, language, when=when, version=self.knowledge_version, passed=self.passed, failed=self.failed)
        return "\n".join([first, *(say("golden_failed_case", language, question=f["question"], why=f["why"])
                                   for f in self.failures[:20])])


async def replay(cases: list[GoldenCase], rerun: Rerun, *, default_space: str,
                 knowledge_version: int = 0) -> GoldenReplay:
    failures = []
    for case in cases:
        inquiry = Inquiry(platform="golden", tenant="", channel="", thread_key="golden", user_id="",
                          text=case.question, spaces=(case.space or default_space,))
        try:
            why = case.failure(await rerun(case.question, inquiry))
        except Exception as exc:  # noqa: BLE001 - a case that cannot run is a failed case
            why = f"could not be answered ({type(exc).__name__})"
        if why:
            failures.append({"question": case.question, "why": why})
    return GoldenReplay(time.time(), len(cases) - len(failures), len(failures), failures, knowledge_version)


class GoldenResults(Protocol):
    async def save(self, result: GoldenReplay) -> None: ...

    async def last(self) -> GoldenReplay | None: ...


class MemoryGoldenResults:
    def __init__(self) -> None:
        self._last: GoldenReplay | None = None

    async def save(self, result: GoldenReplay) -> None:
        self._last = result

    async def last(self) -> GoldenReplay | None:
        return self._last


class RedisGoldenResults:
    """The last replay in Redis: every replica (and ``kbbot status``) reads the same one."""

    def __init__(self, redis: Any, prefix: str = "kbbot:"):
        self.redis = redis
        self.key = f"{prefix}golden:last"

    async def save(self, result: GoldenReplay) -> None:
        await self.redis.set(self.key, json.dumps(asdict(result), ensure_ascii=False))

    async def last(self) -> GoldenReplay | None:
        raw = await self.redis.get(self.key)
        return GoldenReplay(**json.loads(raw)) if raw else None


class FileGoldenResults:
    """The last replay in the data directory (embedded defaults: ``kbbot status`` runs in another process)."""

    def __init__(self, path: Path):
        self.path = path

    async def save(self, result: GoldenReplay) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(result), ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.path)

    async def last(self) -> GoldenReplay | None:
        try:
            return GoldenReplay(**json.loads(self.path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            log.warning("%s: unreadable golden replay result (%s)", self.path, exc)
            return None


def golden_results(redis: Any, prefix: str, data_dir: Path) -> GoldenResults:
    """Where the last replay is kept: Redis when connected, else the data directory."""
    return RedisGoldenResults(redis, prefix) if redis is not None else FileGoldenResults(data_dir / "golden-last.json")


def golden_line(last: dict[str, Any] | None, path: str | None = None, language: str = "en") -> str:
    """The status's line on the last replay (``last`` is ``asdict(GoldenReplay)``); ``path`` is the
    golden file when it exists."""
    if last is None:
        return say("status_golden_pending", language, path=path) if path else say("status_golden_none", language)
    return GoldenReplay(**last).summary(language, head="status_golden_replayed")
