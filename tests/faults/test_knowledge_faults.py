"""A knowledge base holding files that cannot be read: each is reported by name with its reason, the
readable ones are indexed, a file that breaks keeps its previous version, and turns keep being answered."""

from __future__ import annotations

import os
from pathlib import Path

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from tests.conftest import make_settings
from tests.replies import RecordingReply

WARRANTY = "# Warranty\n\nThe standard warranty of HL-M200 motors lasts 24 months from delivery.\n"


def ask(text: str) -> Inquiry:
    return Inquiry("test", "t", "c", "test:kb-faults", "u", text)


async def test_unreadable_files_are_reported_and_the_rest_keeps_answering(tmp_path: Path):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "warranty.md").write_text(WARRANTY, encoding="utf-8")
    (kb / "maintenance.md").write_text("# Bearings\n\nRegrease HL-M200 bearings every 4,000 operating hours.\n",
                                       encoding="utf-8")
    (kb / "firmware.txt").write_bytes(os.urandom(4096) + b"\x00" * 64)           # binary under a text name
    (kb / "notes.md").write_bytes(b"# Notes\n\nCaf\xe9 \xff\xfe broken \xc3\x28 bytes\n")  # invalid UTF-8
    (kb / "empty.txt").write_bytes(b"")                                         # empty
    (kb / "scan.pdf").write_bytes(b"%PDF-1.7\n1 0 obj <<>> garbage, no xref, no trailer")  # corrupt PDF
    with (kb / "dump.txt").open("wb") as big:                                   # 50 MB
        line = b"HL-M200 log line with nothing of interest in it.\n"
        big.write(line * (50 * 1024 * 1024 // len(line) + 1))
    assert (kb / "dump.txt").stat().st_size >= 50 * 1024 * 1024

    runtime = build_runtime(make_settings(tmp_path / "data"))
    report = runtime.indexer.index([kb])
    reasons = {Path(f.source).name: f.reason for f in report.failed}
    assert set(reasons) == {"firmware.txt", "notes.md", "empty.txt", "scan.pdf", "dump.txt"}, reasons
    assert "binary" in reasons["firmware.txt"] or "not valid" in reasons["firmware.txt"]
    assert "UTF-8" in reasons["notes.md"] or "not valid" in reasons["notes.md"] or "binary" in reasons["notes.md"]
    assert reasons["empty.txt"] == "the file is empty"
    assert "not a readable PDF" in reasons["scan.pdf"]
    assert "too large" in reasons["dump.txt"]
    assert sorted(Path(d).name for d in report.added) == ["maintenance.md", "warranty.md"] or len(report.added) == 2

    await runtime.start()
    try:
        reply = RecordingReply()
        answer = await runtime.answerer.answer(ask("How long is the standard warranty of HL-M200 motors?"), reply)
        assert answer.outcome is Outcome.ANSWERED and reply.final is answer
        assert "24 months" in answer.text

        # The warranty file breaks (overwritten with bytes that are not text): its previous version stays.
        (kb / "warranty.md").write_bytes(b"\xff\xfe\x00\x01" * 100)
        again = runtime.indexer.index([kb])
        assert "warranty.md" in {Path(f.source).name for f in again.failed}
        assert not again.removed
        kept = await runtime.answerer.answer(ask("How long is the standard warranty of HL-M200 motors?"),
                                             RecordingReply())
        assert kept.outcome is Outcome.ANSWERED and "24 months" in kept.text
    finally:
        await runtime.close()
