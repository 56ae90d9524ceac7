"""The chat platforms the scenarios run on: one driver per platform, and ``serving``, which puts a runtime
behind the platform's fake as ``kbbot serve`` does.

A driver turns what a scenario says ("alice asks in the shared place", "the reviewer clicks approve") into
the platform's wire format against its fake (``tests/fakes``), and reads back what a reader of that
platform sees now. Everything else, the scenarios themselves included, is written once. A new platform
adds a ``Driver`` subclass here and its entry in ``DRIVERS``.

This is the only file of the scenario suite that imports adapter code.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from pydantic import SecretStr
from slack_sdk.signature import SignatureVerifier

from adapters.insights import start_follow_ups
from adapters.platforms import build_platforms
from adapters.server import build_web_app
from adapters.slack.text import neutralise
from adapters.teams.settings import TeamsSettings
from adapters.teams.text import EXPERT_APPROVE, EXPERT_CAPTURE
from adapters.teams.text import neutralise as teams_neutralise
from adapters.telegram.text import render
from bot.conversation import HandledTurn
from bot.platform import ReviewerMessages
from bot.runtime import Runtime
from bot.state.feedback import MemoryFeedback
from tests.fakes.slack_server import FakeSlack
from tests.fakes.teams import FakeTeams
from tests.fakes.telegram_server import FakeTelegram, callback_update, message_update
from tests.fakes.telegram_server import user as tg_user


@dataclass(frozen=True)
class Place:
    """Where a question is asked: a place others read too (a Slack channel, a Telegram group) or one only
    the asker reads (a Slack DM, a Telegram private chat)."""

    id: str
    private: bool


@dataclass
class Asked:
    """A question as the platform delivered it: where, by whom, and the platform's own event."""

    place: Place
    user: str
    text: str
    event: dict[str, Any]
    #: Telegram: how many bot messages the chat held before the question (its answers come after them).
    before: int = 0


@dataclass
class Shown:
    """A message of kbbot's as a reader sees it now."""

    #: The platform's id of the message (Slack: its ts; Telegram: its message id).
    id: str
    text: str
    #: The sources part of the message ("" without sources).
    sources: str
    #: Its feedback buttons as (rating, turn id), in order.
    feedback: list[tuple[str, str]]
    deleted: bool
    native: Any


@dataclass
class Note:
    """A private message offering an expert's reply to a reviewer, with its buttons by action."""

    text: str
    actions: dict[str, Any]
    native: Any


@dataclass
class Bot:
    """One replica serving one platform: its adapter on a started runtime, what it handled."""

    platform: Driver
    runtime: Runtime
    adapter: Any
    knowledge: Any
    url: str
    session: aiohttp.ClientSession
    turns: list[HandledTurn] = field(default_factory=list)
    feedback: MemoryFeedback = field(default_factory=MemoryFeedback)

    # --- what users do, through the platform -----------------------------------------------------
    async def ask(self, text: str, *, user: str, place: Place | None = None, settle: bool = True) -> Asked:
        """``user`` asks ``text`` in ``place`` (default: where they usually ask); with ``settle``, returns once
        the platform delivered it and kbbot handled it, else once delivered."""
        return await self.platform.ask(self, text, user=user, place=place or self.platform.home(user), settle=settle)

    async def start_over(self, place: Place, *, user: str) -> None:
        """``user`` starts a new conversation in ``place``: what is asked next has no history."""
        await self.platform.start_over(self, place, user=user)

    async def reply(self, asked: Asked, text: str, *, user: str) -> None:
        """A person's reply to kbbot's answer to ``asked``, where it was given."""
        await self.platform.reply(self, asked, text, user=user)

    async def click_feedback(self, shown: Shown, rating: str, *, user: str) -> None:
        await self.platform.click_feedback(self, shown, rating, user=user)

    async def click_note(self, note: Note, action: str, *, user: str) -> str:
        """``user`` clicks ``action`` (approve, capture) on a reviewer's note; what they are told."""
        return await self.platform.click_note(self, note, action, user=user)

    # --- what users see ----------------------------------------------------------------------------
    def shown(self, asked: Asked) -> list[Shown]:
        """kbbot's messages where ``asked`` was asked, since it was (deleted ones too, marked)."""
        return self.platform.shown(asked)

    def answers(self, asked: Asked) -> list[Shown]:
        return [s for s in self.shown(asked) if not s.deleted and s.text.strip()]

    # --- the replica ---------------------------------------------------------------------------------
    async def settle(self) -> None:
        await self.adapter.settle()

    async def refresh(self, source: str) -> Any:
        """A refresh of ``source`` as ``kbbot serve``'s scheduler or an admin runs it (follow-ups after)."""
        record = await self.knowledge.refresher.run(source)
        await self.settle()
        return record

    def kill(self) -> None:
        """SIGKILL: nothing more from this replica's turns."""
        for task in list(self.adapter.delivery.tasks._tasks):
            task.cancel()

    async def recover(self) -> int:
        """One round of taking over the turns of replicas that died; waits for those taken."""
        taken = await self.adapter.conversations.turns.recover()
        await self.adapter.conversations.turns.recovering.settle(0.05)
        return taken


@contextlib.asynccontextmanager
async def serving(runtime: Runtime, platform: Driver, *, replica: str | None = None, answerer: Any = None,
                  **options: Any) -> AsyncIterator[Bot]:
    """``runtime`` (started) served on ``platform``'s fake as ``kbbot serve`` wires it: the adapter built by
    the registry (``adapters.platforms``) from the settings, its web routes, gap follow-ups and the knowledge loop after each
    refresh. ``options`` are the platform's settings; ``replica`` names this replica for take-overs;
    ``answerer`` replaces the runtime's."""
    platform.configure(runtime.settings, **options)
    knowledge = runtime.knowledge_admin(schedule=False)
    feedback = MemoryFeedback()
    turns: list[HandledTurn] = []
    conversations = runtime.conversations(admin=knowledge, feedback=feedback, on_turn=turns.append)
    if answerer is not None:
        conversations = replace(conversations, answerer=answerer)
    if replica is not None and conversations.takeover is not None:
        conversations = replace(conversations, takeover=replace(conversations.takeover, replica=replica))
    [adapter] = build_platforms(runtime, conversations).values()
    start_follow_ups(runtime, knowledge, [adapter])
    knowledge.refresher.after_change.append(
        runtime.knowledge_loop(ReviewerMessages([adapter])).after_refresh)
    runner = web.AppRunner(build_web_app([adapter], runtime), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    await adapter.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Bot(platform, runtime, adapter, knowledge, f"http://127.0.0.1:{runner.addresses[0][1]}", session,
                      turns, feedback)
    finally:
        await adapter.stop(10)
        await runner.cleanup()


class Driver:
    """A chat platform as the scenarios see it; subclasses speak one platform's wire format."""

    name: str
    #: The place others read too, where questions are asked by mentioning kbbot.
    shared: Place

    async def __aenter__(self) -> Driver:
        raise NotImplementedError

    async def __aexit__(self, *exc: object) -> None:
        raise NotImplementedError

    def configure(self, settings: Any, **options: Any) -> None:
        """Point ``settings`` at this platform's fake (and only this platform), with fast cadences."""
        raise NotImplementedError

    def user_id(self, name: str) -> str:
        """The platform's id of the person called ``name`` (``alice``, ``rita``)."""
        raise NotImplementedError

    def private(self, user: str) -> Place:
        """The place only ``user`` and kbbot read."""
        raise NotImplementedError

    def home(self, user: str) -> Place:
        """Where ``user`` usually asks kbbot (Slack: a channel, answered in the mention's thread; Telegram:
        a private chat)."""
        raise NotImplementedError

    def shows(self, markdown: str) -> str:
        """How the platform shows an answer written as ``markdown`` (what a reader sees of its text)."""
        raise NotImplementedError

    async def ask(self, bot: Bot, text: str, *, user: str, place: Place, settle: bool = True) -> Asked:
        raise NotImplementedError

    async def start_over(self, bot: Bot, place: Place, *, user: str) -> None:
        raise NotImplementedError

    async def reply(self, bot: Bot, asked: Asked, text: str, *, user: str) -> None:
        raise NotImplementedError

    async def click_feedback(self, bot: Bot, shown: Shown, rating: str, *, user: str) -> None:
        raise NotImplementedError

    async def click_note(self, bot: Bot, note: Note, action: str, *, user: str) -> str:
        raise NotImplementedError

    def shown(self, asked: Asked) -> list[Shown]:
        raise NotImplementedError

    def states(self, asked: Asked) -> int:
        """How many states the answer to ``asked`` went through on screen, its final one included."""
        raise NotImplementedError

    def notes(self, reviewer: str) -> list[Note]:
        """The expert replies offered to ``reviewer``, oldest first."""
        raise NotImplementedError

    def rate_limit_answers(self, *, times: int, retry_after: float) -> None:
        """The next ``times`` calls of each method that shows an answer's text (its stream and its final
        message) are answered 429 with Retry-After ``retry_after``."""
        raise NotImplementedError

    def refused(self) -> list[float]:
        """When the platform answered 429 (monotonic times)."""
        raise NotImplementedError

    def delivered_at(self, asked: Asked) -> float:
        """When the final state of the answer to ``asked`` was accepted by the platform (monotonic)."""
        raise NotImplementedError

    def everything_sent(self) -> str:
        """Every text kbbot sent the platform, each stream piece, draft, edit and private note included."""
        raise NotImplementedError


# --- Slack -------------------------------------------------------------------------------------------
SLACK_TEAM = "T0KBBOT"
SLACK_BOT = "UKBBOT"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
_slack_ts = itertools.count(1)
_slack_events = itertools.count(1)


def _new_ts() -> str:
    return f"{1_900_000_000 + next(_slack_ts)}.000300"


class SlackDriver(Driver):
    """Slack: a question is an @mention in a channel (or a direct message), answered in its thread; clicks
    are signed interaction payloads; reviewers' notes are ephemeral messages."""

    name = "slack"
    shared = Place("C0SUPPORT", private=False)

    async def __aenter__(self) -> SlackDriver:
        self.fake = FakeSlack(team_id=SLACK_TEAM, bot_user_id=SLACK_BOT)
        await self.fake.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.fake.__aexit__(*exc)

    def configure(self, settings: Any, **options: Any) -> None:
        slack = type(settings.slack)
        settings.slack = slack(bot_token=self.fake.token, signing_secret=SLACK_SECRET, api_url=self.fake.base_url,
                               **{"stream_interval_s": 0.3, "edit_interval_s": 0.3, **options})
        settings.telegram = type(settings.telegram)()
        settings.teams = type(settings.teams)()

    def user_id(self, name: str) -> str:
        return f"U0{name.upper()}"

    def private(self, user: str) -> Place:
        return Place(f"D0{user[2:]}", private=True)

    def home(self, user: str) -> Place:
        return self.shared

    def shows(self, markdown: str) -> str:
        return neutralise(markdown)

    async def _post(self, bot: Bot, raw: str, content_type: str = "application/json", settle: bool = True) -> None:
        ts = str(int(time.time()))
        headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts,
                   "X-Slack-Signature": SignatureVerifier(SLACK_SECRET).generate_signature(timestamp=ts, body=raw)}
        async with bot.session.post(f"{bot.url}/slack/events", data=raw.encode(), headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        if settle:
            await bot.settle()

    async def _event(self, bot: Bot, event: dict[str, Any], settle: bool = True) -> None:
        body = {"token": "legacy", "team_id": SLACK_TEAM, "api_app_id": "AKBBOT", "type": "event_callback",
                "event_id": f"EvS{next(_slack_events):08d}", "event_time": int(time.time()),
                "authorizations": [{"team_id": SLACK_TEAM, "user_id": SLACK_BOT, "is_bot": True}],
                "event": {"team": SLACK_TEAM, "event_ts": event["ts"], **event}}
        await self._post(bot, json.dumps(body), settle=settle)

    async def _click(self, bot: Bot, user: str, container: dict[str, Any], action: dict[str, Any]) -> None:
        payload = {"type": "block_actions", "token": "legacy", "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
                   "team": {"id": SLACK_TEAM, "domain": "kb"},
                   "user": {"id": user, "username": user.lower(), "name": user[2:].lower(), "team_id": SLACK_TEAM},
                   "container": {"type": "message", **container}, "channel": {"id": container["channel_id"]},
                   "actions": [{**action, "action_ts": f"{time.time():.6f}"}]}
        await self._post(bot, urlencode({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded")

    async def ask(self, bot: Bot, text: str, *, user: str, place: Place, settle: bool = True) -> Asked:
        if place.private:
            event = {"type": "message", "channel_type": "im", "text": text}
        else:
            event = {"type": "app_mention", "text": f"<@{SLACK_BOT}> {text}"}
        event.update(user=user, ts=_new_ts(), channel=place.id)
        await self._event(bot, event, settle)
        return Asked(place, user, text, event)

    async def start_over(self, bot: Bot, place: Place, *, user: str) -> None:
        pass  # every mention in a channel starts a thread of its own

    async def reply(self, bot: Bot, asked: Asked, text: str, *, user: str) -> None:
        await self._event(bot, {"type": "message", "channel_type": "channel", "user": user, "text": text,
                                "ts": _new_ts(), "channel": asked.place.id, "thread_ts": asked.event["ts"]})

    async def click_feedback(self, bot: Bot, shown: Shown, rating: str, *, user: str) -> None:
        message = shown.native
        value = next(f"{r}:{turn}" for r, turn in shown.feedback if r == rating)
        await self._click(bot, user, {"message_ts": message.ts, "channel_id": message.channel},
                          {"type": "feedback_buttons", "action_id": "kbbot_feedback", "block_id": "fb", "value": value})

    async def click_note(self, bot: Bot, note: Note, action: str, *, user: str) -> str:
        ephemeral, before = note.native, len(self.fake.ephemerals)
        button = note.actions[action]
        await self._click(bot, user, {"message_ts": ephemeral.ts, "channel_id": ephemeral.channel, "is_ephemeral": True,
                                      "thread_ts": ephemeral.thread_ts},
                          {"type": "button", "action_id": button["action_id"], "block_id": "kbbot_expert",
                           "value": button["value"]})
        return "\n".join(e.text for e in self.fake.ephemerals[before:] if e.user == user)

    def shown(self, asked: Asked) -> list[Shown]:
        found = []
        for m in self.fake.messages.values():
            if m.channel != asked.place.id or m.thread_ts != asked.event["ts"]:
                continue
            sources = " ".join(e["text"] for b in m.blocks_of("context") for e in b["elements"])
            feedback = [tuple(e[f"{kind}_button"]["value"].split(":", 1)) for b in m.blocks_of("context_actions")
                        for e in b["elements"] for kind in ("positive", "negative")]
            found.append(Shown(m.ts, m.body, sources, feedback, m.deleted, m))  # type: ignore[arg-type]
        return found

    def states(self, asked: Asked) -> int:
        [first, *_] = [s for s in self.shown(asked) if not s.deleted]
        return len(first.native.changes)

    def notes(self, reviewer: str) -> list[Note]:
        found = []
        for e in self.fake.ephemerals:
            if e.user != reviewer or not any(b.get("block_id") == "kbbot_expert" for b in e.blocks):
                continue
            text = "\n".join(b["text"]["text"] for b in e.blocks if b.get("type") == "section")
            buttons = [el for b in e.blocks if b.get("type") == "actions" for el in b["elements"]]
            actions = {el["action_id"].removeprefix("kbbot_expert_"): el for el in buttons}
            found.append(Note(text, actions, e))
        return found

    def rate_limit_answers(self, *, times: int, retry_after: float) -> None:
        for method in ("chat.appendStream", "chat.stopStream"):
            self.fake.rate_limit(method, times=times, retry_after=retry_after)

    def refused(self) -> list[float]:
        return [c.at for c in self.fake.calls if c.status == 429]

    def delivered_at(self, asked: Asked) -> float:
        [first, *_] = [s for s in self.shown(asked) if not s.deleted]
        return first.native.changes[-1][1]

    def everything_sent(self) -> str:
        return "\n".join([c.text_sent for c in self.fake.calls] + [e.text for e in self.fake.ephemerals])


# --- Telegram ----------------------------------------------------------------------------------------
TELEGRAM_GROUP = -100777


class TelegramDriver(Driver):
    """Telegram: a question is a private message (or an @mention in a group), answered in the same chat;
    clicks are callback queries; reviewers' notes are private messages."""

    name = "telegram"
    shared = Place(str(TELEGRAM_GROUP), private=False)
    #: Fixed ids for the people the scenarios name (a user's private chat has the user's id).
    PEOPLE = {"alice": 7001, "bob": 7002, "carol": 7003, "dave": 7004, "rita": 9101}

    async def __aenter__(self) -> TelegramDriver:
        self.fake = FakeTelegram()
        await self.fake.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.fake.__aexit__(*exc)

    def configure(self, settings: Any, **options: Any) -> None:
        telegram = type(settings.telegram)
        settings.telegram = telegram(token=self.fake.token, api_url=self.fake.base_url,
                                     **{"edit_interval_s": 0.3, "draft_interval_s": 0.2, "polling_timeout_s": 1,
                                        "groups_enabled": True, **options})
        settings.slack = type(settings.slack)()
        settings.teams = type(settings.teams)()

    def user_id(self, name: str) -> str:
        return str(self.PEOPLE.get(name) or 8000 + zlib.crc32(name.encode()) % 1000)

    def _from(self, user: str) -> dict[str, Any]:
        name = next((n for n, i in self.PEOPLE.items() if str(i) == user), "someone")
        return tg_user(int(user), first_name=name.capitalize())

    def private(self, user: str) -> Place:
        return Place(user, private=True)

    def home(self, user: str) -> Place:
        return self.private(user)

    def shows(self, markdown: str) -> str:
        return render(markdown).text

    async def _send(self, bot: Bot, update: dict[str, Any], timeout_s: float = 30, settle: bool = True) -> dict[str, Any]:
        """Queue ``update`` and wait until the poller confirmed it (and, with ``settle``, its handler finished)."""
        update = await self.fake.fetched(update, timeout_s)
        if settle:
            await bot.settle()
        return update

    def _chat(self, chat_id: int) -> list[Any]:
        return self.fake.messages.get(chat_id, [])

    async def ask(self, bot: Bot, text: str, *, user: str, place: Place, settle: bool = True) -> Asked:
        chat = int(place.id)
        before = len(self._chat(chat))
        if place.private:
            update = message_update(text, chat_id=chat, from_user=self._from(user))
        else:
            handle = f"@{self.fake.username}"
            update = message_update(f"{handle} {text}", chat_id=chat, chat_type="supergroup", from_user=self._from(user),
                                    entities=[{"type": "mention", "offset": 0, "length": len(handle)}])
        update = await self._send(bot, update, settle=settle)
        return Asked(place, user, text, update, before)

    async def start_over(self, bot: Bot, place: Place, *, user: str) -> None:
        # A chat (a group too) is one conversation until someone sends /new.
        chat_type = "private" if place.private else "supergroup"
        await self._send(bot, message_update("/new", chat_id=int(place.id), chat_type=chat_type,
                                             from_user=self._from(user),
                                             entities=[{"type": "bot_command", "offset": 0, "length": 4}]))

    async def reply(self, bot: Bot, asked: Asked, text: str, *, user: str) -> None:
        last = self.answers_to(asked)[-1]
        chat_type = "private" if asked.place.private else "supergroup"
        replied = {"message_id": last.message_id, "date": int(time.time()), "text": last.text,
                   "chat": {"id": last.chat_id, "type": chat_type},
                   "from": {"id": self.fake.bot_id, "is_bot": True, "first_name": "kbbot"}}
        await self._send(bot, message_update(text, chat_id=last.chat_id, chat_type=chat_type,
                                             from_user=self._from(user), reply_to=replied))

    def answers_to(self, asked: Asked) -> list[Any]:
        return [m for m in self._chat(int(asked.place.id))[asked.before:] if not m.deleted]

    async def _callback(self, bot: Bot, data: str, message: Any, user: str) -> str:
        chat, before, acks = message.chat_id, len(self._chat(int(user))), len(self.fake.ok_calls("answerCallbackQuery"))
        chat_type = "private" if chat > 0 else "supergroup"
        await self._send(bot, callback_update(data, message=message, from_user=self._from(user), chat_type=chat_type))
        told = [m.text for m in self._chat(int(user))[before:] if not m.deleted]
        told += [c.args.get("text") or "" for c in self.fake.ok_calls("answerCallbackQuery")[acks:]]
        return "\n".join(t for t in told if t)

    async def click_feedback(self, bot: Bot, shown: Shown, rating: str, *, user: str) -> None:
        turn = next(t for r, t in shown.feedback if r == rating)
        await self._callback(bot, f"kbfb:{rating}:{turn}", shown.native, user)

    async def click_note(self, bot: Bot, note: Note, action: str, *, user: str) -> str:
        return await self._callback(bot, note.actions[action]["callback_data"], note.native, user)

    def shown(self, asked: Asked) -> list[Shown]:
        found = []
        for m in self._chat(int(asked.place.id))[asked.before:]:
            sources = m.text.partition("Sources")[2]
            feedback = [tuple(b["callback_data"].split(":")[1:3]) for b in m.buttons()
                        if b["callback_data"].startswith("kbfb:")]
            found.append(Shown(str(m.message_id), m.text, sources, feedback, m.deleted, m))  # type: ignore[arg-type]
        return found

    def states(self, asked: Asked) -> int:
        [first, *_] = self.answers_to(asked)
        drafts = [d for d in self.fake.drafts if d[0] == first.chat_id]
        return len(drafts) + 1 + first.edits

    def notes(self, reviewer: str) -> list[Note]:
        found = []
        for m in self._chat(int(reviewer)):
            actions = {"approve" if b["callback_data"].startswith("kbxa:") else "capture": b for b in m.buttons()
                       if b["callback_data"].split(":")[0] in ("kbxa", "kbxc")}
            if actions:
                found.append(Note(m.text, actions, m))
        return found

    def rate_limit_answers(self, *, times: int, retry_after: float) -> None:
        for method in ("sendMessageDraft", "sendMessage", "editMessageText"):
            self.fake.rate_limit(method, times=times, retry_after=retry_after)

    def refused(self) -> list[float]:
        return [c.at for c in self.fake.calls if c.status == 429]

    def delivered_at(self, asked: Asked) -> float:
        [first, *_] = self.answers_to(asked)
        sent = [c for c in self.fake.calls if c.ok and c.method in ("sendMessage", "editMessageText")
                and str(c.args.get("chat_id")) == str(first.chat_id)]
        return sent[-1].at

    def everything_sent(self) -> str:
        return "\n".join(c.text for c in self.fake.calls)


# --- Teams ----------------------------------------------------------------------------------------------
class TeamsDriver(Driver):
    """Teams: a question is an @mention posted in a channel (answered in its reply chain) or a message in a
    personal chat; clicks are invokes (the feedback loop's ``message/submitAction``, an Adaptive Card's
    ``adaptiveCard/action``); reviewers' notes are cards in their personal chats."""

    name = "teams"
    PEOPLE = ("alice", "bob", "carol", "dave", "rita")

    async def __aenter__(self) -> TeamsDriver:
        self.fake = FakeTeams()
        await self.fake.__aenter__()
        self.people = {name: self.fake.add_user(f"{name.capitalize()} Example") for name in self.PEOPLE}
        self.shared = Place(self.fake.add_team("Support", list(self.people.values())), private=False)
        self._bot: Bot | None = None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.fake.__aexit__(*exc)

    def configure(self, settings: Any, **options: Any) -> None:
        f = self.fake
        settings.teams = TeamsSettings(app_id=SecretStr(f.app_id), app_secret=SecretStr(f.app_secret),
                                       tenant_id=SecretStr(f.tenant_id), login_url=f.login_url, openid_url=f.openid_url,
                                       service_url=f.service_url,
                                       **{"stream_interval_s": 1.0, "edit_interval_s": 0.3, **options})
        settings.slack = type(settings.slack)()
        settings.telegram = type(settings.telegram)()

    def user_id(self, name: str) -> str:
        if name not in self.people:
            self.people[name] = self.fake.add_user(f"{name.capitalize()} Example")
        return self.people[name].id

    def private(self, user: str) -> Place:
        return Place(self.fake.personal_chat(self.fake.users[user]), private=True)

    def home(self, user: str) -> Place:
        return self.private(user)

    def shows(self, markdown: str) -> str:
        return teams_neutralise(markdown)

    async def _deliver(self, bot: Bot, activity: dict[str, Any], settle: bool = True) -> Any:
        self._bot = bot
        status, body = await self.fake.deliver(bot.url, activity, session=bot.session)
        assert status == 200, (status, body)
        if settle:
            await bot.settle()
        return body

    async def ask(self, bot: Bot, text: str, *, user: str, place: Place, settle: bool = True) -> Asked:
        who = self.fake.users[user]
        activity = self.fake.personal_message(text, user=who) if place.private else \
            self.fake.channel_message(text, user=who, channel=place.id)
        await self._deliver(bot, activity, settle)
        return Asked(place, user, text, activity)

    async def start_over(self, bot: Bot, place: Place, *, user: str) -> None:
        if place.private:  # a channel's every post is a reply chain of its own
            await self._deliver(bot, self.fake.personal_message("new", user=self.fake.users[user]))

    async def reply(self, bot: Bot, asked: Asked, text: str, *, user: str) -> None:
        who = self.fake.users[user]
        activity = self.fake.personal_message(text, user=who) if asked.place.private else \
            self.fake.channel_message(text, user=who, channel=asked.place.id, root=asked.event["id"], mention=False)
        await self._deliver(bot, activity)

    async def click_feedback(self, bot: Bot, shown: Shown, rating: str, *, user: str) -> None:
        reaction = "like" if rating == "up" else "dislike"
        await self._deliver(bot, self.fake.feedback(shown.native, user=self.fake.users[user], reaction=reaction))

    async def click_note(self, bot: Bot, note: Note, action: str, *, user: str) -> str:
        button = note.actions[action]
        body = await self._deliver(bot, self.fake.card_action(note.native, user=self.fake.users[user],
                                                              verb=button["verb"], data=button["data"]))
        return str((body or {}).get("value") or "")

    def _answers_to(self, asked: Asked) -> list[Any]:
        """kbbot's messages after the question, deleted ones too: its reply chain's in a channel."""
        conversation, _, root = asked.event["conversation"]["id"].partition(";messageid=")
        messages = self.fake.messages[conversation]
        if root:
            return [m for m in messages if m.thread == root and m.from_bot]
        after = next(i for i, m in enumerate(messages) if m.id == asked.event["id"])
        return [m for m in messages[after + 1:] if m.from_bot]

    def _turn_of(self, message: Any) -> str:
        # Teams' thumbs name only the message: the turn a click records is the one kbbot noted for it.
        if self._bot is None or not message.feedback_loop:
            return ""
        return self._bot.adapter.answers.peek(message.conversation, message.id) or ""

    def shown(self, asked: Asked) -> list[Shown]:
        found = []
        for m in self._answers_to(asked):
            sources = " ".join(f"[{c['position']}] {c['appearance']['name']}" for c in m.citations)
            turn = self._turn_of(m)
            feedback = [("up", turn), ("down", turn)] if turn else []
            found.append(Shown(m.id, m.text, sources, feedback, m.deleted, m))  # type: ignore[arg-type]
        return found

    def states(self, asked: Asked) -> int:
        [first, *_] = [m for m in self._answers_to(asked) if not m.deleted]
        return len(first.changes)

    def notes(self, reviewer: str) -> list[Note]:
        found = []
        for m in self.fake.chat(self.fake.personal_chat(self.fake.users[reviewer])):
            actions = {"approve" if a["verb"] == EXPERT_APPROVE else "capture": a
                       for card in m.attachments for a in (card.get("content") or {}).get("actions") or []
                       if a.get("verb") in (EXPERT_APPROVE, EXPERT_CAPTURE)}
            if actions:
                found.append(Note(m.text, actions, m))
        return found

    def rate_limit_answers(self, *, times: int, retry_after: float) -> None:
        for kind in ("streaming", "final", "message", "update"):
            self.fake.rate_limit_kind(kind, times=times, retry_after=retry_after)

    def refused(self) -> list[float]:
        return [c.at for c in self.fake.calls if c.status == 429]

    def delivered_at(self, asked: Asked) -> float:
        [first, *_] = [m for m in self._answers_to(asked) if not m.deleted]
        return first.changes[-1][1]

    def everything_sent(self) -> str:
        return "\n".join(json.dumps(c.body, ensure_ascii=False) for c in self.fake.calls if c.body)


#: Every platform the scenarios run on.
DRIVERS: list[type[Driver]] = [SlackDriver, TelegramDriver, TeamsDriver]
