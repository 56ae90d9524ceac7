"""A local Microsoft Teams, as a bot meets it: the Bot Connector REST API, the login service's token
endpoint, the Bot Framework's OpenID configuration and signing keys, and activities delivered to the
bot's ``/api/messages`` with a JWT signed by those keys.

The bot talks to it through the Teams SDK's ``ApiClient`` pointed at ``service_url`` (as every activity's
``serviceUrl`` says), gets its token from ``login_url`` and checks tokens against ``openid_url``. It keeps
what a person in Teams would see: each conversation's messages (a channel's as posts and their reply
chains), with their text, entities (mentions, citations, the AI label), attachments, edits, deletions and
streams; and every call, refused ones included, with its ``time.monotonic()``.

It misbehaves the ways Teams does::

    async with FakeTeams() as teams:
        teams.rate_limit(chat, times=2, retry_after=1)   # 429 on that conversation's next two calls
        teams.rate_limit_kind("final", times=2)          # 429 on the next two final stream messages anywhere
        teams.enforce_documented_limits()                # per bot per conversation: 7/1 s, 8/2 s, 60/30 s, 1800/h
        teams.pace_streams(1.0)                          # a stream request sooner than 1 s after the last: 429
        teams.refuse_streaming()                         # 403 ContentStreamNotAllowed
        teams.cancel_stream(stream_id)                   # the user pressed Stop
        teams.stream_time_limit_s = 2                    # streams end after 2 s, not 2 min
        teams.rotate_keys()                              # a new signing key; tokens name it

Streaming follows "Stream bot messages" (REST): ``typing`` activities with a ``streaminfo`` entity, the first
one ``streamSequence`` 1 and no ``streamId`` (201 ``{"id": streamId}``), then the same ``streamId`` and
``streamSequence`` +1 (202 ``{}``; a sequence not above the last is dropped: 202 with
``ContentStreamSequenceOrderPreConditionFailed``), then a ``message`` with ``streamType`` final and no
``streamSequence``. Only in personal chats; 2 minutes at most.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import random
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.fakes.local_server import LocalServer

__all__ = ["Call", "Conversation", "FakeTeams", "Message", "Stream", "User"]

JSON = dict[str, Any]
ISSUER = "https://api.botframework.com"
BOT_SCOPE = "https://api.botframework.com/.default"
#: Bot messages are refused above about 28 KB (the whole activity, as JSON).
MAX_MESSAGE_BYTES = 28_000
MAX_CITATIONS = 20
#: Per bot per conversation, "send" operations (docs: rate-limit.md): calls within seconds.
DOCUMENTED_LIMITS = [(7, 1.0), (8, 2.0), (60, 30.0), (1800, 3600.0)]
PAGE_SIZE = (50, 500, 200)  # pagedmembers: smallest, largest, default


@dataclass
class Call:
    """One request to the fake, as it saw it."""

    method: str
    path: str
    #: The conversation's id as the request named it (with ``;messageid=`` when it did); "" for others.
    conversation: str
    body: Any
    at: float
    status: int = 0
    response: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not (isinstance(self.response, dict) and self.response.get("error"))

    @property
    def text(self) -> str:
        return str((self.body or {}).get("text") or "") if isinstance(self.body, dict) else ""


@dataclass
class User:
    """A Teams user as ``GET .../members/{id}`` describes them (a ``TeamsChannelAccount``)."""

    id: str
    name: str
    aad_object_id: str
    email: str
    upn: str
    tenant_id: str
    role: str = "user"

    def account(self) -> JSON:
        given, _, surname = self.name.partition(" ")
        return {"id": self.id, "name": self.name, "aadObjectId": self.aad_object_id, "email": self.email,
                "userPrincipalName": self.upn, "givenName": given, "surname": surname or None,
                "tenantId": self.tenant_id, "userRole": self.role}


@dataclass
class Conversation:
    id: str
    #: ``personal``, ``groupChat`` or ``channel``.
    type: str
    tenant_id: str
    members: list[str]
    name: str | None = None
    team_id: str | None = None
    #: A channel's kind: ``standard`` (the team reads it), ``private`` or ``shared`` (its own members).
    membership: str = "standard"


@dataclass
class Message:
    """A message in a conversation, as its readers see it now."""

    id: str
    conversation: str
    #: The post a channel message replies to (its reply chain); a post's own id for the post; None in chats.
    thread: str | None
    sender: str
    from_bot: bool
    type: str = "message"
    text: str = ""
    text_format: str | None = None
    entities: list[JSON] = field(default_factory=list)
    attachments: list[JSON] = field(default_factory=list)
    channel_data: JSON = field(default_factory=dict)
    value: Any = None
    reply_to_id: str | None = None
    deleted: bool = False
    #: Earlier texts, oldest first (one per edit).
    edits: list[str] = field(default_factory=list)
    #: (what, monotonic time): post, stream, final, edit, delete; each accepted change.
    changes: list[tuple[str, float]] = field(default_factory=list)
    #: The stream that wrote it, if one did.
    stream: Stream | None = None

    @property
    def citations(self) -> list[JSON]:
        return [c for e in self.entities if e.get("type") == "https://schema.org/Message" for c in e.get("citation") or []]

    @property
    def ai_generated(self) -> bool:
        return any("AIGeneratedContent" in (e.get("additionalType") or []) for e in self.entities)

    @property
    def feedback_loop(self) -> str | None:
        """The feedback loop's type ("default", "custom"), None without thumbs."""
        loop = self.channel_data.get("feedbackLoop")
        if isinstance(loop, dict):
            return loop.get("type")
        return "default" if self.channel_data.get("feedbackLoopEnabled") else None

    @property
    def mentions(self) -> list[JSON]:
        return [e for e in self.entities if e.get("type") == "mention"]


@dataclass
class Stream:
    id: str
    conversation: str
    started_at: float
    message: Message
    sequence: int = 0
    informative: list[str] = field(default_factory=list)
    #: (monotonic time, streamType, streamSequence, status) of every request naming this stream.
    requests: list[tuple[float, str, int | None, int]] = field(default_factory=list)
    done: bool = False
    cancelled: bool = False

    def gaps(self) -> list[float]:
        """Seconds between the accepted requests of the stream, its final one included."""
        times = [at for at, _, _, status in self.requests if 200 <= status < 300]
        return [b - a for a, b in zip(times, times[1:])]


@dataclass
class _Key:
    kid: str
    private: rsa.RSAPrivateKey
    endorsements: list[str]

    def jwk(self) -> JSON:
        jwk = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", "x5t": self.kid, "endorsements": self.endorsements}


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def _new_key(endorsements: list[str] | None = None) -> _Key:
    return _Key(kid=base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="),
                private=rsa.generate_private_key(public_exponent=65537, key_size=2048),
                endorsements=list(endorsements if endorsements is not None else ["msteams", "skype", "webchat"]))


class FakeTeams(LocalServer):
    """``async with FakeTeams() as teams``; the bot's settings take ``app_id``, ``app_secret``, ``tenant_id``,
    ``login_url`` and ``openid_url``; activities carry ``service_url``."""

    path = "/teams/"

    def __init__(self, *, app_id: str = "7e1b0b52-0000-4000-8000-00000000b07a", app_secret: str = "fake-secret",
                 tenant_id: str = "0d1e2f30-0000-4000-8000-0000000fe4a7", bot_name: str = "kbbot",
                 token_lifetime_s: int = 3599) -> None:
        super().__init__()
        self.app_id = app_id
        self.app_secret = app_secret
        self.tenant_id = tenant_id
        self.bot_name = bot_name
        self.bot_id = f"28:{app_id}"
        self.token_lifetime_s = token_lifetime_s
        self.calls: list[Call] = []
        self.users: dict[str, User] = {}
        self.teams: dict[str, JSON] = {}
        self.conversations: dict[str, Conversation] = {}
        self.messages: dict[str, list[Message]] = defaultdict(list)
        self.streams: dict[str, Stream] = {}
        #: Plain typing indicators (no stream), by conversation.
        self.typing: dict[str, int] = defaultdict(int)
        #: Seconds a stream may last (Teams: 2 minutes).
        self.stream_time_limit_s = 120.0
        self.keys = [_new_key()]
        #: How often the signing keys were read (GET of the JWKS).
        self.key_fetches = 0
        self._access_tokens: dict[str, float] = {}
        # Activity ids are unique across fakes, as Teams' are: a second fake in one process (a bench's next
        # run on the same runtime) must not reuse ids its questions' dedupe keys have already seen.
        self._ids = itertools.count(1_700_000_000_001 + random.randrange(10**9) * 1000)
        self._throttled: dict[str, deque[float | None]] = defaultdict(deque)
        self._throttled_kinds: dict[str, deque[float | None]] = defaultdict(deque)
        self._windows: dict[str, deque[float]] = defaultdict(deque)
        self._limits: list[tuple[int, float]] = []
        self._stream_pace_s: float | None = None
        self._streaming_refused = False

    # --- where the bot points ------------------------------------------------------------------------
    @property
    def service_url(self) -> str:
        """The Bot Connector's base URL, as activities' ``serviceUrl`` (with its trailing slash, as Teams)."""
        return self.base_url

    @property
    def login_url(self) -> str:
        """Stands for ``https://login.microsoftonline.com``: ``/{tenant}/oauth2/v2.0/token``."""
        return self.root_url

    @property
    def openid_url(self) -> str:
        return f"{self.root_url}/v1/.well-known/openidconfiguration"

    # --- people and places ----------------------------------------------------------------------------
    def add_user(self, name: str, *, email: str | None = None, role: str = "user") -> User:
        """A user of the tenant (``29:`` id, an Entra object id, e-mail = UPN unless given)."""
        digest = hashlib.sha256(name.encode()).hexdigest()
        handle = name.lower().replace(" ", ".")
        email = email or f"{handle}@contoso.example"
        user = User(id=f"29:1{digest[:40]}", name=name, aad_object_id=str(uuid.UUID(digest[:32])), email=email,
                    upn=email, tenant_id=self.tenant_id, role=role)
        self.users[user.id] = user
        return user

    def add_team(self, name: str, members: list[User]) -> str:
        """A team with its General channel (whose id is the team's id, as in Teams)."""
        team_id = f"19:{hashlib.sha256(name.encode()).hexdigest()[:32]}@thread.tacv2"
        self.teams[team_id] = {"id": team_id, "name": name, "members": [u.id for u in members],
                               "aadGroupId": str(uuid.uuid5(uuid.NAMESPACE_URL, team_id)), "channels": [team_id]}
        self.conversations[team_id] = Conversation(team_id, "channel", self.tenant_id, [], name="General",
                                                   team_id=team_id)
        return team_id

    def add_channel(self, team_id: str, name: str, *, members: list[User] | None = None,
                    membership: str = "standard") -> str:
        """A channel of ``team_id``; a ``private`` or ``shared`` one has its own ``members``."""
        channel_id = f"19:{hashlib.sha256((team_id + name).encode()).hexdigest()[:32]}@thread.tacv2"
        self.teams[team_id]["channels"].append(channel_id)
        self.conversations[channel_id] = Conversation(channel_id, "channel", self.tenant_id,
                                                      [u.id for u in members or []], name=name, team_id=team_id,
                                                      membership=membership)
        return channel_id

    def personal_chat(self, user: User) -> str:
        chat_id = f"a:1{hashlib.sha256((self.bot_id + user.id).encode()).hexdigest()[:48]}"
        self.conversations.setdefault(chat_id, Conversation(chat_id, "personal", self.tenant_id, [user.id]))
        return chat_id

    def group_chat(self, members: list[User], name: str | None = None) -> str:
        chat_id = f"19:{hashlib.sha256(''.join(u.id for u in members).encode()).hexdigest()[:32]}@thread.v2"
        self.conversations.setdefault(chat_id, Conversation(chat_id, "groupChat", self.tenant_id,
                                                            [u.id for u in members], name=name))
        return chat_id

    def members_of(self, conversation_id: str) -> list[str]:
        conversation = self.conversations[_base(conversation_id)]
        if conversation.type == "channel" and conversation.membership == "standard":
            return list(self.teams[conversation.team_id or ""]["members"])
        return list(conversation.members)

    # --- what people see --------------------------------------------------------------------------------
    def chat(self, conversation_id: str) -> list[Message]:
        """A conversation's messages now, oldest first, deleted ones left out (a channel's: every post
        and reply)."""
        return [m for m in self.messages[_base(conversation_id)] if not m.deleted]

    def thread(self, conversation_id: str, root: str | None = None) -> list[Message]:
        """A channel post and its reply chain (``root``, or the ``;messageid=`` of ``conversation_id``)."""
        root = root or conversation_id.partition(";messageid=")[2]
        return [m for m in self.chat(conversation_id) if m.thread == root]

    def bot_messages(self, conversation_id: str, root: str | None = None) -> list[Message]:
        shown = self.thread(conversation_id, root) if (root or ";messageid=" in conversation_id) \
            else self.chat(conversation_id)
        return [m for m in shown if m.from_bot]

    def message(self, conversation_id: str, message_id: str) -> Message:
        return next(m for m in self.messages[_base(conversation_id)] if m.id == message_id)

    def calls_to(self, method: str, suffix: str = "") -> list[Call]:
        return [c for c in self.calls if c.method == method and c.path.endswith(suffix)]

    def refused(self) -> list[Call]:
        return [c for c in self.calls if c.status == 429]

    # --- misbehaviour ----------------------------------------------------------------------------------
    def rate_limit(self, conversation_id: str, *, times: int = 1, retry_after: float | None = None) -> None:
        """The next ``times`` calls on the conversation get 429 (with ``Retry-After`` when given: Teams does
        not document one for bot APIs)."""
        self._throttled[_base(conversation_id)].extend([retry_after] * times)

    def rate_limit_kind(self, kind: str, *, times: int = 1, retry_after: float | None = None) -> None:
        """The next ``times`` requests of ``kind`` in any conversation get 429: ``informative``,
        ``streaming`` or ``final`` (stream requests), ``message`` or ``typing`` (plain posts), ``update``."""
        self._throttled_kinds[kind].extend([retry_after] * times)

    def _throttle(self, kind: str) -> None:
        waiting = self._throttled_kinds.get(kind)
        if waiting:
            retry_after = waiting.popleft()
            raise _Refusal(429, "TooManyRequests", "API calls quota exceeded",
                           {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None)

    def enforce_documented_limits(self, limits: list[tuple[int, float]] | None = None) -> None:
        """Refuse (429) a conversation's call past any of ``limits`` (calls within seconds; default Teams'
        documented per-bot, per-conversation limits)."""
        self._limits = list(limits or DOCUMENTED_LIMITS)

    def pace_streams(self, min_interval_s: float | None = 1.0) -> None:
        """Refuse (429 "API calls quota exceeded") a stream request sooner than ``min_interval_s`` after that
        stream's last accepted one (Teams: one request a second); None only records the gaps."""
        self._stream_pace_s = min_interval_s

    def refuse_streaming(self, refuse: bool = True) -> None:
        self._streaming_refused = refuse

    def cancel_stream(self, stream_id: str) -> None:
        """The user pressed Stop: the stream's next request is refused."""
        self.streams[stream_id].cancelled = True

    # --- tokens ---------------------------------------------------------------------------------------
    def rotate_keys(self, *, keep_old: bool = False, endorsements: list[str] | None = None) -> str:
        """A new signing key, used from now on (the old ones dropped unless ``keep_old``); its kid."""
        key = _new_key(endorsements)
        self.keys = [key, *self.keys] if keep_old else [key]
        return key.kid

    def token(self, activity: JSON | None = None, *, audience: str | None = None, issuer: str = ISSUER,
              service_url: str | None = None, lifetime_s: float = 3600, age_s: float = 0,
              key: _Key | None = None, kid: str | None = None, **claims: Any) -> str:
        """A Bot Framework JWT as the connector sends with ``activity`` (signed by the current key);
        the keywords make bad ones."""
        now = time.time() - age_s
        signer = key or self.keys[0]
        payload = {"iss": issuer, "aud": audience if audience is not None else self.app_id,
                   "serviceurl": service_url if service_url is not None else
                   (activity or {}).get("serviceUrl", self.service_url),
                   "nbf": int(now) - 5, "iat": int(now) - 5, "exp": int(now + lifetime_s), **claims}
        return jwt.encode(payload, signer.private, algorithm="RS256", headers={"kid": kid or signer.kid})

    def bad_tokens(self, activity: JSON) -> dict[str, str | None]:
        """For ``activity``, a token of each kind a bot must refuse (None: no Authorization header)."""
        stranger = _new_key()
        return {
            "missing header": None,
            "wrong audience": self.token(activity, audience="00000000-0000-0000-0000-000000000000"),
            "wrong issuer": self.token(activity, issuer="https://sts.windows.net/evil/"),
            "expired beyond skew": self.token(activity, age_s=3600 + 301, lifetime_s=3600),
            # nbf is whole seconds, 5 s before "now": 10 s more keeps it past the skew however late it is checked.
            "not yet valid beyond skew": self.token(activity, age_s=-(301 + 5 + 10)),
            "wrong key": self.token(activity, key=stranger, kid=self.keys[0].kid),
            "unknown key": self.token(activity, key=stranger),
            "other service url": self.token(activity, service_url="https://evil.example/teams/"),
            "not a jwt": "not-a-jwt",
        }

    def access_token(self) -> str:
        """An app token as the login service issues (also valid for the connector)."""
        now = time.time()
        token = jwt.encode({"iss": f"https://sts.windows.net/{self.tenant_id}/", "aud": ISSUER, "appid": self.app_id,
                            "tid": self.tenant_id, "nbf": int(now), "iat": int(now),
                            "exp": int(now + self.token_lifetime_s), "jti": uuid.uuid4().hex},
                           self.keys[0].private, algorithm="RS256", headers={"kid": self.keys[0].kid})
        self._access_tokens[token] = now + self.token_lifetime_s
        return token

    def expire_access_tokens(self) -> None:
        self._access_tokens.clear()

    # --- activities to the bot --------------------------------------------------------------------------
    def _activity(self, kind: str, conversation_id: str, user: User, **fields: Any) -> JSON:
        conversation = self.conversations[_base(conversation_id)]
        activity_id = fields.pop("id", None) or str(next(self._ids))
        channel_data: JSON = {"tenant": {"id": self.tenant_id}}
        if conversation.type == "channel":
            channel_data.update(teamsChannelId=conversation.id, teamsTeamId=conversation.team_id,
                                channel={"id": conversation.id, "name": conversation.name},
                                team={"id": conversation.team_id, "name": self.teams[conversation.team_id or ""]["name"],
                                      "aadGroupId": self.teams[conversation.team_id or ""]["aadGroupId"]})
        now = datetime.now(UTC)
        return {"type": kind, "id": activity_id, "timestamp": now.isoformat().replace("+00:00", "Z"),
                "localTimestamp": now.isoformat(), "serviceUrl": self.service_url, "channelId": "msteams",
                "from": {"id": user.id, "name": user.name, "aadObjectId": user.aad_object_id},
                "conversation": {"id": conversation_id, "conversationType": conversation.type,
                                 "tenantId": self.tenant_id, "isGroup": conversation.type != "personal",
                                 **({"name": conversation.name} if conversation.name else {})},
                "recipient": {"id": self.bot_id, "name": self.bot_name}, "locale": "en-US",
                "channelData": channel_data,
                **fields}

    def _text_fields(self, text: str, mention: bool) -> JSON:
        entities: list[JSON] = [{"type": "clientInfo", "locale": "en-US", "country": "US", "platform": "Web",
                                 "timezone": "Europe/London"}]
        if mention:
            tag = f"<at>{self.bot_name}</at>"
            text = f"{tag} {text}"
            entities.insert(0, {"type": "mention", "text": tag,
                                "mentioned": {"id": self.bot_id, "name": self.bot_name}})
        # Teams also sends the message as HTML, the mention as a span.
        html = text.replace(f"<at>{self.bot_name}</at>", f'<span itemtype="http://schema.skype.com/Mention" '
                                                          f'itemscope="" itemid="0">{self.bot_name}</span>')
        return {"text": text, "textFormat": "plain", "entities": entities,
                "attachments": [{"contentType": "text/html", "content": f"<p>{html}</p>"}]}

    def channel_message(self, text: str, *, user: User, channel: str, root: str | None = None,
                        mention: bool = True) -> JSON:
        """A new post in ``channel`` (or, with ``root``, a reply in that post's chain), @-mentioning the bot."""
        activity_id = str(next(self._ids))
        thread = root or activity_id
        return self._activity("message", f"{channel};messageid={thread}", user, id=activity_id,
                              **self._text_fields(text, mention))

    def personal_message(self, text: str, *, user: User) -> JSON:
        return self._activity("message", self.personal_chat(user), user, **self._text_fields(text, False))

    def group_message(self, text: str, *, user: User, chat: str, mention: bool = True) -> JSON:
        return self._activity("message", chat, user, **self._text_fields(text, mention))

    def _conversation_of(self, message: Message) -> str:
        return f"{message.conversation};messageid={message.thread}" if message.thread else message.conversation

    def feedback(self, message: Message, *, user: User, reaction: str = "like", text: str = "") -> JSON:
        """A 👍/👎 on ``message`` through the feedback loop: invoke ``message/submitAction``."""
        value = {"actionName": "feedback",
                 "actionValue": {"reaction": reaction, "feedback": json.dumps({"feedbackText": text})}}
        return self._activity("invoke", self._conversation_of(message), user, name="message/submitAction",
                              value=value, replyToId=message.id)

    def card_action(self, message: Message, *, user: User, verb: str, data: JSON | None = None) -> JSON:
        """A click on an Adaptive Card's ``Action.Execute`` button of ``message``."""
        return self._activity("invoke", self._conversation_of(message), user, name="adaptiveCard/action",
                              value={"action": {"type": "Action.Execute", "verb": verb, "data": data or {}},
                                     "trigger": "manual"}, replyToId=message.id)

    async def deliver(self, bot_url: str, activity: JSON, *, token: str | None | bool = True,
                      session: aiohttp.ClientSession | None = None) -> tuple[int, Any]:
        """POST ``activity`` to the bot's ``{bot_url}/api/messages`` as the connector does (``token``: True
        for a good one, a string for that one, None for no Authorization header); (status, JSON body).
        A message is kept in its conversation first, as Teams shows it before the bot hears of it."""
        if activity["type"] == "message":
            self._keep_user_message(activity)
        headers = {"Content-Type": "application/json"}
        if token is True:
            token = self.token(activity)
        if isinstance(token, str):
            headers["Authorization"] = f"Bearer {token}"
        own = session is None
        session = session or aiohttp.ClientSession()
        try:
            async with session.post(f"{bot_url.rstrip('/')}/api/messages", data=json.dumps(activity),
                                    headers=headers) as response:
                raw = await response.read()
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                return response.status, body
        finally:
            if own:
                await session.close()

    def _keep_user_message(self, activity: JSON) -> None:
        conversation, _, root = activity["conversation"]["id"].partition(";messageid=")
        message = Message(id=activity["id"], conversation=conversation, thread=root or None,
                          sender=activity["from"]["id"], from_bot=False, text=activity.get("text") or "",
                          entities=list(activity.get("entities") or []),
                          attachments=list(activity.get("attachments") or []), value=activity.get("value"),
                          reply_to_id=activity.get("replyToId"))
        message.changes.append(("post", time.monotonic()))
        self.messages[conversation].append(message)

    # --- the server -------------------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/v1/.well-known/openidconfiguration", self._openid)
        r.add_get("/v1/.well-known/keys", self._jwks)
        r.add_post("/{tenant}/oauth2/v2.0/token", self._token_endpoint)
        v3 = "/teams/v3"
        r.add_post(v3 + "/conversations", self._api(self._create_conversation))
        r.add_post(v3 + "/conversations/{conversation}/activities", self._api(self._post))
        r.add_post(v3 + "/conversations/{conversation}/activities/{activity}", self._api(self._post))
        r.add_put(v3 + "/conversations/{conversation}/activities/{activity}", self._api(self._put))
        r.add_delete(v3 + "/conversations/{conversation}/activities/{activity}", self._api(self._delete))
        r.add_get(v3 + "/conversations/{conversation}/members", self._api(self._members))
        r.add_get(v3 + "/conversations/{conversation}/members/{user}", self._api(self._member))
        # The docs write pagedmembers, the SDK pagedMembers: Teams takes either.
        r.add_get(v3 + "/conversations/{conversation}/pagedmembers", self._api(self._paged_members))
        r.add_get(v3 + "/conversations/{conversation}/pagedMembers", self._api(self._paged_members))
        r.add_get(v3 + "/teams/{team}", self._api(self._team))
        r.add_get(v3 + "/teams/{team}/conversations", self._api(self._team_conversations))

    async def _openid(self, request: web.Request) -> web.Response:
        return web.json_response({
            "issuer": ISSUER, "authorization_endpoint": "https://invalid.botframework.com",
            "jwks_uri": f"{self.root_url}/v1/.well-known/keys", "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["private_key_jwt"]})

    async def _jwks(self, request: web.Request) -> web.Response:
        self.key_fetches += 1
        return web.json_response({"keys": [key.jwk() for key in self.keys]})

    async def _token_endpoint(self, request: web.Request) -> web.Response:
        form = dict(parse_qsl(await request.text()))
        call = Call("POST", request.path, "", {k: v for k, v in form.items() if k != "client_secret"}, time.monotonic())
        self.calls.append(call)

        def error(status: int, code: str, description: str) -> web.Response:
            call.status, call.response = status, {"error": code, "error_description": description}
            return web.json_response(call.response, status=status)

        if form.get("grant_type") != "client_credentials":
            return error(400, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type.")
        if request.match_info["tenant"] not in (self.tenant_id, "botframework.com"):
            return error(400, "invalid_request", "AADSTS90002: Tenant not found.")
        if form.get("client_id") != self.app_id:
            return error(400, "unauthorized_client", "AADSTS700016: Application not found in the directory.")
        if form.get("client_secret") != self.app_secret:
            return error(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
        if form.get("scope") != BOT_SCOPE:
            return error(400, "invalid_scope", "AADSTS1002012: The provided value for scope is not valid.")
        call.status = 200
        return web.json_response({"token_type": "Bearer", "expires_in": self.token_lifetime_s,
                                  "ext_expires_in": self.token_lifetime_s, "access_token": self.access_token()})

    def _api(self, handler: Any) -> Any:
        async def handle(request: web.Request) -> web.Response:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            conversation = request.match_info.get("conversation", "")
            call = Call(request.method, request.path, conversation, body, time.monotonic())
            self.calls.append(call)
            try:
                self._authorize(request)
                if conversation:
                    self._admit(conversation, send=request.method != "GET")
                status, response = await handler(request, call)
                headers: dict[str, str] = {}
            except _Refusal as refusal:
                status, headers = refusal.status, refusal.headers
                response = {"error": {"code": refusal.code, "message": refusal.message}}
            call.status, call.response = status, response
            return web.json_response(response, status=status, headers=headers)
        return handle

    def _authorize(self, request: web.Request) -> None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or self._access_tokens.get(token, 0) < time.time():
            raise _Refusal(401, "Unauthorized", "Authorization has been denied for this request.")

    def _admit(self, conversation_id: str, send: bool = True) -> None:
        """404 for a conversation the fake does not know; 429 when throttled or (a ``send``: a post, an
        update, a delete) past a limit."""
        base = _base(conversation_id)
        if base not in self.conversations:
            raise _Refusal(404, "ConversationNotFound", "Conversation not found.")
        throttled = self._throttled.get(base)
        if throttled:
            retry_after = throttled.popleft()
            raise _Refusal(429, "TooManyRequests", "API calls quota exceeded",
                           {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None)
        if self._limits and send:
            now = time.monotonic()
            window = self._windows[base]
            longest = max(seconds for _, seconds in self._limits)
            while window and now - window[0] > longest:
                window.popleft()
            for calls, seconds in self._limits:
                if sum(1 for at in window if now - at < seconds) >= calls:
                    raise _Refusal(429, "TooManyRequests", "API calls quota exceeded")
            window.append(now)

    # --- the Bot Connector --------------------------------------------------------------------------------
    def _conversation(self, conversation_id: str) -> Conversation:
        return self.conversations[_base(conversation_id)]

    async def _post(self, request: web.Request, call: Call) -> tuple[int, JSON]:
        body = call.body if isinstance(call.body, dict) else {}
        conversation_id = request.match_info["conversation"]
        conversation = self._conversation(conversation_id)
        stream_info = next((e for e in body.get("entities") or [] if e.get("type") == "streaminfo"), None)
        self._throttle(str((stream_info or {}).get("streamType") or "streaming") if stream_info is not None
                       else str(body.get("type")))
        if stream_info is not None:
            return self._stream(conversation, body, stream_info, call)
        kind = body.get("type")
        if kind == "typing":
            self.typing[conversation.id] += 1
            return 200, {}
        if kind != "message":
            raise _Refusal(400, "BadArgument", f"Activity type {kind!r} is not supported here.")
        self._check_message(body)
        # The REST reply names the activity in the path; the SDK's reply_to_activity puts it in replyToId.
        replied = request.match_info.get("activity") or body.get("replyToId")
        message = Message(id=str(next(self._ids)), conversation=conversation.id,
                          thread=self._thread_for(conversation, conversation_id, replied), sender=self.bot_id,
                          from_bot=True, reply_to_id=replied)
        if message.thread is None and conversation.type == "channel":
            message.thread = message.id  # a new post starts its own reply chain
        self._write(message, body)
        message.changes.append(("post", call.at))
        self.messages[conversation.id].append(message)
        return 201, {"id": message.id}

    def _thread_for(self, conversation: Conversation, conversation_id: str, replied: str | None) -> str | None:
        if conversation.type != "channel":
            return None
        root = conversation_id.partition(";messageid=")[2]
        if not root and replied:
            # A reply to an activity of the bare channel goes to that activity's reply chain (modelled, not
            # seen on Teams: kbbot posts to the threaded id, as activities name it).
            root = next((m.thread for m in self.messages[conversation.id] if m.id == replied), None) or ""
        if root and not any(m.id == root for m in self.messages[conversation.id]):
            raise _Refusal(400, "BadArgument", "The reply chain's root message was not found.")
        return root or None

    def _check_message(self, body: JSON) -> None:
        if len(json.dumps(body).encode()) > MAX_MESSAGE_BYTES:
            raise _Refusal(413, "MessageSizeTooBig", "Message size too large")
        if not (body.get("text") or body.get("attachments")):
            raise _Refusal(400, "BadArgument", "Message must have text or attachments.")
        citations = [c for e in body.get("entities") or [] if e.get("type") == "https://schema.org/Message"
                     for c in e.get("citation") or []]
        if len(citations) > MAX_CITATIONS:
            raise _Refusal(400, "BadArgument", f"At most {MAX_CITATIONS} citations are allowed.")

    @staticmethod
    def _write(message: Message, body: JSON) -> None:
        message.type = body.get("type", "message")
        message.text = body.get("text") or ""
        message.text_format = body.get("textFormat")
        message.entities = [e for e in body.get("entities") or [] if e.get("type") != "streaminfo"]
        message.attachments = list(body.get("attachments") or [])
        message.channel_data = {k: v for k, v in (body.get("channelData") or {}).items()
                                if k not in ("streamId", "streamType", "streamSequence")}

    async def _put(self, request: web.Request, call: Call) -> tuple[int, JSON]:
        body = call.body if isinstance(call.body, dict) else {}
        self._throttle("update")
        message = self._own_message(request)
        stream = message.stream
        if stream is not None and not stream.done:
            if call.at - stream.started_at <= self.stream_time_limit_s:
                # Modelled, not seen on Teams: a stream is finished by its final message.
                raise _Refusal(403, "ContentStreamNotAllowed", "A message being streamed cannot be updated.")
            stream.done = True  # past its 2 minutes, the stream is over and its message an ordinary one
        self._check_message(body)
        message.edits.append(message.text)
        self._write(message, body)
        message.changes.append(("edit", call.at))
        return 200, {"id": message.id}

    async def _delete(self, request: web.Request, call: Call) -> tuple[int, JSON]:
        message = self._own_message(request)
        message.deleted = True
        message.changes.append(("delete", call.at))
        return 200, {}

    def _own_message(self, request: web.Request) -> Message:
        conversation = self._conversation(request.match_info["conversation"])
        activity_id = request.match_info["activity"]
        for message in self.messages[conversation.id]:
            if message.id == activity_id and not message.deleted:
                if not message.from_bot:
                    raise _Refusal(403, "Forbidden", "The bot can only change its own messages.")
                return message
        raise _Refusal(404, "ActivityNotFoundInConversation", "The activity was not found in the conversation.")

    # --- streaming ----------------------------------------------------------------------------------------
    def _stream(self, conversation: Conversation, body: JSON, info: JSON, call: Call) -> tuple[int, JSON]:
        stream_type = info.get("streamType") or "streaming"
        sequence = info.get("streamSequence")
        stream_id = info.get("streamId")
        stream = self.streams.get(stream_id) if stream_id else None

        def refuse(status: int, code: str, message: str) -> _Refusal:
            if stream is not None:
                stream.requests.append((call.at, stream_type, sequence, status))
            return _Refusal(status, code, message)

        if self._streaming_refused or conversation.type != "personal":
            raise refuse(403, "ContentStreamNotAllowed", "Content stream is not allowed")
        if stream_id and stream is None:
            raise refuse(400, "BadArgument", "The streamId was not found.")
        if stream is not None:
            if stream.cancelled:
                raise refuse(403, "ContentStreamNotAllowed", "Content stream was cancelled by user.")
            if stream.done:
                raise refuse(403, "ContentStreamNotAllowed",
                             "Content stream is not allowed on an already completed streamed message")
            if call.at - stream.started_at > self.stream_time_limit_s:
                stream.done = True
                raise refuse(403, "ContentStreamNotAllowed", "Content stream finished due to exceeded streaming time.")
            accepted = [at for at, _, _, status in stream.requests if 200 <= status < 300]
            if self._stream_pace_s is not None and accepted and call.at - accepted[-1] < self._stream_pace_s:
                raise refuse(429, "TooManyRequests", "API calls quota exceeded")
        if len(json.dumps(body).encode()) > MAX_MESSAGE_BYTES:
            raise refuse(403, "ContentStreamNotAllowed", "Message size too large")

        if stream_type == "final":
            if stream is None:
                raise refuse(400, "BadArgument", "A final streaming message needs the streamId.")
            if sequence is not None:
                raise refuse(400, "BadArgument", "streamSequence must not be set on the final streaming message.")
            if body.get("type") != "message":
                raise refuse(400, "BadArgument", "The final streaming message must be a message activity.")
            self._check_message(body)
            self._write(stream.message, body)
            stream.done = True
            stream.requests.append((call.at, stream_type, sequence, 202))
            stream.message.changes.append(("final", call.at))
            return 202, {}

        if body.get("type") != "typing":
            raise refuse(400, "BadArgument", "Streaming updates must be typing activities.")
        if not isinstance(sequence, int) or sequence < 1:
            raise refuse(400, "BadArgument", "streamSequence is required on streaming updates.")
        if not body.get("text"):
            raise refuse(400, "BadArgument", "Start streaming activities should include text")
        if stream is None:
            if sequence != 1:
                raise refuse(400, "BadArgument", "The first streaming request must have streamSequence 1.")
            if any(not s.done for s in self.streams.values() if s.conversation == conversation.id):
                raise refuse(403, "ContentStreamNotAllowed", "Content stream is not allowed")  # one at a time
            message = Message(id=str(next(self._ids)), conversation=conversation.id, thread=None,
                              sender=self.bot_id, from_bot=True)
            stream = Stream(id=message.id, conversation=conversation.id, started_at=call.at, message=message)
            message.stream = stream
            self.streams[stream.id] = stream
            self.messages[conversation.id].append(message)
            status, response = 201, {"id": stream.id}
        elif sequence <= stream.sequence:
            stream.requests.append((call.at, stream_type, sequence, 202))
            return 202, {"error": {"code": "ContentStreamSequenceOrderPreConditionFailed",
                                   "message": "PreCondition failed exception when processing streaming activity."}}
        else:
            status, response = 202, {}
        stream.sequence = sequence
        stream.requests.append((call.at, stream_type, sequence, status))
        if stream_type == "informative":
            stream.informative.append(body["text"])
        else:
            stream.message.text = body["text"]
            stream.message.changes.append(("stream", call.at))
        return status, response

    # --- members and teams ----------------------------------------------------------------------------
    async def _members(self, request: web.Request, call: Call) -> tuple[int, Any]:
        return 200, [self.users[u].account() for u in self.members_of(request.match_info["conversation"])]

    async def _member(self, request: web.Request, call: Call) -> tuple[int, Any]:
        user = request.match_info["user"]
        if user not in self.members_of(request.match_info["conversation"]) or user not in self.users:
            raise _Refusal(404, "MemberNotFoundInConversation", "The member was not found in the conversation.")
        return 200, self.users[user].account()

    async def _paged_members(self, request: web.Request, call: Call) -> tuple[int, Any]:
        smallest, largest, default = PAGE_SIZE
        try:
            size = min(max(int(request.query.get("pageSize") or default), smallest), largest)
            start = int(request.query.get("continuationToken") or 0)
        except ValueError:
            raise _Refusal(400, "BadArgument", "Invalid pageSize or continuationToken.") from None
        members = self.members_of(request.match_info["conversation"])
        page = members[start:start + size]
        body: JSON = {"members": [self.users[u].account() for u in page]}
        if start + size < len(members):
            body["continuationToken"] = str(start + size)
        return 200, body

    def _team_of(self, request: web.Request) -> JSON:
        team = self.teams.get(request.match_info["team"])
        if team is None:
            raise _Refusal(404, "NotFound", "Team not found.")
        return team

    async def _team(self, request: web.Request, call: Call) -> tuple[int, Any]:
        team = self._team_of(request)
        return 200, {"id": team["id"], "name": team["name"], "aadGroupId": team["aadGroupId"], "type": "standard",
                     "channelCount": len(team["channels"]), "memberCount": len(team["members"]),
                     "tenantId": self.tenant_id}

    async def _team_conversations(self, request: web.Request, call: Call) -> tuple[int, Any]:
        team = self._team_of(request)
        # Teams leaves the General channel's name out.
        return 200, {"conversations": [{"id": c, **({"name": self.conversations[c].name} if c != team["id"] else {})}
                                       for c in team["channels"]]}

    async def _create_conversation(self, request: web.Request, call: Call) -> tuple[int, Any]:
        """A 1:1 chat with a user (``members: [{id}]``, ``isGroup`` false) or a new post in a channel
        (``channelData.channel.id`` and ``activity``)."""
        body = call.body if isinstance(call.body, dict) else {}
        channel = ((body.get("channelData") or {}).get("channel") or {}).get("id")
        if channel:
            conversation = self.conversations.get(channel)
            if conversation is None or not body.get("activity"):
                raise _Refusal(400, "BadArgument", "A channel post needs a known channel and an activity.")
            self._admit(channel)
            self._check_message(body["activity"])
            message = Message(id=str(next(self._ids)), conversation=channel, thread=None, sender=self.bot_id,
                              from_bot=True)
            message.thread = message.id
            self._write(message, body["activity"])
            message.changes.append(("post", call.at))
            self.messages[channel].append(message)
            return 201, {"id": f"{channel};messageid={message.id}", "activityId": message.id}
        members = body.get("members") or []
        if body.get("isGroup") or len(members) != 1 or members[0].get("id") not in self.users:
            raise _Refusal(400, "BadArgument", "A bot can only start a 1:1 chat with one user of the tenant.")
        chat = self.personal_chat(self.users[members[0]["id"]])
        return 201, {"id": chat}


def _base(conversation_id: str) -> str:
    """A conversation's id without its ``;messageid=`` (the reply chain a channel id may name)."""
    return conversation_id.partition(";messageid=")[0]
