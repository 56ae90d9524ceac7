"""Indexing throughput against the bare embedder, and a no-change refresh against a full index.

    uv run python -m bench.indexing [PATH ...] [--json]

Both sides embed the same chunk texts in the same process, one after the other, so the ratio
holds on a noisy machine even when the absolute numbers do not.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import pipelines  # noqa: F401  (telemetry off)
from bot.runtime import build_runtime
from bot.settings import load_settings
from pipelines.components.embedders import load_e5, passage_text


def measure(paths: list[str], threads: int = 2) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(env={"KBBOT_DATA_DIR": tmp})
        runtime = build_runtime(settings)
        load_e5(threads)  # model load is paid before either side is timed

        started = time.perf_counter()
        runtime.indexer.index(paths)
        full_s = time.perf_counter() - started

        chunks = runtime.store.document_store.filter_documents()
        texts = [passage_text(c) for c in chunks]
        model = load_e5(threads)
        started = time.perf_counter()
        for i in range(0, len(texts), 32):
            model.passage(texts[i : i + 32])
        bare_s = time.perf_counter() - started

        started = time.perf_counter()
        again = runtime.indexer.index(paths)
        refresh_s = time.perf_counter() - started
        assert not again.added and not again.changed, "a no-change refresh must not index anything"

    return {
        "chunks": len(texts),
        "index_chunks_per_s": round(len(texts) / full_s, 2),
        "bare_embed_texts_per_s": round(len(texts) / bare_s, 2),
        "index_vs_bare": round(bare_s / full_s, 3),
        "full_index_s": round(full_s, 2),
        "no_change_refresh_s": round(refresh_s, 3),
        "refresh_vs_full": round(refresh_s / full_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["examples/kb"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.paths)
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
