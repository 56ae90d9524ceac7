"""Where "Add to the knowledge base" (``bot.knowledge.loop.expert.FolderCapture``) puts an expert's reply in a
folder source, and who may read it there.

A reply is written to ``expert-answers/<platform>-<channel>/`` of the folder: the place it was said in. Its
readers are that place (``channel:<id>``, as for a turn answered there), whatever the source's ``acl:``
says, so what was said in a private channel is never public once indexed. Files directly under
``expert-answers/`` (captured before places were kept) are read as the ``acl:`` says.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

CAPTURED = "expert-answers"


def place_folder(platform: str, channel: str) -> str:
    """The folder (relative to the source's) of replies said in ``channel`` of ``platform``."""
    return f"{CAPTURED}/{re.sub(r'[^A-Za-z0-9_]', '_', platform)}-{re.sub(r'[^A-Za-z0-9_-]', '_', channel)}"


def place_readers(key: str) -> list[str] | None:
    """The readers of a file at ``key`` (its path relative to the folder) when it is a captured reply of a
    place; None for every other file."""
    parts = PurePosixPath(key).parts
    if len(parts) < 3 or parts[0] != CAPTURED:
        return None
    _, dash, channel = parts[1].partition("-")
    return [f"channel:{channel.lower()}"] if dash and channel else None
