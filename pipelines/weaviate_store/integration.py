"""Where kbbot reaches into weaviate-haystack past its public API, all in this one module.

weaviate-haystack 8.0.0 (the newest release) exports only ``WeaviateDocumentStore`` and the auth
classes. What we need beyond them, and why there is no public way:

* ``ChunkDocumentStore`` overrides the store's private ``_batch_write``/``_batch_write_async`` (and reads
  ``_collection``/``_collection_settings``, calls ``_to_data_object``/``_handle_failed_objects``): the stock
  writes go through the client's batch context, which waits about a second on exit (measured: 1.05 s
  to write one document), and its async write needs server-side batching, new in Weaviate 1.36; nor
  can a consistency level be set on its collection. ``write_documents`` stays the public entry, so
  Haystack's document-store suites still test it (tests/test_weaviate_store.py).
* ``weaviate_filters`` uses the private ``_filters`` module: Haystack filter dicts must become the
  Weaviate filters our own queries send, exactly as the integration's retrievers convert them.
* ``to_document`` reads objects in the integration's format (``_original_id`` holds the Haystack id).

An upgrade of weaviate-haystack is checked against this module (and its tests) first.
"""

from __future__ import annotations

from typing import Any

from haystack import Document
from haystack_integrations.document_stores.weaviate import WeaviateDocumentStore
from haystack_integrations.document_stores.weaviate._filters import convert_filters, validate_filters
from weaviate.classes.config import ConsistencyLevel
from weaviate.classes.query import Filter
from weaviate.collections.classes.data import DataObject
from weaviate.util import generate_uuid5

# Properties of a chunk object that are not the Document's meta.
_NOT_META = {"_original_id", "content", "blob_data", "blob_mime_type", "score", "search_text"}


def with_consistency(collection: Any, level: ConsistencyLevel | None) -> Any:
    return collection.with_consistency_level(level) if level is not None else collection


def to_document(obj: Any, score: float | None = None) -> Document:
    """A Weaviate object of the chunk collection as a Haystack Document (meta without nulls)."""
    props = obj.properties
    meta = {k: v for k, v in props.items() if k not in _NOT_META and v is not None}
    vector = obj.vector.get("default") if isinstance(obj.vector, dict) else obj.vector
    return Document(id=props.get("_original_id") or str(obj.uuid), content=props.get("content"), meta=meta,
                    score=score, embedding=vector or None)


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


class ChunkDocumentStore(WeaviateDocumentStore):
    """weaviate-haystack's document store, writing with one gRPC batch call per ``WRITE_BATCH`` documents.

    ``insert_many`` has the same upsert-by-UUID semantics as the stock batch write without its wait
    (see the module docstring).
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
