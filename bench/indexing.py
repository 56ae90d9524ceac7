"""Indexing throughput against the bare embedder, and a no-change refresh against a full index.

    uv run python -m bench.indexing [PATH ...] [--json]
    uv run python -m bench.indexing --corpus ../shared/eval/cmrc2018 [--json]
    uv run python -m bench.indexing --gdrive 200 [--json]

Both sides embed the same chunk texts in the same process after a warm-up of the model (with
``--rounds N``: alternated N times, best time of each side), so the ratio holds on a noisy machine
even when the absolute numbers do not. ``--corpus`` reads a dataset's
``corpus.jsonl`` as a source (one document per passage) and times a full index against a refresh
with nothing changed, through the same ``Indexer.refresh`` a scheduled run uses, on the configured
store (Weaviate when ``WEAVIATE_URL`` is set, in a collection of its own that is dropped after).
``--gdrive N``: a Google Drive source of N files against the tests' local Drive (``bench.gdrive``):
items per second, Drive calls per item, and the calls of a refresh with nothing changed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (telemetry off)
from adapters.platforms import load_settings
from bench.report import emit
from bot.runtime import build_runtime
from pipelines.components.embedders import load_e5, passage_text
from pipelines.evaluation import read_jsonl
from pipelines.indexing import Indexer
from pipelines.sources.kind import SourceItem


class CorpusSource:
    """A dataset's ``corpus.jsonl`` as a refresh source: one text document per passage."""

    def __init__(self, dataset: Path):
        self.dataset = dataset
        self.rows = read_jsonl(dataset / "corpus.jsonl")

    @property
    def roots(self) -> list[str]:
        return [f"corpus:{self.dataset.name}"]

    def scan(self, current, space):  # noqa: ANN001, ANN201 - the Source protocol
        source = self

        class _Scan:
            total = len(source.rows)

            def __iter__(self) -> Iterator[SourceItem]:
                for row in source.rows:
                    title = row.get("title") or str(row["id"])
                    yield SourceItem(doc_id=f"{source.dataset.name}:{row['id']}", source=f"{source.dataset.name}:{row['id']}",
                                     root=source.roots[0], suffix=".txt", name=str(row["id"]),
                                     data=f"{title}\n\n{row['text']}".encode(), readers=["public"])

        return _Scan()


def measure_corpus(dataset: str) -> dict[str, float | int | str]:
    """A full index of a corpus against a refresh of it with nothing changed, same store, same process."""
    source = CorpusSource(Path(dataset))
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(env={**__import__("os").environ, "KBBOT_DATA_DIR": tmp})
        runtime = build_runtime(settings, collection=f"BenchRefresh_{uuid.uuid4().hex[:8]}")
        store = runtime.store
        try:
            indexer = Indexer(store, runtime.indexing_pipeline(document_embedder=runtime.document_embedder))
            load_e5(settings.embedder.threads)

            started = time.perf_counter()
            full = indexer.refresh(source)
            full_s = time.perf_counter() - started
            embedded = runtime.document_embedder.embedded_texts

            started = time.perf_counter()
            again = indexer.refresh(source)
            refresh_s = time.perf_counter() - started
            assert not (again.added or again.changed or again.removed), "a no-change refresh must not index anything"
            assert runtime.document_embedder.embedded_texts == embedded, "a no-change refresh must embed nothing"
        finally:
            if hasattr(store, "drop"):
                store.drop()
            store.close()
    return {
        "corpus": source.dataset.name,
        "store": settings.store_kind,
        "documents": len(full.added),
        "chunks": full.chunks,
        "failed": len(full.failed),
        "full_index_s": round(full_s, 2),
        "no_change_refresh_s": round(refresh_s, 3),
        "refresh_vs_full": round(refresh_s / full_s, 5),
        "full_vs_refresh_x": round(full_s / refresh_s, 1),
    }


def _full_index(paths: list[str], data_dir: str) -> tuple[float, Any]:
    """Seconds of a full index into the empty ``data_dir``, and the runtime that holds it."""
    runtime = build_runtime(load_settings(env={"KBBOT_DATA_DIR": data_dir}))
    started = time.perf_counter()
    runtime.indexer.index(paths)
    return time.perf_counter() - started, runtime


def _bare(texts: list[str], threads: int) -> float:
    model = load_e5(threads)
    started = time.perf_counter()
    for i in range(0, len(texts), 32):
        model.passage(texts[i : i + 32])
    return time.perf_counter() - started


def measure(paths: list[str], threads: int = 2, rounds: int = 1) -> dict[str, float]:
    """Full index against the bare embedder on the same chunk texts: the model warmed up first (its
    first inference is slow and would be charged to whichever side went first), the two sides
    alternated for ``rounds`` rounds and the best time of each compared; then a no-change refresh
    of the last index."""
    load_e5(threads).passage(["warm-up"])  # model load and first inference paid before any timing
    full_times: list[float] = []
    bare_times: list[float] = []
    texts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            data_dir = f"{tmp}/round{round_}"
            if round_ % 2 and texts:
                bare_times.append(_bare(texts, threads))
            seconds, runtime = _full_index(paths, data_dir)
            full_times.append(seconds)
            texts = [passage_text(c) for c in runtime.store.document_store.filter_documents()]
            if not round_ % 2:
                bare_times.append(_bare(texts, threads))
        started = time.perf_counter()
        again = runtime.indexer.index(paths)
        refresh_s = time.perf_counter() - started
        assert not again.added and not again.changed, "a no-change refresh must not index anything"
    full_s, bare_s = min(full_times), min(bare_times)

    return {
        "chunks": len(texts),
        "index_chunks_per_s": round(len(texts) / full_s, 2),
        "bare_embed_texts_per_s": round(len(texts) / bare_s, 2),
        "index_vs_bare": round(bare_s / full_s, 3),
        "rounds": rounds,
        "full_index_s": round(full_s, 2),
        "no_change_refresh_s": round(refresh_s, 3),
        "refresh_vs_full": round(refresh_s / full_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["examples/kb"])
    parser.add_argument("--corpus", help="a dataset folder with corpus.jsonl (e.g. ../shared/eval/cmrc2018)")
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds of index and bare embedder (best of each)")
    parser.add_argument("--gdrive", type=int, metavar="FILES", help="a Google Drive source of FILES files (the fake)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.gdrive:
        from bench import gdrive

        emit(gdrive.measure(args.gdrive), args.json)
        return
    result = measure_corpus(args.corpus) if args.corpus else measure(args.paths, rounds=args.rounds)
    emit(result, args.json)


if __name__ == "__main__":
    main()
