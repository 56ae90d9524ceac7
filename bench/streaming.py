"""Streaming N concurrent answers through the real adapters to the fake Slack, Telegram and Teams servers,
against the naive strategy of editing after every N new characters (Slack and Telegram), in the same run.

    uv run python -m bench.streaming [--conversations 1 10 50] [--channels many one] [--naive-chars 40] [--redis]
                                     [--helper-delay 0.5] [--json]

Each conversation asks one question at the same moment; the fake model (Anthropic's wire format) streams a
~600-character answer at ``--tokens-per-second`` after ``--first-token-delay``, from a process of its own
(``bench.model_process``: a hosted model's work is not kbbot's; ``--model-in thread`` serves it from a thread
of this process, as this benchmark did before 2026-12-03, where its HTTP and SSE work took kbbot's GIL). The fake platforms enforce
rate limits with 429 + Retry-After: Slack per workspace and method, at Slack's documented tiers
(``tests.fakes.slack_server.DOCUMENTED_TIERS``: chat.update, reactions.add and assistant.threads.setStatus
50/min as Tier 3, chat.appendStream 100/min as Tier 4, chat.startStream, chat.stopStream and reactions.remove
20/min as Tier 2) and chat.postMessage 5 per 5 s per channel; Telegram one message or edit per second per chat
and 30 calls per second per bot; Teams its documented limits per conversation (7/1 s, 8/2 s, 60/30 s,
1,800/h) and one stream request a second, each conversation a personal chat (streamed). On Slack the
conversations are each in a channel of their own (``many``) or
all in one busy channel (``one``), where chat.postMessage's per-channel limit is shared. Per platform, layout,
strategy and N it reports, in ms: the first visible acknowledgement after the question (p50/p95; Slack: a
status, a reaction or text; Telegram: "typing", a reaction or text, from the moment the update is queued for
getUpdates), the question to its answer's first model token and to its first visible text (p50/p95: what
the asker waits, every queue in front of the model included), first visible text minus the model's first
token (p50/p95), final text visible minus the model's last token (p50/p95), on Slack the 👀 reactions taken
back and when, after the answer's final text (p95, max; negative: before it), API calls per answer, 429s
received, and answers lost (the turn did not end with the model's answer shown in full, e.g. a naive answer
still editing when the ``--turn-timeout`` budget ran out).

With ``--redis`` the rate budgets are the ones replicas share in Redis (``REDIS_URL``: one Lua script per
token), else this process's; the run also times one token of each (``bucket_cost``).

``kbbot`` is the adapters' own Reply (the shared ``StreamWriter`` and rate budget; Slack in its
configured ``native`` stream mode, where answers that cannot start a stream at once post and edit;
Telegram in ``edit`` mode, the mode of groups); ``naive`` replaces the Reply with one that posts,
then edits after every N new characters, awaiting each call, with slack-sdk's one 429 retry / one
Retry-After wait on Telegram.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pipelines  # noqa: F401  (telemetry off)
from bench.report import emit_laid_out, percentile, table

REPO = Path(__file__).resolve().parent.parent
ANSWER = " ".join(
    f"Step {i}: check the bearing seal, wipe the grease nipple and regrease with 15 g of lithium-complex grease [1]."
    for i in range(1, 7))
QUESTION = "How often should the bearings be greased"

#: The one channel every mention of the ``one`` layout is asked in.
BUSY_CHANNEL = "C0BUSY"


def pct(values: list[float], q: float) -> float | None:
    return percentile(values, q, ndigits=1)


# --- Telegram's limits on top of the fake --------------------------------------------------------------
def limited_telegram() -> Any:
    from tests.fakes.telegram_server import FakeTelegram

    class LimitedTelegram(FakeTelegram):
        """One message/edit per second per chat, 30 calls per second per bot (chat actions and reactions
        included), like Telegram's flood control."""

        WRITES = ("sendMessage", "editMessageText", "sendMessageDraft")
        #: Calls that post nothing but count against the bot's 30 a second all the same.
        COURTESIES = ("sendChatAction", "setMessageReaction")

        def __init__(self) -> None:
            super().__init__()
            self._per_chat: dict[str, float] = {}
            self._global: deque[float] = deque()
            self._loop: asyncio.AbstractEventLoop | None = None

        async def start(self) -> None:
            self._loop = asyncio.get_running_loop()
            await super().start()

        def push_from_outside(self, update: dict[str, Any]) -> None:
            """Queue an update from the measured loop's thread (the fake serves from its own)."""
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self.push, update)

        async def _handle(self, request):  # noqa: ANN001, ANN202
            method = request.match_info["method"]
            if method in self.WRITES + self.COURTESIES:
                args = await self._args(request)
                chat = str(args.get("chat_id"))
                now = time.monotonic()
                while self._global and self._global[0] <= now - 1:
                    self._global.popleft()
                per_chat = method in self.WRITES and now - self._per_chat.get(chat, -10) < 1.0
                if per_chat or len(self._global) >= 30:
                    from tests.fakes.telegram_server import Call

                    call = Call(method=method, args=args, at=now)
                    self.calls.append(call)
                    return self._error(call, 429, "Too Many Requests: retry after 1", {"retry_after": 1})
                if method in self.WRITES:
                    self._per_chat[chat] = now
                self._global.append(now)
            return await super()._handle(request)

    return LimitedTelegram()


# --- the naive strategy -----------------------------------------------------------------------------
class NaiveReply:
    """Post the first text, then edit after every ``every`` new characters, awaiting each call."""

    def __init__(self, every: int):
        self.every = every
        self.text, self.sent, self.lost = "", 0, False

    async def start(self) -> None: ...

    async def _show(self, text: str) -> None:
        raise NotImplementedError

    async def push(self, delta: str) -> None:
        self.text += delta
        if len(self.text) - self.sent >= self.every:
            self.sent = len(self.text)
            with contextlib.suppress(Exception):
                await self._show(self.text)

    async def finish(self, answer: Any) -> None:
        try:
            await self._show(answer.text)
        except Exception:  # noqa: BLE001
            self.lost = True

    async def fail(self, message: str) -> None:
        with contextlib.suppress(Exception):
            await self._show(message)


class NaiveSlackReply(NaiveReply):
    def __init__(self, client: Any, channel: str, thread_ts: str, every: int):
        super().__init__(every)
        self.client, self.channel, self.thread_ts, self.ts = client, channel, thread_ts, None

    async def _show(self, text: str) -> None:
        if self.ts is None:
            resp = await self.client.chat_postMessage(channel=self.channel, thread_ts=self.thread_ts, text=text)
            self.ts = resp["ts"]
        else:
            await self.client.chat_update(channel=self.channel, ts=self.ts, text=text)


class NaiveTelegramReply(NaiveReply):
    def __init__(self, bot: Any, chat_id: int, every: int):
        super().__init__(every)
        self.bot, self.chat_id, self.message_id = bot, chat_id, None

    async def _show(self, text: str) -> None:
        if self.message_id is None:
            self.message_id = (await self.bot.send_message(self.chat_id, text)).message_id
        else:
            await self.bot.edit_message_text(text, chat_id=self.chat_id, message_id=self.message_id)

    async def finish(self, answer: Any) -> None:
        """One Retry-After wait for the final text (aiogram has no retry of its own)."""
        from aiogram.exceptions import TelegramRetryAfter

        for attempt in range(2):
            try:
                await self._show(answer.text)
                return
            except TelegramRetryAfter as exc:
                if attempt == 0:
                    await asyncio.sleep(exc.retry_after)
            except Exception:  # noqa: BLE001
                break
        self.lost = True


class NaiveAnswerer:
    """The real answerer with the adapter's Reply swapped for a naive one."""

    def __init__(self, real: Any, make_reply: Any):
        self.real, self.make_reply = real, make_reply
        self.history = real.history
        self.replies: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def answer(self, inquiry: Any, reply: Any) -> Any:
        naive = self.make_reply(inquiry)
        self.replies.append(naive)
        return await self.real.answer(inquiry, naive)


# --- one run ---------------------------------------------------------------------------------------
class _ThreadModel:
    """The fake model served from a thread of this process (``--model-in thread``: how this benchmark
    ran before 2026-12-03), with ``ModelProcess``'s interface."""

    def __init__(self, tokens_per_second: float, first_token_delay: float, helper_delay: float = 0.0):
        from bench.model_process import scripted_router
        from tests.fakes.anthropic_server import FakeAnthropic

        router = scripted_router(ANSWER, tokens_per_second, first_token_delay, helper_delay)
        self._serving = FakeAnthropic(router).run_in_thread()
        self.base_url = ""

    def __enter__(self) -> _ThreadModel:
        self.fake = self._serving.__enter__()
        self.base_url = self.fake.base_url
        return self

    def __exit__(self, *exc: Any) -> None:
        self._serving.__exit__(*exc)

    def requests(self) -> list[Any]:
        return list(self.fake.requests)

    def clear(self) -> None:
        self.fake.requests.clear()


def fake_model(model_in: str, tokens_per_second: float, first_token_delay: float, helper_delay: float = 0.0) -> Any:
    """The fake model in a process of its own (a hosted model costs kbbot's process nothing), or in a
    thread of this one."""
    if model_in == "thread":
        return _ThreadModel(tokens_per_second, first_token_delay, helper_delay)
    from bench.model_process import ModelProcess

    return ModelProcess(ANSWER, tokens_per_second=tokens_per_second, first_token_delay=first_token_delay,
                        helper_delay=helper_delay)


def model_tokens(model: Any) -> dict[str, tuple[float, float]]:
    """question -> (first token at, last token at) of its answer request (monotonic seconds)."""
    out = {}
    for request in model.requests():
        text = request.last_user_text
        if request.first_token_at is None or "Question:" not in text:
            continue
        question = text.rsplit("Question:", 1)[1].strip().splitlines()[0].strip()  # the prompt goes on after it
        out[question] = (request.first_token_at, request.last_token_at or request.first_token_at)
    return out


def thread_calls(fake: Any, channel: str, thread_ts: str) -> list[Any]:
    """The successful calls that changed what one thread shows: its messages, status and reactions."""
    messages = {m.ts for m in fake.messages.values() if m.channel == channel and m.thread_ts == thread_ts}
    found = []
    for call in fake.calls:
        args = call.args
        if not call.ok:
            continue
        if call.method == "assistant.threads.setStatus":
            hit = (args.get("channel_id"), args.get("thread_ts")) == (channel, thread_ts)
        elif call.method.startswith("reactions."):
            hit = (args.get("channel"), args.get("timestamp")) == (channel, thread_ts)
        else:
            hit = args.get("channel") == channel and (args.get("thread_ts") == thread_ts or args.get("ts") in messages)
        if hit:
            found.append(call)
    return found


def acknowledged_at(calls: list[Any]) -> float | None:
    """When the asker first saw kbbot react: a status set, a reaction added, or the first text."""
    seen = [c.at for c in calls if (c.method == "assistant.threads.setStatus" and c.args.get("status"))
            or c.method == "reactions.add" or c.text_sent]
    return min(seen, default=None)


async def run_slack(runtime: Any, model: Any, n: int, strategy: str, every: int,
                    layout: str = "many", redis: Any = None) -> dict[str, Any]:
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
    from slack_sdk.web.async_client import AsyncWebClient

    from tests.fakes.slack_server import FakeSlack
    from tests.test_slack import slack_app

    # The fakes serve from threads of their own: their work is not charged to the loop being measured.
    with FakeSlack(team_id="T0KBBOT", bot_user_id="UKBBOT", latency_s=0.01).run_in_thread() as fake:
        fake.documented_tiers()
        answerer = runtime.answerer
        naive = None
        if strategy == "naive":
            client = AsyncWebClient(token=fake.token, base_url=fake.base_url.rstrip("/") + "/")
            client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=1))

            def make(inquiry: Any) -> Any:
                _, _, channel, thread_ts = inquiry.thread_key.split(":", 3)
                return NaiveSlackReply(client, channel, thread_ts, every)

            naive = NaiveAnswerer(answerer, make)
        from bot.state import MemoryIdempotency

        asked: dict[str, float] = {}
        from adapters.slack.reply import make_rates
        from adapters.slack.settings import SlackSettings

        rates = make_rates(SlackSettings(), redis, prefix=fresh_prefix())
        async with slack_app(runtime, fake, idempotency=MemoryIdempotency(), answerer=naive, stream_interval_s=1.0,
                             edit_interval_s=1.2, rates=rates) as slack:
            events = [slack.mention(f"{QUESTION} (ticket {i})?", user=f"U{i:04d}",
                                    channel=BUSY_CHANNEL if layout == "one" else f"C{i:04d}")
                      for i in range(n)]

            async def ask(event: dict[str, Any]) -> None:
                asked[event["ts"]] = time.monotonic()
                await slack.send(event, settle=False)

            await asyncio.gather(*(ask(e) for e in events))
            await slack.adapter.settle(0.2)
        tally = Tally(model_tokens(model))
        for i, event in enumerate(events):
            channel, thread_ts = event["channel"], event["ts"]
            calls = thread_calls(fake, channel, thread_ts)
            turn = next((t for t in slack.turns if t.inquiry.thread_key.endswith(f":{channel}:{thread_ts}")), None)
            messages = fake.thread(channel, thread_ts)
            expected = turn.answer.text if answered(turn) else None
            shown = "\n".join(m.body for m in messages)
            ack = acknowledged_at(calls)
            texts = [c.at for c in calls if c.text_sent and c.method.startswith("chat.")]
            removed = [c.at for c in calls if c.method == "reactions.remove"]
            if removed and texts:
                tally.unreact.append((max(removed) - max(texts)) * 1000)
            # An answer may span messages (its first sentences posted alone when the workspace's tiers are
            # spent): shown in full when its words are there in order, whatever the breaks between them.
            tally.add(i, [c.at for c in calls if c.text_sent and c.method.startswith("chat.")],
                      expected is not None and "".join(expected.split()) in "".join(shown.split())
                      and not any(m.streaming for m in messages),
                      acknowledged_after=None if ack is None else ack - asked[thread_ts], asked_at=asked[thread_ts])
        answer_calls = [c for c in fake.calls if c.method.startswith("chat.")]
        return tally.row("slack", strategy, n, len(answer_calls), fake.calls, layout=layout)


async def run_telegram(runtime: Any, model: Any, n: int, strategy: str, every: int,
                       redis: Any = None) -> dict[str, Any]:
    from adapters.telegram.reply import make_rates
    from adapters.telegram.settings import TelegramSettings
    from tests.fakes.telegram_server import message_update
    from tests.test_telegram import telegram_bot

    # Served from a thread of its own, as the fake Slack is: its work is not charged to the loop measured.
    with limited_telegram().run_in_thread() as fake:
        async with contextlib.AsyncExitStack() as stack:
            naive = None
            if strategy == "naive":
                holder: dict[str, Any] = {}

                def make(inquiry: Any) -> Any:
                    return NaiveTelegramReply(holder["bot"], int(inquiry.channel), every)

                naive = NaiveAnswerer(runtime.answerer, make)
            from bot.state import MemoryIdempotency

            rates = make_rates(TelegramSettings(token=fake.token), redis, prefix=fresh_prefix())
            tg = await stack.enter_async_context(telegram_bot(runtime, fake, idempotency=MemoryIdempotency(),
                                                              answerer=naive, rates=rates, stream_mode="edit",
                                                              edit_interval_s=1.0))
            if strategy == "naive":
                holder["bot"] = tg.adapter.bot
            chats = [8000 + i for i in range(n)]
            asked: dict[int, float] = {}
            for i, chat in enumerate(chats):
                asked[chat] = time.monotonic()
                fake.push_from_outside(message_update(f"{QUESTION} (ticket {i})?", chat_id=chat))
            deadline = time.monotonic() + 600
            while len(tg.turns) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await tg.adapter.settle(0.2)
    tally = Tally(model_tokens(model))
    for i, chat in enumerate(chats):
        turn = next((t for t in tg.turns if str(t.inquiry.channel) == str(chat)), None)
        shown = "".join("".join(m.text.split()) for m in fake.chat(chat))
        expected = turn.answer.text if answered(turn) else None
        tally_chat(tally, i, fake, chat, asked[chat], expected is not None and _contains_words(shown, expected))
    answer_calls = [c for c in fake.calls if c.method not in ("getUpdates", "getMe", "deleteWebhook")]
    return tally.row("telegram", strategy, n, len(answer_calls), fake.calls)


def tally_chat(tally: Tally, i: int, fake: Any, chat: int, asked_at: float, delivered: bool) -> None:
    """Telegram chat ``chat`` (conversation ``i``) into ``tally``: when its texts landed, and when the asker
    first saw kbbot react ("typing", a reaction or text)."""
    mine = [c for c in fake.calls if c.ok and str(c.args.get("chat_id")) == str(chat)]
    texts = [c.at for c in mine if c.method in ("sendMessage", "editMessageText", "sendMessageDraft")
             and c.args.get("text")]
    seen = [c.at for c in mine if c.method in ("sendChatAction", "setMessageReaction")] + texts
    tally.add(i, texts, delivered, acknowledged_after=min(seen) - asked_at if seen else None, asked_at=asked_at)


async def run_teams(runtime: Any, model: Any, n: int, strategy: str, every: int,
                    redis: Any = None) -> dict[str, Any]:
    """``n`` personal chats asking at once, each answer streamed with Teams' streaming protocol, as ``kbbot
    serve`` wires the platform (``tests.scenarios.platforms.serving``); the fake refuses (429) a stream
    request sooner than a second after the stream's last and any call past the documented per-conversation
    limits. Only the ``kbbot`` strategy: Teams has no naive baseline here."""
    from adapters.teams.text import neutralise
    from tests.fakes.teams import FakeTeams
    from tests.scenarios.platforms import TeamsDriver, serving

    fake = FakeTeams()
    with fake.run_in_thread():
        fake.enforce_documented_limits()
        fake.pace_streams(1.0)
        driver = TeamsDriver()
        driver.fake, driver.people = fake, {}
        users = [fake.add_user(f"User {i:04d}") for i in range(n)]
        activities = [fake.personal_message(f"{QUESTION} (ticket {i})?", user=u) for i, u in enumerate(users)]
        asked: dict[str, float] = {}
        async with serving(runtime, driver, stream_interval_s=1.5, edit_interval_s=1.5) as bot:
            if redis is not None:  # the replicas' shared budgets, each run's of its own
                from adapters.teams.reply import make_rates

                bot.adapter.rates = make_rates(runtime.settings.teams, redis, prefix=fresh_prefix())

            async def ask(activity: dict[str, Any]) -> None:
                asked[activity["conversation"]["id"]] = time.monotonic()
                status, _ = await fake.deliver(bot.url, activity, session=bot.session)
                assert status == 200, status

            await asyncio.gather(*(ask(a) for a in activities))
            deadline = time.monotonic() + 600
            while len(bot.turns) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await bot.settle()
            turns = list(bot.turns)
    tally = Tally(model_tokens(model))
    for i, activity in enumerate(activities):
        chat = activity["conversation"]["id"]
        posts = [c for c in fake.calls if c.ok and c.conversation == chat and c.method in ("POST", "PUT")]
        informative = [c.at for c in posts if "'informative'" in str(c.body)]
        texts = [c.at for c in posts if c.text and c.at not in informative]
        turn = next((t for t in turns if t.inquiry.channel == chat), None)
        expected = turn.answer.text if answered(turn) else None
        shown = "\n".join(m.text for m in fake.chat(chat) if m.from_bot and (m.stream is None or m.stream.done))
        tally.add(i, texts, expected is not None and neutralise(expected.strip()) in shown,
                  acknowledged_after=min(informative + texts) - asked[chat] if informative + texts else None,
                  asked_at=asked[chat])
    answer_calls = [c for c in fake.calls if "/v3/conversations" in c.path]
    return tally.row("teams", strategy, n, len(answer_calls), fake.calls)


def answered(turn: Any) -> bool:
    """The turn ended with the model's answer (not the turn budget's or an error's message)."""
    return bool(turn and turn.answer and turn.answer.outcome == "answered")


def _contains_words(shown: str, expected: str) -> bool:
    """The final text is shown (Telegram renders Markdown: compare without spaces and markup)."""
    import re

    strip = lambda s: re.sub(r"[\s*_`\[\]\\]", "", s)  # noqa: E731
    return strip(expected)[:200] in strip(shown) and strip(expected)[-60:] in strip(shown)


class Tally:
    """One run's per-conversation figures, against the model's token times of each question."""

    def __init__(self, tokens: dict[str, tuple[float, float]]):
        self.tokens = tokens
        self.first: list[float] = []
        self.final: list[float] = []
        self.ack: list[float] = []
        self.asked_to_first: list[float] = []
        self.first_token: list[float] = []
        #: Slack: when each 👀 was taken back, after its answer's final text (negative: before it).
        self.unreact: list[float] = []
        self.lost = 0

    def add(self, i: int, shown_at: list[float], delivered: bool, *, acknowledged_after: float | None = None,
            asked_at: float | None = None) -> None:
        """Conversation ``i``: when its text-carrying calls landed; whether its final text is shown in full;
        how long after the question the asker first saw kbbot react (status, reaction or text); when it
        was asked (``asked_at``: what the asker waits from, whatever held the turn back before the model)."""
        self.lost += not delivered
        if acknowledged_after is not None:
            self.ack.append(acknowledged_after * 1000)
        if asked_at is not None and shown_at:
            self.asked_to_first.append((min(shown_at) - asked_at) * 1000)
        token = self.tokens.get(f"{QUESTION} (ticket {i})?")
        if token and asked_at is not None:
            self.first_token.append((token[0] - asked_at) * 1000)
        if token and shown_at:
            self.first.append((min(shown_at) - token[0]) * 1000)
            self.final.append((max(shown_at) - token[1]) * 1000)

    def row(self, platform: str, strategy: str, n: int, calls: int, all_calls: list[Any],
            layout: str = "many") -> dict[str, Any]:
        return {"platform": platform, "strategy": strategy, "conversations": n, "channels": layout,
                "acknowledged_after_question_ms_p50": pct(self.ack, 0.5),
                "acknowledged_after_question_ms_p95": pct(self.ack, 0.95),
                "question_to_first_token_ms_p50": pct(self.first_token, 0.5),
                "question_to_first_token_ms_p95": pct(self.first_token, 0.95),
                "question_to_first_text_ms_p50": pct(self.asked_to_first, 0.5),
                "question_to_first_text_ms_p95": pct(self.asked_to_first, 0.95),
                "first_visible_minus_first_token_ms_p50": pct(self.first, 0.5),
                "first_visible_minus_first_token_ms_p95": pct(self.first, 0.95),
                "final_visible_minus_last_token_ms_p50": pct(self.final, 0.5),
                "final_visible_minus_last_token_ms_p95": pct(self.final, 0.95),
                "reactions_taken_back": len(self.unreact),
                "unreact_after_final_ms_p50": pct(self.unreact, 0.5),
                "unreact_after_final_ms_p95": pct(self.unreact, 0.95),
                "unreact_after_final_ms_max": pct(self.unreact, 1.0),
                "api_calls_per_answer": round(calls / max(n, 1), 1),
                "429s": sum(1 for c in all_calls if c.status == 429),
                "429s_by_method": dict(Counter(c.method for c in all_calls if c.status == 429)),
                "lost": self.lost}


def fresh_prefix() -> str:
    """Each run's buckets start full: a Redis prefix of its own."""
    import uuid

    return f"kbbot:bench:{uuid.uuid4().hex[:8]}:"


async def bucket_cost(redis: Any, n: int = 2000) -> list[dict[str, Any]]:
    """What one token costs the caller: ``PlatformRates.acquire`` of a bucket that always has one, in this
    process and in Redis (one Lua script per token), in µs."""
    from bot.delivery.buckets import RedisBuckets
    from bot.delivery.rates import PlatformRates, Rate

    rows = []
    stores = {"memory": None, **({"redis": RedisBuckets(redis, fresh_prefix())} if redis is not None else {})}
    for name, store in stores.items():
        rates = PlatformRates({"m": Rate(per_minute=1e9, burst=n + 1)}, store=store)
        started = time.perf_counter()
        # A burst of 64 at once opens the connections a long-running replica's pool holds: the first
        # burst of a cold pool pays for opening them (reported as cold_burst_ms), later ones do not.
        await asyncio.gather(*(rates.acquire("warm", "m") for _ in range(64)))
        cold = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        await asyncio.gather(*(rates.acquire("warm", "m") for _ in range(64)))
        warm = (time.perf_counter() - started) * 1000
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await rates.acquire("T", "m")
            times.append((time.perf_counter() - started) * 1e6)
        rows.append({"store": name, "acquires": n, "us_p50": pct(times, 0.5), "us_p95": pct(times, 0.95),
                     "cold_burst_of_64_ms": round(cold, 1), "warm_burst_of_64_ms": round(warm, 1)})
    return rows


async def run(conversations: list[int], every: int, tokens_per_second: float, first_token_delay: float,
              platforms: list[str], strategies: list[str] | None = None,
              turn_timeout_s: float = 60.0, layouts: list[str] | None = None, redis_url: str | None = None,
              model_in: str = "process", helper_delay: float = 0.0) -> dict[str, Any]:
    strategies = strategies or ["kbbot", "naive"]
    layouts = layouts or ["many"]
    from adapters.platforms import load_settings
    from bot.runtime import build_runtime
    data = Path(tempfile.mkdtemp(prefix="kbbot-bench-stream-"))
    rows = []
    with fake_model(model_in, tokens_per_second, first_token_delay, helper_delay) as fake:
        os.environ.update({"ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "sk-bench"})
        settings = load_settings(REPO / "config" / "kbbot.yaml",
                                 env={"KBBOT_DATA_DIR": str(data), "ANTHROPIC_API_KEY": "sk-bench"})
        settings.limits.per_user = settings.limits.per_channel = 0
        settings.approvals.enabled = False
        settings.generator.max_tokens = 4096
        settings.answering.turn_timeout_s = turn_timeout_s
        runtime = build_runtime(settings)
        runtime.indexer.index([REPO / "examples" / "kb"])
        await runtime.start()
        await runtime.warm_up()  # as ``kbbot serve`` does before it listens
        redis = None
        if redis_url:
            from bot.state.redis import connect_redis

            redis = await connect_redis(redis_url)
        try:
            cost = await bucket_cost(redis)
            for platform in platforms:
                # Telegram chats have no shared per-channel budget: only Slack has a one-channel case.
                for layout in layouts if platform == "slack" else ["many"]:
                    for n in conversations:
                        for strategy in strategies:
                            if platform == "teams" and strategy != "kbbot":
                                continue
                            fake.clear()
                            if platform == "slack":
                                row = await run_slack(runtime, fake, n, strategy, every, layout, redis)
                            elif platform == "teams":
                                row = await run_teams(runtime, fake, n, strategy, every, redis)
                            else:
                                row = await run_telegram(runtime, fake, n, strategy, every, redis)
                            row["budget"] = "redis" if redis is not None else "memory"
                            rows.append(row)
                            print(json.dumps(row), flush=True, file=sys.stderr)
        finally:
            if redis is not None:
                await redis.aclose()
            await runtime.close()
    return {"answer_chars": len(ANSWER), "tokens_per_second": tokens_per_second, "turn_timeout_s": turn_timeout_s,
            "first_token_delay_s": first_token_delay, "naive_every_chars": every, "rows": rows,
            "bucket_cost": cost, "model_in": model_in, "helper_delay_s": helper_delay}


def print_table(result: dict[str, Any]) -> None:
    print(f"answer {result['answer_chars']} chars at {result['tokens_per_second']:g} tokens/s, first token after "
          f"{result['first_token_delay_s']:g} s, helper calls answered after {result['helper_delay_s']:g} s; "
          f"naive edits every {result['naive_every_chars']} chars")
    columns = ["platform", "channels", "budget", "strategy", "conversations", "acknowledged_after_question_ms_p50",
               "acknowledged_after_question_ms_p95", "question_to_first_token_ms_p50", "question_to_first_token_ms_p95",
               "question_to_first_text_ms_p50", "question_to_first_text_ms_p95", "first_visible_minus_first_token_ms_p50",
               "first_visible_minus_first_token_ms_p95", "final_visible_minus_last_token_ms_p50",
               "final_visible_minus_last_token_ms_p95", "reactions_taken_back", "unreact_after_final_ms_p95",
               "unreact_after_final_ms_max", "api_calls_per_answer", "429s", "lost"]
    print(table(result["rows"], columns, ["platform", "channels", "budget", "strategy", "N", "ack p50", "ack p95",
                                          "q→token p50", "q→token p95", "q→text p50", "q→text p95",
                                          "first p50", "first p95", "final p50", "final p95", "👀 removed", "👀 after final p95",
                                          "👀 after final max", "calls/answer",
                                          "429s", "lost"]))
    print("\nOne token (PlatformRates.acquire of a bucket with tokens to spare), µs:")
    print(table(result["bucket_cost"], ["store", "acquires", "us_p50", "us_p95", "cold_burst_of_64_ms", "warm_burst_of_64_ms"],
                ["store", "acquires", "p50", "p95", "64 at once, cold pool (ms)", "64 at once, warm (ms)"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--platforms", nargs="+", default=["slack", "telegram", "teams"],
                        choices=["slack", "telegram", "teams"])
    parser.add_argument("--channels", nargs="+", default=["many", "one"], choices=["many", "one"],
                        help="Slack: each conversation in a channel of its own (many), or all in one channel")
    parser.add_argument("--strategies", nargs="+", default=["kbbot", "naive"], choices=["kbbot", "naive"])
    parser.add_argument("--naive-chars", type=int, default=40)
    parser.add_argument("--tokens-per-second", type=float, default=40)
    parser.add_argument("--first-token-delay", type=float, default=0.5)
    parser.add_argument("--turn-timeout", type=float, default=60.0,
                        help="the turn budget (s); a naive answer still editing at the end of it is lost")
    parser.add_argument("--redis", action="store_true",
                        help="rate budgets in Redis at REDIS_URL (as replicas share them), not in this process")
    parser.add_argument("--model-in", choices=["process", "thread"], default="process",
                        help="serve the fake model from a process of its own (default: a hosted model's work is "
                             "not kbbot's) or from a thread of the benchmark's process (as before 2026-12-03)")
    parser.add_argument("--helper-delay", type=float, default=0.0,
                        help="seconds the fake model takes for each helper call (guard, grade, ...); a hosted model "
                             "answers such a short JSON request in 0.3-1 s (default 0: at once)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    redis_url = os.environ.get("REDIS_URL") if args.redis else None
    if args.redis and not redis_url:
        raise SystemExit("--redis needs REDIS_URL (scripts/services.sh start)")
    result = asyncio.run(run(args.conversations, args.naive_chars, args.tokens_per_second, args.first_token_delay,
                             args.platforms, args.strategies, args.turn_timeout, args.channels, redis_url,
                             args.model_in, args.helper_delay))
    emit_laid_out(result, args.json, print_table)


if __name__ == "__main__":
    main()
