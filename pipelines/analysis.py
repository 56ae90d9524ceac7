"""Keyword analysis for BM25, the same in every store.

BM25 is only as good as its terms. Whitespace or trigram tokens make "charging", "charge" and
"charger" three unrelated words, and let "how", "can" and "my" outweigh the one word that names a
feature (see the emanual error analysis in docs/evaluation.md). So chunks and queries are analysed here,
once, in Python: English words are lower-cased, stripped of stop words and Snowball-stemmed
(PyStemmer); Chinese becomes overlapping character bigrams (a lone character stays a unigram);
codes such as ``E-004`` and ``HL-M200`` stay whole. The in-memory store scores these terms with
``bm25s``; Weaviate stores them in a ``search_text`` property tokenized on whitespace, so both
stores rank with the same terms and the same ``k1``/``b``.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer
from haystack import Document

from pipelines.text import breadcrumb

# Bump when the analysis changes: stored ``search_text`` of another version is stale.
ANALYSIS_VERSION = 1
# BM25 saturation and length normalisation, in both stores. Short support sections and long
# manual pages mix in one index: a gentle length penalty (b 0.4, not 0.75) and early saturation
# (k1 0.9, not 1.2) measured best on emanual (0.654 vs 0.613 hit@1; docs/evaluation.md).
BM25_K1 = 0.9
BM25_B = 0.4

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
CJK_CHAR = re.compile(f"[{_CJK}]")
# Chinese function characters (particles, pronouns, question words): a term made of one, or a
# character pair straddling one ("多少度" gives 少度, "是哪个" gives 是哪), says nothing about the
# subject. The answerability decision and the sentence check leave them out of a text's content.
ZH_FUNCTION = frozenset("的了吗呢是在和与怎么什如何哪个我你请要有吧啊就都也把被这那")
# Words (letters/digits) with inner hyphens kept, so codes survive whole; CJK runs apart.
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+(?:-[^\W_{_CJK}]+)*")

# A short English stop list: function words and the question words of support questions
# ("how do I", "what is", "can I"), which carry no topic and dominate BM25 otherwise.
ENGLISH_STOPWORDS = frozenset("""
a about an and are as at be been being but by can could did do does doing for from had has have
having he her here hers him his how i if in into is it its itself me my myself no nor not of off
on once only or our ours out over own please she should so some such than that the their theirs
them then there these they this those through to too under until up very was we were what when
where which while who whom why will with would you your yours yourself
""".split())


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def _cjk_terms(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def unigrams(text: str) -> list[str]:
    """Single terms of ``text``, in order (repeats kept: they are term frequencies)."""
    out: list[str] = []
    words: list[str] = []
    for token in _TOKEN.findall((text or "").lower()):
        if _CJK_RUN.fullmatch(token):
            out.extend(_cjk_terms(token))
        elif token not in ENGLISH_STOPWORDS:
            if "-" in token or any(ch.isdigit() for ch in token):
                out.append(token)  # a code or a number: never stemmed
            else:
                words.append(token)
                out.append("\x00")  # placeholder, stemmed below in one call
    if words:
        stems = iter(_stemmer().stemWords(words))
        out = [next(stems) if t == "\x00" else t for t in out]
    return out


def analyze(text: str) -> list[str]:
    """The BM25 terms of ``text``: its unigrams, then each pair of neighbouring Latin terms joined
    by ``_`` ("picture size" -> ``pictur_size``).

    Manuals name features with two-word phrases ("sleep timer", "picture size", "screen lock")
    whose words are everywhere on their own; a pair matches only where both stand together, in
    that order (stop words between them dropped). emanual dev, BM25 alone: hit@1 0.638 -> 0.695,
    hit@5 0.922 -> 0.955. Chinese needs no pairs: its bigrams already are pairs of characters.
    """
    terms = unigrams(text)
    latin = [t if not _CJK_RUN.match(t) else None for t in terms]
    pairs = [f"{a}_{b}" for a, b in zip(latin, latin[1:]) if a and b]
    return terms + pairs


def search_text(heading: str, body: str, heading_weight: int = 2) -> str:
    """What BM25 indexes for a chunk: its heading path ``heading_weight`` times, then its body.

    The heading path (document title > section > subsection) names what a chunk is about in the
    words people ask with; repeating it is the classic field weighting of title over body, which
    a single-field index (Weaviate's, ours) expresses through term frequency.
    """
    head = analyze(heading)
    return " ".join(head * heading_weight + analyze(body))


def chunk_search_text(chunk: Document) -> str:
    """``search_text`` of a stored chunk: its breadcrumb (``title > section``, which the splitter
    put on its first line) weighted as a heading, the rest as body."""
    meta = chunk.meta or {}
    header = meta.get("header") or ""
    crumb = breadcrumb(meta.get("title"), header.split(" > ") if header else [])
    content = chunk.content or ""
    if crumb and content.startswith(crumb):
        return search_text(crumb, content[len(crumb):])
    return search_text(crumb, content)
