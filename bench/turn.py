"""CPU time per turn outside the model and the stores, and resident memory at 1 and 100 open threads.

    uv run python -m bench.turn [--turns 60] [--threads 100] [--json] [--profile N]

Turns run through ``Answerer.answer`` on the indexed sample knowledge base (in-memory store) with
Claude's wire format served by the fake Anthropic server *in another process*, so the model's side
costs this process nothing but its client. CPU is this process's ``process_time`` over each turn.

The turns run twice. First as they are (``cpu_ms_per_turn``), recording what the store stages
(``embed``: the local embedding model, ``retrieve``: the store) return for each question; then again
with those two stages replaying their recorded outputs, so the second pass's CPU is the turn's
outside the stores, measured directly (``cpu_ms_outside_stores``). Of that, the CPU inside the
model client's calls (the Anthropic SDK with its HTTP stack: the guard, grade and answer calls, the
answer streamed) is measured around each call and reported apart (``cpu_ms_model_client``); the rest
is Haystack's pipeline and kbbot's own code (``cpu_ms_outside_model_and_stores``). RSS is read from
``/proc/self/status`` after one thread and after ``--threads`` threads with one turn each (their
history kept). ``--profile N`` runs the replayed turns under cProfile (process CPU time) and prints
the N functions with the most CPU of their own and the N with the most cumulative CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (telemetry off)
from bench.model_process import ModelProcess
from bench.report import emit, percentile

REPO = Path(__file__).resolve().parent.parent
ANSWER = ("Regrease the HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease [1]. "
          "HL-M300 bearings take 25 g every 3,000 hours [1]. Wipe the nipple clean first [2].")


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float | None:
    return percentile(values, q)


async def run(turns: int, threads: int, profile: int = 0) -> dict[str, object]:
    from adapters.platforms import load_settings
    from bot.runtime import build_runtime  # not at the top: the spawned fake-model process imports this module
    from bot.types import Inquiry
    from tests.replies import RecordingReply

    model = ModelProcess(ANSWER, tokens_per_second=400).__enter__()
    base_url = model.base_url
    data = Path(tempfile.mkdtemp(prefix="kbbot-bench-turn-"))
    env = {"KBBOT_DATA_DIR": str(data), "ANTHROPIC_API_KEY": "sk-bench"}
    os.environ.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-bench"})
    settings = load_settings(REPO / "config" / "kbbot.yaml", env=env)
    settings.limits.per_user = settings.limits.per_channel = 0
    settings.approvals.enabled = False
    runtime = build_runtime(settings)
    runtime.indexer.index([REPO / "examples" / "kb"])
    await runtime.start()
    answerer = runtime.answerer
    questions = ["How often should the bearings be greased?", "What grease should I use for HL-M300 bearings?",
                 "电机轴承多久加一次润滑脂？", "How much grease goes into each HL-M200 bearing?"]
    stages = StoreStages(answerer.pipeline)
    client = ModelClientCpu(answerer.pipeline)
    try:
        for q in questions:  # warm-up: models loaded, connections open
            await answerer.answer(Inquiry("bench", "t", "c", "bench:warm", "u", q), RecordingReply())
        cpu_total, wall = [], []
        for i in range(turns):
            inquiry = Inquiry("bench", "t", "c", f"bench:cpu:{i}", "u", questions[i % len(questions)])
            c0, w0 = time.process_time(), time.perf_counter()
            await answerer.answer(inquiry, RecordingReply())
            cpu_total.append((time.process_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        stages.replay = True
        cpu_outside, cpu_client = [], []
        profiler = cProfile.Profile(time.process_time) if profile else None
        if profiler is not None:
            profiler.enable()
        for i in range(turns):
            inquiry = Inquiry("bench", "t", "c", f"bench:replayed:{i}", "u", questions[i % len(questions)])
            client.spent = 0.0
            c0 = time.process_time()
            await answerer.answer(inquiry, RecordingReply())
            cpu_outside.append((time.process_time() - c0) * 1000)
            cpu_client.append(client.spent * 1000)
        if profiler is not None:
            profiler.disable()
            print_profile(profiler, profile, turns)
        stages.replay = False
        rss_one = rss_mb()
        for i in range(1, threads):
            inquiry = Inquiry("bench", "t", f"c{i}", f"bench:thread:{i}", f"u{i}", questions[i % len(questions)])
            await answerer.answer(inquiry, RecordingReply())
        rss_many = rss_mb()
    finally:
        await runtime.close()
        model.__exit__(None, None, None)
    rest = [outside - spent for outside, spent in zip(cpu_outside, cpu_client)]
    return {
        "turns": turns,
        **figures("cpu_ms_per_turn", cpu_total),
        **figures("cpu_ms_outside_stores", cpu_outside),
        **figures("cpu_ms_model_client", cpu_client),
        **figures("cpu_ms_outside_model_and_stores", rest),
        "wall_ms_per_turn_p50": round(statistics.median(wall), 1),
        "rss_mb_1_thread": round(rss_one, 1),
        f"rss_mb_{threads}_threads": round(rss_many, 1),
        "rss_mb_per_extra_thread": round((rss_many - rss_one) / max(threads - 1, 1), 3),
    }


def figures(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p50": round(statistics.median(values), 1), f"{name}_p95": round(pct(values, 0.95), 1)}


class StoreStages:
    """The store stages of ``pipeline`` (``embed``, ``retrieve``), recording their outputs per input
    and, once ``replay`` is set, returning the recorded outputs instead of running."""

    NAMES = ("embed", "retrieve")

    def __init__(self, pipeline: Any):
        self.replay = False
        self.recorded: dict[str, dict[str, Any]] = {}
        for name in self.NAMES:
            component = pipeline.get_component(name)
            component.run = self._wrap(name, component.run)
            if callable(getattr(component, "run_async", None)):
                component.run_async = self._wrap_async(name, component.run_async)

    def _key(self, name: str, kwargs: dict[str, Any]) -> str:
        return f"{name}:{sorted((k, repr(v)[:300]) for k, v in kwargs.items())}"

    def _wrap(self, name: str, run: Any) -> Any:
        def wrapped(**kwargs: Any) -> dict[str, Any]:
            key = self._key(name, kwargs)
            if self.replay and key in self.recorded:
                return self.recorded[key]
            out = self.recorded[key] = run(**kwargs)
            return out
        return wrapped

    def _wrap_async(self, name: str, run_async: Any) -> Any:
        async def wrapped(**kwargs: Any) -> dict[str, Any]:
            key = self._key(name, kwargs)
            if self.replay and key in self.recorded:
                return self.recorded[key]
            out = self.recorded[key] = await run_async(**kwargs)
            return out
        return wrapped


class ModelClientCpu:
    """Adds up the process CPU spent inside the model client's calls (``spent``, seconds): the
    answer generator of ``pipeline`` and the helper generator its guard and grade consult. Turns
    run one at a time, and nothing else runs during a model call's CPU, so the sum is the client's."""

    def __init__(self, pipeline: Any):
        self.spent = 0.0
        generators = {id(g): g for g in (pipeline.get_component("generate"),
                                         getattr(pipeline.get_component("guard"), "generator", None),
                                         getattr(pipeline.get_component("grade"), "generator", None))
                      if g is not None}
        for generator in generators.values():
            generator.run_async = self._timed(generator.run_async)

    def _timed(self, run_async: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return await run_async(*args, **kwargs)
            finally:
                self.spent += time.process_time() - c0
        return timed


def print_profile(profiler: cProfile.Profile, top: int, turns: int) -> None:
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(top)
        print(f"--- cProfile by {key} over {turns} turns (process CPU seconds) ---\n{out.getvalue()}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    args = parser.parse_args()
    result = asyncio.run(run(args.turns, args.threads, args.profile))
    emit(result, args.json)


if __name__ == "__main__":
    main()
