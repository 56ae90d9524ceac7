"""The two collections' definitions, their names, and the keyword-analysis version they were built for.

Chunks: no vectorizer, cosine distance; ``content``, ``title`` and ``header`` tokenized as
``DEFAULT_TOKENIZATION`` and not filterable; BM25 runs over ``search_text`` (``QUERY_PROPERTIES``); the
keyword properties as ``field``; ``version`` and ``position`` as int; other meta fields come in by
auto-schema. Why trigram and no stop words: docs/evaluation.md, "How the Weaviate schema and fusion were chosen".

A collection records which ``pipelines.analysis.ANALYSIS_VERSION`` its ``search_text`` was written
with; one written by another version is refused (``StoreOutdated``) until ``kbbot reindex`` rewrites it.
"""

from __future__ import annotations

import hashlib
import os
import re
from contextlib import suppress
from typing import Any

import weaviate.exceptions as wexc
from weaviate.classes.config import ConsistencyLevel, DataType, Property, Reconfigure, Tokenization
from weaviate.classes.data import DataObject

from pipelines.analysis import BM25_B, BM25_K1, chunk_search_text
from pipelines.errors import ServiceUnavailable
from pipelines.weaviate_store.integration import ChunkDocumentStore, to_document

DEFAULT_TOKENIZATION = "trigram"
DEFAULT_GRPC_PORT = 50051

KEYWORD_PROPERTIES = ("doc_id", "space", "language", "source", "content_hash", "format", "root")
SEARCHABLE_PROPERTIES = ("content", "title", "header")
# BM25 runs over the chunk's analysed terms (``pipelines.analysis``: stemmed, stop words out, CJK
# bigrams, heading path weighted), stored pre-tokenized and split on whitespace by Weaviate, so the
# server ranks with exactly the terms the embedded store uses. emanual dev hit@1 0.48 -> see docs/evaluation.md.
QUERY_PROPERTIES = ("search_text",)
SEARCH_TEXT_PROPERTY = {"name": "search_text", "dataType": ["text"], "tokenization": "whitespace",
                        "indexFilterable": False}
# Who may read a chunk (``pipelines.filters.readers_filter``): filtered on with ContainsAny, never searched.
READERS_PROPERTY = {"name": "readers", "dataType": ["text[]"], "tokenization": "field", "indexSearchable": False,
                    "indexFilterable": True}
# A document's table facts, as JSON: read back whole, never searched.
FACTS_PROPERTY = {"name": "facts", "dataType": ["text"], "indexSearchable": False, "indexFilterable": False}

MANIFEST_READERS_PROPERTY = {"name": "readers", "dataType": ["text[]"], "indexSearchable": False,
                             "indexFilterable": False}

_CLASS_NAME = re.compile(r"[A-Z][_0-9A-Za-z]*")


class StoreOutdated(ServiceUnavailable):
    """The collection holds chunks indexed for another keyword analysis; serving them would rank
    half the knowledge base with stale terms. The message says what to run."""


def collection_name(name: str) -> str:
    """A valid Weaviate class name for ``name`` (``[A-Z][_0-9A-Za-z]*``): the first letter upper-cased,
    other characters made ``_``, and, when anything had to change beyond the first letter, a short
    hash of the original, so ``Eval_emanual-test`` and ``Eval_emanual_test`` stay two collections."""
    if not name:
        raise ValueError("a Weaviate collection needs a name")
    capitalized = name[:1].upper() + name[1:]
    if _CLASS_NAME.fullmatch(capitalized):
        return capitalized
    cleaned = re.sub(r"[^_0-9A-Za-z]", "_", capitalized)
    if not cleaned[0].isalpha() or not cleaned[0].isupper():
        cleaned = "K" + cleaned
    return f"{cleaned}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def replication_settings(factor: int) -> dict[str, Any]:
    """The ``replicationConfig`` of a class: ``factor`` copies of every object. Asynchronous
    replication repairs a node that was down in the background (otherwise only the objects read
    again get repaired); a deletion made while a copy was away wins over the copy's older object
    (time-based resolution), so a revoked document's chunks do not come back with that node."""
    if factor < 1:
        raise ValueError(f"a replication factor is at least 1, got {factor}")
    if factor == 1:
        return {}
    return {"replicationConfig": {"factor": factor, "asyncEnabled": True,
                                  "deletionStrategy": "TimeBasedResolution"}}


def consistency_level(name: str | None) -> ConsistencyLevel | None:
    """``one``, ``quorum`` or ``all`` as the client's ConsistencyLevel (None: Weaviate's default, quorum)."""
    if name is None:
        return None
    try:
        return ConsistencyLevel(name.upper())
    except ValueError:
        raise ValueError(f"unknown consistency level {name!r} (expected one, quorum or all)") from None


def chunk_collection_settings(name: str, tokenization: str = DEFAULT_TOKENIZATION,
                              replication_factor: int = 1) -> dict[str, Any]:
    """The chunk collection as a REST class definition (``collection_settings`` of WeaviateDocumentStore)."""
    properties: list[dict[str, Any]] = [
        {"name": "_original_id", "dataType": ["text"], "tokenization": "field", "indexSearchable": False},
        # Searched only, never filtered on: no filterable (roaring-set) index beside the BM25 one. With
        # trigrams that second index cost a third of Weaviate's CPU per write (5,000 clapnq chunks:
        # 12.3 -> 8.3 s; bench/retrieval.py's 50,000-chunk copy).
        *({"name": p, "dataType": ["text"], "tokenization": tokenization, "indexFilterable": False}
          for p in SEARCHABLE_PROPERTIES),
        SEARCH_TEXT_PROPERTY,
        *({"name": p, "dataType": ["text"], "tokenization": "field", "indexSearchable": False}
          for p in KEYWORD_PROPERTIES),
        READERS_PROPERTY,
        {"name": "version", "dataType": ["int"]},
        {"name": "position", "dataType": ["int"]},
        {"name": "blob_data", "dataType": ["blob"]},
        {"name": "blob_mime_type", "dataType": ["text"], "tokenization": "field", "indexSearchable": False},
        {"name": "score", "dataType": ["number"]},
    ]
    return {
        "class": name,
        "vectorizer": "none",
        "vectorIndexType": "hnsw",
        "vectorIndexConfig": {"distance": "cosine"},
        # No stopword list: it made no difference to BM25 with trigrams (bench/tokenization.py), and with
        # one a filter on an auto-schema (word-tokenized) field for a value like "a" is an error.
        "invertedIndexConfig": {"indexNullState": True, "bm25": {"k1": BM25_K1, "b": BM25_B},
                                "stopwords": {"preset": "none"}},
        "properties": properties,
        **replication_settings(replication_factor),
    }


def manifest_collection_settings(name: str, replication_factor: int = 1) -> dict[str, Any]:
    """The manifest collection: one object per document plus the meta object; no vectors."""
    keyword = {"dataType": ["text"], "tokenization": "field", "indexSearchable": False}
    return {
        "class": name,
        "vectorizer": "none",
        "vectorIndexConfig": {"skip": True},
        "invertedIndexConfig": {"indexNullState": True},
        "properties": [
            *({"name": p, **keyword} for p in ("doc_id", "content_hash", "title", "source", "space", "language",
                                                 "root", "indexed_at")),
            *({"name": p, "dataType": ["int"]} for p in ("version", "chunks", "knowledge_version", "committed_seq", "analysis")),
            {"name": "seq", "dataType": ["int"], "indexRangeFilters": True},  # read as "seq > last seen"
            {"name": "revoked", "dataType": ["boolean"]},
            FACTS_PROPERTY,
            MANIFEST_READERS_PROPERTY,
        ],
        **replication_settings(replication_factor),
    }


def grpc_port_from_env(default: int = DEFAULT_GRPC_PORT) -> int:
    raw = os.environ.get("WEAVIATE_GRPC_PORT", "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"WEAVIATE_GRPC_PORT must be a port number, got {raw!r}") from None


# --- bringing a collection made by an earlier kbbot up to date ------------------------------------
def has_search_text(collection: Any) -> bool:
    return any(p.name == "search_text" for p in collection.config.get().properties)


def upgrade_chunk_schema(collection: Any) -> None:
    """Adds ``search_text`` when missing and sets this version's BM25 parameters."""
    if not has_search_text(collection):
        try:
            collection.config.add_property(Property(name="search_text", data_type=DataType.TEXT,
                                                    tokenization=Tokenization.WHITESPACE, index_filterable=False))
        except wexc.UnexpectedStatusCodeError:
            if not has_search_text(collection):  # else: added concurrently by another process
                raise
    collection.config.update(inverted_index_config=Reconfigure.inverted_index(bm25_k1=BM25_K1, bm25_b=BM25_B))


def _ensure_property(collection: Any, prop: Property) -> bool:
    """Adds ``prop`` to a collection made by an earlier kbbot that lacks it; True when it was missing."""
    if any(p.name == prop.name for p in collection.config.get().properties):
        return False
    with suppress(wexc.UnexpectedStatusCodeError):  # added concurrently by another process
        collection.config.add_property(prop)
    return True


def ensure_facts_property(manifest: Any) -> None:
    """Manifests made before facts existed get the property (never-searched JSON text)."""
    _ensure_property(manifest, Property(name="facts", data_type=DataType.TEXT, index_searchable=False,
                                        index_filterable=False))


def ensure_manifest_readers(manifest: Any) -> None:
    """Manifests made before permissions were recorded get the property (read back whole, never filtered)."""
    _ensure_property(manifest, Property(name="readers", data_type=DataType.TEXT_ARRAY, index_searchable=False,
                                        index_filterable=False))


def ensure_chunk_readers(collection: Any, public: str) -> int:
    """Chunk collections made before permissions were recorded get the filterable ``readers``
    property, and their chunks the readers they had: everyone of their space (``public``) until the
    next refresh records their source's permissions. Returns how many chunks were stamped."""
    added = _ensure_property(collection, Property(name="readers", data_type=DataType.TEXT_ARRAY,
                                                  tokenization=Tokenization.FIELD, index_searchable=False,
                                                  index_filterable=True))
    return rewrite_chunks(collection, None, {"readers": [public]}) if added else 0


def rewrite_chunks(collection: Any, where: Any, changes: dict[str, Any], limit: int = 10_000) -> int:
    """Sets ``changes`` on the chunks ``where`` selects (all for None; else at most ``limit``, which
    Weaviate caps at its QUERY_MAXIMUM_RESULTS, 10,000 by default), vectors and ids kept."""
    batch: list[DataObject] = []
    done = 0
    objects = (collection.iterator(include_vector=True) if where is None else
               collection.query.fetch_objects(filters=where, include_vector=True, limit=limit).objects)
    for obj in objects:
        props = {k: v for k, v in obj.properties.items() if v is not None}
        props.update(changes)
        vector = obj.vector.get("default") if isinstance(obj.vector, dict) else obj.vector
        batch.append(DataObject(properties=props, uuid=obj.uuid, vector=vector or None))
        if len(batch) >= ChunkDocumentStore.WRITE_BATCH:
            done += _rewrite(collection, batch, None)
            batch = []
    return done + _rewrite(collection, batch, None)


def rewrite_search_text(collection: Any, progress: Any = None) -> int:
    """Rewrites every chunk's ``search_text`` with this version's analysis (vectors and ids kept);
    returns how many chunks were rewritten. ``progress(n)`` hears of each batch."""
    batch: list[DataObject] = []
    done = 0
    for obj in collection.iterator(include_vector=True):
        props = {k: v for k, v in obj.properties.items() if v is not None}
        props["search_text"] = chunk_search_text(to_document(obj))
        vector = obj.vector.get("default") if isinstance(obj.vector, dict) else obj.vector
        batch.append(DataObject(properties=props, uuid=obj.uuid, vector=vector or None))
        if len(batch) >= ChunkDocumentStore.WRITE_BATCH:
            done += _rewrite(collection, batch, progress)
            batch = []
    return done + _rewrite(collection, batch, progress)


def _rewrite(collection: Any, objects: list[DataObject], progress: Any) -> int:
    if not objects:
        return 0
    result = collection.data.insert_many(objects)
    if result.errors:
        first = next(iter(result.errors.values()))
        raise RuntimeError(f"rewriting {len(result.errors)} chunks failed: {getattr(first, 'message', first)}")
    if progress is not None:
        progress(len(objects))
    return len(objects)
