"""The indexing pipeline: convert -> clean -> split -> embed -> write, and the incremental indexer.

A refresh reads a *source* (a ``Source``: folders, URLs, Confluence, one kind each in
``pipelines.sources``) as a sequence of ``SourceItem`` s and compares each with the store's current
record: an unchanged item (same content hash, or a 304 from its server) costs no conversion and no
embedding; a changed one is published as a new version (atomically: the previous version is served
until the switch); an item the source could not read keeps its previous version; a document of the
source's roots that the source no longer lists (or says is gone) is revoked. Each refresh that
changes anything advances the knowledge version. ``Indexer.index(paths)`` is a refresh of those
paths as an ad-hoc source.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from haystack import Pipeline
from haystack.components.preprocessors import DocumentCleaner
from haystack.dataclasses import ByteStream

from pipelines.components.converter import SUPPORTED_SUFFIXES, Failure, FileLimits, FileToDocument, OcrOptions
from pipelines.components.splitter import SectionSplitter
from pipelines.components.writer import KnowledgeWriter
from pipelines.errors import ServiceUnavailable, root_cause
from pipelines.records import content_hash
from pipelines.sources.folder import FolderSource
from pipelines.sources.kind import Source, SourceItem
from pipelines.store import DEFAULT_SPACE, DocRecord, KnowledgeStore

log = logging.getLogger(__name__)


def build_indexing_pipeline(
    store: KnowledgeStore,
    document_embedder: Any,
    *,
    chunk_chars: int = 700,
    overlap_sentences: int = 1,
    max_file_mb: float = 20,
    from_documents: bool = False,
    ocr: OcrOptions | None = None,
    limits: FileLimits | None = None,
) -> Pipeline:
    """Files or ByteStreams in at ``convert.sources``; with ``from_documents``, Documents in at ``clean.documents``.
    ``limits``: what one file may inflate to, and the characters and chunks one document may have."""
    limits = limits or FileLimits()
    pipe = Pipeline()
    if not from_documents:
        pipe.add_component("convert", FileToDocument(max_file_mb=max_file_mb, ocr=ocr, limits=limits))
    pipe.add_component(
        "clean",
        DocumentCleaner(
            remove_empty_lines=False,  # blank lines separate paragraphs and tables for the splitter
            remove_extra_whitespaces=False,
            unicode_normalization="NFC",
            replace_regexes={r"[ \t\u00a0\u3000]+\n": "\n", r"\n{3,}": "\n\n", r"[\x00-\x08\x0b\x0c\x0e-\x1f]": ""},
        ),
    )
    pipe.add_component("split", SectionSplitter(chunk_chars=chunk_chars, overlap_sentences=overlap_sentences,
                                                max_chunks=limits.max_chunks))
    pipe.add_component("embed", document_embedder)
    pipe.add_component("write", KnowledgeWriter(store))
    if not from_documents:
        pipe.connect("convert.documents", "clean.documents")
    pipe.connect("clean.documents", "split.documents")
    pipe.connect("split.documents", "embed.documents")
    pipe.connect("embed.documents", "write.documents")
    return pipe


@dataclass
class FormatCounts:
    """One format's share of a refresh: documents converted, PDF pages read by OCR, failures."""

    documents: int = 0
    ocr_pages: int = 0
    failed: int = 0

    def summary(self) -> str:
        text = f"{self.documents} indexed"
        if self.ocr_pages:
            text += f" ({self.ocr_pages} pages OCR'd)"
        return text + (f", {self.failed} failed" if self.failed else "")


def format_of(suffix: str) -> str:
    """The report's name for a file type: ``.htm`` and ``.html`` are both html, etc."""
    suffix = suffix.lower().lstrip(".")
    return {"htm": "html", "markdown": "md", "": "unknown"}.get(suffix, suffix)


@dataclass
class IndexReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    #: Documents revoked because no configured source has them any more (see ``Indexer.refresh``'s ``orphans``).
    orphaned: list[str] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    chunks: int = 0
    knowledge_version: int = 0
    seconds: float = 0.0
    #: Documents whose readers (permissions at the source) changed while their content did not:
    #: updated in place, without conversion or embedding.
    permissions: list[str] = field(default_factory=list)
    #: Per file type (``pdf``, ``docx``, ...): what was converted this run, and what failed.
    formats: dict[str, FormatCounts] = field(default_factory=dict)
    #: Documents held back (readable by nobody, ``SourceItem.held_back``): why -> how many.
    held: dict[str, int] = field(default_factory=dict)

    def count_format(self, suffix: str) -> FormatCounts:
        return self.formats.setdefault(format_of(suffix), FormatCounts())

    def formats_summary(self) -> str:
        """``pdf: 3 indexed (12 pages OCR'd); docx: 1 indexed, 1 failed``; empty when nothing was converted."""
        return "; ".join(f"{name}: {counts.summary()}" for name, counts in sorted(self.formats.items()))

    @property
    def changed_anything(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.orphaned or self.permissions)

    def summary(self) -> str:
        return (
            f"indexed {len(self.added)} new, {len(self.changed)} changed, {len(self.unchanged)} unchanged, "
            f"{len(self.removed)} removed, {len(self.failed)} failed"
            + (f", {len(self.permissions)} with new permissions" if self.permissions else "")
            + (f", {sum(self.held.values())} held back (readable by nobody)" if self.held else "")
            + f"; {self.chunks} chunks written; "
            f"knowledge version {self.knowledge_version} ({self.seconds:.1f} s)"
        )


class RefreshAborted(RuntimeError):
    """A refresh stopped before its end (``should_stop``); what was published stays, the rest keeps
    its previous version."""


Progress = Callable[[Iterable[Any], int], Iterable[Any]]


def _service_error(exc: BaseException) -> ServiceUnavailable | None:
    """The ``ServiceUnavailable`` behind a pipeline error (the store went away), if that is what it is."""
    cause: BaseException | None = root_cause(exc)
    seen = 0
    while cause is not None and seen < 10:
        if isinstance(cause, ServiceUnavailable):
            return cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


class Indexer:
    """Runs the indexing pipeline item by item, skipping what has not changed."""

    def __init__(self, store: KnowledgeStore, pipeline: Pipeline, suffixes: Iterable[str] = SUPPORTED_SUFFIXES,
                 max_file_mb: float | None = None):
        self.store = store
        self.pipeline = pipeline
        self.suffixes = set(suffixes)
        self.max_file_mb = max_file_mb

    def index(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        space: str = DEFAULT_SPACE,
        progress: Progress | None = None,
    ) -> IndexReport:
        """A refresh of ``paths`` (files and folders) as an ad-hoc source."""
        return self.refresh(FolderSource(paths, suffixes=self.suffixes, max_file_mb=self.max_file_mb), space=space,
                            progress=progress)

    def refresh(
        self,
        source: Source,
        *,
        space: str = DEFAULT_SPACE,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
        report: IndexReport | None = None,
        orphans: Callable[[dict[str, DocRecord], set[str]], Iterable[str]] | None = None,
        permissions_only: bool = False,
    ) -> IndexReport:
        """Brings the store in step with ``source``; see the module docstring.

        ``orphans``, once every item is refreshed, is given the store's records and the doc ids the
        source listed this run, and names documents to revoke as well (``report.orphaned``): those of
        sources that are no longer configured, revoked only after their replacement is published.

        ``permissions_only``: only the readers of documents already indexed are brought in step (a
        source that can, ``source.permissions_only``, reads no content for it); nothing is converted,
        embedded or added; what the source no longer lists is still revoked.

        A store that cannot be reached ends the refresh (``ServiceUnavailable``); any other error of
        one document is reported as its failure and the others go on. ``should_stop`` is asked before
        each item (``RefreshAborted``). Whatever ends the run, what was published is committed; a
        caller that passes ``report`` sees in it what a failed run did before it ended.
        """
        started = time.perf_counter()
        report = report if report is not None else IndexReport()
        current = self.store.records()
        roots = set(source.roots)
        if permissions_only and hasattr(source, "permissions_only"):
            source.permissions_only = True
        scan = source.scan(current, space)
        seen: set[str] = set()
        try:
            iterator: Iterable[SourceItem] = progress(scan, scan.total) if progress else scan
            for item in iterator:
                if should_stop is not None and should_stop():
                    raise RefreshAborted(f"stopped after {len(seen)} of {scan.total} documents")
                if permissions_only:
                    self._refresh_readers(item, current.get(item.doc_id), report, seen)
                else:
                    self._refresh_item(item, current.get(item.doc_id), space, report, seen)
            for doc_id, record in self.store.records().items():
                if record.root in roots and doc_id not in seen:
                    self.store.revoke(doc_id)
                    report.removed.append(record.source)
            if orphans is not None:
                records = self.store.records()
                doomed = list(orphans(records, seen))
                if doomed and should_stop is not None and should_stop():
                    raise RefreshAborted(f"stopped after all {scan.total} documents, before revoking "
                                         f"{len(doomed)} of sources no longer configured")
                for doc_id in doomed:
                    if self.store.revoke(doc_id):
                        report.orphaned.append(records[doc_id].source)
        finally:
            try:
                report.knowledge_version = self.store.commit()
            except Exception:  # the run's own error matters more; the next commit counts these changes
                log.exception("could not commit the knowledge version after a refresh")
            report.seconds = time.perf_counter() - started
        return report

    def _refresh_readers(self, item: SourceItem, current: DocRecord | None, report: IndexReport,
                         seen: set[str]) -> None:
        """A permissions-only refresh of one item: its readers, if it is indexed; never its content."""
        if item.gone:
            if current is not None and self.store.revoke(item.doc_id):
                report.removed.append(item.source)
            return
        seen.add(item.doc_id)
        if item.error is not None:
            report.failed.append(Failure(item.source, item.error))
            return
        if current is None:
            return  # new at the source: the next full refresh indexes it
        self._update_readers(item, current, report)

    @staticmethod
    def _count_held(item: SourceItem, report: IndexReport) -> None:
        reason = item.held_back
        if reason is not None:
            report.held[reason] = report.held.get(reason, 0) + 1

    def _update_readers(self, item: SourceItem, current: DocRecord, report: IndexReport) -> None:
        self._count_held(item, report)
        if sorted(current.readers) != item.principals and self.store.set_readers(item.doc_id, item.principals):
            report.permissions.append(item.source)
            log.info("permissions of %s are now %s", item.source, ", ".join(item.principals))
        else:
            report.unchanged.append(item.source)

    def _refresh_item(self, item: SourceItem, current: DocRecord | None, space: str, report: IndexReport,
                      seen: set[str]) -> None:
        if item.gone:
            if current is not None and self.store.revoke(item.doc_id):
                report.removed.append(item.source)
            elif item.error:  # never indexed: the source lists something that does not exist
                report.failed.append(Failure(item.source, item.error))
            return
        seen.add(item.doc_id)
        if item.error is not None:
            report.failed.append(Failure(item.source, item.error))
            return
        if item.not_modified and current is not None:
            self._update_readers(item, current, report)
            return
        if item.data is None:
            report.failed.append(Failure(item.source, "no content was read"))
            return
        digest = content_hash(item.data)
        if current and current.content_hash == digest and current.space == space and current.root == item.root:
            self._update_readers(item, current, report)
            return
        meta = {**item.meta, "doc_id": item.doc_id, "content_hash": digest, "source": item.source, "space": space,
                "root": item.root, "readers": item.principals}
        stream = ByteStream(item.data, meta={"suffix": item.suffix, "source": item.source,
                                             "file_path": (item.name or "document") + item.suffix})
        try:
            result = self.pipeline.run({"convert": {"sources": [stream], "meta": [meta]}},
                                       include_outputs_from={"convert"})
        except Exception as exc:  # noqa: BLE001 - one document's failure; the store going away ends the run
            unavailable = _service_error(exc)
            if unavailable is not None:
                raise unavailable from exc
            cause = root_cause(exc)
            log.exception("indexing %s failed", item.source)
            report.count_format(item.suffix).failed += 1
            report.failed.append(Failure(item.source, f"indexing failed ({type(cause).__name__}: {cause})"))
            return
        failures = result["convert"]["failures"] + result.get("split", {}).get("failures", [])
        counts = report.count_format(item.suffix)
        if failures:
            counts.failed += 1
            report.failed.extend(Failure(item.source, f.reason) for f in failures)
            return
        counts.documents += 1
        counts.ocr_pages += sum(1 for d in result["convert"]["documents"] if (d.meta or {}).get("ocr"))
        published = result["write"]["published"]
        report.chunks += sum(r.chunks for r in published)
        self._count_held(item, report)
        (report.changed if current else report.added).append(item.source)
