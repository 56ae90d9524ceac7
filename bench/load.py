"""A load run across replicas: conversations through the fake Slack (with rate tiers) answered by
several ``kbbot serve`` processes on one Redis and one Weaviate, with and without faults.

    uv run python -m bench.load [--replicas 3] [--conversations 60] [--duration 60] [--turns 2] [--json]

Needs ``REDIS_URL`` and ``WEAVIATE_URL`` (``make bench`` starts both). Conversation ``c`` starts at
``c * duration / conversations`` in one of ``--channels`` channels; each of its ``--turns`` mentions
(the first opens a thread, the others follow in it) goes to a random replica, and the next is asked
once the answer is complete (or after ``--answer-timeout``). A delivery that is refused or not
acknowledged within 3 s is delivered again to another replica after ``--retry-s`` (Slack's 1 and 5
minute retries, shortened), at most three times, as Slack does. The fake model streams a 600-character
answer made of its first source's sentences at 60 tokens/s after 0.3 s.

The fault run kills replica 0 (SIGKILL) at 40 % of the duration and starts it again at 60 %, and has
the model answer every 15th answer request with a 429 (Retry-After 1 s). The fake Slack enforces
Slack's documented tiers, the ones bench.streaming uses (``tests.fakes.slack_server.DOCUMENTED_TIERS``),
per workspace: chat.startStream and chat.stopStream 20/min, chat.appendStream 100/min, chat.update,
reactions.add and the status 50/min, reactions.remove 20/min; chat.postMessage 5 per 5 s per channel.

The two-workspaces run is the steady run with a second, quiet workspace of the same Enterprise Grid org
beside it (``--quiet-per-minute`` questions a minute, default 5, in channels of its own; the fake Slack
counts its per-workspace tiers apart): the busy one must not starve the quiet one's acknowledgements.

Reported per run: questions asked, answered once (delivered), never answered (lost), answered more
than once (duplicated), turns that ended in an error outcome, the acknowledgement (the status, the
reaction or the first text, whichever came first; the quiet workspace's apart), first text and final
text (ms from the mention's delivery, p50/p95), 429s the fake Slack and the fake model sent, the turns'
outcomes as the replicas logged them, and each replica's peak RSS (a restarted replica's is its new
process's). A mention a replica had
acknowledged when it was killed is not redelivered by Slack: such a question is lost, and counted so.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import pipelines  # noqa: F401  (telemetry off)
from bench.report import percentile, table
from tests.cluster.replicas import (
    TEAM,
    answers_in,
    deliver,
    ends_answer,
    event_body,
    refresh_once,
    running,
    serve_env,
    wait_healthy,
    write_config,
)
from tests.fakes.anthropic_server import FakeAnthropic, Script
from tests.fakes.slack_server import FakeSlack
from tests.model_router import ModelRouter, steps

KB_FILES = ("faq.md", "fault-codes.md", "maintenance-schedule.md", "motor-does-not-start.txt")
QUESTIONS = ["How often should the bearings be greased?", "What does fault code E07 mean?",
             "How long is the standard warranty?", "The motor does not start, what should I check?",
             "What should I inspect every month?", "Is the warranty longer for a service contract?"]
#: The length of the fake model's answer. It says what the question's first source holds (sentences of
#: it, cited), as an answer must to pass the sentence check: a canned text that no source of most
#: questions holds would make them ``not_found`` and measure no delivery at all.
ANSWER_CHARS = 600


@dataclass
class Turn:
    conversation: int
    channel: str
    thread_ts: str | None
    asked_at: float = 0.0
    first_text_s: float | None = None
    final_s: float | None = None
    question_ts: str = ""
    team: str = TEAM
    event_id: str = ""


#: The second workspace of the two-workspace run (an Enterprise Grid org: one app, one token).
QUIET_TEAM = "T0QUIET"
#: Outcomes of a turn that ended as it should (anything else is an error outcome).
GOOD_OUTCOMES = {"answered", "not_found", "off_topic", "clarify", "cached"}


@dataclass
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


def pct(values: list[float], q: float) -> float | None:
    return percentile(values, q)


async def deliver_like_slack(session: Any, replicas: list[Any], body: str, retry_s: float) -> bool:
    """Delivers an event to a random ready replica, retrying up to three times elsewhere as Slack does.

    Ready: passed its health check since it last started, as a load balancer's readiness check has it
    (a replica started again takes ~15 s to listen; sent there, every try of a mention could be refused
    before any replica heard of it, which no kbbot change can trace or answer)."""
    for attempt in range(4):
        live = [r for r in replicas if r.ready and r.process.poll() is None] or replicas
        try:
            if await deliver(session, random.choice(live), body, retry=attempt) < 3:
                return True
        except Exception:  # noqa: BLE001 - refused, reset or timed out: Slack retries
            pass
        await asyncio.sleep(retry_s)
    return False


async def conversation(c: int, run: Run, args: argparse.Namespace, slack: Any, session: Any, replicas: list[Any],
                       start: float, *, at: float | None = None, team: str = TEAM, channel: str | None = None,
                       turns: int | None = None) -> None:
    await asyncio.sleep(max(0.0, start + (c * args.duration / args.conversations if at is None else at)
                            - time.monotonic()))
    channel = channel or f"C0LOAD{c % args.channels:02d}"
    root: dict[str, Any] | None = None
    for k in range(args.turns if turns is None else turns):
        body = json.loads(event_body(QUESTIONS[(c + k) % len(QUESTIONS)], channel, f"Ev{team}{c:04d}{k:02d}",
                                     user=f"U0LOAD{c:04d}", team=team))  # one asker per conversation
        if root is not None:
            body["event"]["thread_ts"] = root["ts"]
        root = root or body["event"]
        raw = json.dumps(body)
        turn = Turn(c, channel, root["ts"], asked_at=time.monotonic(), question_ts=body["event"]["ts"], team=team,
                    event_id=body["event_id"])
        run.turns.append(turn)
        before = {m.ts for m in slack.thread(channel, root["ts"])}  # the earlier answers' messages, all of them
        if not await deliver_like_slack(session, replicas, raw, args.retry_s):
            continue
        deadline = turn.asked_at + args.answer_timeout
        while time.monotonic() < deadline:
            thread = slack.thread(channel, root["ts"])
            fresh = [m for m in thread if m.ts not in before]
            if fresh and turn.first_text_s is None and fresh[0].changes:
                turn.first_text_s = fresh[0].changes[0][1] - turn.asked_at
            done = [m for m in fresh if ends_answer(m)]  # not its first sentences posted alone
            if done:
                turn.final_s = done[0].changes[-1][1] - turn.asked_at if done[0].changes else None
                break
            await asyncio.sleep(0.1)


async def inject_faults(run: Run, args: argparse.Namespace, session: Any, replicas: list[Any], start: float) -> None:
    await asyncio.sleep(max(0.0, start + 0.4 * args.duration - time.monotonic()))
    replicas[0].kill()
    run.faults.append(f"replica 0 killed at {time.monotonic() - start:.0f} s")
    await asyncio.sleep(max(0.0, start + 0.6 * args.duration - time.monotonic()))
    replicas[0].restart()
    began = time.monotonic()
    await wait_healthy(session, [replicas[0]])
    run.faults.append(f"replica 0 started again at {began - start:.0f} s, healthy {time.monotonic() - began:.0f} s later")


def acknowledged_s(slack: Any, turn: Turn) -> float | None:
    """Seconds from the question to the first sign it was taken: the status set in its thread, the
    reaction on it, or its first text, whichever Slack showed first."""
    shown = [c.at for c in slack.calls if c.ok and c.at >= turn.asked_at and (
        (c.method == "assistant.threads.setStatus" and c.args.get("status")
         and (c.args.get("channel_id"), c.args.get("thread_ts")) == (turn.channel, turn.thread_ts))
        or (c.method == "reactions.add" and (c.args.get("channel"), c.args.get("timestamp"))
            == (turn.channel, turn.question_ts)))]
    if turn.first_text_s is not None:
        shown.append(turn.asked_at + turn.first_text_s)
    return min(shown) - turn.asked_at if shown else None


def quiet_plan(args: argparse.Namespace) -> list[float]:
    """When the quiet workspace's questions are asked: ``--quiet-per-minute`` over the run, evenly."""
    count = max(1, round(args.quiet_per_minute * args.duration / 60))
    return [(i + 0.5) * args.duration / count for i in range(count)]


async def one_run(name: str, faults: bool, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    kb = tmp / "kb"
    if not kb.exists():
        kb.mkdir()
        examples = Path(__file__).resolve().parent.parent / "examples" / "kb"
        for f in KB_FILES:
            (kb / f).write_bytes((examples / f).read_bytes())
    folder = tmp / name
    config = write_config(folder / "config", kb, f"Load_{uuid.uuid4().hex[:8]}", f"kbbot:load:{uuid.uuid4().hex[:8]}:",
                          lease_s=args.lease_s, refresh_every_s=600)
    answers = itertools.count(1)
    model_429s = 0

    def answer(body: dict[str, Any]) -> Script:
        nonlocal model_429s
        if faults and next(answers) % 15 == 0:
            model_429s += 1
            return Script(status=429, retry_after=1)
        return Script(steps(body, chars=ANSWER_CHARS), tokens_per_second=60, first_token_delay=0.3)

    router = ModelRouter()
    router.responders["answer"] = answer
    run = Run(name)
    async with FakeAnthropic() as claude, FakeSlack(token="xoxb-load") as slack, aiohttp.ClientSession() as session:
        claude.responder = router
        slack.documented_tiers()
        env = serve_env(folder, config=config, slack=slack, model_url=claude.base_url)
        await refresh_once(env, folder / "admin")
        async with running(args.replicas, env, folder) as replicas:
            await wait_healthy(session, replicas)
            start = time.monotonic()
            work = [conversation(c, run, args, slack, session, replicas, start) for c in range(args.conversations)]
            if name == "two-workspaces":  # a quiet workspace of the same org beside the busy one
                for i, at in enumerate(quiet_plan(args)):
                    channel = f"C0QUIET{i % 3}"
                    slack.channel_teams[channel] = QUIET_TEAM
                    work.append(conversation(10_000 + i, run, args, slack, session, replicas, start, at=at,
                                             team=QUIET_TEAM, channel=channel, turns=1))
            if faults:
                work.append(inject_faults(run, args, session, replicas, start))
            await asyncio.gather(*work)
            await asyncio.sleep(3)  # late duplicates show up here
            rss = [r.rss_mb() for r in replicas]
            counts = {}
            for turn in run.turns:
                key = (turn.channel, turn.thread_ts)
                if key not in counts:
                    counts[key] = len(answers_in(slack, json.dumps({"event": {"channel": turn.channel,
                                                                              "ts": turn.thread_ts}})))
            slack_429s = sum(1 for call in slack.calls if call.status == 429)
            acks = {id(t): acknowledged_s(slack, t) for t in run.turns}
            logs = {r.n: [str(line.get("message")) for line in r.lines()] for r in replicas}
            outcomes = collections.Counter(
                m.rsplit(" ", 1)[1] for lines in logs.values() for m in lines if " -> turn " in m)
    asked = len(run.turns)
    threads = {(t.channel, t.thread_ts): sum(1 for u in run.turns if (u.channel, u.thread_ts) == (t.channel, t.thread_ts))
               for t in run.turns}
    answered = sum(min(counts[k], n) for k, n in threads.items())
    duplicated = sum(max(0, counts[k] - n) for k, n in threads.items())
    # Where each question of a thread short of answers went: the replicas whose log says it arrived.
    lost_events = [f"{t.event_id}: " + (",".join(f"replica {n}" for n, lines in logs.items()
                                                 if any(f"received app_mention {t.event_id} " in m for m in lines))
                                        or "received by no replica")
                   for t in run.turns if counts[(t.channel, t.thread_ts)] < threads[(t.channel, t.thread_ts)]]
    first = [t.first_text_s * 1000 for t in run.turns if t.first_text_s is not None]
    final = [t.final_s * 1000 for t in run.turns if t.final_s is not None]

    def ack_ms(team: str | None = None) -> list[float]:
        return [acks[id(t)] * 1000 for t in run.turns if acks[id(t)] is not None and team in (None, t.team)]

    quiet = ack_ms(QUIET_TEAM) if name == "two-workspaces" else []
    return {"run": name, "replicas": args.replicas, "asked": asked, "delivered": answered, "lost": asked - answered,
            "duplicated": duplicated,
            "error_outcomes": sum(n for outcome, n in outcomes.items() if outcome not in GOOD_OUTCOMES),
            "ack_p50_ms": pct(ack_ms(TEAM), 0.5), "ack_p95_ms": pct(ack_ms(TEAM), 0.95),
            **({"quiet_asked": sum(1 for t in run.turns if t.team == QUIET_TEAM), "quiet_ack_p50_ms": pct(quiet, 0.5),
                "quiet_ack_p95_ms": pct(quiet, 0.95)} if quiet else {}),
            "first_text_p50_ms": pct(first, 0.5), "first_text_p95_ms": pct(first, 0.95),
            "final_p50_ms": pct(final, 0.5), "final_p95_ms": pct(final, 0.95), "slack_429s": slack_429s,
            "model_429s": model_429s, "outcomes": " ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
            "rss_mb": "/".join(f"{r:.0f}" if r else "–" for r in rss),
            "faults": "; ".join(run.faults) or "none", "lost_events": "; ".join(lost_events) or "none"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=60)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds over which conversations start")
    parser.add_argument("--turns", type=int, default=2, help="questions per conversation")
    parser.add_argument("--channels", type=int, default=10)
    parser.add_argument("--retry-s", type=float, default=2.0, help="Slack's redelivery delay (1 min in Slack)")
    parser.add_argument("--lease-s", type=float, default=4.0, help="slack.claim_lease_s of the replicas")
    parser.add_argument("--answer-timeout", type=float, default=90.0)
    parser.add_argument("--runs", nargs="+", default=["steady", "faults"], choices=["steady", "faults", "two-workspaces"])
    parser.add_argument("--quiet-per-minute", type=float, default=5.0,
                        help="two-workspaces: questions a minute in the quiet workspace")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep the replicas' logs and data in DIR")
    args = parser.parse_args()
    if not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")):
        raise SystemExit("bench.load needs REDIS_URL and WEAVIATE_URL (make bench starts them)")
    random.seed(19)
    rows = []
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            if args.keep.exists() and any(args.keep.iterdir()):
                # Checked before the replicas start: a run's logs must not mix with an earlier run's.
                raise SystemExit(f"--keep {args.keep}: not empty (an earlier run's logs?); give a new or empty directory")
            args.keep.mkdir(parents=True, exist_ok=True)
        tmp = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kbbot-load-")))
        for name in args.runs:
            rows.append(asyncio.run(one_run(name, name == "faults", args, tmp)))
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
