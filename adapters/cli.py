"""The ``kbbot`` command: index, refresh, status, chat, ask, serve, eval."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from adapters.answer_eval import run_answer_eval
from adapters.console.platform import ConsoleReply, console_inquiry
from adapters.platforms import load_settings
from adapters.workers import Worker, supervise, worker_count
from bot.knowledge.insights.report import format_report, report_of
from bot.knowledge.refresh import RefreshBusy, UnknownSource
from bot.knowledge.status import format_status
from bot.logs import log_format, setup_logging
from bot.runtime import Generators, Runtime, build_runtime, make_store, status_of
from bot.settings import Settings, SettingsError, parse_interval
from bot.types import Answer
from pipelines.components.extractive import ExtractiveAnswerer
from pipelines.components.turn import TurnLedger
from pipelines.errors import ErrorKind, ServiceUnavailable, diagnose
from pipelines.evaluation import (
    corpus_documents,
    corpus_folder,
    evaluate,
    evaluate_abstention,
    index_corpus,
    load_queries,
)
from pipelines.redact import scrub
from pipelines.sources.folder import FolderSource
from pipelines.topics import Topics


class UserError(Exception):
    """A problem the person at the terminal can fix; printed as one line, exit status 2."""


#: What to do instead of changing the embedded store beside ``kbbot serve``.
THROUGH_THE_SERVER = (
    "Refresh through the server instead: `/kbbot refresh [SOURCE]` in Slack, `/refresh [SOURCE]` in Telegram "
    "(admins), or \"refresh now\" on the admin page (/admin/sources). A changed acl: in the settings file is read "
    "when kbbot serve starts: stop it, run this command, then start it again. With Weaviate (WEAVIATE_URL) "
    "both may run at once.")


@contextlib.contextmanager
def embedded_store_held(settings: Settings, command: str) -> Iterator[None]:
    """Keeps ``kbbot refresh`` / ``index`` from changing the embedded store beside a live ``kbbot serve``.

    The server keeps the store in memory: what another process saved would go unseen by it (a withdrawn
    grant still in force), and its own next refresh would save its old copy over it. Having the server
    read what others saved would still need a lock between the writers; refusing needs only the lock,
    and the kernel drops a process's lock when it dies, so none is left behind. ``serve`` holds it shared
    for its life, a change exclusively for its run; each is refused at once while the other holds it.
    Taken before the store is read, so what a command reads is what it changes. Weaviate is shared by
    every process: nothing to hold."""
    if settings.store_kind == "weaviate":
        yield
        return
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = settings.data_dir / "store"
    with open(settings.data_dir / "store.lock", "a") as lock:
        try:
            fcntl.flock(lock, (fcntl.LOCK_SH if command == "serve" else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            if command == "serve":
                raise UserError(f"kbbot refresh or index is changing the embedded store in {store}; start kbbot "
                                "serve once it has finished") from None
            try:  # a shared lock is still free only to servers: one of them holds it, not a refresh
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"another kbbot refresh or index is changing the embedded store in {store}; "
                                "run this once it has finished") from None
            raise UserError(f"kbbot serve is running on the embedded store in {store}; nothing was changed: "
                            "the server keeps the store in memory, so it would not see what kbbot " + command +
                            f" changed, and its next refresh would undo it. {THROUGH_THE_SERVER}") from None
        yield


def tqdm_progress(desc: str, unit: str | None = None):
    def wrap(items: Iterable[Any], total: int) -> Iterable[Any]:
        return tqdm(items, total=total, desc=desc, unit=unit or ("file" if desc == "indexing" else "batch"),
                    file=sys.stderr, leave=False, dynamic_ncols=True)

    return wrap


def _waiting() -> None:
    print("Another refresh is running; waiting for it to finish…", file=sys.stderr)


def run_index(runtime: Runtime, paths: list[str], space: str) -> int:
    """``kbbot index PATH…``: a refresh of those paths as an ad-hoc source."""
    async def work() -> Any:
        async with runtime.refreshing() as refresher:
            source = FolderSource(paths, suffixes=runtime.settings.indexing.extensions,
                                  max_file_mb=runtime.settings.indexing.max_file_mb)
            return await refresher.run_source(source, space=space, progress=tqdm_progress("indexing"),
                                              on_wait=_waiting)

    try:
        report = asyncio.run(work())
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    except RefreshBusy as exc:
        raise UserError(str(exc)) from exc
    for failure in report.failed:
        print(f"failed: {failure.source}: {failure.reason}", file=sys.stderr)
    if report.formats:
        print("by format: " + report.formats_summary())
    print(report.summary())  # the last line: scripts read it
    nothing_indexed = not (report.added or report.changed or report.unchanged)
    return 1 if report.failed and nothing_indexed else 0


def run_corpus_folder(runtime: Runtime, folder: Path) -> int:
    """An eval set's folder corpus refreshed into its own store; how many files were (re)indexed."""
    async def work() -> Any:
        async with runtime.refreshing() as refresher:
            source = FolderSource([str(folder)], suffixes=runtime.settings.indexing.extensions,
                                  max_file_mb=runtime.settings.indexing.max_file_mb)
            return await refresher.run_source(source, space="default", progress=tqdm_progress("indexing"),
                                              on_wait=_waiting)

    report = asyncio.run(work())
    for failure in report.failed:
        print(f"failed: {failure.source}: {failure.reason}", file=sys.stderr)
    return report.added + report.changed


def run_refresh(runtime: Runtime, names: list[str], *, trigger: str = "manual", out: Any = None,
                permissions_only: bool = False) -> int:
    """``kbbot refresh [SOURCE]``: the configured sources now, with a progress bar and a summary line each.

    Exit status 1 when a run failed as a whole (e.g. its folder is missing); documents that failed are
    listed but do not fail the command.
    """
    out = out or sys.stdout
    settings = runtime.settings
    if not settings.sources:
        raise UserError("no sources are configured (sources: in the settings file)")
    names = names or [s.name for s in settings.sources]

    async def work() -> list[Any]:
        records = []
        async with runtime.refreshing() as refresher:
            for name in names:
                refresher.source(name)  # unknown names fail before anything runs
            for name in names:
                records.append(await refresher.run(name, trigger=trigger, on_wait=_waiting,
                                                   progress=tqdm_progress(f"refreshing {name}", "doc"),
                                                   permissions_only=permissions_only))
        return records

    try:
        records = asyncio.run(work())
    except (UnknownSource, RefreshBusy) as exc:
        raise UserError(str(exc)) from exc
    for record in records:
        for failure in record.failed:
            print(f"failed: {failure['source']}: {failure['reason']}", file=sys.stderr)
        for line in record.held_lines():
            print(line, file=sys.stderr)
        print(record.summary(), file=out)
    return 0 if all(r.ok for r in records) else 1


def ensure_indexed(runtime: Runtime) -> None:
    """An empty store gets the configured sources first, so ``kbbot chat`` works on a fresh clone."""
    if runtime.store.count_chunks() > 0:
        return
    if not runtime.settings.sources:
        raise UserError("the knowledge base is empty and no sources are configured: run `kbbot index PATH` first")
    names = ", ".join(s.name for s in runtime.settings.sources)
    print(f"The knowledge base is empty; refreshing {names} first.", file=sys.stderr)
    run_refresh(runtime, [], trigger="startup", out=sys.stderr)


def run_status(settings: Settings, as_json: bool) -> int:
    """``kbbot status [--json]``: knowledge version, sources, services; exit 3 when a service is down."""
    status = asyncio.run(status_of(settings))
    print(json.dumps(status, ensure_ascii=False) if as_json else format_status(status))
    down = any(s["status"] == "down" for s in status["services"].values())
    return 3 if down else 0


class SilentReply:
    """For ``--json``: nothing is printed until the one JSON object."""

    async def start(self) -> None: ...

    async def push(self, delta: str) -> None: ...

    async def finish(self, answer: Answer) -> None: ...

    async def fail(self, message: str) -> None: ...


async def started(runtime: Runtime, work: Any) -> Any:
    """Runs ``work(runtime)`` between ``runtime.start()`` and ``runtime.close()`` in one event loop."""
    await runtime.start()
    try:
        return await work(runtime)
    finally:
        await runtime.close()


def run_ask(runtime: Runtime, question: str, thread: str | None, as_json: bool) -> int:
    ensure_indexed(runtime)
    inquiry = console_inquiry(question, thread or f"ask-{uuid.uuid4().hex[:12]}")
    reply = SilentReply() if as_json else ConsoleReply()
    answer = asyncio.run(started(runtime, lambda rt: rt.answerer.answer(inquiry, reply)))
    if as_json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False))
    return 0 if answer.outcome.value != "error" else 1


def run_chat(runtime: Runtime, thread: str | None) -> int:
    ensure_indexed(runtime)
    thread = thread or f"chat-{uuid.uuid4().hex[:12]}"
    generator = runtime.settings.generator_kind
    print(f"kbbot — {runtime.store.count_chunks()} chunks, knowledge version {runtime.store.knowledge_version}, "
          f"generator: {generator}. Ask in English or Chinese; Ctrl-D to quit.")

    async def loop(rt: Runtime) -> None:
        while True:
            try:
                line = await asyncio.to_thread(input, "\nyou> ")
            except EOFError:
                print()
                return
            if line.strip() in {"/quit", "/exit"}:
                return
            if not line.strip():
                continue
            print("kbbot> ", end="", flush=True)
            await rt.answerer.answer(console_inquiry(line, thread), ConsoleReply())

    try:
        asyncio.run(started(runtime, loop))
    except KeyboardInterrupt:
        print()
    return 0


def run_report(runtime: Runtime, since: str, as_json: bool) -> int:
    """``kbbot report [--since 7d] [--json]``."""
    try:
        window_s = parse_interval(since)
    except ValueError as exc:
        raise UserError(f"--since: {exc}") from None
    if not runtime.settings.insights.enabled:
        raise UserError("turn records are off (insights.enabled: false in the settings file)")
    until = time.time()
    report = asyncio.run(started(runtime, lambda rt: report_of(rt, since=until - window_s, until=until)))
    print(json.dumps(report, ensure_ascii=False) if as_json else format_report(report))
    return 0


def eval_abstention(settings: Settings, runtime: Runtime, mode: str, answerable: list[Any],
                    unanswerable: list[Any]) -> dict[str, Any]:
    """Whole turns over the eval store, extractive (no model cost, thresholds decide), no topic scope."""
    r, a = settings.retrieval, settings.answering
    extractive = Generators(ExtractiveAnswerer(), None, settings.prompt.budget_chars, a.turn_timeout_s)
    pipeline = runtime.query_pipeline(extractive, Topics(), clarify=False, mode=mode)
    result = evaluate_abstention(pipeline, answerable, unanswerable, ledger=lambda: TurnLedger(retries_left=0))
    return {"min_similarity": r.min_similarity, "off_topic_similarity": a.off_topic_similarity,
            "off_topic_similarity_zh": a.off_topic_similarity_zh, **result}


def run_eval(settings: Settings, dataset: str, k: int, mode: str, as_json: bool, unanswerable: bool = False,
             per_query: str | None = None, answers: bool = False, limit: int | None = None,
             turns: str | None = None) -> int:
    try:
        return _run_eval(settings, dataset, k, mode, as_json, unanswerable, per_query, answers, limit, turns)
    except Exception as exc:
        if diagnose(exc).kind is not ErrorKind.STORE:
            raise
        # A store error is the user's to fix (a server down, a name it refuses): one line, no trace.
        detail = scrub(" ".join(str(exc).split()), settings.store.weaviate_url or "")[:500]
        raise ServiceUnavailable(f"the document store failed: {detail}") from exc


def _run_eval(settings: Settings, dataset: str, k: int, mode: str, as_json: bool, unanswerable: bool,
              per_query: str | None, answers: bool, limit: int | None, turns: str | None) -> int:
    path = Path(dataset)
    if not path.is_dir():
        raise UserError(f"no dataset folder at {dataset}")
    try:
        folder = corpus_folder(path)
        docs = corpus_documents(path) if folder is None else []
        queries = load_queries(path)
        refusals = load_queries(path, "queries_unanswerable.jsonl") if unanswerable else []
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from exc
    name = path.resolve().name
    runtime = build_runtime(settings, directory_name=f"eval/{name}", collection=f"Eval_{name}")
    store = runtime.store
    if folder is not None:  # files, read as `kbbot index` reads them (unchanged ones are skipped)
        indexed = run_corpus_folder(runtime, folder)
    else:
        indexed = index_corpus(store, runtime.indexing_pipeline(from_documents=True), docs,
                               progress=tqdm_progress("embedding corpus"))
    if indexed:
        print(f"indexed {indexed} passages of {name}", file=sys.stderr)

    def retrieval(m: str) -> Any:
        return runtime.retrieval_pipeline(mode=m, candidates=max(settings.retrieval.candidates, k * 3))

    try:
        if answers:
            result = {"dataset": name, **run_answer_eval(settings, runtime, path, limit=limit, turns_path=turns)}
        elif per_query:
            result = {"dataset": name, **eval_per_query(retrieval, queries, docs, mode, k, Path(per_query))}
        else:
            result = {"dataset": name, **evaluate(retrieval(mode), queries, mode=mode, k=k)}
        if unanswerable:
            result["abstention"] = eval_abstention(settings, runtime, mode, queries, refusals)
    finally:
        store.close()
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        for key, value in result.items():
            print(f"{key:>8}: {value}")
    return 0


def eval_per_query(retrieval: Any, queries: list[Any], docs: list[Any], mode: str, k: int,
                   path: Path) -> dict[str, Any]:
    """Every mode over the same store; one JSON line per question with each mode's ranks and miss
    cause (``pipelines.evaluation.miss_cause``); the summary of ``mode`` with its causes counted."""
    titles = {d.meta["doc_id"]: d.meta["title"] for d in docs}
    summaries: dict[str, Any] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for m in ("bm25", "vector", "hybrid"):
        records[m] = []
        summaries[m] = evaluate(retrieval(m), queries, mode=m, k=k, titles=titles, per_query=records[m])
    with path.open("w", encoding="utf-8") as fh:
        for rows in zip(*records.values()):
            first = rows[0]
            line = {"id": first["id"], "text": first["text"], "gold_ids": first["gold_ids"]}
            for row in rows:
                line[row["mode"]] = {key: row[key] for key in ("section_rank", "chunk_rank", "candidate_rank",
                                                               "top", "cause")}
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    causes: dict[str, int] = {}
    for row in records[mode]:
        causes[row["cause"]] = causes.get(row["cause"], 0) + 1
    return {**summaries[mode], "causes": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
            "modes": {m: {key: s[key] for key in ("hit@1", "hit@5", f"mrr@{k}")} for m, s in summaries.items()},
            "per_query": str(path)}


def run_reindex(settings: Settings) -> int:
    """``kbbot reindex``: rebuilds the keyword index of the configured store from its stored chunks."""
    store = make_store(settings, allow_outdated=True)
    try:
        reindex = getattr(store, "reindex_keywords", None)
        if reindex is None:  # the embedded store analyses its chunks when it loads them
            print("nothing to do: the embedded store builds its keyword index when it opens")
            return 0
        bar = tqdm_progress("reindexing", unit="chunk")
        total = store.count_chunks()
        with bar(iter(()), total) as progress:
            done = reindex(progress=progress.update)
        print(f"reindexed the keywords of {done} chunks in {settings.store.collection}")
        return 0
    finally:
        store.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbbot", description="Answers questions from a knowledge base.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO) to stderr")
    p.add_argument("--config", help="settings file (default: $KBBOT_CONFIG or config/kbbot.yaml)")
    p.add_argument("--log-format", choices=["json", "text"],
                   help="log lines as JSON objects or text (default: $KBBOT_LOG_FORMAT, else json for serve, "
                        "text otherwise)")
    sub = p.add_subparsers(dest="command", required=True)

    ix = sub.add_parser("index", help="refresh files and folders now as an ad-hoc source "
                                      "(no PATH: the configured sources, like refresh)")
    ix.add_argument("paths", nargs="*")
    ix.add_argument("--space", default="default", help="knowledge space of these documents")

    rf = sub.add_parser("refresh", help="refresh the configured sources now (all, or the one named)")
    rf.add_argument("source", nargs="?", help="a source name from the settings file")
    rf.add_argument("--permissions-only", action="store_true",
                    help="only who may read each indexed document (Confluence restrictions and space permissions, "
                         "the acl: of folders and URLs): no content read, nothing embedded")

    sub.add_parser("reindex", help="rebuild the keyword (BM25) index from the stored chunks, after an upgrade "
                                   "that changed the keyword analysis (no re-embedding)")

    st = sub.add_parser("status", help="knowledge version, each source's documents, last and next run, services")
    st.add_argument("--json", action="store_true", help="print exactly one JSON object")

    chat = sub.add_parser("chat", help="talk to kbbot in the terminal")
    chat.add_argument("--thread", help="continue a named conversation")

    ask = sub.add_parser("ask", help="ask one question")
    ask.add_argument("question")
    ask.add_argument("--thread", help="conversation key; turns persist between invocations")
    ask.add_argument("--json", action="store_true", help="print exactly one JSON object")

    rp = sub.add_parser("report", help="turns by outcome, answer and feedback rates, latency, unanswered questions "
                                       "grouped by meaning, 👎 answers, sources needing attention")
    rp.add_argument("--since", default="7d", help="how far back: 24h, 7d, 30d … (default 7d)")
    rp.add_argument("--json", action="store_true", help="print exactly one JSON object")

    srv = sub.add_parser("serve", help="run the chat adapters and HTTP endpoints (KBBOT_PORT, default 3000)")
    srv.add_argument("--port", type=int, help="HTTP port (default: $KBBOT_PORT or 3000)")
    srv.add_argument("--workers", type=int, help="serving processes behind the port (default: $KBBOT_WORKERS, else "
                                                 "the usable cores with Redis and Weaviate, else 1)")

    ev = sub.add_parser("eval", help="score retrieval on a dataset folder (corpus.jsonl, queries.jsonl)")
    ev.add_argument("dataset")
    ev.add_argument("--k", type=int, default=10)
    ev.add_argument("--mode", choices=["bm25", "vector", "hybrid"], default="hybrid")
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--per-query", metavar="FILE",
                    help="run bm25, vector and hybrid; write one JSON line per question (gold ranks in sections "
                         "and chunks, miss cause) to FILE")
    ev.add_argument("--unanswerable", action="store_true",
                    help="also run whole turns (extractive) and score abstention on queries_unanswerable.jsonl")
    ev.add_argument("--answers", action="store_true",
                    help="run whole turns with the configured generator and score the answers "
                         "(citations, grounding, reference overlap, language, abstention, seconds per turn)")
    ev.add_argument("--limit", type=int, help="with --answers: the first N questions of each set")
    ev.add_argument("--turns", help="with --answers: append each turn as a JSON line to this file")
    return p


def run_store_command(settings: Settings, args: argparse.Namespace) -> int:
    """``index``, ``refresh`` and ``serve``: the commands that change the knowledge store."""
    runtime = build_runtime(settings)
    if args.command == "serve":
        from adapters.server import run_serve  # Slack and Telegram SDKs: heavy, and only `serve` needs them

        if Worker.from_env().first:  # the others serve what worker 0 indexed
            ensure_indexed(runtime)
        return run_serve(runtime, port=args.port)
    try:
        if args.command == "index" and args.paths:
            return run_index(runtime, args.paths, args.space)
        return run_refresh(runtime, [args.source] if getattr(args, "source", None) else [],
                           permissions_only=getattr(args, "permissions_only", False))
    finally:
        runtime.store.close()


def worker_argv(args: argparse.Namespace) -> list[str]:
    """What each worker of ``serve --workers`` runs: this ``serve`` with the same options (the port comes as
    ``KBBOT_PORT``)."""
    return [*(["--verbose"] if args.verbose else []), *(["--config", args.config] if args.config else []),
            *(["--log-format", args.log_format] if args.log_format else []), "serve"]


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    verbose = args.verbose or args.command == "serve"
    try:
        fmt = log_format(args.log_format, default="json" if args.command == "serve" else "text")
    except ValueError as exc:
        print(f"kbbot: {exc}", file=sys.stderr)
        return 2
    setup_logging(fmt, logging.INFO if verbose else logging.WARNING)
    try:
        settings = load_settings(args.config)
        if args.command == "eval":
            return run_eval(settings, args.dataset, args.k, args.mode, args.json, args.unanswerable, args.per_query,
                            args.answers, args.limit, args.turns)
        if args.command == "reindex":
            return run_reindex(settings)
        if args.command == "status":
            return run_status(settings, args.json)
        if args.command == "serve" and Worker.from_env().alone:
            count = worker_count(args.workers, settings)
            if count > 1:
                from adapters.server import port_from

                return supervise(worker_argv(args), count, args.port or port_from(os.environ))
        if args.command in ("index", "refresh", "serve"):
            with embedded_store_held(settings, args.command):
                return run_store_command(settings, args)
        runtime = build_runtime(settings)
        if args.command == "ask":
            return run_ask(runtime, args.question, args.thread, args.json)
        if args.command == "chat":
            return run_chat(runtime, args.thread)
        if args.command == "report":
            return run_report(runtime, args.since, args.json)
    except (SettingsError, UserError) as exc:
        print(f"kbbot: {exc}", file=sys.stderr)
        return 2
    except ServiceUnavailable as exc:
        print(f"kbbot: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
