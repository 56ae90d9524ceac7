"""A replica killed in the middle of an answer, on the real adapters against the fake platforms: another
replica takes the question over, removes what the first wrote and answers once. The plain case (a
replica dies mid-answer) is a scenario of every platform (tests/scenarios); here, a turn taken over while
its replica is alive, and replicas killed at named steps before the platform had its acknowledgement."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bot.runtime import Runtime
from bot.types import Answer, Inquiry, Outcome, Reply
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram, message_update
from tests.kill import RENEWALS, die_at, died, disarmed  # noqa: F401  (disarmed is a fixture)
from tests.test_slack import fake_slack, slack_app  # noqa: F401  (fake_slack is a fixture)
from tests.test_telegram import QUESTION, fake_tg, telegram_bot  # noqa: F401  (fake_tg is a fixture)

LEASE = 3.0  # a real turn on a loaded machine holds its event loop for a while
PARTIAL = "Grease the bearings every 2,000 operating hours with the lithium grease named in the manual. " * 4


async def until(condition, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


class LateWriter:
    """An Answerer whose turn is alive but silent until ``go`` (its replica stalled past the lease), then
    streams ``text`` (waiting until its message is shown) and finishes."""

    def __init__(self, text: str, shown: Any) -> None:
        self.text = text
        self.shown = shown
        self.go = asyncio.Event()
        self.cancelled = False

    async def answer(self, inquiry: Inquiry, reply: Reply) -> Answer:
        await reply.start()
        await self.go.wait()
        try:
            await reply.push(self.text)
            await until(self.shown)
            answer = Answer(self.text, Outcome.ANSWERED)
            await reply.finish(answer)
            return answer
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_slack_turn_taken_over_while_alive_takes_back_the_message_it_posted_after(kb_runtime: Runtime,
                                                                                       fake_slack: FakeSlack):
    """A's turn stalls past its lease without dying; B takes the question over and answers. A then writes a
    message the entry never held, so B could not retire it: A's fenced final takes it back itself."""
    thread: list[Any] = []
    late = LateWriter(PARTIAL, lambda: any(m.body.strip() for m in fake_slack.thread(*thread)))
    async with slack_app(kb_runtime, fake_slack, answerer=late, replica="A", claim_lease_s=LEASE) as a, \
            slack_app(kb_runtime, fake_slack, replica="B", claim_lease_s=LEASE) as b:
        for replica in (a, b):
            replica.adapter.conversations.turns.serve(replica.adapter.delivery)
        body = await a.send(a.mention(), settle=False)
        event = body["event"]
        thread.extend((event["channel"], event["ts"]))
        await asyncio.sleep(0.3)  # A's turn has started and renews its lease
        for task in asyncio.all_tasks():  # A stalls: its renewals stop, its turn does not
            if task.get_name().startswith(RENEWALS):
                task.cancel()
        await asyncio.sleep(LEASE * 1.6)
        assert await b.adapter.conversations.turns.recover() == 1
        await b.adapter.conversations.turns.recovering.settle(0.05)
        [answer] = [m for m in fake_slack.thread(*thread) if m.body.strip()]
        late.go.set()  # A comes back and writes
        await a.adapter.settle()

    assert late.cancelled, "A's final was fenced: B had the turn"
    shown = [m for m in fake_slack.thread(*thread) if m.body.strip()]
    assert [m.ts for m in shown] == [answer.ts], [m.body[:40] for m in shown]
    mine = [m for m in fake_slack.messages.values() if m.thread_ts == event["ts"] and PARTIAL[:40] in m.body]
    assert mine and all(m.deleted for m in mine), "A's message was posted, then taken back"
    assert not a.turns and [t.answer.outcome for t in b.turns if t.answer] == [Outcome.ANSWERED]


#: Slack waits this long for an event's 200, then sends it again; it sends nothing again once it got one.
SLACK_ACK_S = 3.0


@pytest.mark.kill_point
@pytest.mark.parametrize("point", ["recorded", "claimed"])
async def test_slack_question_of_a_replica_killed_before_it_acknowledged_the_event_is_answered_once(
        kb_runtime: Runtime, fake_slack: FakeSlack, point: str):
    """The replica dies after it took the event and before Slack had its 200 (issue #28: recorded before
    acknowledged): Slack sends the event again, to another replica, and the question is answered once."""
    killed = die_at(point)
    async with slack_app(kb_runtime, fake_slack, replica="A", claim_lease_s=LEASE) as a, \
            slack_app(kb_runtime, fake_slack, replica="B", claim_lease_s=LEASE) as b:
        for replica in (a, b):
            replica.adapter.conversations.turns.serve(replica.adapter.delivery)
        body = a.event_body(a.mention())
        event = body["event"]
        first = asyncio.create_task(a.post(json.dumps(body)))
        await died(killed)
        done, _ = await asyncio.wait({first}, timeout=SLACK_ACK_S)
        acknowledged = bool(done) and first.result().status == 200
        assert not acknowledged, "Slack had its 200 before the question was recorded and claimed"
        first.cancel()
        for task in list(a.adapter.delivery.tasks._tasks):  # SIGKILL: nothing more from A
            task.cancel()
        if not acknowledged:  # Slack's retries: at once, then after a minute (A's leases are long gone)
            await b.send(event, event_id=body["event_id"], retry=1)
            await asyncio.sleep(LEASE * 1.6)
            await b.send(event, event_id=body["event_id"], retry=2)
        conversations = b.adapter.conversations
        for _ in range(round(LEASE * 2 / 0.1)):  # recovery rounds while A's pending entry, if any, expires
            await conversations.turns.recover()
            await asyncio.sleep(0.1)
        await conversations.turns.recovering.settle(0.05)
        await b.adapter.settle()

    answers = [m for m in fake_slack.thread(event["channel"], event["ts"]) if not m.streaming and m.body.strip()]
    assert len(answers) == 1, f"acknowledged: {acknowledged}; answers: {[m.body[:40] for m in answers]}"
    assert not a.turns and [t.answer.outcome for t in b.turns if t.answer] == [Outcome.ANSWERED]


@pytest.mark.kill_point
@pytest.mark.parametrize("point", ["recorded", "claimed"])
async def test_telegram_question_of_a_process_killed_before_it_confirmed_the_update_is_answered_once(
        kb_runtime: Runtime, fake_tg: FakeTelegram, point: str):
    """The process dies after it took an update from getUpdates and before it confirmed it (the next
    getUpdates' offset): the next process gets the update again, and the question is answered once."""
    killed = die_at(point)
    async with telegram_bot(kb_runtime, fake_tg, stream_mode="edit", claim_lease_s=LEASE) as a:
        a.adapter.conversations.turns.serve(a.adapter.delivery)
        fake_tg.push(message_update(QUESTION, chat_id=7003))
        await died(killed)
        polling = a.adapter._polling  # SIGKILL: no getUpdates more, nothing else from this process
        assert polling is not None
        polling.cancel()
        await asyncio.gather(polling, return_exceptions=True)
        for task in list(a.adapter.delivery.tasks._tasks):
            task.cancel()
    async with telegram_bot(kb_runtime, fake_tg, stream_mode="edit", claim_lease_s=LEASE) as b:
        conversations = b.adapter.conversations
        assert conversations.takeover is not None
        conversations.takeover.replica = "B"
        conversations.turns.serve(b.adapter.delivery)
        for _ in range(round(LEASE * 2 / 0.1)):  # recovery rounds while A's pending entry, if any, expires
            await conversations.turns.recover()
            await asyncio.sleep(0.1)
        await conversations.turns.recovering.settle(0.05)
        await b.adapter.settle()

    answers = fake_tg.chat(7003)
    assert len(answers) == 1, [m.text[:40] for m in answers]
    assert not a.turns and [t.answer.outcome for t in b.turns if t.answer] == [Outcome.ANSWERED]
