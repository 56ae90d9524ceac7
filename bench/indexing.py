"""Indexing throughput against the bare embedder, and a no-change refresh against a full index.

    uv run python -m bench.indexing [PATH ...] [--json]
    uv run python -m bench.indexing --corpus ../shared/eval/cmrc2018 [--json]
    uv run python -m bench.indexing --source sharepoint [--files 60] [--drives 2] [--json]
    uv run python -m bench.indexing --source gdrive [--files 200] [--json]

Both sides embed the same chunk texts in the same process after a warm-up of the model (with
``--rounds N``: alternated N times, best time of each side), so the ratio holds on a noisy machine
even when the absolute numbers do not. ``--corpus`` reads a dataset's
``corpus.jsonl`` as a source (one document per passage) and times a full index against a refresh
with nothing changed, through the same ``Indexer.refresh`` a scheduled run uses, on the configured
store (Weaviate when ``WEAVIATE_URL`` is set, in a collection of its own that is dropped after).
``--source sharepoint`` reads libraries of the fake Microsoft Graph (``tests/fakes/graph.py``, served
from a thread of its own) through the real SharePoint source: a first run (files per second, Graph
calls and downloads per file), a run with nothing changed (one delta call per library) and one with one
file edited.
``--source gdrive``: a Google Drive source of ``--files`` files against the tests' local Drive
(``bench.gdrive``): items per second, Drive calls per item, and the calls of a refresh with nothing changed.
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


def measure_sharepoint(files: int = 60, drives: int = 2) -> dict[str, float | int | str]:
    """A SharePoint source against the fake Graph: a full run, a run with nothing changed, one edit."""
    import os

    from pipelines.sources.kind import SourceContext
    from pipelines.sources.sharepoint import SHAREPOINT, SharePointEntry, SharePointSettings
    from tests.fakes.graph import FakeGraph, site_user_permission

    graph = FakeGraph(tls=True)
    with graph.run_in_thread(), tempfile.TemporaryDirectory() as tmp:
        os.environ["REQUESTS_CA_BUNDLE"] = graph.ca_file  # MSAL's requests trusts the fake login
        os.environ["KBBOT_BENCH_SHAREPOINT_SECRET"] = graph.app_secret
        site = graph.add_site("contoso.sharepoint.com", "sites/bench", permissions=[
            site_user_permission("c:0-.f|rolemanager|spo-grid-all-users/bench")])
        libraries = [graph.add_drive(f"Library {d}", site=site) for d in range(drives)]
        items = [graph.add_file(libraries[i % drives], f"Manuals/Folder {i % 7}/HL-K{i} note.md",
                                f"# HL-K{i}\n\nThe HL-K{i} pump impeller is inspected every {1000 + i} hours.\n".encode())
                 for i in range(files)]
        entry = SharePointEntry(name="bench", sharepoint=SharePointSettings(
            tenant_id=graph.tenant_id, client_id=graph.app_id, client_secret_env="KBBOT_BENCH_SHAREPOINT_SECRET",
            site="https://contoso.sharepoint.com/sites/bench", folder="Manuals", graph_url=graph.graph_url,
            login_url=graph.login_url, download_hosts=["localhost"]))
        settings = load_settings(env={**os.environ, "KBBOT_DATA_DIR": tmp})
        context = SourceContext(extensions=tuple(settings.indexing.extensions), allow_hosts=("127.0.0.1", "localhost"))
        runtime = build_runtime(settings, collection=f"BenchSharePoint_{uuid.uuid4().hex[:8]}")
        store = runtime.store
        states: dict = {}
        try:
            indexer = Indexer(store, runtime.indexing_pipeline(document_embedder=runtime.document_embedder))
            load_e5(settings.embedder.threads).passage(["warm-up"])

            def run() -> tuple[Any, float, int, int]:
                nonlocal states
                calls, downloads = len(graph.calls), len(graph.downloads)
                source = SHAREPOINT.build(entry, context, states)
                started = time.perf_counter()
                try:
                    report = indexer.refresh(source)
                finally:
                    source.close()
                states = dict(source.updated_states)
                return (report, time.perf_counter() - started, len(graph.calls) - calls,
                        len(graph.downloads) - downloads)

            full, full_s, full_calls, full_downloads = run()
            assert len(full.added) == files, full
            again, again_s, again_calls, _ = run()
            assert not (again.added or again.changed or again.removed), again
            graph.edit(items[0], b"# HL-K0\n\nThe HL-K0 pump impeller is inspected every 999 hours.\n")
            edit, edit_s, edit_calls, edit_downloads = run()
            assert len(edit.changed) == 1, edit
        finally:
            if hasattr(store, "drop"):
                store.drop()
            store.close()
    return {
        "store": settings.store_kind,
        "files": files,
        "libraries": drives,
        "full_s": round(full_s, 2),
        "full_files_per_s": round(files / full_s, 1),
        "full_graph_calls": full_calls,
        "full_graph_calls_per_file": round(full_calls / files, 2),
        "full_downloads_per_file": round(full_downloads / files, 2),
        "no_change_s": round(again_s, 3),
        "no_change_graph_calls": again_calls,
        "no_change_delta_calls_per_library": round(again_calls / drives, 2),
        "one_edit_s": round(edit_s, 2),
        "one_edit_graph_calls": edit_calls,
        "one_edit_downloads": edit_downloads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["examples/kb"])
    parser.add_argument("--corpus", help="a dataset folder with corpus.jsonl (e.g. ../shared/eval/cmrc2018)")
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds of index and bare embedder (best of each)")
    parser.add_argument("--source", choices=["sharepoint", "gdrive"], help="a run of that kind of source against its fake")
    parser.add_argument("--files", type=int, help="--source: files in the source (sharepoint 60, gdrive 200)")
    parser.add_argument("--drives", type=int, default=2, help="--source sharepoint: libraries")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.source == "sharepoint":
        result = measure_sharepoint(args.files or 60, args.drives)
    elif args.source == "gdrive":
        from bench import gdrive

        result = gdrive.measure(args.files or 200)
    else:
        result = measure_corpus(args.corpus) if args.corpus else measure(args.paths, rounds=args.rounds)
    emit(result, args.json)


if __name__ == "__main__":
    main()
