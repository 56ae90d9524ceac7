"""``[n]`` citation markers as kbbot shows them, from what models actually write.

Small models write ``【1】``, ``[1,2]``, ``［1］`` or put ``[1] [2][3]`` on a line of its own after
the text; all of it becomes the one form ``[1][2]``, on the line it supports. They also imitate
the prompt's ``<source id="1">`` tags (the 1.5B local model wrote ``<sources id="1">`` after each
paragraph of a Chinese answer) and, at temperature 0, fall into a loop that repeats one paragraph
until ``max_tokens``: a tag becomes its marker, and a paragraph said again is said once.
"""

from __future__ import annotations

import re

from pipelines.text import split_sentences, terms

MARKER = re.compile(r"\[(\d{1,3})\]")
_VARIANT = re.compile(r"[\[【［]\s*(\d{1,3}(?:\s*[,，、;；]\s*\d{1,3})*)\s*[\]】］]")
_ONLY_MARKERS = re.compile(r"(?:\s*\[\d{1,3}\])+\s*")
_SOURCE_TAG = re.compile(r"</?sources?\b[^<>]*>")
_TAG_ID = re.compile(r"""\bid\s*=\s*["']?(\d{1,3})""")


def _tag_marker(match: re.Match[str]) -> str:
    number = _TAG_ID.search(match.group(0))
    return f"[{number.group(1)}]" if number and not match.group(0).startswith("</") else ""


def _unrepeated(text: str) -> str:
    """Each paragraph once: a paragraph (blank-line separated) equal to an earlier one is dropped;
    a text with no repeat is returned as written (its blank lines untouched)."""
    seen: set[str] = set()
    kept: list[str] = []
    paragraphs = re.split(r"\n\s*\n", text)
    for paragraph in paragraphs:
        key = " ".join(paragraph.split())
        if key and key in seen:
            continue
        seen.add(key)
        kept.append(paragraph)
    return text if len(kept) == len(paragraphs) else "\n\n".join(kept)


def normalize_markers(text: str) -> str:
    """``[n]`` markers only, each list split (``[1,2]`` -> ``[1][2]``), a copied ``<source id="n">``
    tag as ``[n]``, a repeated paragraph once, and a line holding nothing but markers joined to the
    text line above it (the sentences it cites)."""
    text = _unrepeated(_SOURCE_TAG.sub(_tag_marker, text))
    text = _VARIANT.sub(lambda m: "".join(f"[{n}]" for n in re.findall(r"\d+", m.group(1))), text)
    out: list[str] = []
    for line in text.split("\n"):
        last = next((i for i in range(len(out) - 1, -1, -1) if out[i].strip()), None)
        if line.strip() and _ONLY_MARKERS.fullmatch(line) and last is not None:
            out[last] = out[last].rstrip() + " " + "".join(m.group(0) for m in MARKER.finditer(line))
            del out[last + 1:]
            continue
        out.append(line)
    return "\n".join(out)


def cited_numbers(text: str) -> list[int]:
    """The source numbers cited in ``text``, in order of first appearance."""
    return list(dict.fromkeys(int(n) for n in MARKER.findall(text)))


def sentence_citations(text: str) -> list[tuple[str, list[int]]]:
    """Each sentence of ``text`` (markers removed) with the sources it cites.

    A sentence without a marker of its own is covered by the next marker on its line ("A. B. [1]"
    cites 1 for both); a sentence whose line has no marker after it cites nothing.
    """
    pairs: list[tuple[str, list[int]]] = []
    for line in text.splitlines():
        pending: list[str] = []
        for sentence in split_sentences(line):
            numbers = cited_numbers(sentence)
            bare = MARKER.sub("", sentence).strip()
            if not numbers:
                if bare:
                    pending.append(bare)
                continue
            pairs.extend((p, numbers) for p in pending)
            pending = []
            if bare:
                pairs.append((bare, numbers))
            elif pairs:  # a marker split off as a sentence of its own belongs to the one before
                last, cited = pairs[-1]
                pairs[-1] = (last, list(dict.fromkeys(cited + numbers)))
        pairs.extend((p, []) for p in pending)
    return pairs


# A sentence with no marker is credited to the source holding at least this share of its content
# terms: the 1.5B local model cited nothing in 5 of its first 6 clapnq answers, most of them
# paraphrasing one source closely.
REPAIR_OVERLAP = 0.6


def attach_missing_markers(text: str, sources: list[str]) -> str:
    """``text`` with a ``[n]`` added after each sentence of a line that cites nothing, when the
    sentence's content terms are mostly (``REPAIR_OVERLAP``) in source ``n`` (the best such
    source); everything else is left as written. ``sources``: the texts the model was shown, in
    ``[n]`` order."""
    if not sources:
        return text
    source_terms: list[set[str]] = []  # read only when a line cites nothing (most lines do cite)
    lines = []
    for line in text.split("\n"):
        if MARKER.search(line):  # a marked line: its markers cover its sentences
            lines.append(line)
            continue
        position = 0
        for sentence in split_sentences(line):
            end = line.find(sentence, position) + len(sentence)
            words = set(terms(sentence))
            source_terms = source_terms or [set(terms(s)) for s in sources]
            best = max(range(len(sources)), key=lambda n: len(words & source_terms[n]))
            if len(words) >= 2 and len(words & source_terms[best]) / len(words) >= REPAIR_OVERLAP:
                marker = f" [{best + 1}]"
                line = line[:end] + marker + line[end:]
                end += len(marker)
            position = end
        lines.append(line)
    return "\n".join(lines)
