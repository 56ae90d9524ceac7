"""The Teams platform: channel mentions, personal and group chats in; streamed, cited answers out.

Teams posts every activity to ``POST /api/messages`` on ``kbbot serve``'s web server, each with a Bot
Framework JWT checked first (``adapters.teams.auth.ActivityAuth``: 401 and one log line when it does not
prove the activity came from the Bot Connector for this app). The activity is read with the Teams SDK's
own models (``ActivityTypeAdapter``) and answered at once: a question is accepted (recorded as pending,
then claimed: ``bot.delivery``) before the 200, its turn runs after; commands run after the 200 too;
invokes (👍/👎 through the feedback loop, the reviewers' Adaptive Card buttons) are answered in the
response itself, as Teams expects.

- A channel message that @mentions kbbot is answered in its reply chain (posting to the activity's
  ``19:…;messageid=<root>`` conversation); a later message in that chain, mentioning kbbot or not (Teams
  delivers those with the ``ChannelMessage.Read.Group`` permission), is a follow-up with the chain's
  history, or, after kbbot could not answer, someone else's reply offered to the reviewers
  (``bot/knowledge/loop/expert.py``) in their personal chats with two buttons. A personal chat is
  answered directly; a group chat when kbbot is mentioned. The thread key is the reply chain, or the chat.
- Commands, typed as a message (``/`` optional, the bot's mention stripped): ``help``, ``new`` (a fresh
  thread), ``prefs …``, ``remember on|off``, ``forget`` (``bot.preference_commands``) for everyone;
  ``status`` and ``refresh [SOURCE]`` for ``teams.admins``.
- Access: ``teams.allowed_tenants``, ``allowed_teams``, ``allowed_channels`` and ``allowed_users``, as
  checks registered once with the delivery layer's gate; a user not allowed is told once in 30 days.
- Replies: ``adapters/teams/reply.py`` (streaming, edits, rates); texts and cards:
  ``adapters/teams/text.py``; calls to the Bot Connector: ``adapters/teams/connector.py``. Each activity's
  ``serviceUrl`` is kept with its conversation's reply target; messages kbbot starts (reviewers' notes,
  re-checks, the digest) go through the last one seen in the tenant, else ``teams.service_url``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from typing import Any
from urllib.parse import quote

import httpx
from aiohttp import web
from microsoft_teams.api import (
    Account,
    ActivityTypeAdapter,
    CreateConversationParams,
    MessageActivityInput,
)
from pydantic import ValidationError

from adapters.teams.auth import ActivityAuth, BotTokens
from adapters.teams.connector import Connector, error_of
from adapters.teams.reply import AnswerTurns, TeamsMessages, TeamsPlace, make_rates, take_send_budget
from adapters.teams.settings import TeamsSettings
from adapters.teams.text import (
    CARD,
    EXPERT_APPROVE,
    EXPERT_CAPTURE,
    RECHECK_KEEP,
    RECHECK_RETIRE,
    REVIEW_APPROVE,
    REVIEW_WITHDRAW,
    card,
    card_action,
    card_message,
    expert_actions,
    language_of,
    neutralise,
    plain_parts,
    recheck_actions,
    recheck_text,
    review_actions,
)
from bot.conversation import AdminStatus, Conversations, ReviewStatus
from bot.delivery.gate import Access, Delivery
from bot.delivery.pending import PendingTurn
from bot.delivery.rates import PlatformRates
from bot.delivery.reply import ChatReply, RetryAfter
from bot.delivery.turns import Arrival
from bot.knowledge.loop.expert import MAX_REPLY_CHARS, ExpertReplies
from bot.knowledge.loop.recheck import RecheckRequest
from bot.messages import say
from bot.platform import Reviewers
from bot.preference_commands import VERBS as PREFERENCE_VERBS
from bot.settings.base import reveal
from bot.state.feedback import Feedback
from bot.types import Inquiry

log = logging.getLogger("kbbot.teams")

#: How the catalogue's words name this platform's commands and settings.
NAMES = {"commands": "status and refresh", "admins": "teams.admins", "reviewers": "teams.reviewers"}
#: Commands and the most words each takes without a ``/`` (more: a question that starts with the word).
COMMANDS = {"help": 1, "new": 1, "status": 1, "forget": 1, "refresh": 2, "remember": 2,
            **{verb: 3 for verb in PREFERENCE_VERBS}}
#: An Adaptive Card action's answer in the invoke response: a message shown to the clicker.
CARD_REPLY = "application/vnd.microsoft.activity.message"


def _field(value: Any) -> str:
    return "".join(c for c in str(value if value is not None else "?") if c.isprintable())[:64]


class TeamsAdapter:
    """``POST /api/messages`` and what Teams' activities become (see the module)."""

    name = "teams"
    #: Principals are read by user id (``29:…``, unique in the tenant; no directory yet).
    tenant = ""

    def __init__(self, conversations: Conversations, settings: TeamsSettings, *, rates: PlatformRates | None = None,
                 redis: Any = None, prefix: str = "kbbot:", auth: ActivityAuth | None = None,
                 connector: Connector | None = None):
        self.conversations = conversations
        self.settings = settings
        self.app_id = reveal(settings.app_id)
        self.bot_id = f"28:{self.app_id}"
        self.reviewers = Reviewers("", list(settings.reviewers))
        self.digest_to = settings.digest_to or ""
        self.rates = rates or make_rates(settings)
        self.auth = auth or ActivityAuth(self.app_id, openid_url=settings.openid_url)
        self.connector = connector or Connector(BotTokens(
            self.app_id, reveal(settings.app_secret), reveal(settings.tenant_id) or "botframework.com",
            login_url=settings.login_url))
        self.answers = AnswerTurns(redis, prefix)
        self.delivery = Delivery(conversations.turns if conversations is not None else None, self)
        self.delivery.check(self._tenant_allowed)
        self.delivery.check(self._place_allowed)
        self.delivery.check(self._user_allowed)
        #: What activities told: the connector of each tenant, the team of each channel, users' object ids,
        #: the personal chat with each user kbbot wrote to.
        self._service_urls: dict[str, str] = {}
        self._teams_of: dict[str, str] = {}
        self._object_ids: dict[str, str] = {}
        self._chats: dict[str, str] = {}
        #: User id -> a conversation they wrote in (where the connector describes them: ``directory``).
        self.seen: dict[str, str] = {}
        #: Microsoft Graph for users' groups (``teams.graph_groups``; set by ``adapters.teams.build``), closed with the rest.
        self.graph: Any = None

    # --- serving ------------------------------------------------------------------------------------
    def mount(self, web_app: web.Application) -> None:
        web_app.router.add_post("/api/messages", self.handle)

    async def start(self) -> None:
        log.info("Teams: receiving activities at /api/messages for app %s", self.app_id)

    async def stop(self, timeout_s: float = 30.0) -> None:
        await self.delivery.drain(timeout_s)
        await self.connector.close()
        await self.auth.close()
        if self.graph is not None:
            await self.graph.close()

    def health(self) -> dict[str, Any]:
        return {"mode": "webhook", "turns_in_progress": self.delivery.in_progress}

    async def settle(self, quiet_s: float = 0.05) -> None:
        """Wait until every received activity has been handled (tests)."""
        await self.delivery.settle(quiet_s)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            log.warning("Teams: refused a request from %s that holds no activity", request.remote)
            return web.json_response({"error": "Bad Request"}, status=400)
        if (refusal := await self.auth.refusal(request, body)) is not None:
            return refusal
        try:
            activity = ActivityTypeAdapter.validate_python(body)
        except ValidationError as exc:
            log.warning("Teams: could not read %s activity %s (%d problems)", _field(body.get("type")),
                        _field(body.get("id")), len(exc.errors()))
            return web.json_response({"error": "Bad Request"}, status=400)
        conversation = activity.conversation
        self.delivery.received(str(activity.type), str(activity.id or ""), _field(conversation.id))
        tenant = self._tenant_of(activity)
        if activity.service_url and tenant:
            self._service_urls[tenant] = activity.service_url
        if activity.type == "message":
            await self._on_message(activity, tenant)
            return web.Response(status=200)
        if activity.type == "invoke":
            status, reply = await self._on_invoke(activity, tenant)
            return web.json_response(reply, status=status)
        return web.Response(status=200)

    # --- access checks (registered once with the delivery layer's gate) ------------------------------
    def _tenant_allowed(self, access: Access) -> str | None:
        if self.settings.allowed_tenants and access.tenant not in self.settings.allowed_tenants:
            return f"tenant {access.tenant or '?'} is not in teams.allowed_tenants"
        return None

    def _place_allowed(self, access: Access) -> str | None:
        """Questions and commands in channels of ``teams.allowed_teams`` and in ``teams.allowed_channels``
        (channels and group chats); personal chats are no place here."""
        if access.what == "click" or access.private:
            return None
        team = self._teams_of.get(access.chat)
        if self.settings.allowed_teams and team is not None and team not in self.settings.allowed_teams:
            return f"team {team} is not in teams.allowed_teams"
        if self.settings.allowed_channels and access.chat not in self.settings.allowed_channels:
            return f"conversation {access.chat} is not in teams.allowed_channels"
        return None

    def _user_allowed(self, access: Access) -> str | None:
        allowed = self.settings.allowed_users
        if allowed and access.user not in allowed and self._object_ids.get(access.user) not in allowed:
            return f"user {access.user} is not in teams.allowed_users"
        return None

    # --- who and where ---------------------------------------------------------------------------------
    @staticmethod
    def _tenant_of(activity: Any) -> str:
        tenant = getattr(activity.conversation, "tenant_id", None)
        if not tenant:
            channel_tenant = getattr(getattr(activity, "channel_data", None), "tenant", None)
            tenant = getattr(channel_tenant, "id", None)
        return str(tenant or "")

    def _place(self, activity: Any, tenant: str) -> TeamsPlace:
        conversation = activity.conversation
        kind = str(conversation.conversation_type or "personal")
        conversation_id = str(conversation.id)
        if kind == "channel" and ";messageid=" not in conversation_id:
            conversation_id = f"{conversation_id};messageid={activity.id}"  # a new post roots its own chain
        return TeamsPlace(service_url=str(activity.service_url), conversation=conversation_id, kind=kind,
                          tenant=tenant, user=str(activity.from_.id), question_id=str(activity.id or ""))

    def _access(self, activity: Any, place: TeamsPlace, what: str, turn_id: str | None = None) -> Access:
        """The gate's view of an activity; what the checks need beyond it is noted first."""
        team = getattr(getattr(activity, "channel_data", None), "team", None)
        if team is not None and getattr(team, "id", None):
            self._teams_of[place.base] = str(team.id)
        if activity.from_.aad_object_id:
            self._object_ids[place.user] = str(activity.from_.aad_object_id)
        self.seen[place.user] = place.base
        return Access(what, place.user, place.tenant, "" if place.personal else place.base, private=place.personal,
                      turn_id=turn_id)

    def _question(self, activity: Any) -> str:
        """The message's text without kbbot's mention (others' mentions as their names)."""
        text = activity.text or ""
        for entity in activity.entities or []:
            mentioned = getattr(entity, "mentioned", None)
            if getattr(entity, "type", None) == "mention" and mentioned is not None and mentioned.id == self.bot_id:
                text = text.replace(getattr(entity, "text", None) or f"<at>{mentioned.name}</at>", " ")
        text = re.sub(r"</?at>", "", text)  # someone else's mention: their name
        return re.sub(r"\s+", " ", text).strip()

    @staticmethod
    def _command(text: str) -> tuple[str, list[str]] | None:
        words = text.split()
        if not words:
            return None
        slash = words[0].startswith("/")
        verb = words[0].lstrip("/").lower()
        if verb not in COMMANDS:
            return ("help", []) if slash else None  # an unknown command: say what kbbot does
        if not slash and len(words) > COMMANDS[verb]:
            return None
        return verb, words[1:]

    def _keys(self, place: TeamsPlace, activity: Any) -> list[str]:
        return [f"teams:activity:{self.app_id}:{place.base}:{activity.id}"]

    # --- messages ------------------------------------------------------------------------------------------
    async def _on_message(self, activity: Any, tenant: str) -> None:
        if activity.from_.id == self.bot_id or getattr(activity.from_, "role", None) == "bot":
            return
        place = self._place(activity, tenant)
        text = self._question(activity)
        language = language_of(activity.locale, text)
        mentioned = activity.is_recipient_mentioned()
        if place.kind == "groupChat" and not mentioned:
            return  # a group chat talks among itself: only a mention is for kbbot
        command = self._command(text)
        access = self._access(activity, place, "command" if command else "question")
        if not self.delivery.admit(access):
            addressed = place.personal or mentioned or command is not None  # else maybe not meant for kbbot
            if addressed and self._user_allowed(access) is not None and self._tenant_allowed(access) is None \
                    and self._place_allowed(access) is None:
                self.delivery.background(asyncio.create_task(self._refuse_once(place, language)))
            return
        if command is not None:
            self.delivery.background(asyncio.create_task(self._on_command(activity, place, command, language)))
            return
        if place.kind == "channel" and not mentioned:
            # Teams delivers the chain's other messages only with ChannelMessage.Read.Group: an expert's reply
            # after kbbot could not answer, or a follow-up in a chain kbbot answered; anything else is chat.
            if await self.conversations.is_expert_reply(place.key, place.user):
                self.delivery.background(asyncio.create_task(self._offer_expert_reply(activity, place, text)))
                return
            if not await self.conversations.answered_before(place.key):
                return
        inquiry = Inquiry(platform="teams", tenant=tenant, channel=place.base, thread_key=place.key, user_id=place.user,
                          text=text, spaces=self.settings.spaces_for(place.base), private=place.personal,
                          reply_to={"place": dataclasses.asdict(place), "language": language})
        event_id = str(activity.id or "")
        accepted = await self.delivery.accept(Arrival(
            inquiry, self._keys(place, activity), event_id, place.kind, target=dict(inquiry.reply_to or {}),
            ttl_s=self.settings.dedupe_ttl_s, lease_s=self.settings.claim_lease_s, crashed=say("crashed", language)))
        if accepted is None:
            log.info("activity %s was already handled; not answering twice", event_id)
            return
        turn = self.delivery.answer(accepted, self._reply(place, language))
        self.delivery.background(asyncio.create_task(turn, name=f"turn {event_id}"))  # after the 200

    def _reply(self, place: TeamsPlace, language: str) -> ChatReply:
        refused = self.delivery.refused_capabilities
        stream = place.personal and self.settings.stream_mode == "stream" and not refused.refused(f"stream:{place.tenant}")

        def streams_refused() -> None:
            log.warning("tenant %s refuses streaming; posting and updating for %.0f min", place.tenant,
                        refused.retry_s / 60)
            refused.refuse(f"stream:{place.tenant}")

        async def final(message_id: str, turn_id: str) -> None:
            await self.answers.record(place.conversation, message_id, turn_id)

        # In a personal chat its user is the only one who could click; elsewhere any reviewer may.
        review = self.conversations.kept.approved is not None and (
            self.settings.is_reviewer(place.user) if place.personal else bool(self.settings.reviewers))
        return ChatReply(TeamsMessages(self.connector, place, self.settings, self.rates, stream=stream,
                                       language=language, on_stream_refused=streams_refused, on_final=final,
                                       review=review), name=place.key)

    async def _say(self, place: TeamsPlace, text: str) -> bool:
        """kbbot's words (escaped) where ``place`` is, inside its budgets; 429s slept out."""
        try:
            for part in plain_parts(text, self.settings.max_message_chars):
                await self._send(place, MessageActivityInput(text=part))
        except (httpx.HTTPError, RetryAfter) as exc:
            log.warning("%s: could not post (%s)", place.key, exc)
            return False
        return True

    async def _send(self, place: TeamsPlace, activity: Any, attempts: int = 4) -> str:
        for attempt in range(attempts):
            await take_send_budget(self.rates, place)
            try:
                sent = await self.connector.call(place.service_url, "post", lambda api: api.conversations.create_activity(
                    place.conversation, activity))
                return str(getattr(sent, "id", "") or "")
            except RetryAfter as wait:
                await self.rates.hold(place.base, "send", wait.seconds)
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(wait.seconds)
        raise AssertionError("unreachable")

    async def _refuse_once(self, place: TeamsPlace, language: str) -> None:
        log.info("user %s is not in teams.allowed_users", place.user)
        if await self.delivery.first_refusal(f"teams:{self.app_id}:{place.user}"):
            await self._say(place, say("refused", language))

    # --- commands --------------------------------------------------------------------------------------
    async def _on_command(self, activity: Any, place: TeamsPlace, command: tuple[str, list[str]], language: str) -> None:
        verb, words = command
        async with self.delivery.claimed(self._keys(place, activity), self.settings.dedupe_ttl_s,
                                         self.settings.claim_lease_s) as claim:
            if claim is None:
                log.info("activity %s was already handled; not answering twice", activity.id)
                return
            if verb == "help":
                await self._say(place, say("help", language))
            elif verb == "new":
                if not await self.conversations.start_afresh(place.key):
                    await claim.finish(answered=False)  # a redelivery may try again
                    await self._say(place, say("crashed", language))
                    return
                await self._say(place, say("new", language))
            elif verb in ("status", "refresh"):
                await self._admin(place, verb, words, language)
            else:
                text = await self.conversations.preference_command("teams", place.tenant, place.user, [verb, *words],
                                                                   prefix="", language=language, channel=place.base)
                await self._say(place, text)

    async def _admin(self, place: TeamsPlace, verb: str, words: list[str], language: str) -> None:
        async def started(source: str | None) -> None:
            if verb == "refresh":
                await self._say(place, say("refreshing", language, what=source or say("every_source", language)))

        result = await self.conversations.admin_command(verb, " ".join(words).strip() or None, user=place.user,
                                                        is_admin=place.user in self.settings.admins, started=started,
                                                        language=language)
        text = result.text if result.status in (AdminStatus.DONE, AdminStatus.REFUSED) else say(
            f"admin_{result.status.value}", language, **NAMES)
        await self._say(place, text)

    # --- invokes: 👍/👎 and the reviewers' buttons -------------------------------------------------------
    async def _on_invoke(self, activity: Any, tenant: str) -> tuple[int, Any]:
        name = getattr(activity, "name", "")
        place = self._place(activity, tenant)
        if name == "message/submitAction":
            return 200, await self._on_feedback(activity, place)
        if name == "adaptiveCard/action":
            return 200, await self._on_card(activity, place)
        log.info("Teams: ignoring an invoke %s", _field(name))
        return 200, {}

    async def _on_feedback(self, activity: Any, place: TeamsPlace) -> dict[str, Any]:
        value = activity.value
        action = getattr(value, "action_value", None)
        reaction = str(getattr(action, "reaction", "") or "")
        message_id = str(activity.reply_to_id or "")
        turn_id = (await self.answers.turn_of(place.conversation, message_id) or "") if message_id else ""
        if not self.delivery.admit(self._access(activity, place, "click", turn_id)):
            return {}
        rating = {"like": "up", "dislike": "down"}.get(reaction)
        if rating is None:
            log.warning("ignoring a feedback invoke without a reaction: %r", _field(reaction))
            return {}
        item = Feedback(turn_id=turn_id, rating=rating, user_id=place.user, tenant=place.tenant, channel=place.base,
                        message_id=message_id, platform="teams")
        await self.conversations.record_feedback(item)
        return {}

    async def _on_card(self, activity: Any, place: TeamsPlace) -> dict[str, Any]:
        verb, data = card_action(activity.value)
        language = await self.conversations.user_language("teams", place.tenant, place.user) or \
            language_of(activity.locale)
        user, name = place.user, str(activity.from_.name or place.user)
        if verb in (EXPERT_APPROVE, EXPERT_CAPTURE):
            reply_id = str(data.get("reply") or "")
            if not self.delivery.admit(self._access(activity, place, "click", reply_id)):
                return {}
            capture = verb == EXPERT_CAPTURE
            result = await self.conversations.keep_expert_reply(reply_id, capture=capture, reviewer=user, name=name,
                                                                is_reviewer=self.settings.is_reviewer(user))
            status = result.status.value
            key = f"expert_{status}_{'capture' if capture else 'approve'}" if status == "done" else f"expert_{status}"
            return self._card_reply(say(key, language, detail=result.detail, user=name, reviewers=NAMES["reviewers"]))
        if verb in (REVIEW_APPROVE, REVIEW_WITHDRAW):
            return await self._on_review(activity, place, verb == REVIEW_APPROVE, str(data.get("turn") or ""),
                                         language)
        if verb in (RECHECK_KEEP, RECHECK_RETIRE):
            turn_id = str(data.get("turn") or "")
            if not self.delivery.admit(self._access(activity, place, "click", turn_id)):
                return {}
            review = await self.conversations.decide_recheck(turn_id, keep=verb == RECHECK_KEEP,
                                                             reviewer=self.settings.is_reviewer(user), user=user,
                                                             display_name=name)
            text = say(f"review_{review.status.value}", language, **NAMES)
            if review.status in (ReviewStatus.KEPT, ReviewStatus.RETIRED) and activity.reply_to_id:
                await self._decided(place, str(activity.reply_to_id), text)
            return self._card_reply(text)
        log.info("Teams: ignoring a card action %s", _field(verb))
        return {}

    async def _on_review(self, activity: Any, place: TeamsPlace, approving: bool, turn_id: str,
                         language: str) -> dict[str, Any]:
        """"✅ Approve" or "↩️ Withdraw approval" under an answer: reviewers only, by turn id. Done, the
        card answers with itself swapped (who did it, and the other button); else the clicker is told why."""
        if not self.delivery.admit(self._access(activity, place, "click", turn_id)):
            return {}
        name = str(activity.from_.name or place.user)
        review = await self.conversations.review(turn_id, approving=approving,
                                                 reviewer=self.settings.is_reviewer(place.user), user=place.user,
                                                 display_name=name, tenant=f"teams:{place.tenant}")
        if review.status not in (ReviewStatus.APPROVED, ReviewStatus.WITHDRAWN):
            return self._card_reply(say(f"review_{review.status.value}", language, **NAMES))
        note = say(f"review_{review.status.value}_by", language, user=name)
        swapped = card(review_actions(turn_id, approved=approving, language=language), note)
        return {"statusCode": 200, "type": CARD, "value": swapped}

    @staticmethod
    def _card_reply(text: str) -> dict[str, Any]:
        return {"statusCode": 200, "type": CARD_REPLY, "value": text}

    async def _decided(self, place: TeamsPlace, message_id: str, note: str) -> None:
        """The re-check's message keeps its text, its buttons replaced by the decision."""
        try:
            await take_send_budget(self.rates, place)
            await self.connector.call(place.service_url, "update", lambda api: api.conversations.update_activity(
                place.conversation, message_id, MessageActivityInput(text=neutralise(note))))
        except (httpx.HTTPError, RetryAfter) as exc:
            log.warning("could not remove the re-check's buttons (%s)", exc)

    # --- expert replies (bot/knowledge/loop/expert.py) -------------------------------------------------
    def _link(self, activity: Any, place: TeamsPlace) -> str:
        root = place.conversation.partition(";messageid=")[2]
        team = self._teams_of.get(place.base, "")
        query = f"?tenantId={quote(place.tenant)}&groupId={quote(team)}&parentMessageId={quote(root)}"
        return f"https://teams.microsoft.com/l/message/{quote(place.base)}/{quote(str(activity.id))}{query}"

    async def _offer_expert_reply(self, activity: Any, place: TeamsPlace, text: str) -> None:
        """The reply kept, and a note with the two buttons to each reviewer, in their personal chat."""
        if not self.settings.reviewers:
            log.info("%s: a reply by %s could be kept, but teams.reviewers names nobody", place.key, place.user)
            return
        if ExpertReplies.too_long(text):  # reviewers would not see it whole: its author is told
            await self._say(place, say("expert_too_long", language_of(activity.locale, text),
                                       limit=f"{MAX_REPLY_CHARS:,}"))
            return
        author = str(activity.from_.name or place.user)
        reply = await self.conversations.expert_reply(place.key, author=place.user, author_name=author, text=text,
                                                      link=self._link(activity, place))
        if reply is None:
            return
        approve = self.conversations.kept.approved is not None
        capture = self.conversations.expert is not None and self.conversations.expert.capture_to is not None
        for reviewer in sorted(self.settings.reviewers):
            language = await self.conversations.user_language("teams", place.tenant, reviewer) or "en"
            note = say("expert_offer", language, author=author, question=" ".join(reply["question"].split())[:300])
            parts = plain_parts(note + "\n\n" + reply["text"], self.settings.max_message_chars)
            actions = expert_actions(reply["id"], approve=approve, capture=capture, language=language)
            if not await self._to_person(reviewer, place.tenant, parts, actions):
                log.warning("%s: reviewer %s cannot get the expert reply note", place.key, reviewer)

    # --- messages kbbot starts ---------------------------------------------------------------------------
    def service_url_of(self, tenant: str) -> str:
        """The connector of ``tenant``: the last an activity of it named, else any seen, else the setting."""
        return self._service_urls.get(tenant) or next(iter(self._service_urls.values()), self.settings.service_url)

    def _default_tenant(self) -> str:
        return reveal(self.settings.tenant_id) or next(iter(self._service_urls), "")

    async def _chat_with(self, user: str, tenant: str) -> TeamsPlace:
        """The personal chat with ``user`` (created once: Teams answers with the same chat each time)."""
        service_url = self.service_url_of(tenant)
        chat = self._chats.get(user)
        if chat is None:
            params = CreateConversationParams(members=[Account(id=user)], tenant_id=tenant or None,
                                              channel_data={"tenant": {"id": tenant}} if tenant else None)
            await take_send_budget(self.rates, TeamsPlace(service_url, f"create:{user}", "personal", tenant))
            created = await self.connector.call(service_url, "create conversation",
                                                lambda api: api.conversations.create(params))
            chat = self._chats[user] = str(created.id)
        return TeamsPlace(service_url, chat, "personal", tenant, user)

    async def _where(self, to: str, tenant: str) -> TeamsPlace:
        """A user's personal chat (``29:…``), or a channel (a new post) or group chat by its id."""
        if self.owns(to):
            return await self._chat_with(to, tenant)
        kind = "channel" if to.endswith("@thread.tacv2") or to.endswith("@thread.skype") else "groupChat"
        return TeamsPlace(self.service_url_of(tenant), to, kind, tenant)

    async def _to_person(self, to: str, tenant: str, parts: list[str],
                         actions: list[tuple[str, str, dict[str, str]]] | None = None) -> bool:
        try:
            place = await self._where(to, tenant)
            for i, part in enumerate(parts, 1):
                last = i == len(parts)
                activity = card_message(part, actions) if last and actions else MessageActivityInput(text=part)
                await self._send(place, activity)
        except (httpx.HTTPError, RetryAfter) as exc:
            detail = error_of(exc) if isinstance(exc, httpx.HTTPStatusError) else exc
            log.warning("could not send to %s (%s)", to, detail)
            return False
        return True

    async def send_note(self, to: str, text: str) -> bool:
        """Plain text (escaped) to a user's personal chat or a conversation, inside its budgets."""
        return await self._to_person(to, self._default_tenant(), plain_parts(text, self.settings.max_message_chars))

    async def post_recheck(self, to: str, request: RecheckRequest) -> bool:
        """The re-check of an approval with "Keep approved" / "Retire" to ``to`` (a reviewer's user id)."""
        tenant = request.tenant.partition(":")[2] or self._default_tenant()
        parts = plain_parts(recheck_text(request), self.settings.max_message_chars)
        return await self._to_person(to, tenant, parts, recheck_actions(request.turn_id, answered=request.answered))

    def owns(self, user: str) -> bool:
        return user.startswith("29:")

    # --- what the delivery layer asks of Teams (bot.delivery.gate.PlatformMessages) ------------------------
    async def account(self) -> str:
        return f"teams:{self.app_id}"

    def rebuild(self, turn: PendingTurn) -> ChatReply:
        return self.reply_to(turn.target)

    def reply_to(self, target: dict[str, Any]) -> ChatReply:
        return self._reply(TeamsPlace(**target["place"]), str(target.get("language") or "en"))

    async def delete(self, target: dict[str, Any], message_id: str) -> bool:
        place = TeamsPlace(**target["place"])
        await take_send_budget(self.rates, place)
        try:
            await self.connector.call(place.service_url, "delete", lambda api: api.conversations.delete_activity(
                place.conversation, message_id))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404:  # already gone
                raise
        return True

    async def edit(self, target: dict[str, Any], message_id: str, text: str) -> None:
        place = TeamsPlace(**target["place"])
        await take_send_budget(self.rates, place)
        await self.connector.call(place.service_url, "update", lambda api: api.conversations.update_activity(
            place.conversation, message_id, MessageActivityInput(text=f"_{neutralise(text)}_")))
