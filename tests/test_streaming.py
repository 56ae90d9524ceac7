"""The platform-neutral throttling core: one ordered writer per answer, one rate budget per workspace."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.delivery.rates import COMPLETES, STARTS, PlatformRates, Rate, TokenBucket
from bot.delivery.reply import Cadence, DeliveryFailed, RetryAfter, StreamWriter


class RecordingSink:
    """Records sends; can refuse some with RetryAfter or fail them, and can take time per send."""

    def __init__(self, *, send_s: float = 0.0):
        self.sends: list[tuple[str, bool, float]] = []
        self.refusals: list[tuple[str, bool]] = []
        self.retry_after: dict[int, float] = {}  # attempt number -> Retry-After
        self.errors: dict[int, Exception] = {}
        self.send_s = send_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.attempts = 0

    platform = "test"

    async def ready(self, final: bool) -> bool:
        return True

    async def send(self, text: str, final: bool) -> bool:
        self.attempts += 1
        attempt = self.attempts
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.send_s:
                await asyncio.sleep(self.send_s)
            if attempt in self.retry_after:
                self.refusals.append((text, final))
                raise RetryAfter(self.retry_after[attempt])
            if attempt in self.errors:
                raise self.errors[attempt]
            self.sends.append((text, final, time.monotonic()))
            return True
        finally:
            self.in_flight -= 1

    @property
    def texts(self) -> list[str]:
        return [t for t, _, _ in self.sends]


async def produce(writer: StreamWriter, tokens: list[str], every_s: float) -> None:
    for token in tokens:
        writer.push(token)
        await asyncio.sleep(every_s)


TOKENS = [f"word{i} " for i in range(120)]
FULL = "".join(TOKENS)


async def test_deltas_are_coalesced_paced_and_sent_in_order():
    sink = RecordingSink(send_s=0.01)
    writer = StreamWriter(sink, Cadence(min_interval_s=0.1))
    await produce(writer, TOKENS, 0.004)
    await writer.finish()

    assert sink.sends[-1][:2] == (FULL, True)
    assert sum(final for _, final, _ in sink.sends) == 1
    assert len(sink.sends) < len(TOKENS) / 5, "deltas are coalesced, not sent one by one"
    assert sink.texts[0] == TOKENS[0], "the first token goes out at once"
    intermediate = [t for t, final, _ in sink.sends if not final]
    for earlier, later in zip(intermediate, intermediate[1:]):
        assert later.startswith(earlier) and len(later) > len(earlier), "only when the text grew, in order"
    # The final send may repeat the last intermediate text (all tokens were out before ``finish``):
    # it is still sent, because it is what ends the stream (Slack's chat.stopStream, the last edit).
    assert FULL.startswith(intermediate[-1])
    gaps = [b - a for (_, _, a), (_, _, b) in zip(sink.sends, sink.sends[1:])]
    assert min(gaps) >= 0.1 - 0.005
    assert sink.max_in_flight == 1, "a single writer: sends never overlap"
    assert writer.stats.pushes == len(TOKENS) and writer.stats.sends == len(sink.sends)


async def test_min_growth_holds_small_increments_back():
    sink = RecordingSink()
    writer = StreamWriter(sink, Cadence(min_interval_s=0.0, min_growth=50, first_growth=10))
    for token in ["abc", "def", "ghij"]:  # 10 characters: the first send
        writer.push(token)
        await asyncio.sleep(0.01)
    for _ in range(20):  # 2 characters at a time: a send about every 50
        writer.push("xy")
        await asyncio.sleep(0.01)
    await writer.finish()
    intermediate = [t for t, final, _ in sink.sends if not final]
    assert intermediate[0] == "abcdefghij"
    assert all(len(b) - len(a) >= 50 for a, b in zip(intermediate, intermediate[1:]))
    assert sink.sends[-1][0] == "abcdefghij" + "xy" * 20


async def test_retry_after_sleeps_then_sends_the_latest_text():
    sink = RecordingSink()
    sink.retry_after[2] = 0.3  # the second send is refused for 0.3 s
    writer = StreamWriter(sink, Cadence(min_interval_s=0.05))
    producer = asyncio.create_task(produce(writer, TOKENS, 0.005))
    await producer
    await writer.finish()

    refused_text, _ = sink.refusals[0]
    after = [s for s in sink.sends if s[0] != TOKENS[0]]
    retried_text, _, retried_at = after[0]
    assert len(retried_text) > len(refused_text), "after the wait the latest text goes out, not the stale one"
    refused_at = sink.sends[0][2]
    assert retried_at - refused_at >= 0.3
    assert sink.sends[-1][:2] == (FULL, True)
    assert writer.stats.retry_waits == 1


async def test_a_sink_waiting_in_ready_then_sends_what_arrived_meanwhile():
    """``ready`` (e.g. a shared rate budget) is awaited before the text is taken, so it is never stale."""

    class SlowBudgetSink(RecordingSink):
        async def ready(self, final: bool) -> bool:
            await asyncio.sleep(0.2)
            return True

    sink = SlowBudgetSink()
    writer = StreamWriter(sink, Cadence(min_interval_s=0.0))
    writer.push("first ")
    await asyncio.sleep(0.05)  # the writer waits in ready()
    writer.push("second ")
    await asyncio.sleep(0.3)
    assert sink.texts == ["first second "]
    await writer.finish()


async def test_a_sink_with_no_budget_to_spare_skips_intermediates_but_not_the_final():
    """``ready`` returning False means "not now": the writer looks again later, the final always goes."""

    class SpareOnlySink(RecordingSink):
        def __init__(self) -> None:
            super().__init__()
            self.spare = False
            self.asked: list[bool] = []

        async def ready(self, final: bool) -> bool:
            self.asked.append(final)
            return final or self.spare

    sink = SpareOnlySink()
    writer = StreamWriter(sink, Cadence(min_interval_s=0.05))
    writer.push("first ")
    await asyncio.sleep(0.2)
    assert sink.texts == [] and len(sink.asked) >= 2, "asked again after min_interval_s, sent nothing"
    sink.spare = True
    writer.push("second ")
    await asyncio.sleep(0.1)
    assert sink.texts == ["first second "]
    sink.spare = False
    writer.push("third")
    await writer.finish()
    assert sink.texts == ["first second ", "first second third"]
    assert sink.sends[-1][1] is True


async def test_final_text_survives_repeated_retry_after():
    sink = RecordingSink()
    writer = StreamWriter(sink, Cadence(min_interval_s=0.0))
    writer.push("hello ")
    await asyncio.sleep(0.01)
    for attempt in (2, 3, 4):
        sink.retry_after[attempt] = 0.05
    await writer.finish("hello world")
    assert sink.sends[-1][:2] == ("hello world", True)
    assert [final for _, final in sink.refusals] == [True, True, True]


async def test_final_text_refused_past_the_bound_is_an_error_not_silence():
    sink = RecordingSink()
    for attempt in range(1, 10):
        sink.retry_after[attempt] = 0.05
    writer = StreamWriter(sink, Cadence(min_interval_s=0.0, max_retry_wait_s=0.12))
    with pytest.raises(DeliveryFailed, match="refused"):
        await writer.finish("never shown")


async def test_a_failed_intermediate_send_stops_intermediates_but_not_the_final():
    sink = RecordingSink()
    sink.errors[2] = RuntimeError("boom")
    writer = StreamWriter(sink, Cadence(min_interval_s=0.02))
    await produce(writer, TOKENS[:40], 0.005)
    await writer.finish()
    assert sink.texts[0] == TOKENS[0]
    assert sink.sends[-1][:2] == ("".join(TOKENS[:40]), True)
    assert len(sink.sends) == 2, "after the failure only the final text was sent"


async def test_final_send_error_is_raised_by_finish():
    sink = RecordingSink()
    sink.errors[1] = ValueError("platform said no")
    writer = StreamWriter(sink)
    with pytest.raises(ValueError, match="platform said no"):
        await writer.finish("text")


async def test_close_waits_for_the_send_in_flight_and_sends_nothing_after():
    sink = RecordingSink(send_s=0.1)
    writer = StreamWriter(sink, Cadence(min_interval_s=0.0))
    writer.push("partial ")
    await asyncio.sleep(0.02)  # the send is in flight
    writer.push("more ")
    await writer.close()
    closed_at = time.monotonic()
    assert sink.texts == ["partial "]
    assert sink.sends[0][2] <= closed_at
    writer.push("ignored")
    await asyncio.sleep(0.05)
    assert sink.texts == ["partial "]


async def test_close_during_pacing_returns_at_once():
    sink = RecordingSink()
    writer = StreamWriter(sink, Cadence(min_interval_s=5.0))
    writer.push("a")
    await asyncio.sleep(0.01)
    writer.push("b")  # waits 5 s for its turn
    started = time.monotonic()
    await writer.close()
    assert time.monotonic() - started < 0.5
    assert sink.texts == ["a"]


# --- rate budget ---------------------------------------------------------------------------
class FakeTime:
    """A clock whose sleep advances it: token-bucket arithmetic without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def test_token_bucket_allows_the_burst_then_the_rate():
    t = FakeTime()
    bucket = TokenBucket(Rate(per_minute=60, burst=3), clock=t.clock, sleep=t.sleep)
    waits = [await bucket.acquire() for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3:] == pytest.approx([1.0, 1.0, 1.0])
    assert t.now == pytest.approx(1003.0)


async def test_hold_blocks_everyone_for_retry_after():
    t = FakeTime()
    bucket = TokenBucket(Rate(per_minute=60, burst=5), clock=t.clock, sleep=t.sleep)
    await bucket.hold(7.0)
    assert await bucket.acquire() == pytest.approx(7.0), "one call right after the hold"
    assert await bucket.acquire() == pytest.approx(1.0), "then the normal rate, no burst saved up while held"


async def test_try_acquire_takes_only_a_free_token_and_never_jumps_the_queue():
    t = FakeTime()
    bucket = TokenBucket(Rate(per_minute=60, burst=2), clock=t.clock, sleep=t.sleep)
    assert [await bucket.try_acquire(), await bucket.try_acquire(), await bucket.try_acquire()] == [True, True, False]
    t.now += 1.0
    assert await bucket.try_acquire() is True, "refilled at the rate"
    await bucket.hold(5.0)
    t.now += 2.0
    assert await bucket.try_acquire() is False, "held after a 429"

    woken = asyncio.Event()

    async def slow_sleep(seconds: float) -> None:  # time passes, the waiter has not run yet
        t.now += seconds
        await woken.wait()

    queued = TokenBucket(Rate(per_minute=60, burst=1), clock=t.clock, sleep=slow_sleep)
    assert await queued.try_acquire() is True
    waiter = asyncio.create_task(queued.acquire())
    await asyncio.sleep(0.01)
    assert await queued.tokens() >= 1.0, "a token is due"
    assert await queued.try_acquire() is False, "but a caller (a final) waits for it: spare-only callers get nothing"
    woken.set()
    assert await waiter == pytest.approx(1.0)
    rates = PlatformRates({"chat.update": Rate(per_minute=60, burst=1)})
    assert await rates.try_acquire("T1", "chat.postMessage") is True, "a method without a rate is not limited"


async def test_waiting_callers_get_tokens_by_priority_a_completing_call_first():
    """One token a second, three callers waiting: the call that completes something goes before an
    earlier caller's first text; among completing calls the fewest calls left, then the earliest ready;
    a caller whose state changes while it waits (its answer completed) moves up at once."""
    t = FakeTime()
    bucket = TokenBucket(Rate(per_minute=60, burst=1), clock=t.clock, sleep=t.sleep)
    assert await bucket.try_acquire()
    order: list[str] = []
    state = {"late": (STARTS, 0, 1.0)}

    async def wait(name: str, priority) -> None:  # noqa: ANN001
        await bucket.acquire(priority)
        order.append(name)

    tasks = [asyncio.create_task(wait("first text, asked first", (STARTS, 0, 0.0))),
             asyncio.create_task(wait("final, 3 messages left", (COMPLETES, 3, 5.0))),
             asyncio.create_task(wait("final, ready at 7", (COMPLETES, 1, 7.0))),
             asyncio.create_task(wait("final, ready at 6", (COMPLETES, 1, 6.0))),
             asyncio.create_task(wait("completes while waiting", lambda: state["late"]))]
    await asyncio.sleep(0)
    state["late"] = (COMPLETES, 1, 2.0)
    await asyncio.gather(*tasks)
    assert order == ["completes while waiting", "final, ready at 6", "final, ready at 7", "final, 3 messages left",
                     "first text, asked first"]
    assert t.now == pytest.approx(1005.0), "one token a second, none lost to the ordering"


async def test_a_cancelled_waiter_takes_no_token():
    t = FakeTime()
    bucket = TokenBucket(Rate(per_minute=60, burst=1), clock=t.clock, sleep=t.sleep)
    assert await bucket.try_acquire()
    gone = asyncio.create_task(bucket.acquire((COMPLETES, 1, 0.0)))
    stays = asyncio.create_task(bucket.acquire((STARTS, 0, 0.0)))
    await asyncio.sleep(0)
    gone.cancel()
    assert await stays == pytest.approx(1.0), "the token went to the caller still waiting"
    assert bucket.waiting == 0 and await bucket.try_acquire() is False


async def test_try_acquire_all_takes_every_bucket_or_none():
    t = FakeTime()
    rates = PlatformRates({"send": Rate(per_minute=60, burst=2), "bot": Rate(per_minute=60, burst=1)},
                        clock=t.clock, sleep=t.sleep)
    assert await rates.try_acquire_all(("chat1", "send"), ("all", "bot")) is True
    assert await rates.try_acquire_all(("chat1", "send"), ("all", "bot")) is False, "the bot-wide bucket is empty"
    assert await rates.bucket("chat1", "send").tokens() == pytest.approx(1.0), "the chat's token was not taken"
    assert await rates.try_acquire_all(("chat1", "send"), ("all", "unlimited")) is True


async def test_budget_is_shared_per_scope_and_method():
    t = FakeTime()
    rates = PlatformRates({"chat.update": Rate(per_minute=60, burst=1)}, clock=t.clock, sleep=t.sleep)
    assert await rates.acquire("T1", "chat.update") == 0.0
    assert await rates.acquire("T2", "chat.update") == 0.0, "another workspace has its own bucket"
    assert await rates.acquire("T1", "chat.postMessage") == 0.0, "a method without a rate is not limited"
    assert await rates.acquire("T1", "chat.update") == pytest.approx(1.0)
    assert rates.bucket("T1", "chat.update") is rates.bucket("T1", "chat.update")


async def test_concurrent_answers_of_one_workspace_stay_inside_the_tier_together():
    """Four answers stream at once; together they stay within the method's rate, and all finish."""
    rates = PlatformRates({"update": Rate(per_minute=1200, burst=2)})  # 20/s for the whole workspace
    calls: list[float] = []

    class BudgetedSink:
        def __init__(self) -> None:
            self.final: str | None = None

        platform = "test"

        async def ready(self, final: bool) -> bool:
            return True

        async def send(self, text: str, final: bool) -> bool:
            await rates.acquire("T1", "update")
            calls.append(time.monotonic())
            if final:
                self.final = text
            return True

    async def answer(sink: BudgetedSink) -> str:
        writer = StreamWriter(sink, Cadence(min_interval_s=0.02))
        await produce(writer, TOKENS[:60], 0.005)
        await writer.finish()
        return "".join(TOKENS[:60])

    sinks = [BudgetedSink() for _ in range(4)]
    expected = await asyncio.gather(*(answer(s) for s in sinks))
    assert [s.final for s in sinks] == expected
    calls.sort()
    for i, start in enumerate(calls):
        in_window = [c for c in calls[i:] if c < start + 0.5]
        assert len(in_window) <= 2 + 20 * 0.5 + 1, "the shared bucket caps the workspace's calls"
