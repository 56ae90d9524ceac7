"""The kinds of source a refresh reads, one plugin each, and their registry ``SOURCE_KINDS``.

- ``path``: local folders (``folder``);
- ``urls``: pages and sitemaps (``urls``, with ``fetcher``, ``robots``, ``sitemaps``);
- ``confluence``: a Confluence site (``confluence/``: client, source, permissions);
- ``sharepoint``: a SharePoint site's libraries or a OneDrive, through Microsoft Graph (``sharepoint/``).
- ``gdrive``: a Google Drive folder or shared drive (``gdrive/``: client, source, permissions).

What a kind is and gives is ``kind.SourceKind`` (``kind`` also holds ``SourceItem`` and ``Source``, what
the indexer reads). A new kind is one module or package here and one line below; ``bot`` builds,
schedules, reports and reconciles sources through this registry only.
"""

from __future__ import annotations

from typing import Any

from pipelines.sources.confluence import CONFLUENCE
from pipelines.sources.folder import FOLDER
from pipelines.sources.gdrive import GDRIVE
from pipelines.sources.kind import SourceKind
from pipelines.sources.sharepoint import SHAREPOINT
from pipelines.sources.urls import URLS

#: name (the ``sources:`` entry's key that selects the kind) -> the kind.
SOURCE_KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (FOLDER, URLS, CONFLUENCE, SHAREPOINT, GDRIVE)}


def kind_of(entry: Any) -> SourceKind:
    """The kind of a ``sources:`` entry (the settings check that it is exactly one)."""
    return next(kind for kind in SOURCE_KINDS.values() if kind.selected(entry))
