"""``kbbot eval`` on any dataset folder name, ``--per-query`` records, and the keyword-analysis
migration of a Weaviate collection (``kbbot reindex``), against a real Weaviate."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from haystack import Document
from haystack.document_stores.types import DuplicatePolicy

from adapters.cli import main, run_reindex
from pipelines.components.retrievers import retriever_for
from pipelines.store import DocRecord, prepare_chunks
from pipelines.weaviate_store import (
    SEARCH_TEXT_PROPERTY,
    StoreOutdated,
    WeaviateKnowledgeStore,
    chunk_collection_settings,
    collection_name,
)
from tests.conftest import make_settings

WEAVIATE_URL = os.environ.get("WEAVIATE_URL")
needs_weaviate = pytest.mark.skipif(not WEAVIATE_URL, reason="WEAVIATE_URL is not set: needs a running Weaviate "
                                                             "(eval \"$(scripts/services.sh env --export)\")")

CORPUS = [
    {"id": "s1", "title": "Phone manual > Battery", "text": "Battery\nCharge the battery before first use."},
    {"id": "s2", "title": "Phone manual > Battery > Wireless charging",
     "text": "Wireless charging\nPlace the phone on a wireless charger to charge it."},
    {"id": "s3", "title": "Phone manual > Display > Brightness", "text": "Brightness\nDrag the slider to dim the screen."},
]
QUERIES = [
    {"id": "q1", "text": "How do I charge the phone wirelessly?", "gold_ids": ["s2"]},
    {"id": "q2", "text": "How can I make the screen darker?", "gold_ids": ["s3"]},
]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "manuals-test.v2"  # a hyphen and a dot: not a valid Weaviate class name
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in CORPUS), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(r) for r in QUERIES), encoding="utf-8")
    return folder


def test_collection_names_are_made_valid_and_stay_distinct():
    assert collection_name("kbChunk") == "KbChunk"
    hyphen, underscore = collection_name("Eval_emanual-test"), collection_name("Eval_emanual_test")
    assert hyphen.startswith("Eval_emanual_test_") and underscore == "Eval_emanual_test"
    assert collection_name("2024 docs").startswith("K2024_docs_")


def _eval(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, *args: str) -> dict:
    monkeypatch.setenv("KBBOT_DATA_DIR", str(tmp_path / "data"))
    assert main(["eval", str(dataset), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_per_query_writes_every_mode_rank_and_cause(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WEAVIATE_URL", raising=False)
    out = tmp_path / "ranks.jsonl"
    result = _eval(dataset, tmp_path, monkeypatch, capsys, "--per-query", str(out))
    assert result["dataset"] == "manuals-test.v2" and result["n"] == 2
    assert set(result["modes"]) == {"bm25", "vector", "hybrid"}
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [line["id"] for line in lines] == ["q1", "q2"]
    first = lines[0]
    for mode in ("bm25", "vector", "hybrid"):
        assert set(first[mode]) == {"section_rank", "chunk_rank", "candidate_rank", "top", "cause"}
    assert first["bm25"]["section_rank"] == 1 and first["bm25"]["cause"] == "hit"  # charge ~ charging ~ charger
    assert sum(result["causes"].values()) == 2


@needs_weaviate
def test_eval_on_weaviate_takes_any_folder_name(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEAVIATE_URL", WEAVIATE_URL)
    result = _eval(dataset, tmp_path, monkeypatch, capsys, "--mode", "hybrid")
    assert result["hit@1"] == 1.0
    WeaviateKnowledgeStore(WEAVIATE_URL, collection="Eval_manuals-test.v2").drop()


@needs_weaviate
def test_a_store_error_ends_in_one_clear_line(dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEAVIATE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("KBBOT_DATA_DIR", str(tmp_path / "data"))
    assert main(["eval", str(dataset), "--json"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kbbot: ") and "Traceback" not in err[0]


@needs_weaviate
def test_an_outdated_collection_is_refused_until_reindexed(tmp_path, capsys):
    name = f"TestOld_{uuid.uuid4().hex[:10]}"
    # A collection as the previous kbbot made it: no search_text, no analysis version.
    old = chunk_collection_settings(name)
    old["properties"] = [p for p in old["properties"] if p["name"] != SEARCH_TEXT_PROPERTY["name"]]
    probe = WeaviateKnowledgeStore(WEAVIATE_URL, collection=f"{name}Probe")
    client = probe.document_store.client
    client.collections.create_from_dict(old)
    store = WeaviateKnowledgeStore(WEAVIATE_URL, collection=name, allow_outdated=True)  # empty: upgraded in place
    assert store.outdated is None
    record = DocRecord(doc_id="d1", version=0, content_hash="h", title="Pump", source="pump.md")
    chunk = Document(content="Pump\nThe impeller is replaced yearly.", meta={"header": ""}, embedding=[0.1] * 384)
    store.publish(record, [chunk])
    store.commit()
    # Make it old again: chunks written without search_text and no analysis version.
    prepared = prepare_chunks(store.record("d1"), [chunk])
    store.document_store.write_documents(prepared, policy=DuplicatePolicy.OVERWRITE)
    store.manifest_log.set_analysis(0)
    store.close()
    with pytest.raises(StoreOutdated, match="kbbot reindex"):
        WeaviateKnowledgeStore(WEAVIATE_URL, collection=name)
    settings = make_settings(tmp_path, WEAVIATE_URL=WEAVIATE_URL)
    settings.store.collection = name
    assert run_reindex(settings) == 0
    assert "reindexed the keywords of 1 chunks" in capsys.readouterr().out
    reopened = WeaviateKnowledgeStore(WEAVIATE_URL, collection=name)
    found = retriever_for(reopened, mode="bm25", candidates=5).run(query="replacing impellers")["documents"]
    assert [d.meta["doc_id"] for d in found] == ["d1"]
    assert "search_text" not in found[0].meta
    reopened.drop()
    reopened.close()
    probe.drop()
    probe.close()
