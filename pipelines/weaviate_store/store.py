"""``WeaviateKnowledgeStore``: publishing, revoking and reading documents over the two collections.

Same semantics as ``pipelines.store.InMemoryKnowledgeStore``, and the same state for every process
that opens the same collections.

Publishing writes the new version's chunks, waits ``settle_s``, replaces the document's manifest
object (the moment the new version becomes visible and the old one invisible), bumps ``seq``, then
deletes the older chunks. ``CurrentKnowledge`` keeps only chunks of the manifest's version, so a query
never sees a mix; the settle pause lets a query that read the index before the new chunks landed read
the manifest before the switch, so it does not see neither. Revoking writes a tombstone first, then
deletes the chunks; versions keep growing across a revocation.

``records()`` (``CurrentKnowledge`` calls it once per query) costs one read of the meta object when
nothing changed and reads only the documents changed since the last call otherwise; it is never
served from a timer, since the old chunks are gone right after a switch. Writers are expected to be
serialized (the scheduler's Redis lock); a full read every ``FULL_REFRESH_S`` repairs the cache of a
reader should two writers ever race for a sequence number. Measured costs: docs/benchmarks.md, "The Weaviate store".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import weaviate.exceptions as wexc
from haystack import Document
from haystack.document_stores.types import DuplicatePolicy
from weaviate.classes.query import Filter

from pipelines.analysis import ANALYSIS_VERSION, chunk_search_text
from pipelines.fusion import LANGUAGES
from pipelines.records import PUBLIC, DocRecord, prepare_chunks
from pipelines.redact import redact_url
from pipelines.weaviate_store import schema
from pipelines.weaviate_store.connection import Connection
from pipelines.weaviate_store.manifest import META_OBJECT, Manifest, record_of
from pipelines.weaviate_store.options import DEFAULT_ALPHA, DEFAULT_FUSION, FUSIONS
from pipelines.weaviate_store.schema import StoreOutdated

# A query reads the index, then (in CurrentKnowledge) the manifest. Were the manifest switched
# between the two, before the query could see the new chunks, the query would keep neither
# version. Waiting this long between writing the new chunks and switching lets such a query
# finish first; it costs a replaced document this much, far less than embedding it did.
DEFAULT_SETTLE_S = 0.1
FULL_REFRESH_S = 60.0
_EVERY_CHUNK = Filter.by_property("version").greater_or_equal(0)


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
                 tokenization: str = schema.DEFAULT_TOKENIZATION, fusion: str = DEFAULT_FUSION,
                 alpha: float | str = DEFAULT_ALPHA, settle_s: float = DEFAULT_SETTLE_S, timeout_s: float = 30.0,
                 allow_outdated: bool = False, api_key: str | None = None, replication_factor: int = 1,
                 consistency: str | None = None):
        if not url or urlparse(url).scheme not in ("http", "https"):
            raise ValueError(f"Weaviate URL must start with http:// or https://, got {redact_url(url or '')!r}")
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r} (expected one of {', '.join(FUSIONS)})")
        self.url = url.rstrip("/")
        self.shown_url = redact_url(self.url)  # what messages say: no password
        self.grpc_port = grpc_port if grpc_port is not None else schema.grpc_port_from_env()
        self.fusion = fusion
        self.alpha = alpha
        self.tokenization = tokenization
        self.settle_s = settle_s
        self.replication_factor = replication_factor
        name = schema.collection_name(collection)
        self.collection_name = name
        self.manifest_name = f"{name}Manifest"
        self.connection = Connection(self.url, self.grpc_port,
                                     schema.chunk_collection_settings(name, tokenization, replication_factor),
                                     self.manifest_name, timeout_s=timeout_s, api_key=api_key,
                                     consistency=schema.consistency_level(consistency))
        self.manifest_log = Manifest(lambda: self.connection.manifest)
        self._write_lock = threading.RLock()  # one writer at a time in this process; readers never wait
        self._refresh_lock = threading.Lock()  # one manifest refresh at a time; the others reuse it
        self._cache: dict[str, DocRecord] | None = None
        self._cache_seq = -1
        self._cache_full_at = 0.0
        # Languages with chunks, and what they were probed at: (manifest seq last read, own publishes).
        self._languages: tuple[tuple[int, int], tuple[str, ...]] | None = None
        self._publishes = 0
        self.outdated: str | None = None
        try:
            self._open(allow_outdated)
        except BaseException:
            self.connection.close()  # no connection left behind (and no "unclosed" warning)
            raise

    def _open(self, allow_outdated: bool) -> None:
        with self.guard():
            client = self.connection.client
            if not client.collections.exists(self.manifest_name):
                try:
                    client.collections.create_from_dict(schema.manifest_collection_settings(self.manifest_name,
                                                                                            self.replication_factor))
                except wexc.UnexpectedStatusCodeError:
                    if not client.collections.exists(self.manifest_name):  # else: another process made it
                        raise
            self.connection.connect()
            schema.ensure_facts_property(self.manifest)
            schema.ensure_manifest_readers(self.manifest)
            schema.ensure_chunk_readers(self.collection, PUBLIC)
            if self.manifest_log.ensure_meta():
                self.manifest_log.set_analysis(ANALYSIS_VERSION)
            self._check_analysis(allow_outdated)

    def _check_analysis(self, allow_outdated: bool) -> None:
        """Refuses a collection whose chunks were analysed otherwise (``StoreOutdated``); an empty
        one is brought up to date in place, since nothing in it can be stale."""
        stored = self.manifest_log.analysis()
        if stored == ANALYSIS_VERSION and schema.has_search_text(self.collection):
            return
        if self.count_chunks() == 0:
            schema.upgrade_chunk_schema(self.collection)
            self.manifest_log.set_analysis(ANALYSIS_VERSION)
            return
        self.outdated = (f"the Weaviate collection {self.collection_name} was indexed by an earlier kbbot "
                         f"(keyword analysis {stored}, this version reads {ANALYSIS_VERSION}); "
                         "run `kbbot reindex` once to rebuild its keyword index from the stored chunks "
                         "(no re-embedding; answers resume after it)")
        if not allow_outdated:
            raise StoreOutdated(self.outdated)

    def reindex_keywords(self, progress: Any = None) -> int:
        """Rewrites every chunk's ``search_text`` with this version's analysis (vectors and ids kept)
        and records the analysis version; returns how many chunks were rewritten."""
        with self._write_lock, self.guard():
            schema.upgrade_chunk_schema(self.collection)
            done = schema.rewrite_search_text(self.collection, progress)
            self.manifest_log.set_analysis(ANALYSIS_VERSION)
            self.outdated = None
            return done

    # --- connection -------------------------------------------------------------------------
    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turns 'cannot reach Weaviate' into ``WeaviateUnavailable`` (see ``Connection.guard``)."""
        with self.connection.guard():
            yield

    @property
    def document_store(self) -> Any:
        """The chunks as a Haystack document store (weaviate-haystack's, see ``integration``)."""
        return self.connection.document_store

    @property
    def collection(self) -> Any:
        """The chunk collection (sync client)."""
        return self.connection.collection

    @property
    def manifest(self) -> Any:
        """The manifest collection (sync client)."""
        return self.connection.manifest

    async def async_collection(self) -> Any:
        """The chunk collection on an async client bound to the running event loop."""
        return await self.connection.async_collection()

    def close(self) -> None:
        self.connection.close()

    async def close_async(self) -> None:
        await self.connection.close_async()

    def drop(self) -> None:
        """Deletes both collections (tests, and re-creating a store with another schema)."""
        with self.guard():
            for name in (self.collection_name, self.manifest_name):
                self.connection.client.collections.delete(name)
        with self._refresh_lock:
            self._cache = None
        self._languages = None

    # --- reading ----------------------------------------------------------------------------
    @property
    def knowledge_version(self) -> int:
        with self.guard():
            return self.manifest_log.meta()["knowledge_version"]

    def records(self, *, reread: bool = False) -> dict[str, DocRecord]:
        """Every document's current record.

        One small read (the meta object's ``seq``) when nothing changed since the last call; after
        a change, only the documents changed since then are read (all of them every
        ``FULL_REFRESH_S``, in case two writers ever raced for a sequence number, or when ``reread``).
        """
        with self.guard():
            seq = self.manifest_log.meta()["seq"]
            with self._refresh_lock:
                if self._cache is not None and self._cache_seq >= seq and not reread:
                    return dict(self._cache)
                full = (reread or self._cache is None
                        or time.monotonic() - self._cache_full_at > FULL_REFRESH_S)
                changed = None if full else self.manifest_log.changed(self._cache_seq)
                if changed is None:
                    full, changed = True, self.manifest_log.changed(None) or []
                records = {} if full else dict(self._cache or {})
                for obj in changed:
                    doc_id = obj.properties.get("doc_id")
                    if not doc_id or doc_id == META_OBJECT:
                        continue
                    if obj.properties.get("revoked"):
                        records.pop(doc_id, None)
                    else:
                        records[doc_id] = record_of(obj.properties)
                # Objects newer than ``seq`` may be in already; the next refresh reads them again.
                self._cache, self._cache_seq = records, seq
                if full:
                    self._cache_full_at = time.monotonic()
                return dict(records)

    def record(self, doc_id: str) -> DocRecord | None:
        with self.guard():
            obj = self.manifest_log.entry(doc_id)
        return record_of(obj.properties) if obj is not None and not obj.properties.get("revoked") else None

    def is_current(self, doc_id: str, version: int) -> bool:
        rec = self.record(doc_id)
        return rec is not None and rec.version == version

    def count_chunks(self) -> int:
        """The chunks, as one copy of each shard holds them (the node the client talks to, where it has one).

        Not ``count(*)`` (``document_store.count_documents()``): Weaviate 1.38 asks every copy for that,
        at ``ALL``, and when a node has just died, while gossip still lists it (about 5 s), waits a
        minute for it, twice the query timeout (``tests/cluster``). A filtered count is answered at
        ``ONE`` instead; every chunk carries its version, so the filter keeps them all.
        """
        with self.guard():
            return self.collection.aggregate.over_all(total_count=True, filters=_EVERY_CHUNK).total_count or 0

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
        with self.guard():
            present = tuple(lang for lang in LANGUAGES if self.collection.query.fetch_objects(
                filters=Filter.by_property("language").equal(lang), limit=1, return_properties=[]).objects)
        self._languages = (key, present)
        return present

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
        with self._write_lock, self.guard():
            previous = self.manifest_log.entry(record.doc_id)
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
            seq = self.manifest_log.next_seq()
            self.manifest_log.write([(record, seq)])
            self.manifest_log.set_seq(seq)
            self._publishes += 1
            self._delete_chunks(record.doc_id, below=record.version)
            return record

    def set_readers(self, doc_id: str, readers: list[str]) -> bool:
        """Who may read the document now, on each of its chunks (rewritten in place, vectors kept: no
        conversion, no embedding) and then in its manifest record under a new sequence number, so the
        next commit counts it as a change of the knowledge. True when anything changed."""
        with self._write_lock, self.guard():
            record = self.record(doc_id)
            if record is None or sorted(record.readers) == sorted(readers):
                return False
            record.readers = sorted(readers)
            where = Filter.by_property("doc_id").equal(doc_id) & Filter.by_property("version").equal(record.version)
            schema.rewrite_chunks(self.collection, where, {"readers": list(record.readers)},
                                  limit=min(max(record.chunks, 1), 10_000))
            seq = self.manifest_log.next_seq()
            self.manifest_log.write([(record, seq)])
            self.manifest_log.set_seq(seq)
            self._publishes += 1
            return True

    def revoke(self, doc_id: str) -> bool:
        with self._write_lock, self.guard():
            if self.record(doc_id) is None:
                return False
            seq = self.manifest_log.next_seq()
            self.manifest_log.tombstone(doc_id, seq)
            self.manifest_log.set_seq(seq)
            self._publishes += 1
            self._delete_chunks(doc_id)
            return True

    def commit(self) -> int:
        """Advance the knowledge version if anything was published or revoked since the last commit."""
        with self._write_lock, self.guard():
            meta = self.manifest_log.meta()
            version = meta["knowledge_version"]
            if meta["seq"] != meta["committed_seq"]:
                version += 1
                self.manifest_log.commit(version, meta["seq"])
            return version
