"""Language-aware text helpers shared by the splitter, the ranker and the extractive answerer.

Chinese has no spaces, so word-based tools see a whole paragraph as one token; these helpers
treat CJK characters (and their bigrams) as terms and split sentences on both 。！？ and .!?.
"""

from __future__ import annotations

import html
import re
import unicodedata

# The answer's link filter lives in pipelines/links.py; these names are also this module's.
from pipelines.links import link_allowed, link_host, restrict_links, web_link_host  # noqa: F401

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{_CJK}]")
_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
# A sentence ends after 。！？；!? (CJK may be followed directly by text), or after . when
# whitespace follows (so "1.5" stays whole) and the period does not end "e.g.", "vs." or "No.".
_SENTENCE_END = re.compile(r"(?<=[。！？；!?])(?![”」』）)])\s*"
                           r"|(?<=[.])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bE\.g\.)(?<!\bvs\.)(?<!\bNo\.)\s+(?=\S)")
_TERM = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+", re.UNICODE)

LANGUAGE_NAMES = {"zh": "Chinese (简体中文)", "en": "English"}

_EN_STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i in is it its my of on or should that the this to "
    "what when where which who why will with you your we our me was were has have had if not no".split()
)
_ZH_STOPWORDS = frozenset("的 了 吗 呢 是 在 和 与 怎 么 什 如 何 哪 个 我 你 请 要 有 吧 啊 就 都 也 把 被 这 那".split())


def cjk_ratio(text: str) -> float:
    """Share of letters in ``text`` that are CJK characters (0.0 when there are no letters)."""
    letters = _LETTER.findall(text)
    if not letters:
        return 0.0
    return sum(1 for ch in letters if _CJK_CHAR.match(ch)) / len(letters)


def detect_language(text: str) -> str:
    """``zh`` when a meaningful share of the letters is CJK, else ``en``.

    CJK characters carry far more meaning per character than Latin letters, so a text that is
    30% CJK by letter count is mostly Chinese by content (model numbers are Latin in both).
    """
    return "zh" if cjk_ratio(text) > 0.3 else "en"


def split_sentences(text: str) -> list[str]:
    """Split into sentences on Chinese and English boundaries, keeping punctuation attached.

    Line breaks are boundaries too: list items, table rows and headings are units of their own,
    and a table row is never cut inside.
    """
    sentences: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("|"):
            sentences.append(line.strip())
            continue
        for part in _SENTENCE_END.split(line):
            if part and part.strip():
                sentences.append(part.strip())
    return sentences


def terms(text: str) -> list[str]:
    """Content terms for lexical overlap: lower-cased words, CJK characters and CJK bigrams."""
    out: list[str] = []
    prev_cjk = ""
    for tok in _TERM.findall(text.lower()):
        if _CJK_CHAR.match(tok):
            if tok not in _ZH_STOPWORDS:
                out.append(tok)
            if prev_cjk:
                out.append(prev_cjk + tok)
            prev_cjk = tok
        else:
            prev_cjk = ""
            if tok not in _EN_STOPWORDS:
                out.append(tok)
    return out


def breadcrumb(title: str | None, path: list[str]) -> str:
    """``Title > Section > Subsection``: the line that opens every chunk, so a chunk read alone
    (by BM25, by the model, by a person) still says which document and section it is from."""
    parts = [p for p in ([title] if title else []) + list(path) if p]
    if len(parts) > 1 and parts[0].strip() == parts[1].strip():
        parts = parts[1:]
    return " > ".join(parts)


# Fault codes and model numbers: letters, a hyphen, then something with a digit (E-007,
# HL-M200, HL-M200-7R5). Kept verbatim through rewrites and carried over to follow-ups.
_IDENTIFIER = re.compile(r"(?<![\w-])[A-Za-z]{1,4}-[A-Za-z0-9]*\d[A-Za-z0-9]*(?:-[A-Za-z0-9]+)*")


def identifiers(text: str) -> list[str]:
    """Codes and model numbers in ``text``, in order, without repeats."""
    return list(dict.fromkeys(m.group(0) for m in _IDENTIFIER.finditer(text or "")))


# The tags that delimit data in our prompts. Text from documents, history or users must not be
# able to close one and pose as instructions, so such tags inside data lose their "<". A model reads
# through spellings a fixed pattern would miss (``< /source>``, ``<\u200b/source>``, ``&lt;/source&gt;``,
# fullwidth ``＜／ｓｏｕｒｃｅ＞``), so the text is matched in a normalised form: HTML character references
# decoded, invisible format characters dropped, compatibility forms folded (NFKC), case ignored.
_TAG_NAMES = r"(?:sources?|history|facts|question|conversation|last_message|passages?|message|earlier_queries)"
_PROMPT_TAG = re.compile(r"<\s*/?\s*" + _TAG_NAMES + r"(?![a-z0-9_])")
_CHAR_REFERENCE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")


def _normalised(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` as a model would read it (see above), and for each of its characters the span of
    ``text`` it came from."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        reference = _CHAR_REFERENCE.match(text, i) if text[i] == "&" else None
        decoded = html.unescape(reference.group()) if reference else ""
        if reference and decoded != reference.group():
            end = reference.end()
        else:
            decoded, end = text[i], i + 1
        for ch in decoded:
            if unicodedata.category(ch) == "Cf":  # zero-width spaces and joiners, soft hyphens, BOM...
                continue
            for folded in unicodedata.normalize("NFKC", ch).lower():
                out.append(folded)
                spans.append((i, end))
        i = end
    return "".join(out), spans


def neutralize_tags(text: str) -> str:
    text = text or ""
    if not any(c in text for c in "<&\uff1c\ufe64"):  # nothing that could open a tag: the common case
        return text
    normal, spans = _normalised(text)
    cuts = [spans[m.start()] for m in _PROMPT_TAG.finditer(normal)]
    for start, end in reversed(cuts):  # the opening bracket, however it was spelled, becomes "‹"
        text = text[:start] + "‹" + text[end:]
    return text

