"""Publishes the chunks of each document as its new current version in the knowledge store."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from haystack import Document, component

from pipelines.components.facts import document_subject, table_facts, unique_facts
from pipelines.records import NOBODY
from pipelines.store import DocRecord, KnowledgeStore


@component
class KnowledgeWriter:
    """Groups chunks by ``meta.doc_id`` and publishes each group as one new document version,
    with the entity–attribute–value facts of its tables.

    Publishing (not a plain write) is what keeps a query from ever seeing two versions of a
    document at once; see ``pipelines.store``.
    """

    def __init__(self, store: KnowledgeStore):
        self.store = store

    @component.output_types(published=list[DocRecord])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        groups: dict[str, list[Document]] = defaultdict(list)
        for chunk in documents:
            groups[chunk.meta["doc_id"]].append(chunk)
        published = []
        for doc_id, chunks in groups.items():
            meta = chunks[0].meta
            title = meta.get("title") or doc_id
            subject = document_subject(title)
            record = DocRecord(
                doc_id=doc_id,
                version=0,
                content_hash=meta["content_hash"],
                title=title,
                source=meta.get("source") or doc_id,
                space=meta.get("space") or "default",
                language=meta.get("language") or "en",
                root=meta.get("root"),
                # No readers in the meta: nobody may read it (fail closed); every source states its readers,
                # and a caller whose documents everyone may read says ``public`` (``evaluation``).
                readers=sorted(meta.get("readers") or [NOBODY]),
                facts=unique_facts(f for chunk in chunks for f in table_facts(chunk.content or "", subject)),
            )
            published.append(self.store.publish(record, chunks))
        return {"published": published}
