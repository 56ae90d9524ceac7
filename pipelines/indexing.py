"""The indexing pipeline: convert -> clean -> split -> embed -> write, and the incremental indexer.

An unchanged file (same content hash as its current version) costs no conversion and no
embedding; a changed one is published as a new version; a file gone from an indexed folder
is revoked. Each run that changes anything advances the knowledge version.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haystack import Pipeline
from haystack.components.preprocessors import DocumentCleaner

from pipelines.components.converter import SUPPORTED_SUFFIXES, Failure, FileToDocument
from pipelines.components.splitter import SectionSplitter
from pipelines.components.writer import KnowledgeWriter
from pipelines.store import DEFAULT_SPACE, KnowledgeStore


def build_indexing_pipeline(
    store: KnowledgeStore,
    document_embedder: Any,
    *,
    chunk_chars: int = 700,
    overlap_sentences: int = 1,
    max_file_mb: float = 20,
    from_documents: bool = False,
) -> Pipeline:
    """Files in at ``convert.sources``; with ``from_documents``, Documents in at ``clean.documents``."""
    pipe = Pipeline()
    if not from_documents:
        pipe.add_component("convert", FileToDocument(max_file_mb=max_file_mb))
    pipe.add_component(
        "clean",
        DocumentCleaner(
            remove_empty_lines=False,  # blank lines separate paragraphs and tables for the splitter
            remove_extra_whitespaces=False,
            unicode_normalization="NFC",
            replace_regexes={r"[ \t\u00a0\u3000]+\n": "\n", r"\n{3,}": "\n\n", r"[\x00-\x08\x0b\x0c\x0e-\x1f]": ""},
        ),
    )
    pipe.add_component("split", SectionSplitter(chunk_chars=chunk_chars, overlap_sentences=overlap_sentences))
    pipe.add_component("embed", document_embedder)
    pipe.add_component("write", KnowledgeWriter(store))
    if not from_documents:
        pipe.connect("convert.documents", "clean.documents")
    pipe.connect("clean.documents", "split.documents")
    pipe.connect("split.documents", "embed.documents")
    pipe.connect("embed.documents", "write.documents")
    return pipe


@dataclass
class IndexReport:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    chunks: int = 0
    knowledge_version: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"indexed {len(self.added)} new, {len(self.changed)} changed, {len(self.unchanged)} unchanged, "
            f"{len(self.removed)} removed, {len(self.failed)} failed; {self.chunks} chunks written; "
            f"knowledge version {self.knowledge_version} ({self.seconds:.1f} s)"
        )


# Bumped whenever conversion, cleaning or splitting changes what a file becomes, so the next
# refresh re-indexes everything once instead of keeping chunks made the old way.
INDEX_FORMAT = "3"


def content_hash(data: bytes) -> str:
    """The content hash a document version is known by: its bytes and the index format."""
    return hashlib.sha256(INDEX_FORMAT.encode() + b"\x00" + data).hexdigest()


def discover(paths: Iterable[str | os.PathLike[str]], suffixes: Iterable[str] = SUPPORTED_SUFFIXES) -> list[Path]:
    """Supported files under ``paths`` (files given directly are kept whatever their type)."""
    wanted = {s.lower() for s in suffixes}
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {raw}")
        if path.is_file():
            found.append(path.resolve())
            continue
        for child in sorted(path.rglob("*")):
            rel = child.relative_to(path)
            if child.is_file() and child.suffix.lower() in wanted and not any(p.startswith(".") for p in rel.parts):
                found.append(child.resolve())
    return found


def display_source(path: Path) -> str:
    """The path as people see it: relative to the working directory when inside it."""
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


Progress = Callable[[Iterable[Path], int], Iterable[Path]]


class Indexer:
    """Runs the indexing pipeline file by file, skipping what has not changed."""

    def __init__(self, store: KnowledgeStore, pipeline: Pipeline, suffixes: Iterable[str] = SUPPORTED_SUFFIXES):
        self.store = store
        self.pipeline = pipeline
        self.suffixes = set(suffixes)

    def index(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        space: str = DEFAULT_SPACE,
        progress: Progress | None = None,
    ) -> IndexReport:
        started = time.perf_counter()
        paths = list(paths)
        roots = [Path(p).resolve().as_posix() for p in paths if Path(p).is_dir()]
        files = discover(paths, self.suffixes)
        report = IndexReport()
        seen: set[str] = set()
        iterator: Iterable[Path] = progress(files, len(files)) if progress else files
        for path in iterator:
            doc_id = path.as_posix()
            seen.add(doc_id)
            source = display_source(path)
            try:
                data = path.read_bytes()
            except OSError as exc:
                report.failed.append(Failure(source, f"cannot read the file ({exc.strerror or exc})"))
                continue
            digest = content_hash(data)
            current = self.store.record(doc_id)
            if current and current.content_hash == digest and current.space == space:
                report.unchanged.append(source)
                continue
            root = next((r for r in roots if doc_id.startswith(r + "/")), None)
            meta = {"doc_id": doc_id, "content_hash": digest, "source": source, "space": space, "root": root}
            result = self.pipeline.run({"convert": {"sources": [str(path)], "meta": [meta]}},
                                       include_outputs_from={"convert"})
            failures = result["convert"]["failures"]
            if failures:
                report.failed.extend(Failure(source, f.reason) for f in failures)
                continue
            published = result["write"]["published"]
            report.chunks += sum(r.chunks for r in published)
            (report.changed if current else report.added).append(source)
        for doc_id, record in self.store.records().items():
            if record.root in roots and doc_id not in seen:
                self.store.revoke(doc_id)
                report.removed.append(record.source)
        report.knowledge_version = self.store.commit()
        report.seconds = time.perf_counter() - started
        return report
