from pathlib import Path

import pytest

from bot.runtime import build_runtime
from pipelines.store import InMemoryKnowledgeStore
from tests.conftest import EXAMPLES, make_settings


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "overheat.md").write_text("# 电机过热\n\n## 原因\n环境温度超过 40 °C 时电机会过热。请清理散热片。", encoding="utf-8")
    (kb / "warranty.txt").write_text("Warranty\nThe warranty lasts 24 months from delivery.", encoding="utf-8")
    return kb


def test_reindexing_unchanged_files_embeds_nothing(tmp_path: Path, folder: Path):
    runtime = build_runtime(make_settings(tmp_path / "data"))
    first = runtime.indexer.index([folder])
    embedded = runtime.document_embedder.embedded_texts
    assert (len(first.added), first.chunks, first.knowledge_version) == (2, 2, 1)
    assert embedded == 2

    second = runtime.indexer.index([folder])
    assert second.unchanged == [p for p in second.unchanged] and len(second.unchanged) == 2
    assert runtime.document_embedder.embedded_texts == embedded  # nothing embedded again
    assert second.knowledge_version == 1  # nothing changed, no new knowledge version
    assert "0 new, 0 changed, 2 unchanged" in second.summary()


def test_changed_file_gets_new_version_and_removed_file_is_revoked(tmp_path: Path, folder: Path):
    runtime = build_runtime(make_settings(tmp_path / "data"))
    runtime.indexer.index([folder])
    (folder / "warranty.txt").write_text("Warranty\nThe warranty lasts 36 months from delivery.", encoding="utf-8")
    (folder / "overheat.md").unlink()
    report = runtime.indexer.index([folder])
    assert len(report.changed) == 1 and len(report.removed) == 1
    records = runtime.store.records()
    assert [r.version for r in records.values()] == [2]
    contents = [d.content for d in runtime.store.document_store.filter_documents()]
    assert contents == ["Warranty\nThe warranty lasts 36 months from delivery."]  # the old version is gone

    reopened = InMemoryKnowledgeStore(tmp_path / "data" / "store")  # persisted across processes
    assert reopened.knowledge_version == report.knowledge_version == 2
    assert reopened.count_chunks() == 1


def test_failing_files_are_reported_by_name_and_the_rest_is_indexed(tmp_path: Path, folder: Path):
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    (folder / "latin1.txt").write_bytes("Températures élevées".encode("utf-16"))
    (folder / "empty.md").write_text("   \n", encoding="utf-8")
    runtime = build_runtime(make_settings(tmp_path / "data"))
    report = runtime.indexer.index([folder])
    reasons = {Path(f.source).name: f.reason for f in report.failed}
    assert set(reasons) == {"broken.pdf", "latin1.txt", "empty.md"}
    assert "not a readable PDF" in reasons["broken.pdf"]
    assert "binary" in reasons["latin1.txt"] or "not valid" in reasons["latin1.txt"]
    assert reasons["empty.md"] == "the file is empty"
    assert len(report.added) == 2 and runtime.store.count_chunks() == 2


def test_every_chunk_carries_identity_and_versioning_meta(kb_data_dir: Path):
    store = InMemoryKnowledgeStore(kb_data_dir / "store")
    chunks = store.document_store.filter_documents()
    assert len({c.meta["doc_id"] for c in chunks}) >= 12
    for chunk in chunks:
        for key in ("doc_id", "version", "position", "title", "source", "language", "content_hash", "space"):
            assert chunk.meta.get(key) not in (None, ""), (key, chunk.meta)
    formats = {c.meta["format"] for c in chunks}
    assert {"markdown", "text", "html", "pdf"} <= formats
    assert {c.meta["language"] for c in chunks} == {"zh", "en"}


def test_pdf_and_html_sample_documents_are_readable(kb_data_dir: Path):
    store = InMemoryKnowledgeStore(kb_data_dir / "store")
    by_file = {}
    for chunk in store.document_store.filter_documents():
        by_file.setdefault(Path(chunk.meta["doc_id"]).name, []).append(chunk.content)
    assert "+86 400-820-1234" in " ".join(by_file["service-contacts.pdf"])
    assert "24 months" in " ".join(by_file["warranty.html"])


def test_index_of_missing_path_is_a_clear_error(tmp_path: Path):
    runtime = build_runtime(make_settings(tmp_path / "data"))
    with pytest.raises(FileNotFoundError, match="no such file or folder: /nowhere"):
        runtime.indexer.index(["/nowhere"])


def test_example_kb_is_bilingual_and_complete():
    files = sorted(p.name for p in EXAMPLES.iterdir())
    assert len(files) >= 12
    assert {Path(f).suffix for f in files} >= {".md", ".txt", ".html", ".pdf"}
