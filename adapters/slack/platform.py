"""The Slack adapter: mentions, thread follow-ups and DMs in; streamed, cited answers out.

Events arrive through bolt's ``AsyncApp`` (Events API over HTTP, or Socket Mode) and are acknowledged
as soon as a question in them is accepted (recorded as pending, then claimed: listener middleware, which
bolt runs before its ack); the turn runs after the ack. Every listener passes the delivery layer's gate first
(``bot/delivery/``: tracking, the access checks this adapter registers once, claims, take-over);
each question becomes an ``Inquiry`` for the conversation service (``bot/conversation.py``: turns,
clicks, commands) with a ``ChatReply`` over ``SlackMessages`` (``adapters/slack/reply.py``: streaming, edits, the final
message with sources and 👍/👎, the rate tiers) that renders the answer in the thread; the text and
blocks are built in ``adapters/slack/text.py``, the words come from ``bot/messages.py``. A workspace
that refuses streaming is remembered for an hour (``Delivery.refused_capabilities``), so its later
answers edit directly.

Slack redelivers events it believes were not acknowledged; a claim on the event id (and on the
message itself) makes sure one question gets one answer.

Admins (``slack.admins``) have a slash command: ``/kbbot status`` (knowledge version, sources, last
and next runs, services) and ``/kbbot refresh [SOURCE]``; the command is acknowledged at once and
the result is posted to its ``response_url`` (visible to the admin only). Others are politely refused,
in the language of their preferences.

What kbbot remembers (``bot/state/cache.py``, ``bot/state/preferences.py``):

- reviewers (``slack.reviewers``: user ids, or team id -> user ids) see "✅ Approve" under a thread's
  first answer (one the Answerer offered to the answer cache). A click approves by turn id (the
  server holds the answer) and the message then says who approved it, with "Withdraw approval";
  answers served from the cache carry "Withdraw approval" too. Anyone else's click is refused in an
  ephemeral message (``chat.postEphemeral``) and changes nothing; so is a click on an expired turn;
- after a refresh changed what an approved answer cites, its reviewer (or ``approvals.reviewers_channel``)
  gets the old and the new answer with "Keep approved" / "Retire" (``adapters/slack/loop.py``,
  ``bot/knowledge/loop/recheck.py``), reviewers only like the approval buttons;
- everyone has ``/kbbot prefs …``, ``/kbbot remember on|off`` and ``/kbbot forget`` (answered
  ephemerally in the ack);
- a reply in a thread kbbot could not answer (or whose answer got a 👎), by someone other than the asker,
  is not answered but shown to the reviewers in ephemeral notes with "Save as approved answer" and "Add
  to the knowledge base" (``bot/knowledge/loop/expert.py``); follow-ups of questions a refresh answered
  are posted here through ``reply_to`` (``bot/knowledge/loop/followups.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.http import slack_refusal, slack_signature_problem, slack_trace_config
from adapters.slack.loop import KEEP_ACTION, RETIRE_ACTION, decided_blocks, recheck_blocks, recheck_text
from adapters.slack.reply import SlackMessages, SlackThread, error_code, make_client, make_rates, post_scope
from adapters.slack.settings import SlackSettings
from adapters.slack.text import (
    APPROVE_ACTION,
    EXPERT_APPROVE_ACTION,
    EXPERT_CAPTURE_ACTION,
    FEEDBACK_ACTION,
    WITHDRAW_ACTION,
    expert_blocks,
    mrkdwn_escape,
    neutralise,
    notification_text,
    question_text,
    review_block,
    review_text,
    reviewed_blocks,
)
from bot.conversation import AdminStatus, Conversations, ReviewStatus
from bot.delivery.gate import Access, Delivery
from bot.delivery.pending import PendingTurn
from bot.delivery.rates import PlatformRates
from bot.delivery.reply import ChatReply, split_message
from bot.delivery.turns import Accepted, Arrival
from bot.knowledge.loop.expert import MAX_REPLY_CHARS, ExpertReplies
from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say
from bot.platform import Reviewers
from bot.preference_commands import VERBS as PREFERENCE_VERBS
from bot.settings.base import reveal
from bot.state.feedback import Feedback
from bot.types import Inquiry

log = logging.getLogger("kbbot.slack")

SLASH_COMMAND = "/kbbot"
#: How the catalogue's words name this platform's commands and settings.
NAMES = {"commands": "`/kbbot status` and `/kbbot refresh`", "admins": "`slack.admins`",
         "reviewers": "`slack.reviewers`", "approved_answers": " (`approvals.enabled`)"}

#: Errors meaning this workspace or token cannot stream at all (remembered, so later answers edit directly).
WORKSPACE_STREAM_REFUSALS = frozenset({
    "unknown_method", "not_allowed_token_type", "method_deprecated", "missing_scope", "feature_not_enabled",
    "not_supported", "team_not_allowed", "access_denied",
})


#: A Slack user id (``U…``, or ``W…`` in an Enterprise Grid): what an owner or reviewer listed for Slack looks like.
SLACK_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")

#: Where the listener middleware leaves the question it accepted for the listener (bolt's request context).
ACCEPTED = "kbbot_question"


@dataclasses.dataclass(frozen=True)
class Question:
    """A question accepted before its event's acknowledgement, to be answered after it."""

    where: SlackThread
    accepted: Accepted


def _click_team(body: dict[str, Any]) -> str:
    """The workspace a block action (button click) came from."""
    return str((body.get("team") or {}).get("id") or (body.get("user") or {}).get("team_id") or "")


@dataclasses.dataclass(frozen=True)
class Click:
    """A block action (a button click), as every click handler reads it."""

    action_id: str
    value: str
    user: str
    name: str  # the clicker's user name, as Slack sends it with the click
    team: str
    channel: str
    ts: str  # the message clicked on
    thread_ts: str | None
    message: dict[str, Any]

    @classmethod
    def of(cls, body: dict[str, Any]) -> Click:
        action = (body.get("actions") or [{}])[0]
        who = body.get("user") or {}
        container = body.get("container") or {}
        message = body.get("message") or {}
        return cls(action_id=str(action.get("action_id") or ""), value=str(action.get("value") or ""),
                   user=str(who.get("id") or ""), name=str(who.get("name") or who.get("username") or ""),
                   team=_click_team(body),
                   channel=str((body.get("channel") or {}).get("id") or container.get("channel_id") or ""),
                   ts=str(container.get("message_ts") or message.get("ts") or ""),
                   thread_ts=message.get("thread_ts") or container.get("thread_ts"), message=message)


class SlackAdapter:
    """Bolt ``AsyncApp`` with kbbot's listeners; ``handle_http`` serves ``/slack/events``."""

    name = "slack"
    #: Slack's user ids are unique across workspaces: principals are read without a tenant.
    tenant = ""

    def __init__(self, conversations: Conversations, settings: SlackSettings, *, client: AsyncWebClient | None = None,
                 rates: PlatformRates | None = None, reviewers_channel: str = "", digest_to: str = ""):
        self.conversations = conversations
        self.settings = settings
        self.reviewers = Reviewers(reviewers_channel, settings.all_reviewers())
        self.digest_to = digest_to
        self.rates = rates or make_rates(settings)
        self.client = client or make_client(settings)
        self.app = AsyncApp(
            name="kbbot",
            client=self.client,
            signing_secret=reveal(settings.signing_secret),
            request_verification_enabled=not settings.socket_mode,
            process_before_response=False,  # ack first, answer after
            attaching_conversation_kwargs_enabled=False,
            logger=logging.getLogger("kbbot.slack.bolt"),
        )
        self.app.use(self._received)
        # A question is accepted (recorded as pending and claimed) in listener middleware, which bolt runs
        # before it acknowledges the event; the listener answers it after the acknowledgement.
        self.app.event("app_mention", middleware=[self._accept_mention])(self._on_question)
        self.app.event("message", middleware=[self._accept_message])(self._on_question)
        self.app.action(FEEDBACK_ACTION)(self._on_feedback)
        self.app.action(APPROVE_ACTION)(self._on_review)
        self.app.action(WITHDRAW_ACTION)(self._on_review)
        self.app.action(KEEP_ACTION)(self._on_recheck)
        self.app.action(RETIRE_ACTION)(self._on_recheck)
        self.app.action(EXPERT_APPROVE_ACTION)(self._on_expert_click)
        self.app.action(EXPERT_CAPTURE_ACTION)(self._on_expert_click)
        self.app.command(SLASH_COMMAND)(self._on_command)
        self.delivery = Delivery(conversations.turns if conversations is not None else None, self)
        self.delivery.check(self._team_allowed)
        self.delivery.check(self._place_allowed)
        self._threads: dict[str, float] = {}  # thread key -> until when it counts as answered here
        self._socket: Any = None
        self._session: aiohttp.ClientSession | None = None
        self._bot_id: str | None = None

    # --- serving ------------------------------------------------------------------------------
    def mount(self, web_app: web.Application, path: str = "/slack/events") -> None:
        if not self.settings.socket_mode:
            web_app.router.add_post(path, self.handle_http)

    async def handle_http(self, request: web.Request) -> web.Response:
        if problem := slack_signature_problem(request.headers):
            return slack_refusal(request, problem)
        response = await self.app.async_dispatch(await to_bolt_request(request))
        return await to_aiohttp_response(response)

    async def start(self) -> None:
        if self.client.session is None:
            # One connection pool for every Web API call (bolt's per-request clients share the
            # client's session): otherwise each call opens a connection of its own, with its TLS
            # handshake, which in a burst of mentions delays every acknowledgement and answer.
            # Bolt copies this session into its per-request clients, so every call is counted once.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.client.timeout),
                                                  trace_configs=[slack_trace_config()])
            self.client.session = self._session
        if self.settings.socket_mode:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler  # Socket Mode only (websockets)

            self._socket = AsyncSocketModeHandler(self.app, app_token=reveal(self.settings.app_token))
            await self._socket.connect_async()
            log.info("Slack: connected in Socket Mode")
        else:
            log.info("Slack: receiving events at /slack/events")

    async def stop(self, timeout_s: float = 30.0) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        await self.drain(timeout_s)
        if self._session is not None:
            self.client.session = None
            await self._session.close()
            self._session = None

    def health(self) -> dict[str, Any]:
        return {"mode": "socket" if self.settings.socket_mode else "events_api",
                "turns_in_progress": self.delivery.in_progress}

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for the turns in progress (shutdown)."""
        await self.delivery.drain(timeout_s)

    async def settle(self, quiet_s: float = 0.05) -> None:
        """Wait until every acknowledged event has been handled (tests)."""
        await self.delivery.settle(quiet_s)

    # --- access checks (registered once with the delivery layer's gate) ----------------------------
    def _team_allowed(self, access: Access) -> str | None:
        """Questions, clicks and commands come from workspaces ``slack.allowed_teams`` admits."""
        if self.settings.allowed_teams and access.tenant not in self.settings.allowed_teams:
            return f"workspace {access.tenant or '?'} is not in slack.allowed_teams"
        return None

    def _place_allowed(self, access: Access) -> str | None:
        """Questions in a DM when ``slack.direct_messages``, else in ``slack.allowed_channels``."""
        if access.what != "question":
            return None
        if access.private:
            return None if self.settings.direct_messages else "direct messages are off (slack.direct_messages)"
        if self.settings.allowed_channels and access.chat not in self.settings.allowed_channels:
            return f"channel {access.chat} is not in slack.allowed_channels"
        return None

    # --- listeners ----------------------------------------------------------------------------
    async def _received(self, req: Any, body: dict[str, Any], next: Callable[[], Awaitable[Any]]) -> None:
        """Bolt middleware: every event callback is logged (``Delivery.received``) before a listener runs."""
        if body.get("type") == "event_callback":
            event = body.get("event") or {}
            retry = (req.headers.get("x-slack-retry-num") or [""])[0]
            self.delivery.received(str(event.get("type") or ""), str(body.get("event_id") or ""),
                                   f"{event.get('channel') or '?'} at {event.get('ts') or '?'}", retry=retry)
        await next()

    def _admit_question(self, body: dict[str, Any], event: dict[str, Any], context: Any, *, is_dm: bool) -> bool:
        return self.delivery.admit(Access("question", str(event.get("user") or ""), self._team(body, event, context),
                                          str(event.get("channel") or ""), private=is_dm))

    async def _accept_mention(self, body: dict[str, Any], event: dict[str, Any], context: Any,
                              next: Callable[[], Awaitable[None]]) -> None:
        """Listener middleware: runs before bolt acknowledges the event (``_accept``)."""
        if not (event.get("bot_id") or event.get("edited") or event.get("subtype")):
            thread_ts = event.get("thread_ts") or event["ts"]
            is_dm = event.get("channel_type") == "im" or str(event.get("channel", "")).startswith("D")
            if self._admit_question(body, event, context, is_dm=is_dm):
                context[ACCEPTED] = await self._accept(body, event, context, thread_ts=thread_ts, kind="mention",
                                                       is_dm=is_dm)
        await next()

    async def _accept_message(self, body: dict[str, Any], event: dict[str, Any], context: Any,
                              next: Callable[[], Awaitable[None]]) -> None:
        """Listener middleware: runs before bolt acknowledges the event (``_accept``)."""
        context[ACCEPTED] = await self._message_question(body, event, context)
        await next()

    async def _message_question(self, body: dict[str, Any], event: dict[str, Any], context: Any) -> Question | None:
        # Edits (message_changed), deletions, bot posts and joins all carry a subtype.
        if event.get("subtype") not in (None, "thread_broadcast", "file_share"):
            return None
        bot_user_id = context.bot_user_id
        if event.get("bot_id") or not event.get("user") or event.get("user") == bot_user_id:
            return None
        if event.get("channel_type") == "im":
            if self._admit_question(body, event, context, is_dm=True):
                return await self._accept(body, event, context, thread_ts=event.get("thread_ts") or event["ts"],
                                          kind="dm", is_dm=True)
            return None
        thread_ts = event.get("thread_ts")
        if thread_ts and thread_ts != event.get("ts") and await self._expert_reply(body, event, context, thread_ts):
            return None  # kept for the reviewers, not a question
        if not thread_ts or thread_ts == event.get("ts") or not self.settings.follow_ups:
            return None  # top-level channel messages are answered only when they mention kbbot
        if bot_user_id and f"<@{bot_user_id}" in (event.get("text") or ""):
            return None  # this one also arrives as app_mention
        if not self._admit_question(body, event, context, is_dm=False):
            return None
        team = self._team(body, event, context)
        key = SlackThread(team, event["channel"], thread_ts, event["user"]).key
        if not await self._answered_here(key):
            return None
        return await self._accept(body, event, context, thread_ts=thread_ts, kind="follow_up", is_dm=False)

    # --- expert replies (bot/knowledge/loop/expert.py) ------------------------------------------------
    async def _expert_reply(self, body: dict[str, Any], event: dict[str, Any], context: Any, thread_ts: str) -> bool:
        """A reply by someone other than the asker in a thread kbbot could not answer: offered to the
        workspace's reviewers after the acknowledgement (ephemeral notes with the two buttons)."""
        team, channel, user = self._team(body, event, context), str(event["channel"]), str(event["user"])
        key = SlackThread(team, channel, thread_ts, user).key
        if not self.delivery.admit(Access("question", user, team, channel)):
            return False
        if not await self.conversations.is_expert_reply(key, user):
            return False
        text = str(event.get("text") or "")
        if ExpertReplies.too_long(text):  # reviewers would not see it whole: its author is told, the thread stays open
            self.delivery.background(asyncio.create_task(self._too_long(team, channel, thread_ts, user)))
            return True
        link = f"https://app.slack.com/client/{team}/{channel}/thread/{channel}-{thread_ts}"
        self.delivery.background(asyncio.create_task(self._offer_expert_reply(team, channel, thread_ts, key, user,
                                                                              text, link)))
        return True

    async def _too_long(self, team: str, channel: str, thread_ts: str, user: str) -> None:
        language = await self.conversations.user_language("slack", team, user) or "en"
        await self.rates.acquire(team, "chat.postEphemeral")
        await self._ephemeral(self.client, channel, user,
                              say("expert_too_long", language, limit=f"{MAX_REPLY_CHARS:,}"), thread_ts)

    async def _offer_expert_reply(self, team: str, channel: str, thread_ts: str, key: str, user: str, text: str,
                                  link: str) -> None:
        reviewers = self.settings.reviewers_of(team)
        if not reviewers:
            log.info("thread %s: a reply by %s could be kept, but slack.reviewers names nobody", key, user)
            return
        reply = await self.conversations.expert_reply(key, author=user, author_name=await self._name_of(user),
                                                      text=text, link=link)
        if reply is None:
            return
        approve = self.conversations.kept.approved is not None
        capture = self.conversations.expert is not None and self.conversations.expert.capture_to is not None
        for reviewer in reviewers:
            language = await self.conversations.user_language("slack", team, reviewer) or "en"
            blocks = expert_blocks(reply, capture=capture, approve=approve, language=language)
            try:
                await self.rates.acquire(team, "chat.postEphemeral")
                await self.client.chat_postEphemeral(channel=channel, user=reviewer, thread_ts=thread_ts, blocks=blocks,
                                                     text=say("expert_offer", language, author=f"<@{user}>",
                                                              question="…"))
            except SlackApiError as exc:  # not in the channel, say: the others may still see it
                log.warning("thread %s: reviewer %s cannot see the expert reply note (%s)", key, reviewer,
                            error_code(exc))

    async def _name_of(self, user: str) -> str:
        """The user's display name for a kept reply; the id when Slack does not say."""
        try:
            profile = ((await self.client.users_info(user=user)).get("user") or {}).get("profile") or {}
            return str(profile.get("display_name") or profile.get("real_name") or user)
        except SlackApiError:
            return user

    async def _on_expert_click(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any],
                               client: AsyncWebClient) -> None:
        """"Save as approved answer" / "Add to the knowledge base" on an expert reply: reviewers only."""
        click = Click.of(body)
        if not await self._admitted(ack, click, click.value):
            return
        user, team, channel = click.user, click.team, click.channel
        capture = click.action_id == EXPERT_CAPTURE_ACTION
        result = await self.conversations.keep_expert_reply(
            click.value, capture=capture, reviewer=user, name=click.name or user,
            is_reviewer=self.settings.is_reviewer(team, user))
        language = await self.conversations.user_language("slack", team, user) or "en"
        status = result.status.value
        key = f"expert_{status}_{'capture' if capture else 'approve'}" if status == "done" else f"expert_{status}"
        text = say(key, language, detail=mrkdwn_escape(result.detail), user=f"<@{user}>", reviewers="`slack.reviewers`")
        await self._ephemeral(client, channel, user, text, click.thread_ts)

    async def _admitted(self, ack: Callable[[], Awaitable[Any]], click: Click, turn_id: str) -> bool:
        """The delivery gate's checks of a click, then its acknowledgement (a refused click is still
        acknowledged, as Slack expects within 3 s, and does nothing)."""
        admitted = self.delivery.admit(Access("click", click.user, click.team, click.channel, turn_id=turn_id))
        await ack()
        return admitted

    async def _on_question(self, context: Any, client: AsyncWebClient) -> None:
        """After the acknowledgement: the question its middleware accepted, if any, answered in its thread."""
        question: Question | None = context.get(ACCEPTED)
        if question is not None:
            await self.delivery.answer(question.accepted, self._reply(client, question.where))

    async def _on_feedback(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        click = Click.of(body)
        rating, _, turn_id = click.value.partition(":")
        if not await self._admitted(ack, click, turn_id):
            return
        if rating not in ("up", "down"):
            log.warning("ignoring a feedback click without a rating: %r", click.value)
            return
        item = Feedback(turn_id=turn_id, rating=rating, user_id=click.user, tenant=click.team, channel=click.channel,
                        message_id=click.ts, platform="slack")
        await self.conversations.record_feedback(item)

    async def _ephemeral(self, client: AsyncWebClient, channel: str, user: str, text: str,
                         thread_ts: str | None) -> None:
        try:
            await client.chat_postEphemeral(channel=channel, user=user, text=text,
                                            **({"thread_ts": thread_ts} if thread_ts else {}))
        except SlackApiError as exc:
            log.warning("could not tell %s in %s ephemerally: %s", user, channel, error_code(exc))

    async def _on_review(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any],
                         client: AsyncWebClient) -> None:
        """A click on "✅ Approve" or "Withdraw approval": reviewers only, by turn id."""
        click = Click.of(body)
        approving, turn_id = click.action_id == APPROVE_ACTION, click.value
        if not await self._admitted(ack, click, turn_id):
            return
        user, team, channel, ts, thread_ts, message = (click.user, click.team, click.channel, click.ts,
                                                       click.thread_ts, click.message)
        language = await self.conversations.user_language("slack", team, user) or "en"  # Slack does not tell
        review = await self.conversations.review(
            turn_id, approving=approving, reviewer=self.settings.is_reviewer(team, user), user=user,
            display_name=click.name, tenant=f"slack:{team}")
        if review.status not in (ReviewStatus.APPROVED, ReviewStatus.WITHDRAWN):
            await self._ephemeral(client, channel, user, review_text(review.status, language, **NAMES), thread_ts)
            return
        answer_text = None
        if review.answer is not None:
            answer_text = split_message(neutralise(review.answer.text.strip()), self.settings.max_message_chars)[-1]
        note = review_text(review.status, language, user=f"<@{user}>")
        blocks = reviewed_blocks(list(message.get("blocks") or []), note,
                                 review_block(turn_id, approved=approving, language=language), answer_text)
        if blocks is None or not channel or not ts:
            await self._ephemeral(client, channel, user, note, thread_ts)
            return
        try:
            await self.rates.acquire(team, "chat.update")
            await client.chat_update(channel=channel, ts=ts, blocks=blocks,
                                     text=notification_text(str(message.get("text") or note)))
        except SlackApiError as exc:
            log.warning("turn %s: could not update the reviewed message (%s)", turn_id, error_code(exc))
            await self._ephemeral(client, channel, user, note, thread_ts)

    # --- the knowledge loop (bot/knowledge/loop): re-checked approvals, messages to reviewers ----------------------
    async def post_recheck(self, channel: str, request: RecheckRequest) -> bool:
        """The re-check of an approval with "Keep approved" / "Retire" in ``channel`` (a user id: their DM)."""
        team = request.tenant.partition(":")[2]
        try:
            await self.rates.acquire(post_scope(team, channel), "chat.postMessage")
            await self.client.chat_postMessage(channel=channel, text=recheck_text(request),
                                               blocks=recheck_blocks(request), unfurl_links=False)
        except SlackApiError as exc:
            log.warning("turn %s: the re-check could not be posted to %s (%s)", request.turn_id, channel,
                        error_code(exc))
            return False
        return True

    async def send_note(self, to: str, text: str) -> bool:
        """``text`` escaped and its mentions made inert, to a channel or a user's DM (``chat.postMessage``
        to the user id), one message per ``slack.max_message_chars``, inside that channel's budget (a note
        names no workspace: its scope has none)."""
        try:
            for part in split_message(mrkdwn_escape(neutralise(text)), self.settings.max_message_chars):
                await self.rates.acquire(post_scope("", to), "chat.postMessage")
                await self.client.chat_postMessage(channel=to, text=part, unfurl_links=False)
        except SlackApiError as exc:
            log.warning("could not post to %s (%s)", to, error_code(exc))
            return False
        return True

    def owns(self, user: str) -> bool:
        return bool(SLACK_USER_ID.fullmatch(user))

    async def _on_recheck(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any],
                          client: AsyncWebClient) -> None:
        """A click on "Keep approved" or "Retire" under a re-checked approval: reviewers only, by turn id."""
        click = Click.of(body)
        keep, turn_id = click.action_id == KEEP_ACTION, click.value
        if not await self._admitted(ack, click, turn_id):
            return
        user, team, channel = click.user, click.team, click.channel
        language = await self.conversations.user_language("slack", team, user) or "en"
        review = await self.conversations.decide_recheck(
            turn_id, keep=keep, reviewer=self.settings.is_reviewer(team, user), user=user,
            display_name=click.name)
        if review.status not in (ReviewStatus.KEPT, ReviewStatus.RETIRED):
            await self._ephemeral(client, channel, user, review_text(review.status, language, **NAMES), None)
            return
        note = review_text(review.status, language, user=f"<@{user}>")
        try:
            await self.rates.acquire(team, "chat.update")
            await client.chat_update(channel=channel, ts=click.ts, text=note,
                                     blocks=decided_blocks(list(click.message.get("blocks") or []), note))
        except SlackApiError as exc:
            log.warning("turn %s: could not update the re-check message (%s)", turn_id, error_code(exc))
            await self._ephemeral(client, channel, user, note, None)

    async def _on_command(self, ack: Callable[..., Awaitable[Any]], command: dict[str, Any],
                          respond: Callable[..., Awaitable[Any]]) -> None:
        """``/kbbot prefs|remember|forget`` for everyone (answered in the ack, visible to the user only);
        ``/kbbot status`` and ``/kbbot refresh [SOURCE]`` for admins (the result goes to response_url)."""
        user = str(command.get("user_id") or "")
        team = str(command.get("team_id") or "")
        if not self.delivery.admit(Access("command", user, team, str(command.get("channel_id") or ""))):
            await ack(text=say("not_allowed", "en"))  # a stranger's workspace has no preferences here
            return
        verb, _, rest = " ".join(str(command.get("text") or "").split()).partition(" ")
        verb = verb.lower()
        if verb in PREFERENCE_VERBS:
            text = await self.conversations.preference_command("slack", team, user, [verb, *rest.split()],
                                                           prefix=f"{SLASH_COMMAND} ",
                                                           channel=str(command.get("channel_id") or ""))
            await ack(text=text)
            return
        language = await self.conversations.user_language("slack", team, user) or "en"  # Slack does not tell
        if verb not in ("status", "refresh"):
            await ack(text=say("slack_usage", language))
            return

        async def started(source: str | None) -> None:
            if verb == "status":
                await ack()
            else:
                await ack(text=say("refreshing", language, what=f"`{source}`" if source else say("every_source",
                                                                                                 language)))

        result = await self.conversations.admin_command(verb, rest.strip() or None, user=user,
                                                        is_admin=user in self.settings.admins, started=started,
                                                        language=language)
        if result.status in (AdminStatus.NOT_ADMIN, AdminStatus.UNAVAILABLE, AdminStatus.REFUSED):
            await ack(text=result.text if result.status is AdminStatus.REFUSED else
                      say(f"admin_{result.status.value}", language, **NAMES))
            return
        text = result.text if result.status is AdminStatus.DONE else say("admin_failed", language)
        try:
            await respond(text=mrkdwn_escape(text), response_type="ephemeral")
        except Exception:
            log.exception("could not post the /kbbot %s result", verb)

    # --- one turn --------------------------------------------------------------------------------
    @staticmethod
    def _team(body: dict[str, Any], event: dict[str, Any], context: Any) -> str:
        return str(event.get("team") or body.get("team_id") or getattr(context, "team_id", None) or "")

    async def _answered_here(self, thread_key: str) -> bool:
        until = self._threads.get(thread_key)
        if until is not None and until > time.monotonic():
            return True
        return await self.conversations.answered_before(thread_key)

    def _remember_thread(self, thread_key: str) -> None:
        now = time.monotonic()
        if len(self._threads) > 10000:
            self._threads = {k: t for k, t in self._threads.items() if t > now}
        self._threads[thread_key] = now + self.settings.thread_memory_s

    def _streaming_allowed(self, team: str) -> bool:
        return self.settings.stream_mode == "native" and not self.delivery.refused_capabilities.refused(f"stream:{team}")

    def _stream_refused(self, team: str, code: str) -> None:
        if code in WORKSPACE_STREAM_REFUSALS:
            log.warning("workspace %s refuses streaming (%s); answering with chat.update for %.0f min",
                        team, code, self.delivery.refused_capabilities.retry_s / 60)
            self.delivery.refused_capabilities.refuse(f"stream:{team}")

    async def _accept(self, body: dict[str, Any], event: dict[str, Any], context: Any, *, thread_ts: str, kind: str,
                      is_dm: bool) -> Question | None:
        """A question that passed the gate, accepted (``Delivery.accept``: recorded as pending, then
        claimed) before bolt acknowledges its event; None when there is nothing to answer (a redelivery)."""
        team = self._team(body, event, context)
        channel = str(event.get("channel") or "")
        user = str(event.get("user") or "")
        if not channel:
            return None
        event_id = str(body.get("event_id") or "")
        keys = [f"slack:event:{event_id}"] if event_id else []
        keys.append(f"slack:message:{team}:{channel}:{event.get('ts')}")
        where = SlackThread(team=team, channel=channel, thread_ts=thread_ts, user=user, is_dm=is_dm,
                            question_ts=str(event.get("ts") or ""))
        inquiry = Inquiry(platform="slack", tenant=team, channel=channel, thread_key=where.key, user_id=user,
                          text=question_text(event.get("text") or "", context.bot_user_id),
                          spaces=self.settings.spaces_for(channel), private=is_dm,
                          reply_to=dataclasses.asdict(where))
        if self._bot_id is None and getattr(context, "bot_id", None):
            self._bot_id = str(context.bot_id)  # bolt's own auth.test said it: no call of ours
        accepted = await self.delivery.accept(Arrival(
            inquiry, keys, event_id, kind, target=dataclasses.asdict(where), ttl_s=self.settings.dedupe_ttl_s,
            lease_s=self.settings.claim_lease_s, crashed=say("crashed", "en")))
        if accepted is None:
            log.info("event %s (%s in %s) was already handled; not answering twice", event_id, kind, channel)
            return None
        self._remember_thread(where.key)
        return Question(where, accepted)

    def _reply(self, client: AsyncWebClient, where: SlackThread) -> ChatReply:
        return ChatReply(SlackMessages(client, where, self.settings, self.rates,
                                       native=self._streaming_allowed(where.team),
                                       on_stream_refused=lambda code: self._stream_refused(where.team, code),
                                       background=self.delivery.background), name=where.key)

    # --- what the delivery layer asks of Slack (bot.delivery.Platform) ------------------------------
    async def account(self) -> str:
        """``slack:{bot id}`` of the bot token (one ``auth.test``): two Slack apps on one Redis never
        take over each other's questions."""
        if self._bot_id is None:
            self._bot_id = str((await self.client.auth_test()).get("bot_id") or "")
        return f"slack:{self._bot_id}"

    def rebuild(self, turn: PendingTurn) -> ChatReply:
        return self.reply_to(turn.target)

    def reply_to(self, target: dict[str, Any]) -> ChatReply:
        where = SlackThread(**target)
        self._remember_thread(where.key)
        return self._reply(self.client, where)

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        await self.rates.acquire(str(target["team"]), "chat.delete")
        try:
            await self.client.chat_delete(channel=str(target["channel"]), ts=message_id)
        except SlackApiError as exc:
            if error_code(exc) != "message_not_found":
                raise
        return True

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        await self.rates.acquire(str(target["team"]), "chat.update")
        await self.client.chat_update(channel=str(target["channel"]), ts=message_id, text=f"_{text}_")
