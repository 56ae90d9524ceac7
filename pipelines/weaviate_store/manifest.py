"""The manifest collection: one object per document (its current record, a sequence number, a
``revoked`` flag) and one meta object (``knowledge_version``, the last sequence number ``seq``, the
one the last commit counted, and the keyword-analysis version of the chunks).

Every publish and revocation gets the next ``seq``, so a reader learns what changed since it last
looked by reading the objects with a greater one. A revoked document keeps a tombstone for that.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import weaviate.exceptions as wexc
from weaviate.classes.query import Filter
from weaviate.collections.classes.data import DataObject
from weaviate.util import generate_uuid5

from pipelines.records import PUBLIC, DocRecord

RECORD_FIELDS = ("doc_id", "version", "content_hash", "title", "source", "space", "language", "chunks", "root",
                 "indexed_at")
META_OBJECT = "\x00manifest-meta"
META_UUID = generate_uuid5(META_OBJECT)
# Changed objects read per query; more changed than this: the whole manifest is read instead.
PAGE = 5000
_RECORD_PROPERTIES = [*RECORD_FIELDS, "facts", "revoked", "readers"]


def record_uuid(doc_id: str) -> str:
    return generate_uuid5(f"doc\x00{doc_id}")


def _load_facts(raw: Any) -> list[list[str]]:
    if not raw:
        return []
    try:
        facts = json.loads(raw)
    except ValueError:
        return []
    return [list(map(str, f)) for f in facts if isinstance(f, list) and len(f) == 3]


def record_of(props: dict[str, Any]) -> DocRecord:
    """A manifest object's properties as the document's record."""
    values = {f: props.get(f) for f in RECORD_FIELDS}
    values["version"] = int(values["version"] or 0)
    values["chunks"] = int(values["chunks"] or 0)
    for f in ("title", "source", "content_hash"):
        values[f] = values[f] or ""
    values["space"] = values["space"] or "default"
    values["facts"] = _load_facts(props.get("facts"))
    values["language"] = values["language"] or "en"
    # A record written before permissions were recorded: readable by everyone of its space, as then.
    values["readers"] = sorted(map(str, props.get("readers") or [])) or [PUBLIC]
    if not values["indexed_at"]:
        values.pop("indexed_at")
    return DocRecord(**values)


def record_properties(record: DocRecord, seq: int) -> dict[str, Any]:
    """The manifest object of ``record``, current as of sequence number ``seq``."""
    return {**{f: getattr(record, f) for f in RECORD_FIELDS}, "facts": json.dumps(record.facts, ensure_ascii=False),
            "readers": list(record.readers), "seq": seq, "revoked": False}


def record_object(record: DocRecord, seq: int) -> DataObject:
    return DataObject(properties=record_properties(record, seq), uuid=record_uuid(record.doc_id))


class Manifest:
    """Reads and writes of the manifest collection; ``collection`` returns it (reconnected when needed).
    Callers hold the store's guard and, to write, its write lock."""

    def __init__(self, collection: Callable[[], Any]):
        self._get = collection

    @property
    def collection(self) -> Any:
        return self._get()

    def ensure_meta(self) -> bool:
        """Creates the meta object when missing; True when this call created it."""
        if self.collection.query.fetch_object_by_id(META_UUID) is not None:
            return False
        try:
            self.collection.data.insert({"doc_id": META_OBJECT, "knowledge_version": 0, "seq": 0, "committed_seq": 0},
                                        uuid=META_UUID)
        except wexc.UnexpectedStatusCodeError:
            return False  # created concurrently by another process
        return True

    def meta(self) -> dict[str, int]:
        obj = self.collection.query.fetch_object_by_id(META_UUID,
                                                        return_properties=["knowledge_version", "seq", "committed_seq"])
        props = obj.properties if obj is not None else {}
        return {k: int(props.get(k) or 0) for k in ("knowledge_version", "seq", "committed_seq")}

    def next_seq(self) -> int:
        return self.meta()["seq"] + 1

    def set_seq(self, seq: int) -> None:
        self.collection.data.update(META_UUID, {"seq": seq})

    def analysis(self) -> int:
        """The keyword-analysis version the chunks were written with (0: before versions were recorded)."""
        obj = self.collection.query.fetch_object_by_id(META_UUID, return_properties=["analysis"])
        return int((obj.properties if obj is not None else {}).get("analysis") or 0)

    def set_analysis(self, version: int) -> None:
        self.collection.data.update(META_UUID, {"analysis": version})

    def commit(self, knowledge_version: int, seq: int) -> None:
        self.collection.data.update(META_UUID, {"knowledge_version": knowledge_version, "committed_seq": seq})

    def entry(self, doc_id: str) -> Any:
        """The document's manifest object (also a tombstone), or None."""
        return self.collection.query.fetch_object_by_id(record_uuid(doc_id), return_properties=_RECORD_PROPERTIES)

    def write(self, records: list[tuple[DocRecord, int]]) -> None:
        """Makes each record current as of its sequence number (the caller then moves ``seq``)."""
        for start in range(0, len(records), 500):
            self.collection.data.insert_many([record_object(r, seq) for r, seq in records[start : start + 500]])

    def tombstone(self, doc_id: str, seq: int) -> None:
        # A tombstone, not a delete: readers refreshing by sequence number must see it go.
        self.collection.data.update(record_uuid(doc_id), {"revoked": True, "seq": seq})

    def changed(self, since_seq: int | None) -> list[Any] | None:
        """Manifest objects changed after ``since_seq``, or all of them for None; None if too many changed."""
        if since_seq is None:
            return list(self.collection.iterator(return_properties=_RECORD_PROPERTIES, cache_size=PAGE))
        changed = self.collection.query.fetch_objects(filters=Filter.by_property("seq").greater_than(since_seq),
                                                      limit=PAGE, return_properties=_RECORD_PROPERTIES).objects
        return changed if len(changed) < PAGE else None
