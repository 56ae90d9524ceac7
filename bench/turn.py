"""CPU time per turn outside the model and the stores, and resident memory at 1 and 100 open threads.

    uv run python -m bench.turn [--turns 60] [--threads 100] [--json] [--profile N]

Turns run through ``Answerer.answer`` on the indexed sample knowledge base (in-memory store) with
Claude's wire format served by the fake Anthropic server *in another process*, so the model's side
costs this process nothing but the HTTP client. CPU is this process's ``process_time`` over each
turn; "outside the stores" subtracts the CPU of the stages that are the store and the local embedding
model (``embed``, ``retrieve``), measured for each question by calling those two components alone
after the turns (median of 7): their wall time inside a turn is inflated by a loaded machine. RSS is read from ``/proc/self/status``
after one thread and after ``--threads`` threads with one turn each (their history kept).
``--profile N`` runs the measured turns under cProfile (process CPU time, the event loop's thread)
and prints the N functions with the most CPU of their own and the N with the most cumulative CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import multiprocessing
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pipelines  # noqa: F401  (telemetry off)
from bench.report import emit

REPO = Path(__file__).resolve().parent.parent
ANSWER = ("Regrease the HL-M200 bearings every 4,000 operating hours with 15 g of lithium-complex grease [1]. "
          "HL-M300 bearings take 25 g every 3,000 hours [1]. Wipe the nipple clean first [2].")


def _serve_model(port_queue: multiprocessing.Queue) -> None:  # pragma: no cover - child process
    # Here, not at the top: the spawned fake-model process imports this module, and loading the bot
    # there would only cost it memory and start-up time.
    from tests.fakes.anthropic_server import FakeAnthropic, Script
    from tests.model_router import ModelRouter

    async def main() -> None:
        router = ModelRouter()
        router.responders["answer"] = lambda body: Script(ANSWER, tokens_per_second=400)
        async with FakeAnthropic(router) as fake:
            port_queue.put(fake.base_url)
            await asyncio.Event().wait()

    asyncio.run(main())


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def run(turns: int, threads: int, profile: int = 0) -> dict[str, object]:
    from bot.runtime import build_runtime  # not at the top: see _serve_model
    from bot.settings import load_settings
    from bot.types import Inquiry
    from tests.replies import RecordingReply

    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    model = spawn.Process(target=_serve_model, args=(queue,), daemon=True)
    model.start()
    base_url = queue.get(timeout=60)
    data = Path(tempfile.mkdtemp(prefix="kbbot-bench-turn-"))
    env = {"KBBOT_DATA_DIR": str(data), "ANTHROPIC_API_KEY": "sk-bench"}
    os.environ.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-bench"})
    settings = load_settings(REPO / "config" / "kbbot.yaml", env=env)
    settings.limits.per_user = settings.limits.per_channel = 0
    settings.memory.approved_answers = False
    runtime = build_runtime(settings)
    runtime.indexer.index([REPO / "examples" / "kb"])
    await runtime.start()
    answerer = runtime.answerer
    questions = ["How often should the bearings be greased?", "What grease should I use for HL-M300 bearings?",
                 "电机轴承多久加一次润滑脂？", "How much grease goes into each HL-M200 bearing?"]
    try:
        for q in questions:  # warm-up: models loaded, connections open
            await answerer.answer(Inquiry("bench", "t", "c", "bench:warm", "u", q), RecordingReply())
        cpu_total, wall, asked = [], [], []
        profiler = cProfile.Profile(time.process_time) if profile else None
        if profiler is not None:
            profiler.enable()
        for i in range(turns):
            inquiry = Inquiry("bench", "t", "c", f"bench:cpu:{i}", "u", questions[i % len(questions)])
            c0, w0 = time.process_time(), time.perf_counter()
            await answerer.answer(inquiry, RecordingReply())
            cpu = time.process_time() - c0
            wall.append((time.perf_counter() - w0) * 1000)
            cpu_total.append(cpu * 1000)
            asked.append(inquiry.text)
        if profiler is not None:
            profiler.disable()
            print_profile(profiler, profile, turns)
        store_cpu = {q: store_cpu_ms(answerer.pipeline, q) for q in questions}
        cpu_outside = [max(0.0, cpu - store_cpu[q]) for cpu, q in zip(cpu_total, asked)]
        rss_one = rss_mb()
        for i in range(1, threads):
            inquiry = Inquiry("bench", "t", f"c{i}", f"bench:thread:{i}", f"u{i}", questions[i % len(questions)])
            await answerer.answer(inquiry, RecordingReply())
        rss_many = rss_mb()
    finally:
        await runtime.close()
        model.terminate()
    return {
        "turns": turns,
        "cpu_ms_per_turn_p50": round(statistics.median(cpu_total), 1),
        "cpu_ms_per_turn_p95": round(pct(cpu_total, 0.95), 1),
        "cpu_ms_outside_model_and_stores_p50": round(statistics.median(cpu_outside), 1),
        "cpu_ms_outside_model_and_stores_p95": round(pct(cpu_outside, 0.95), 1),
        "wall_ms_per_turn_p50": round(statistics.median(wall), 1),
        "rss_mb_1_thread": round(rss_one, 1),
        f"rss_mb_{threads}_threads": round(rss_many, 1),
        "rss_mb_per_extra_thread": round((rss_many - rss_one) / max(threads - 1, 1), 3),
    }


def store_cpu_ms(pipeline: object, question: str, repeats: int = 7) -> float:
    """The CPU of the store stages alone for ``question`` (median of ``repeats``): the query
    embedded by the local model, then retrieval, called directly on the pipeline's own components.
    Measured apart because a stage's time inside a turn is wall time, which a loaded machine inflates
    well past its CPU (the figure went negative when subtracted)."""
    embed, retrieve = pipeline.get_component("embed"), pipeline.get_component("retrieve")
    costs = []
    for _ in range(repeats):
        c0 = time.process_time()
        embedding = embed.run(text=question)["embedding"]
        retrieve.run(query=question, query_embedding=embedding)
        costs.append((time.process_time() - c0) * 1000)
    return statistics.median(costs)


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
