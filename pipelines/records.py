"""What the store records of each document, and how its chunks are stamped with that identity.

Shared by every store (``pipelines.store``'s in-memory one, ``pipelines.weaviate_store``), so neither
needs the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

from haystack import Document

DEFAULT_SPACE = "default"
#: Readers of a document its source restricts in no way: everyone who may search its knowledge space.
PUBLIC = "public"
#: Readers of a document held back: its readers could not be established, or no one passes every
#: restriction. No asker holds it and no setting may grant it (``pipelines.acl.principal`` refuses it).
NOBODY = "nobody"

# Bumped whenever conversion, cleaning or splitting changes what a file becomes, so the next
# refresh re-indexes everything once instead of keeping chunks made the old way.
INDEX_FORMAT = "4"


def content_hash(data: bytes) -> str:
    """The content hash a document version is known by: its bytes and the index format (the sources'
    validators keep it too, to know whether the store still holds what they describe)."""
    return hashlib.sha256(INDEX_FORMAT.encode() + b"\x00" + data).hexdigest()


@dataclass
class DocRecord:
    """What the store knows of one document's current version."""

    doc_id: str
    version: int
    content_hash: str
    title: str
    source: str
    space: str = DEFAULT_SPACE
    language: str = "en"
    chunks: int = 0
    root: str | None = None
    # Entity–attribute–value facts read from the document's tables (see components/facts.py).
    facts: list[list[str]] = field(default_factory=list)
    #: Principals who may read it (``public``, ``user:<e-mail>``, ``group:<name>``, ``channel:<id>``): a
    #: reader needs one of them (``pipelines.filters.readers_filter``). Stamped on every chunk.
    readers: list[str] = field(default_factory=lambda: [PUBLIC])
    indexed_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


def chunk_id(doc_id: str, version: int, position: int) -> str:
    """Deterministic chunk id, so re-writing a version overwrites instead of duplicating."""
    return hashlib.sha256(f"{doc_id}\x00{version}\x00{position}".encode()).hexdigest()


def prepare_chunks(record: DocRecord, chunks: list[Document]) -> list[Document]:
    """Stamp chunks with the record's identity and version, and give them deterministic ids."""
    out = []
    for position, chunk in enumerate(chunks):
        meta = {
            **(chunk.meta or {}),
            "doc_id": record.doc_id,
            "version": record.version,
            "position": position,
            "title": record.title,
            "source": record.source,
            "space": record.space,
            "content_hash": record.content_hash,
            "readers": list(record.readers),
        }
        meta.setdefault("language", record.language)
        out.append(
            Document(
                id=chunk_id(record.doc_id, record.version, position),
                content=chunk.content,
                meta=meta,
                embedding=chunk.embedding,
            )
        )
    return out
