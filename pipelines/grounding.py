"""What an answer may show: each sentence only once the sources it cites hold it.

A language model writes sentences its sources do not hold (a small model pads manual steps with
a generic phone's; any model answers a question the sources do not cover from what it knows). So
the text a model streams reaches the user one checked sentence at a time (``SentenceGate``): a
sentence is held back until it is complete and its citation markers have arrived, then shown only
if the chunks it cites support it (``SupportCheck``); what is shown is also cleaned as the final text
is (markers normalised, links to hosts none of the sources is on removed), so the streamed text and
the final text are the same text. At most one sentence is held back at any moment.

Supported means (``SupportCheck.holds``):

- every value the sentence states (numbers with a unit or of two digits or more, decimals) and every
  code or model number (``E-004``, ``HL-M200``) appears in the cited chunks: a sentence that changes
  "15 g" into "25 g" keeps most of its words and is still wrong;
- and either at least ``LEXICAL_SUPPORT`` of its content terms (English stems without stop words,
  Chinese characters and character pairs) are in the cited chunks, or, for a sentence in another
  language than a cited chunk, its embedding is within ``TRANSLATION_SUPPORT`` of one of that chunk's
  sentences (a faithful translation shares no words with its source; the values rule above carries
  most of the weight there). Within one language the words decide alone: every faithful paraphrase
  of the bilingual set shares 60 % of its terms with its source, and embedding a chunk's sentences
  cost ~350 ms of CPU a turn (``bench.turn``) where the words had already decided.

A sentence that cites nothing is credited to the one source that supports it (as the final text's
marker repair does), else left out. Lines kbbot writes itself (the extractive answer's label) and
lines that state nothing (fewer than two content terms: "Steps:", a table rule) pass; they are held
until the next sentence is shown, so an answer whose every claim is left out shows nothing.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipelines.analysis import CJK_CHAR, ZH_FUNCTION, unigrams
from pipelines.citations import MARKER, normalize_markers
from pipelines.text import detect_language, restrict_links, split_sentences

# The share and the cosine, chosen on the bilingual set in tests/test_grounding.py (faithful and
# unfaithful paraphrases and translations of examples/kb sentences); the share is the groundedness
# definition's of pipelines/answer_eval.py.
LEXICAL_SUPPORT = 0.6
TRANSLATION_SUPPORT = 0.815

# Tokens that hold a digit: numbers as written ("4,000", "1.5", "60–80" is two), a number with its unit
# run on ("15g", "50Hz"), and codes (E-004, HL-M200-015, 6309-2Z, IP55, P00.14, R134a).
_TOKEN = re.compile(r"(?<![\w.-])[A-Za-z0-9]+(?:[-.,/][A-Za-z0-9]+)*")
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
_NUMBER_UNIT = re.compile(r"(\d+(?:\.\d+)?)[A-Za-z]{1,3}")
# A list position is not a value: "1." or "2)" opening a line, "Step 3", "第 2 步".
_LINE_START = re.compile(r"^[\s*_>#-]*$")
_LIST_MARK = re.compile(r"[.)、](?:\s|$)")
_STEP_WORD = re.compile(r"(?:\bsteps?|\bno\.|#|第)\s*$", re.I)
# Slack's mention markup (<@U0BOSS>, <!subteam^S0TEAM|@ops>) names people, not values: the Slack
# adapter defuses it; the ids in it are no fact a source must hold.
_CHAT_MENTION = re.compile(r"<[@#!][^<>\s|]*(?:\|[^<>]*)?>")


def _number(text: str) -> str:
    number = text.replace(",", "")
    return (number.rstrip("0").rstrip(".") or "0") if "." in number else number


def facts(text: str) -> set[str]:
    """The values and codes ``text`` states, normalised ("4,000" -> "4000", "1.50" -> "1.5", codes
    lower-cased): what a supported sentence must take from its sources exactly. A list position
    ("1." opening a line, "Step 2") is not a value, nor a chat mention's id."""
    found = set()
    text = _CHAT_MENTION.sub(" ", text)
    for match in _TOKEN.finditer(text):
        token = match.group()
        if not any(ch.isdigit() for ch in token):
            continue
        if _NUMBER.fullmatch(token):
            before = text[: match.start()]
            if token.isdigit() and _STEP_WORD.search(before):
                continue  # "Step 12", "第 105 步"
            if len(token) <= 2 and _LINE_START.match(before) and _LIST_MARK.match(text, match.end()):
                continue
            found.add(_number(token))
        elif unit := _NUMBER_UNIT.fullmatch(token):
            found.add(_number(unit.group(1)))
        else:
            found.add(token.lower().rstrip(".,"))
    return found


def content_terms(text: str) -> set[str]:
    """Stemmed English words without stop words, codes whole, Chinese characters and character pairs."""
    chars = {c for c in CJK_CHAR.findall(text) if c not in ZH_FUNCTION}
    return set(unigrams(text)) | chars


def is_claim(sentence: str) -> bool:
    """A sentence that states something: two content terms or more ("Steps:" and "1." state nothing)."""
    return len(content_terms(MARKER.sub("", sentence))) >= 2


class SentenceEmbedder(Protocol):
    """The embedding model as the check uses it: a claim as a query, source sentences as passages.
    e5's asymmetric roles separated faithful translations from same-topic claims better than passage
    against passage on tests/fixtures/grounding (translations 0.819-0.913, unsupported 0.811-0.863)."""

    def query(self, text: str) -> np.ndarray:
        """The L2-normalised query vector of ``text``."""

    def passages(self, texts: list[str]) -> np.ndarray:
        """L2-normalised passage vectors of ``texts``, one row each."""


@dataclass
class _Source:
    text: str
    language: str
    terms: set[str]
    facts: set[str]
    sentences: list[str]
    vectors: np.ndarray | None = None


# Source sentences' passage vectors, by text, across turns: the chunks a knowledge base's questions
# cite recur, and embedding one chunk's sentences costs ~0.3 s of CPU (bench.turn). Kept per embedder
# (another model's vectors are not comparable) for as long as it lives; 4,096 vectors of 384 floats: 6 MB.
_VECTORS: weakref.WeakKeyDictionary[SentenceEmbedder, dict[str, np.ndarray]] = weakref.WeakKeyDictionary()
_VECTORS_KEPT = 4096


_VECTORS_LOCK = threading.Lock()  # gates judge in worker threads (CheckedAnswer's async path), many turns at once


def _passage_vectors(embedder: SentenceEmbedder, sentences: list[str]) -> list[np.ndarray]:
    with _VECTORS_LOCK:
        kept = _VECTORS.setdefault(embedder, {})
        found = {s: kept[s] for s in dict.fromkeys(sentences) if s in kept}
    missing = [s for s in dict.fromkeys(sentences) if s not in found]
    if missing:  # embedded outside the lock: another turn's gate need not wait for this one's model run
        made = dict(zip(missing, embedder.passages(missing), strict=True))
        with _VECTORS_LOCK:
            if len(kept) + len(made) > _VECTORS_KEPT:
                kept.clear()
            kept.update(made)
        found.update(made)
    return [found[s] for s in sentences]


class SupportCheck:
    """Whether numbered sources (the texts a model was shown, in ``[n]`` order) hold a sentence.

    ``embedder`` enables the translation path; without it only shared terms count. Each source is
    analysed once, when a sentence first needs it, and its sentences embedded once, when a sentence in
    another language first fails on terms.
    """

    def __init__(self, sources: Sequence[str], embedder: SentenceEmbedder | None = None):
        self.texts = list(sources)
        self.embedder = embedder
        self._sources: dict[int, _Source] = {}

    def __len__(self) -> int:
        return len(self.texts)

    def _source(self, number: int) -> _Source:
        source = self._sources.get(number)
        if source is None:
            text = self.texts[number - 1]
            source = self._sources[number] = _Source(text, detect_language(text), content_terms(text), facts(text),
                                                     [s for s in split_sentences(text) if is_claim(s)])
        return source

    def _vectors(self, source: _Source) -> np.ndarray:
        if source.vectors is None:
            assert self.embedder is not None
            source.vectors = np.stack(_passage_vectors(self.embedder, source.sentences))
        return source.vectors

    def holds(self, sentence: str, numbers: Collection[int], *, by_meaning: bool = True) -> bool:
        """Whether the sources ``numbers`` (1-based) together support ``sentence`` (module docstring);
        ``by_meaning`` False: by shared terms only (no embedding)."""
        cited = [self._source(n) for n in dict.fromkeys(numbers) if 1 <= n <= len(self.texts)]
        if not cited:
            return False
        bare = MARKER.sub("", sentence)
        if not facts(bare) <= set().union(*(s.facts for s in cited)):
            return False
        terms = content_terms(bare)
        if not terms:
            return True
        if len(terms & set().union(*(s.terms for s in cited))) / len(terms) >= LEXICAL_SUPPORT:
            return True
        return by_meaning and self._close_in_meaning(bare, cited)

    def may_embed(self, text: str) -> bool:
        """Whether checking the sentences of ``text`` may run the embedding model: there is one, and a
        source they cite (any source, for a sentence that cites none) is in another language than
        ``text``; within one language the words decide alone. Cheap: the caller decides by it whether a
        judgement leaves the event loop."""
        if self.embedder is None or not self.texts:
            return False
        every = range(1, len(self.texts) + 1)
        markers, bare = MARKER.findall(text), MARKER.sub("", text)
        cited = {n for n in (int(m) for m in markers) if n in every}
        # A marker-less claim beside cited ones goes to ``holder`` over every source.
        if not cited or sum(is_claim(u) for u in split_sentences(bare)) > len(markers):
            cited = set(every)
        language = detect_language(bare)
        return any(self._source(n).language != language for n in cited)

    def _close_in_meaning(self, sentence: str, cited: list[_Source]) -> bool:
        if self.embedder is None:
            return False
        language = detect_language(sentence)
        other = [s for s in cited if s.sentences and s.language != language]
        if not other:
            return False  # same language: the shared words have decided
        vector = self.embedder.query(sentence)
        return any(float(np.max(self._vectors(source) @ vector)) >= TRANSLATION_SUPPORT for source in other)

    def holder(self, sentence: str) -> int | None:
        """The source that supports an uncited ``sentence`` on its own: by shared terms first (the one
        sharing the most), then by meaning; None when no source does."""
        bare = MARKER.sub("", sentence)
        terms = content_terms(bare)
        ranked = sorted(range(1, len(self.texts) + 1), key=lambda n: -len(terms & self._source(n).terms))
        for by_meaning in (False, True):
            for number in ranked:
                if self.holds(bare, [number], by_meaning=by_meaning):
                    return number
            if self.embedder is None:
                break
        return None


@dataclass
class GateStats:
    """What the gate did to one answer (the turn's trace and record carry it)."""

    shown: int = 0  # claims shown
    left_out: int = 0  # claims no cited source supports
    repeated: int = 0  # claims said before in the same answer (a small model's loop)
    markers_added: int = 0  # claims that cited nothing, credited to the source that holds them
    links_removed: list[str] = field(default_factory=list)


# A sentence is complete once something other than whitespace and citation markers follows it:
# markers written after the full stop ("... grease. [1]") or on the next line belong to it.
_MARKERISH = re.compile(r"\s*(?:[\[【［]\s*\d{1,3}(?:\s*[,，、;；]\s*\d{1,3})*\s*[\]】］]\s*)*")
_OPEN_MARKER = re.compile(r"[\[【［]\s*(?:\d{1,3}(?:\s*[,，、;；]\s*\d{0,3})*)?\s*$")
_LEAD = re.compile(r"\s*")
# A link still open where a line ends: its label, its address (``[shop](`` with the address on the next line),
# a reference definition's label, or a tag's attributes (``<a href="https:``). A unit goes on past such a line
# end, so that the link is judged whole; up to a blank line, which ends it in every renderer.
_OPEN_LINK = re.compile(r"(?:\[[^\]]*|\]\([^)]*|<[A-Za-z][^<>]*|(?:^|\n)[ ]{0,3}\[[^\]]+\]:\s*)$")
_JOINED_LINES = 4


class SentenceGate:
    """The one held-back sentence between a model's stream and what the user sees.

    ``feed(delta)`` returns the text that may be shown now (possibly empty); ``close()`` the rest once
    the model is done. ``text`` is everything shown: the answer's final text.
    """

    def __init__(self, check: SupportCheck, *, allowed_hosts: Collection[str] = (), trusted: Collection[str] = ()):
        self.check = check
        self.allowed_hosts = set(allowed_hosts)
        self.trusted = {t.strip() for t in trusted}
        self.stats = GateStats()
        self._buffer = ""
        self._shown: list[str] = []
        self._held = ""  # separators and lines that state nothing, waiting for the next claim shown
        self._line_start = True  # the next unit begins a line
        self._said: set[str] = set()

    @property
    def text(self) -> str:
        return "".join(self._shown)

    def feed(self, delta: str) -> str:
        self._buffer += delta
        return self._release(final=False)

    def add(self, delta: str) -> bool:
        """``feed`` in two steps, for a caller that judges elsewhere than it receives: adds ``delta`` and
        says whether a unit is complete, so that ``release()`` would judge it."""
        self._buffer += delta
        return self._complete_unit(final=False) is not None

    def release(self) -> str:
        """What ``feed`` returns: the complete units judged, the text that may be shown now."""
        return self._release(final=False)

    def may_embed(self, final: bool = False) -> bool:
        """Whether judging the complete unit buffered (``final``: all that is buffered) may run the
        embedding model (``SupportCheck.may_embed``): ~40 ms a sentence, more for a source's sentences
        the first time, too long to hold an event loop. A delta is a token: one unit completes at a time."""
        cut = len(self._buffer) if final else self._complete_unit(final=False)
        return cut is not None and self.check.may_embed(self._buffer[:cut])

    def close(self) -> str:
        """The rest, the model being done; lines that state nothing after the last claim are dropped."""
        text = self._release(final=True)
        self._held = ""
        return text

    def _release(self, final: bool) -> str:
        out: list[str] = []
        while (cut := self._complete_unit(final)) is not None:
            unit, self._buffer = self._buffer[:cut], self._buffer[cut:]
            if shown := self._judge(unit):
                out.append(self._as_rendered(self.text + "".join(out), shown))
        text = "".join(out)
        if text:
            self._shown.append(text)
        return text

    def _complete_unit(self, final: bool) -> int | None:
        """Where the first complete unit of the buffer ends (its markers and the whitespace up to its
        line end included), or None while it may still grow."""
        buffer = self._buffer
        start = _LEAD.match(buffer).end()
        if start == len(buffer):
            return len(buffer) if final and buffer else None
        line_end = buffer.find("\n", start)
        for _ in range(_JOINED_LINES):
            if line_end < 0 or not _OPEN_LINK.search(buffer[start:line_end]):
                break
            following = buffer.find("\n", line_end + 1)
            if following >= 0 and not buffer[line_end + 1:following].strip():
                break
            line_end = following
        line = buffer[start:] if line_end < 0 else buffer[start:line_end]
        # A table row is one unit, in a list item too: its cells are not sentences of their own.
        sentences = [line] if line.count("|") >= 2 else split_sentences(line.replace("\n", " "))
        first = start + line.replace("\n", " ").find(sentences[0]) + len(sentences[0]) if sentences else start
        if len(sentences) > 1 and not _OPEN_LINK.search(buffer[start:first]):
            end = first
        elif line_end >= 0:
            end = line_end
        else:
            return len(buffer) if final else None
        rest = buffer[end:]
        after = rest[_MARKERISH.match(rest).end():]
        if not after.strip() or _OPEN_MARKER.match(after.lstrip()):
            # Nothing yet after the sentence, or "[" / "[1" that may become its marker: wait.
            return len(buffer) if final else None
        trailing = len(rest) - len(after)
        return end + trailing + re.match(r"[ \t]*\n?", after).end()

    def _as_rendered(self, before: str, text: str) -> str:
        """``text``, judged as a renderer reads it: after ``before``, all that was shown. A link can begin in
        one unit and end in the next (a reference definition after its uses, a label left open): what was
        shown cannot be taken back, so ``text`` loses its part of such a link, or goes whole."""
        whole, removed = restrict_links(before + text, self.allowed_hosts)
        if not removed:
            return text
        self.stats.links_removed += removed
        if whole.startswith(before):
            return whole[len(before):]
        self.stats.shown -= 1
        self.stats.left_out += 1
        return ""

    def _judge(self, unit: str) -> str:
        """What of ``unit`` is shown now (cleaned; with what was held before it), or ""."""
        body = unit.strip()
        lead = unit[: len(unit) - len(unit.lstrip())]
        trail = unit[len(lead) + len(body):]
        line_start = self._line_start or "\n" in lead
        self._line_start = trail.endswith("\n") or (not body and unit.endswith("\n"))
        if not body:
            self._held += unit
            return ""
        body, removed = restrict_links(normalize_markers(body), self.allowed_hosts)
        self.stats.links_removed += removed
        bare = MARKER.sub("", body).strip()
        if bare in self.trusted or not is_claim(body):
            self._held += lead + body + trail
            return ""
        key = " ".join(bare.split())
        shown = self._checked(body, bare) if key not in self._said else None
        if shown is None:
            if key in self._said:
                self.stats.repeated += 1
            else:
                self.stats.left_out += 1
            # A left-out line goes whole (the blank lines after it stay); a sentence left out inside a
            # line keeps that line's end.
            self._held += lead + "\n" * max(0, trail.count("\n") - line_start)
            return ""
        self._said.add(key)
        self.stats.shown += 1
        self._held += lead + shown + trail
        text, self._held = self._held, ""
        return text if self.stats.shown > 1 else text.lstrip()

    def _checked(self, body: str, bare: str) -> str | None:
        """``body`` as shown (the markers it may keep, one added when it cites nothing), or None when
        no source it cites supports it."""
        count = len(self.check)
        numbers = [n for n in (int(m) for m in MARKER.findall(body)) if 1 <= n <= count]
        body = MARKER.sub(lambda m: m.group(0) if 1 <= int(m.group(1)) <= count else "", body)
        if numbers:
            if not self.check.holds(bare, numbers):
                return None
        else:
            holder = self.check.holder(bare)
            if holder is None:
                return None
            body = _with_marker(body, holder)
            self.stats.markers_added += 1
        return body


def _with_marker(body: str, number: int) -> str:
    """``body`` with ``[number]`` after its last word (before a closing full stop or colon)."""
    match = re.search(r"[.。!?！？；;:：]?\s*$", body)
    cut = match.start() if match else len(body)
    return f"{body[:cut]} [{number}]{body[cut:]}"
