"""Who can fill a gap: the owner of the document nearest to its questions.

The nearest document is the best of the chunks retrieved for the gap's turns (``Gap.nearest``). Its
owners come from its source's ``owners:`` map (``SourceSettings.owners``): for a folder a path
prefix relative to the folder, for web pages a URL prefix, for Confluence also ``author:NAME`` (the
page's author, kept in the chunk's meta) and ``space:KEY``; the longest matching prefix wins, an
author before a space. An owner is a Slack user id (``U…``/``W…``) or a Telegram user id (a number).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from bot.messages import say

Owners = Callable[[dict[str, Any]], list[str]]


def _longest(owners: dict[str, list[str]], value: str) -> tuple[int, list[str]] | None:
    best = None
    for prefix, ids in owners.items():
        if prefix and value.startswith(prefix) and (best is None or len(prefix) > best[0]):
            best = (len(prefix), ids)
    return best


def owners_resolver(sources: list[Any], resolve: Callable[[str], Path]) -> Owners:
    """``chunk -> owner ids`` (``[]``: nobody) for ``sources`` (``SourceSettings``); ``resolve`` makes a
    source's ``path`` absolute as the refresher does."""
    mapped = [s for s in sources if s.owners]
    roots = {s.name: resolve(s.path).resolve().as_posix().rstrip("/") + "/" for s in mapped if s.path}

    def owners_of(chunk: dict[str, Any]) -> list[str]:
        doc_id, source = str(chunk.get("doc_id") or ""), str(chunk.get("source") or "")
        author, space = chunk.get("author"), chunk.get("confluence_space")
        best: tuple[int, list[str]] | None = None
        for src in mapped:
            if src.confluence is not None:
                for key in (f"author:{author}" if author else None, f"space:{space}" if space else None):
                    if key and key in src.owners:
                        return list(src.owners[key])
            if src.path:
                root = roots[src.name]
                if not doc_id.startswith(root):
                    continue
                relative = PurePosixPath(doc_id[len(root):]).as_posix()
                found = _longest({k.removeprefix("./"): v for k, v in src.owners.items()}, relative)
            else:
                found = _longest({k: v for k, v in src.owners.items() if "://" in k}, source)
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        return list(best[1]) if best else []

    return owners_of


def split_by_owner(gaps: list[dict[str, Any]], owners_of: Owners) -> tuple[dict[str, list[dict[str, Any]]],
                                                                           list[dict[str, Any]]]:
    """({owner id: their gaps}, the gaps nobody owns)."""
    mine: dict[str, list[dict[str, Any]]] = {}
    nobody = []
    for gap in gaps:
        nearest = gap.get("nearest") or []
        ids = owners_of(nearest[0]) if nearest else []
        for owner in ids:
            mine.setdefault(owner, []).append(gap)
        if not ids:
            nobody.append(gap)
    return mine, nobody


def owner_text(gaps: list[dict[str, Any]], *, since: str, until: str, questions: int = 5, language: str = "en") -> str:
    """An owner's list: each gap's questions and the passages that came closest (plain text)."""
    lines = [say("owners_head", language, since=since[:10], until=until[:10])]
    for i, gap in enumerate(gaps, 1):
        lines += ["", say("owners_gap", language, number=i, question=gap["representative"], count=gap["count"])]
        lines += [f"   · {q}" for q in gap["questions"][1:questions]]
        for chunk in gap.get("nearest") or []:
            if chunk.get("withheld"):
                lines.append(say("owners_withheld", language))
                continue
            excerpt = " ".join(str(chunk.get("excerpt") or "").split())[:200]
            lines.append(say("owners_closest", language, title=chunk.get("title") or chunk.get("source"),
                             source=chunk.get("source"), excerpt=excerpt))
    return "\n".join(lines)
