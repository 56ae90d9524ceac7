"""A Confluence source: a full refresh of N pages against a refresh with nothing changed, and with one page edited.

    uv run python -m bench.confluence [--pages 500] [--json]

The pages live in the local Confluence of the tests (``tests/fakes/confluence_server.py``, served
from a thread of its own so its work is not charged to the refresh), are read through the same
``Refresher.run`` a scheduled run uses, and go to the configured store (Weaviate when
``WEAVIATE_URL`` is set, in a collection of its own that is dropped after; else the embedded one).
A no-change refresh lists the pages (one request per 100 pages, and one listing of attachments)
and asks for nothing else: no body, no conversion, no embedding.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid

import pipelines  # noqa: F401  (telemetry off)
from adapters.platforms import load_settings
from bench.report import emit
from bot.runtime import build_runtime
from bot.settings import SourceSettings
from pipelines.components.embedders import load_e5
from pipelines.sources.confluence import ConfluenceSettings
from tests.fakes.confluence_server import FakeConfluence

TOKEN_ENV = "KBBOT_BENCH_CONFLUENCE_TOKEN"


def page_body(i: int) -> str:
    return (f"<h1>Valve RV-{i:04d}</h1><p>The RV-{i:04d} valve opens at {100 + i % 400} kPa and closes at "
            f"{80 + i % 300} kPa.</p><h2>Maintenance</h2><p>Replace the RV-{i:04d} seal every {1000 + i} hours; "
            "check the actuator linkage for play at every inspection and grease the spindle thread.</p>")


def measure(pages: int) -> dict[str, float | int | str]:
    os.environ[TOKEN_ENV] = "bench-token"
    server = FakeConfluence(cloud=True, token="bench-token")
    for i in range(pages):
        server.add_page("OPS", f"Valve RV-{i:04d}", page_body(i))
    with tempfile.TemporaryDirectory() as tmp, server.run_in_thread():
        settings = load_settings(env={**os.environ, "KBBOT_DATA_DIR": tmp})
        settings.redis_url = None  # the run log in a file of the temporary folder
        settings.sources = [SourceSettings(name="wiki", interval="1h", confluence=ConfluenceSettings(
            url=server.base_url, spaces=["OPS"], token_env=TOKEN_ENV))]
        runtime = build_runtime(settings, collection=f"BenchConfluence_{uuid.uuid4().hex[:8]}")
        store = runtime.store
        try:
            refresher = runtime.refresher()
            load_e5(settings.embedder.threads).passage(["warm-up"])  # model load paid before any timing

            def run() -> tuple[float, int, object]:
                requests = len(server.log)
                started = time.perf_counter()
                record = asyncio.run(refresher.run("wiki"))
                return time.perf_counter() - started, len(server.log) - requests, record

            full_s, full_requests, full = run()
            embedded = runtime.document_embedder.embedded_texts
            again_s, again_requests, again = run()
            assert again.unchanged == pages and not (again.added or again.changed), again
            assert runtime.document_embedder.embedded_texts == embedded, "a no-change refresh must embed nothing"
            server.edit(next(iter(server.pages.values())), page_body(pages + 1))
            one_s, one_requests, one = run()
            assert one.changed == 1, one
        finally:
            if hasattr(store, "drop"):
                store.drop()
            store.close()
    return {
        "pages": pages,
        "store": settings.store_kind,
        "full_refresh_s": round(full_s, 2),
        "full_requests": full_requests,
        "no_change_refresh_s": round(again_s, 3),
        "no_change_requests": again_requests,
        "one_page_edited_s": round(one_s, 3),
        "one_page_edited_requests": one_requests,
        "full_vs_no_change_x": round(full_s / again_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    emit(measure(args.pages), args.json)


if __name__ == "__main__":
    main()
