"""A Google Drive source against the local Drive of the tests: a crawl of N files, a refresh with nothing
changed, and one with one file edited (``python -m bench.indexing --source gdrive --files N``).

The files live in ``tests/fakes/gdrive.py`` (served from a thread of its own, so its work is not charged
to the refresh), are read through the same ``Refresher.run`` a scheduled run uses, and go to the
configured store (Weaviate when ``WEAVIATE_URL`` is set, in a collection of its own dropped after; else
the embedded one). Drive calls are counted apart from token requests; a refresh with nothing changed
should be one ``changes.list`` call.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from typing import Any

from adapters.platforms import load_settings
from bot.runtime import build_runtime
from bot.settings import SourceSettings
from pipelines.components.embedders import load_e5
from pipelines.sources.gdrive import DriveSettings
from tests.fakes.gdrive import FakeDrive, anyone, service_account_json

KEY_ENV = "KBBOT_BENCH_GDRIVE_KEY"


def file_text(i: int) -> bytes:
    return (f"# Valve RV-{i:04d}\n\nThe RV-{i:04d} valve opens at {100 + i % 400} kPa and closes at "
            f"{80 + i % 300} kPa.\n\n## Maintenance\n\nReplace the RV-{i:04d} seal every {1000 + i} hours; check "
            "the actuator linkage for play at every inspection and grease the spindle thread.\n").encode()


def measure(files: int) -> dict[str, Any]:
    server = FakeDrive()
    with tempfile.TemporaryDirectory() as tmp, server.run_in_thread():
        kb = server.folder("Valves", "root")
        folders = [server.folder(f"Series {n}", kb.id).id for n in range(max(1, files // 50))]
        added = [server.add(f"rv-{i:04d}.md", folders[i % len(folders)], file_text(i), permissions=[anyone()])
                 for i in range(files)]
        os.environ[KEY_ENV] = service_account_json(server)
        settings = load_settings(env={**os.environ, "KBBOT_DATA_DIR": tmp})
        settings.redis_url = None  # the run log in a file of the temporary folder
        settings.refresh.allow_hosts = ["127.0.0.1"]
        settings.sources = [SourceSettings(name="drive", interval="1h", gdrive=DriveSettings(
            folder=kb.id, api_url=server.base_url, service_account_env=KEY_ENV, anyone_public=True))]
        runtime = build_runtime(settings, collection=f"BenchGdrive_{uuid.uuid4().hex[:8]}")
        store = runtime.store
        try:
            refresher = runtime.refresher()
            load_e5(settings.embedder.threads).passage(["warm-up"])  # model load paid before any timing

            def run() -> tuple[float, int, int, Any]:
                calls, tokens = len(server.calls()), len(server.calls("/token"))
                started = time.perf_counter()
                record = asyncio.run(refresher.run("drive"))
                return (time.perf_counter() - started, len(server.calls()) - calls,
                        len(server.calls("/token")) - tokens, record)

            full_s, full_calls, full_tokens, full = run()
            assert full.ok and full.added == files, full
            embedded = runtime.document_embedder.embedded_texts
            again_s, again_calls, again_tokens, again = run()
            assert again.unchanged == files and not (again.added or again.changed), again
            assert runtime.document_embedder.embedded_texts == embedded, "a no-change refresh must embed nothing"
            server.edit(added[0], file_text(files + 1))
            one_s, one_calls, _, one = run()
            assert one.changed == 1, one
        finally:
            if hasattr(store, "drop"):
                store.drop()
            store.close()
    return {
        "files": files,
        "folders": len(folders) + 1,
        "store": settings.store_kind,
        "full_refresh_s": round(full_s, 2),
        "full_items_per_s": round(files / full_s, 2),
        "full_drive_calls": full_calls,
        "full_calls_per_item": round(full_calls / files, 3),
        "full_token_requests": full_tokens,
        "no_change_refresh_s": round(again_s, 3),
        "no_change_drive_calls": again_calls,
        "no_change_token_requests": again_tokens,
        "one_file_edited_s": round(one_s, 3),
        "one_file_edited_drive_calls": one_calls,
        "full_vs_no_change_x": round(full_s / again_s, 1),
    }
