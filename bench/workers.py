"""A burst of questions through ``kbbot serve --workers W``, for each W side by side in one run.

    uv run python -m bench.workers [--workers 1 2] [--conversations 50] [--platforms slack telegram] [--json]

``bench.streaming`` runs the adapters inside the measuring process; this runs ``kbbot serve`` itself, as
deployed: its own processes (``adapters.workers``), Redis and Weaviate (``REDIS_URL``, ``WEAVIATE_URL``:
``make bench`` starts them), the Slack Events API signed as Slack sends it and Telegram's long polling
(worker 0 hands the updates on). The fakes serve from threads of this process and the model (Anthropic's
wire format, ``bench.model_process``) from a process of its own, so a server's CPU is only kbbot's.
The fakes enforce the platforms' limits as in ``bench.streaming`` (Slack's documented tiers with
chat.postMessage per channel, Telegram's one write a second per chat and 30 calls a second per bot).

Each W gets its own Redis prefix (fresh rate budgets) over one indexed collection; each conversation asks
once, all at the same moment, in a channel (chat) of its own. Reported per platform and W, in ms: the
first acknowledgement, question to the model's first token, and question to the first visible text
(p50/p95), 429s, and answers lost (no complete final text within ``--turn-timeout``); and the CPU seconds
the burst took (``bench.cpu``): the kbbot server's processes, Weaviate, Redis, the model's process and
this one (the fakes and the senders), and of all of them by the time of the first text p95 (sampled
every 0.1 s). On two cores, CPU seconds over two is the least time that work can take, whatever kbbot
does with its order: with both cores busy until the p95 first text, only less work moves it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

import pipelines  # noqa: F401  (telemetry off)
from bench.cpu import CpuMeter, named
from bench.report import emit_laid_out, table
from bench.streaming import (
    ANSWER,
    QUESTION,
    Tally,
    acknowledged_at,
    limited_telegram,
    model_tokens,
    tally_chat,
    thread_calls,
)

REPO = Path(__file__).resolve().parent.parent
#: The answer's last words: a thread shows the answer in full once a final message holds them.
LAST_WORDS = ANSWER.rstrip(" .[]1")[-40:]


def write_settings(folder: Path, collection: str, prefix: str, turn_timeout_s: float) -> Path:
    """The repository's settings as ``bench.streaming`` runs them: no per-user limits or approvals, the
    same stream and edit intervals; this run's collection and Redis prefix; examples/kb as the source."""
    from tests.cluster.replicas import write_config

    path = write_config(folder, REPO / "examples" / "kb", collection, prefix, lease_s=30, refresh_every_s=86400)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["limits"].update(per_user=0, per_channel=0)
    raw["approvals"]["enabled"] = False
    raw["generator"]["max_tokens"] = 4096
    raw["answering"]["turn_timeout_s"] = turn_timeout_s
    raw["slack"].update(stream_interval_s=1.0, edit_interval_s=1.2)
    raw["telegram"].update(stream_mode="edit", edit_interval_s=1.0)
    # Indexed once before the runs: no refresh of the source may start in a server during its burst.
    raw["sources"] = []
    # Slack delivers from many addresses; here every event comes from this one.
    raw["server"]["max_connections_per_client"] = 1000
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def final_shown(texts: list[str]) -> bool:
    """Some message holds the answer's last words (compared without spaces: Telegram's rendering may move them)."""
    words = "".join(LAST_WORDS.split())
    return any(words in "".join(t.split()) for t in texts)


async def slack_burst(server: Any, slack: Any, n: int, timeout_s: float) -> dict[str, Any]:
    from tests.cluster.replicas import deliver, event_body

    bodies = [event_body(f"{QUESTION} (ticket {i})?", f"C{i:04d}", f"EvBench{uuid.uuid4().hex[:8]}",
                         user=f"U{i:04d}") for i in range(n)]
    asked: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0)) as session:
        async def ask(body: str) -> None:
            asked[json.loads(body)["event"]["ts"]] = time.monotonic()
            await deliver(session, server, body)

        await asyncio.gather(*(ask(b) for b in bodies))
    events = [json.loads(b)["event"] for b in bodies]

    def shown(event: dict[str, Any]) -> bool:
        return final_shown([m.body for m in slack.thread(event["channel"], event["ts"]) if not m.streaming])

    deadline = time.monotonic() + timeout_s
    while not all(shown(e) for e in events) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)
    return {"events": events, "asked": asked, "shown": {e["ts"]: shown(e) for e in events}}


def slack_row(burst: dict[str, Any], slack: Any, model: Any, workers: int) -> dict[str, Any]:
    tally = Tally(model_tokens(model))
    for i, event in enumerate(burst["events"]):
        calls = thread_calls(slack, event["channel"], event["ts"])
        ack = acknowledged_at(calls)
        asked = burst["asked"][event["ts"]]
        tally.add(i, [c.at for c in calls if c.text_sent and c.method.startswith("chat.")], burst["shown"][event["ts"]],
                  acknowledged_after=None if ack is None else ack - asked, asked_at=asked)
    answer_calls = [c for c in slack.calls if c.method.startswith("chat.")]
    return {**tally.row("slack", "kbbot", len(burst["events"]), len(answer_calls), slack.calls), "workers": workers}


async def telegram_burst(telegram: Any, model: Any, n: int, workers: int, timeout_s: float) -> dict[str, Any]:
    from tests.fakes.telegram_server import message_update

    chats = [8000 + i for i in range(n)]
    asked: dict[int, float] = {}
    for i, chat in enumerate(chats):
        asked[chat] = time.monotonic()
        telegram.push_from_outside(message_update(f"{QUESTION} (ticket {i})?", chat_id=chat))

    def texts(chat: int) -> list[str]:
        return [m.text for m in telegram.chat(chat)]

    deadline = time.monotonic() + timeout_s
    while not all(final_shown(texts(c)) for c in chats) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)
    tally = Tally(model_tokens(model))
    for i, chat in enumerate(chats):
        tally_chat(tally, i, telegram, chat, asked[chat], final_shown(texts(chat)))
    answer_calls = [c for c in telegram.calls if c.method not in ("getUpdates", "getMe", "deleteWebhook")]
    return {**tally.row("telegram", "kbbot", n, len(answer_calls), telegram.calls), "workers": workers}


async def one_server(workers: int, platform: str, n: int, model: Any, folder: Path, collection: str,
                     turn_timeout_s: float) -> dict[str, Any]:
    from tests.cluster.replicas import SECRET, Replica, wait_healthy, workers_seen
    from tests.fakes.slack_server import FakeSlack

    run = folder / f"{platform}-w{workers}"
    config = write_settings(run / "config", collection, f"kbbot:bench-workers:{uuid.uuid4().hex[:8]}:", turn_timeout_s)
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(run)), "HAYSTACK_TELEMETRY_ENABLED": "False",
           "KBBOT_CONFIG": str(config), "KBBOT_LOG_FORMAT": "json", "KBBOT_DATA_DIR": str(run / "data"),
           "REDIS_URL": os.environ["REDIS_URL"], "WEAVIATE_URL": os.environ["WEAVIATE_URL"],
           "WEAVIATE_GRPC_PORT": os.environ.get("WEAVIATE_GRPC_PORT", "50051"),
           "ANTHROPIC_API_KEY": "sk-bench", "ANTHROPIC_BASE_URL": model.base_url}
    with FakeSlack(team_id="T0KBBOT", bot_user_id="UKBBOT", latency_s=0.01).run_in_thread() as slack, \
            limited_telegram().run_in_thread() as telegram:
        slack.documented_tiers()
        if platform == "slack":
            env.update(SLACK_BOT_TOKEN=slack.token, SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=slack.base_url)
        else:
            env.update(TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_URL=telegram.base_url)
        server = Replica(0, env, run / "serve.log", workers=workers)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                await wait_healthy(session, [server])
            if workers > 1:
                await workers_seen(server.port, workers)
            await asyncio.sleep(2)  # the workers' first calls (getMe, polling) settled
            model.clear()
            meter = CpuMeter({"weaviate": named("weaviate-server", "weaviate"), "redis": named("redis-server"),
                              "model": [model.pid], "fakes": [os.getpid()]}, trees={"kbbot": server.process.pid})
            meter.start()
            sampling = asyncio.create_task(meter.sample())
            try:
                if platform == "slack":
                    burst = await slack_burst(server, slack, n, turn_timeout_s + 30)
                    row = slack_row(burst, slack, model, workers)
                else:
                    row = await telegram_burst(telegram, model, n, workers, turn_timeout_s + 30)
            finally:
                sampling.cancel()
            # All the questions are asked within milliseconds of the meter's start.
            p95 = row["question_to_first_text_ms_p95"]
            by_p95 = meter.by(p95 / 1000) if p95 is not None else None
            return {**row, "cpu_s": meter.stop(), "cpu_s_by_first_text_p95": by_p95}
        finally:
            server.stop()


async def run(workers: list[int], conversations: int, platforms: list[str], tokens_per_second: float,
              first_token_delay: float, turn_timeout_s: float) -> dict[str, Any]:
    from bench.model_process import ModelProcess
    from tests.cluster.replicas import refresh_once, write_config

    if not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")):
        raise SystemExit("bench.workers needs REDIS_URL and WEAVIATE_URL (make bench starts them)")
    folder = Path(tempfile.mkdtemp(prefix="kbbot-bench-workers-"))
    collection = f"BenchWorkers_{uuid.uuid4().hex[:8]}"
    rows = []
    with ModelProcess(ANSWER, tokens_per_second=tokens_per_second, first_token_delay=first_token_delay) as model:
        index_config = write_config(folder / "index", REPO / "examples" / "kb", collection, "kbbot:bench-index:",
                                    lease_s=30, refresh_every_s=86400)
        await refresh_once({"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(folder)),
                            "KBBOT_CONFIG": str(index_config), "REDIS_URL": os.environ["REDIS_URL"],
                            "WEAVIATE_URL": os.environ["WEAVIATE_URL"],
                            "WEAVIATE_GRPC_PORT": os.environ.get("WEAVIATE_GRPC_PORT", "50051")}, folder / "index-data")
        for platform in platforms:
            for w in workers:
                row = await one_server(w, platform, conversations, model, folder, collection, turn_timeout_s)
                rows.append(row)
                print(json.dumps(row), flush=True, file=sys.stderr)
    return {"conversations": conversations, "tokens_per_second": tokens_per_second,
            "first_token_delay_s": first_token_delay, "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['conversations']} questions at once, first token after {result['first_token_delay_s']:g} s, "
          f"{result['tokens_per_second']:g} tokens/s")
    columns = ["platform", "workers", "acknowledged_after_question_ms_p50", "acknowledged_after_question_ms_p95",
               "question_to_first_token_ms_p50", "question_to_first_token_ms_p95", "question_to_first_text_ms_p50",
               "question_to_first_text_ms_p95", "api_calls_per_answer", "429s", "lost"]
    print(table(result["rows"], columns, ["platform", "workers", "ack p50", "ack p95", "q→token p50", "q→token p95",
                                          "q→text p50", "q→text p95", "calls/answer", "429s", "lost"]))
    print("\nCPU seconds during the burst (every answer to its end), by process; and of all of them by the time")
    print("the first text p95 (cores busy: that over the time, out of the machine's cores):")
    roles = ["kbbot", "weaviate", "redis", "model", "fakes"]
    cpu_rows = []
    for r in result["rows"]:
        by, p95 = r.get("cpu_s_by_first_text_p95"), r["question_to_first_text_ms_p95"]
        cpu_rows.append({"platform": r["platform"], "workers": r["workers"], **r["cpu_s"],
                         "total": round(sum(r["cpu_s"].values()), 2), "by": by,
                         "busy": None if by is None or not p95 else round(by / (p95 / 1000), 2)})
    print(table(cpu_rows, ["platform", "workers", *roles, "total", "by", "busy"],
                ["platform", "workers", *roles, "total", "by first text p95", "cores busy"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--platforms", nargs="+", default=["slack", "telegram"], choices=["slack", "telegram"])
    parser.add_argument("--tokens-per-second", type=float, default=40)
    parser.add_argument("--first-token-delay", type=float, default=0.5)
    parser.add_argument("--turn-timeout", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.workers, args.conversations, args.platforms, args.tokens_per_second,
                             args.first_token_delay, args.turn_timeout))
    emit_laid_out(result, args.json, print_table)


if __name__ == "__main__":
    main()
