"""The knowledge store: chunks in a Haystack document store plus a manifest of current versions.

Every chunk carries ``doc_id``, ``version`` and ``position``. The manifest maps each document
to its one current version; publishing writes the new chunks first, then switches the manifest
entry (the moment the new version becomes visible and the old one invisible), then deletes the
old chunks. Retrieval drops any chunk whose version is not the manifest's, so a query never
sees a mix of two versions of a document, and a revoked document disappears at once.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

from haystack import Document
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.document_stores.types import DuplicatePolicy

from pipelines.filters import PUBLIC, compile_filter
from pipelines.filters import space_filter as space_filter
from pipelines.keyword_index import KeywordIndex
from pipelines.records import DEFAULT_SPACE as DEFAULT_SPACE
from pipelines.records import DocRecord as DocRecord
from pipelines.records import chunk_id as chunk_id
from pipelines.records import prepare_chunks as prepare_chunks


class KnowledgeStore(Protocol):
    """What indexing and querying need from a store, whatever holds the chunks."""

    document_store: Any

    @property
    def knowledge_version(self) -> int: ...

    def records(self) -> dict[str, DocRecord]: ...

    def record(self, doc_id: str) -> DocRecord | None: ...

    def publish(self, record: DocRecord, chunks: list[Document]) -> DocRecord: ...

    def revoke(self, doc_id: str) -> bool: ...

    def set_readers(self, doc_id: str, readers: list[str]) -> bool: ...

    def commit(self) -> int: ...

    def is_current(self, doc_id: str, version: int) -> bool: ...

    def count_chunks(self) -> int: ...

    def close(self) -> None:
        """Releases connections (a no-op for the in-memory store)."""
        ...


class FilteredDocumentStore(InMemoryDocumentStore):
    """Haystack's in-memory store, matching filters with ``pipelines.filters.compile_filter``: ``in`` on a
    list-valued field (a chunk's ``readers``) is "contains any", as in Weaviate, so the permission filter
    is applied inside the query (before top-k) exactly as it is there."""

    def to_dict(self) -> dict[str, Any]:
        # Saved as Haystack's own store: the file stays what it was, readable by either class.
        data = super().to_dict()
        data["type"] = f"{InMemoryDocumentStore.__module__}.{InMemoryDocumentStore.__name__}"
        return data

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        if not filters:
            return super().filter_documents(filters)
        self._validate_filters(filters)
        match = compile_filter(filters)
        docs = [d for d in self.storage.values() if match(d)]
        return docs if self.return_embedding else [replace(d, embedding=None) for d in docs]

    def embedding_retrieval(self, query_embedding: list[float], filters: dict[str, Any] | None = None,
                            top_k: int = 10, scale_score: bool = False,
                            return_embedding: bool | None = False) -> list[Document]:
        if not filters:
            return super().embedding_retrieval(query_embedding, None, top_k, scale_score, return_embedding)
        if len(query_embedding) == 0 or not isinstance(query_embedding[0], float):
            raise ValueError("query_embedding should be a non-empty list of floats.")
        self._validate_filters(filters)
        match = compile_filter(filters)
        candidates = [d for d in self.storage.values() if d.embedding is not None and match(d)]
        if not candidates:
            return []
        scores = self._compute_query_embedding_similarity_scores(embedding=query_embedding, documents=candidates,
                                                                 scale_score=scale_score)
        keep = self.return_embedding if return_embedding is None else return_embedding
        ranked = sorted(zip(candidates, scores, strict=True), key=lambda pair: pair[1], reverse=True)[:top_k]
        return [replace(d, score=score, embedding=d.embedding if keep else None) for d, score in ranked]


class InMemoryKnowledgeStore:
    """Haystack's in-memory store, saved as JSON under a directory (the embedded default)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        self.directory = Path(directory) if directory else None
        self._lock = threading.RLock()
        self._records: dict[str, DocRecord] = {}
        self._knowledge_version = 0
        self._dirty = False
        # Counts every change of the chunks: the keyword index is rebuilt when it moves.
        self._generation = 0
        self._keywords = KeywordIndex()
        self.document_store = self._new_document_store()
        if self.directory and (self.directory / "manifest.json").exists():
            self._load()

    @staticmethod
    def _new_document_store() -> FilteredDocumentStore:
        # BM25 is scored by our keyword index (pipelines.keyword_index), not by this store; it still
        # tokenizes what it is given for its own BM25, so it keeps its default (cheapest) tokenizer.
        return FilteredDocumentStore(
            embedding_similarity_function="cosine",
            shared=False,
        )

    # --- reading -------------------------------------------------------------------------
    @property
    def knowledge_version(self) -> int:
        return self._knowledge_version

    def records(self) -> dict[str, DocRecord]:
        with self._lock:
            return dict(self._records)

    def record(self, doc_id: str) -> DocRecord | None:
        with self._lock:
            return self._records.get(doc_id)

    def is_current(self, doc_id: str, version: int) -> bool:
        rec = self.record(doc_id)
        return rec is not None and rec.version == version

    def count_chunks(self) -> int:
        return self.document_store.count_documents()

    def keyword_search(self, query: str, *, filters: dict[str, Any] | None = None, top_k: int = 30) -> list[Document]:
        """BM25 on the analysed terms of every chunk (see ``pipelines.keyword_index``)."""
        return self._keywords.search(self.document_store.filter_documents, self._generation, query,
                                     filters=filters, top_k=top_k)

    def close(self) -> None:
        pass


    # --- writing -------------------------------------------------------------------------
    def publish(self, record: DocRecord, chunks: list[Document]) -> DocRecord:
        """Make ``chunks`` the current version of ``record.doc_id``; returns the new record."""
        with self._lock:
            previous = self._records.get(record.doc_id)
            record.version = (previous.version + 1) if previous else 1
            record.chunks = len(chunks)
            prepared = prepare_chunks(record, chunks)
            self.document_store.write_documents(prepared, policy=DuplicatePolicy.OVERWRITE)
            self._records[record.doc_id] = record
            if previous:
                self._delete_version(previous.doc_id, previous.version)
            self._dirty = True
            self._generation += 1
            return record

    def revoke(self, doc_id: str) -> bool:
        with self._lock:
            previous = self._records.pop(doc_id, None)
            if previous is None:
                return False
            self._delete_version(doc_id, previous.version)
            self._dirty = True
            self._generation += 1
            return True

    def set_readers(self, doc_id: str, readers: list[str]) -> bool:
        """Who may read the document now, in its record and on each of its chunks, in place: no
        conversion, no embedding. True when anything changed (the next commit counts it as a change
        of the knowledge, so caches keyed by the knowledge version forget answers built on it)."""
        with self._lock:
            record = self._records.get(doc_id)
            if record is None or sorted(record.readers) == sorted(readers):
                return False
            record.readers = sorted(readers)
            chunks = self.document_store.filter_documents({"operator": "AND", "conditions": [
                {"field": "meta.doc_id", "operator": "==", "value": doc_id},
                {"field": "meta.version", "operator": "==", "value": record.version}]})
            stamped = [replace(c, meta={**c.meta, "readers": list(record.readers)}) for c in chunks]
            if not self.document_store.return_embedding:  # filter_documents dropped the vectors
                stamped = [replace(c, embedding=self.document_store.storage[c.id].embedding) for c in stamped]
            self.document_store.write_documents(stamped, policy=DuplicatePolicy.OVERWRITE)
            self._dirty = True
            self._generation += 1
            return True

    def _delete_version(self, doc_id: str, version: int) -> None:
        self.document_store.delete_by_filter(
            {
                "operator": "AND",
                "conditions": [
                    {"field": "meta.doc_id", "operator": "==", "value": doc_id},
                    {"field": "meta.version", "operator": "==", "value": version},
                ],
            }
        )

    def commit(self) -> int:
        """Advance the knowledge version if anything changed since the last commit, and save."""
        with self._lock:
            if self._dirty:
                self._knowledge_version += 1
                self._dirty = False
                self._save()
            return self._knowledge_version

    # --- persistence ---------------------------------------------------------------------
    def _save(self) -> None:
        if not self.directory:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.directory / "chunks.json", lambda p: self.document_store.save_to_disk(str(p)))
        manifest = {
            "knowledge_version": self._knowledge_version,
            "documents": [asdict(r) for r in self._records.values()],
        }
        _atomic_write(
            self.directory / "manifest.json",
            lambda p: p.write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8"),
        )

    def _load(self) -> None:
        assert self.directory is not None
        manifest = json.loads((self.directory / "manifest.json").read_text(encoding="utf-8"))
        self._knowledge_version = int(manifest.get("knowledge_version", 0))
        self._records = {d["doc_id"]: DocRecord(**d) for d in manifest.get("documents", [])}
        chunks_file = self.directory / "chunks.json"
        if chunks_file.exists():
            loaded = InMemoryDocumentStore.load_from_disk(str(chunks_file))
            docs = loaded.filter_documents()
            # Chunks indexed before permissions were recorded were readable by everyone of their
            # space; they stay so until the next refresh records their source's permissions.
            docs = [d if "readers" in (d.meta or {}) else replace(d, meta={**d.meta, "readers": [PUBLIC]})
                    for d in docs]
            self.document_store.write_documents(docs, policy=DuplicatePolicy.OVERWRITE)
            self._generation += 1


def _atomic_write(target: Path, write: Any) -> None:
    """Write through a temporary file and rename, so a crash never leaves half a store."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_store(kind: str, *, directory: str | os.PathLike[str] | None = None, **options: Any) -> KnowledgeStore:
    """The store factory: ``memory`` (saved under ``directory``) or ``weaviate`` (``url=``)."""
    if kind == "memory":
        return InMemoryKnowledgeStore(directory)
    if kind == "weaviate":
        from pipelines.weaviate_store import WeaviateKnowledgeStore  # here: the Weaviate client is heavy to import

        return WeaviateKnowledgeStore(**options)
    raise ValueError(f"unknown store kind {kind!r} (expected memory or weaviate)")
