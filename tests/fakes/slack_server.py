"""A local stand-in for the Slack Web API, for tests and benchmarks.

The bot talks to Slack through the real ``slack_sdk`` ``AsyncWebClient`` (inside bolt's ``AsyncApp``),
pointed at this server with ``base_url``; it serves the methods kbbot uses, keeps the messages they
create, and records every call (rate-limited and failed ones included) with its ``time.monotonic()``.

It can misbehave the ways Slack does::

    async with FakeSlack() as slack:
        client = AsyncWebClient(token="xoxb-test", base_url=slack.base_url)
        slack.rate_limit("chat.appendStream", times=3, retry_after=1)  # 429 + Retry-After
        slack.refuse_streaming()                                        # {"ok": false, "error": "unknown_method"}
        slack.expire_streams_after(2)                                   # message_not_in_streaming_state
        slack.fail("chat.update", error="internal_error")
        slack.limit("chat.update", calls=3, per_s=1.0)                  # a rate tier, enforced with 429s
        slack.limit("reactions.add", calls=50, per_s=60.0)              # (any method, reactions and status too)
        slack.documented_tiers()                                        # Slack's published tiers, all of them

Checks follow Slack's documented limits: ``markdown_text`` at most 12,000 characters and never with
``text``/``blocks``; at most 50 blocks; a ``markdown`` block at most 12,000 characters (12,000 in total per
message); section text at most 3,000; streams need ``thread_ts`` and, in channels, the recipient ids.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from tests.fakes.local_server import LocalServer

__all__ = ["Call", "Ephemeral", "FakeSlack", "Message", "STREAM_METHODS"]

STREAM_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream")
MARKDOWN_LIMIT = 12000
MAX_BLOCKS = 50
SECTION_LIMIT = 3000
#: Slack's documented rate tiers, calls per minute per workspace (and app): chat.startStream and
#: chat.stopStream 20 (Tier 2), chat.appendStream 100 (Tier 4), chat.update and reactions.add 50 (Tier 3),
#: reactions.remove 20 (Tier 2). assistant.threads.setStatus has "special" limits, not published: Tier 3
#: is assumed, the stricter reading.
DOCUMENTED_TIERS = {"chat.startStream": 20, "chat.stopStream": 20, "chat.appendStream": 100, "chat.update": 50,
                    "assistant.threads.setStatus": 50, "reactions.add": 50, "reactions.remove": 20}
#: Limits per channel: chat.postMessage about one a second, with short bursts (calls within seconds).
PER_CHANNEL = {"chat.postMessage": (5, 5.0)}


@dataclass
class Call:
    """One Web API request as the fake saw it."""

    method: str
    args: dict[str, Any]
    at: float
    token: str | None
    status: int = 200
    response: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.response.get("ok"))

    @property
    def error(self) -> str | None:
        return self.response.get("error")

    @property
    def text_sent(self) -> str:
        """The message text this call carried (markdown_text, stream chunks, markdown blocks, text)."""
        return _text_of(self.args)


@dataclass
class Message:
    """A message kbbot created, as Slack would now show it."""

    channel: str
    ts: str
    thread_ts: str | None
    markdown: str = ""
    text: str | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)
    streaming: bool = False
    deleted: bool = False
    #: (method, monotonic time) of every successful call that changed this message.
    changes: list[tuple[str, float]] = field(default_factory=list)

    @property
    def body(self) -> str:
        """The Markdown a reader sees: streamed/markdown_text text, else markdown blocks, else ``text``."""
        if self.markdown:
            return self.markdown
        blocks = "".join(b.get("text", "") for b in self.blocks if b.get("type") == "markdown")
        return blocks or (self.text or "")

    def blocks_of(self, kind: str) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b.get("type") == kind]


@dataclass
class Ephemeral:
    """A message only ``user`` sees (``chat.postEphemeral``); Slack does not keep it."""

    channel: str
    user: str
    text: str
    thread_ts: str | None
    ts: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def _chunk_text(chunks: Any) -> str:
    if isinstance(chunks, str):
        try:
            chunks = json.loads(chunks)
        except ValueError:
            return ""
    return "".join(str(c.get("text", "")) for c in chunks or [] if isinstance(c, dict)
                   and c.get("type") == "markdown_text")


def _blocks(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return list(value or [])


def _text_of(args: dict[str, Any]) -> str:
    parts = [str(args.get("markdown_text") or ""), _chunk_text(args.get("chunks"))]
    parts += [str(b.get("text", "")) for b in _blocks(args.get("blocks")) if b.get("type") == "markdown"]
    if not any(parts):
        parts.append(str(args.get("text") or ""))
    return "".join(parts)


class SlackError(Exception):
    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


class FakeSlack(LocalServer):
    """An aiohttp server speaking the parts of the Slack Web API kbbot uses (``/api/{method}``)."""

    def __init__(self, *, team_id: str = "T0KBBOT", bot_user_id: str = "UKBBOT", bot_id: str = "BKBBOT",
                 token: str = "xoxb-test", latency_s: float = 0.0):
        super().__init__()
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.token = token
        #: Seconds every call takes before it is answered (a rough network round trip).
        self.latency_s = latency_s
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], Message] = {}
        #: channel_id -> thread_ts -> statuses set with assistant.threads.setStatus, in order.
        self.statuses: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._ts = itertools.count(1)
        self._rate_limited: dict[str, deque[float]] = defaultdict(deque)
        self._failures: dict[str, deque[tuple[str, int]]] = defaultdict(deque)
        self._refused: str | None = None
        self._expire_after: int | None = None
        self._appends: dict[tuple[str, str], int] = defaultdict(int)
        self._limits: dict[str, tuple[int, float, str | None]] = {}
        self._window: dict[tuple[str, str], deque[float]] = defaultdict(deque)
        #: channel -> the workspace it belongs to, for an Enterprise Grid org of several workspaces: the
        #: per-workspace tiers are counted per workspace (a channel not listed is in ``team_id``'s).
        self.channel_teams: dict[str, str] = {}
        #: Bodies POSTed to response URLs (slash commands' ``respond``), by the key in the URL.
        self.responses: dict[str, list[dict[str, Any]]] = defaultdict(list)
        #: Messages posted with chat.postEphemeral, oldest first.
        self.ephemerals: list[Ephemeral] = []
        #: (channel, message ts) -> the emoji names kbbot reacted with (reactions.add / reactions.remove).
        self.reactions: dict[tuple[str, str], list[str]] = defaultdict(list)
        #: user id -> the ``user`` object users.info answers (``add_user``); the bot user is always there.
        self.users: dict[str, dict[str, Any]] = {}
        #: user group handle -> its members' ids (usergroups.list with include_users).
        self.usergroups: dict[str, list[str]] = {}
        #: channel id -> its members' ids (conversations.members, paginated by ``members_page``).
        self.channel_members: dict[str, list[str]] = {}
        #: channel id -> the ``channel`` object conversations.info answers (``add_channel``); a channel
        #: only in ``channel_members`` is described as a public one, as most are.
        self.channels: dict[str, dict[str, Any]] = {}
        self.members_page = 100
        #: users.list's largest page (Slack recommends asking for 200 at most).
        self.users_page = 200
        #: Scopes the token lacks: a method needing one answers ``missing_scope`` (users.info without
        #: users:read.email answers the profile without its e-mail, as Slack does).
        self.missing_scopes: set[str] = set()

    # ------------------------------------------------------------------ scripting
    def add_user(self, user_id: str, email: str | None = None, *, is_bot: bool = False, deleted: bool = False,
                 name: str | None = None, guest: str | None = None) -> None:
        """``guest``: ``"multi"`` (a multi-channel guest, ``is_restricted``) or ``"single"`` (a
        single-channel guest, ``is_ultra_restricted`` too, as Slack sets both)."""
        profile: dict[str, Any] = {"real_name": name or user_id, "display_name": name or user_id}
        if email:
            profile["email"] = email
        self.users[user_id] = {"id": user_id, "team_id": self.team_id, "name": (name or user_id).lower(),
                               "deleted": deleted, "is_bot": is_bot, "is_app_user": False, "is_admin": False,
                               "is_owner": False, "is_restricted": guest is not None,
                               "is_ultra_restricted": guest == "single", "profile": profile}

    def add_channel(self, channel_id: str, members: list[str] | None = None, *, private: bool = False,
                    ext_shared: bool = False, org_shared: bool = False, pending_ext_shared: bool = False,
                    name: str | None = None) -> None:
        """A channel as conversations.info describes it (and its members, for conversations.members):
        ``ext_shared`` is Slack Connect (shared with another organisation), ``org_shared`` shared with
        another workspace of the same Enterprise Grid organisation."""
        if members is not None:
            self.channel_members[channel_id] = list(members)
        teams = [self.team_id] + (["T0OTHERORG"] if ext_shared else []) + (["T0SISTER"] if org_shared else [])
        self.channels[channel_id] = {
            "id": channel_id, "name": name or channel_id.lower(), "is_channel": not private, "is_group": private,
            "is_im": False, "is_mpim": False, "is_private": private, "created": 1_700_000_000,
            "is_archived": False, "is_general": False, "is_shared": ext_shared or org_shared,
            "is_org_shared": org_shared, "is_ext_shared": ext_shared, "is_pending_ext_shared": pending_ext_shared,
            "pending_shared": ["T0INVITED"] if pending_ext_shared else [], "context_team_id": self.team_id,
            "shared_team_ids": teams, "is_member": True,
            "topic": {"value": "", "creator": "", "last_set": 0}, "purpose": {"value": "", "creator": "", "last_set": 0}}

    def rate_limit(self, method: str, *, times: int = 1, retry_after: float = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with 429 and ``Retry-After``."""
        self._rate_limited[method].extend([retry_after] * times)

    def refuse_streaming(self, error: str | None = "unknown_method") -> None:
        """Answer every streaming method with ``{"ok": false, "error": error}`` (``None`` stops refusing)."""
        self._refused = error

    def expire_streams_after(self, appends: int | None) -> None:
        """Streams end server-side after ``appends`` appendStream calls: later calls get
        ``message_not_in_streaming_state`` (as when a stream times out)."""
        self._expire_after = appends

    def fail(self, method: str, *, error: str = "internal_error", times: int = 1, status: int = 200) -> None:
        """Answer the next ``times`` calls of ``method`` with ``error`` (HTTP ``status``)."""
        self._failures[method].extend([(error, status)] * times)

    def limit(self, method: str, *, calls: int, per_s: float, per: str | None = None) -> None:
        """Enforce a rate tier: more than ``calls`` successful calls within ``per_s`` seconds get 429;
        ``per``: counted separately for each value of that argument (``"channel"`` for postMessage)."""
        self._limits[method] = (calls, per_s, per)

    def documented_tiers(self) -> None:
        """Enforce Slack's documented limits (``DOCUMENTED_TIERS`` per workspace, ``PER_CHANNEL`` per
        channel): what bench.streaming and bench.load run against."""
        for method, per_minute in DOCUMENTED_TIERS.items():
            self.limit(method, calls=per_minute, per_s=60.0)
        for method, (calls, per_s) in PER_CHANNEL.items():
            self.limit(method, calls=calls, per_s=per_s, per="channel")

    # ------------------------------------------------------------------ queries
    def calls_to(self, *methods: str) -> list[Call]:
        return [c for c in self.calls if c.method in methods]

    def ok_calls(self, *methods: str) -> list[Call]:
        return [c for c in self.calls_to(*methods) if c.ok]

    def thread(self, channel: str, thread_ts: str) -> list[Message]:
        """kbbot's live messages in a thread, oldest first."""
        found = [m for m in self.messages.values()
                 if m.channel == channel and m.thread_ts == thread_ts and not m.deleted]
        return sorted(found, key=lambda m: float(m.ts))

    # ------------------------------------------------------------------ lifecycle
    #: ``base_url`` is ``http://127.0.0.1:<port>/api/``, the ``base_url`` for ``AsyncWebClient`` (``SLACK_API_URL``).
    path = "/api/"

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/api/{method}", self._handle)
        app.router.add_post("/respond/{key}", self._respond)

    def response_url(self, key: str) -> str:
        """A slash command's ``response_url``; what is posted there lands in ``responses[key]``."""
        return self.root_url + f"/respond/{key}"

    async def _respond(self, request: web.Request) -> web.Response:
        self.responses[request.match_info["key"]].append(json.loads(await request.read()))
        return web.Response(text="ok")

    # ------------------------------------------------------------------ the wire
    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await self._args(request)
        token = self._token(request, args)
        call = Call(method=method, args=args, at=time.monotonic(), token=token)
        self.calls.append(call)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        headers: dict[str, str] = {}
        if self._rate_limited[method]:
            retry_after = self._rate_limited[method].popleft()
            call.status, call.response = 429, {"ok": False, "error": "ratelimited"}
            headers["Retry-After"] = str(int(math.ceil(retry_after)))
        elif (wait := self._over_limit(method, args, call.at)) is not None:
            call.status, call.response = 429, {"ok": False, "error": "ratelimited"}
            headers["Retry-After"] = str(max(1, int(math.ceil(wait))))
        elif self._failures[method]:
            error, status = self._failures[method].popleft()
            call.status, call.response = status, {"ok": False, "error": error}
        elif token != self.token:
            call.response = {"ok": False, "error": "not_authed" if not token else "invalid_auth"}
        else:
            try:
                call.response = {"ok": True, **self._apply(method, args, call.at)}
            except SlackError as exc:
                call.response = {"ok": False, "error": exc.error}
            if call.ok and method in self._limits:
                self._window[self._window_key(method, args)].append(call.at)
        return web.json_response(call.response, status=call.status, headers=headers)

    @staticmethod
    async def _args(request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        raw = await request.read()
        if not raw:
            return args
        if request.content_type == "application/json":
            args.update(json.loads(raw))
        else:
            args.update(parse_qsl(raw.decode(), keep_blank_values=True))
        return args

    @staticmethod
    def _token(request: web.Request, args: dict[str, Any]) -> str | None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value:
            return value.strip()
        return args.get("token")

    def _window_key(self, method: str, args: dict[str, Any]) -> tuple[str, str]:
        per = self._limits[method][2]
        if per:
            return method, str(args.get(per, ""))
        channel = str(args.get("channel") or args.get("channel_id") or "")
        return method, self.channel_teams.get(channel, self.team_id)

    def _over_limit(self, method: str, args: dict[str, Any], now: float) -> float | None:
        if method not in self._limits:
            return None
        calls, per_s, _ = self._limits[method]
        window = self._window[self._window_key(method, args)]
        while window and window[0] <= now - per_s:
            window.popleft()
        if len(window) < calls:
            return None
        return window[0] + per_s - now

    # ------------------------------------------------------------------ the methods
    def _apply(self, method: str, args: dict[str, Any], now: float) -> dict[str, Any]:
        if method in STREAM_METHODS and self._refused:
            raise SlackError(self._refused)
        handler = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.delete": self._delete,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "assistant.threads.setStatus": self._set_status,
            "reactions.add": self._react,
            "reactions.remove": self._unreact,
            "users.info": self._users_info,
            "users.list": self._users_list,
            "usergroups.list": self._usergroups_list,
            "usergroups.users.list": self._usergroups_users,
            "conversations.members": self._conversation_members,
            "conversations.info": self._conversation_info,
        }.get(method)
        if handler is None:
            raise SlackError("unknown_method")
        return handler(args, now)

    def _auth_test(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        return {"url": "https://fake.slack.test/", "team": "Fake Workspace", "user": "kbbot",
                "team_id": self.team_id, "user_id": self.bot_user_id, "bot_id": self.bot_id,
                "is_enterprise_install": False}

    def _new_ts(self) -> str:
        return f"{1_700_000_000 + next(self._ts)}.000100"

    def _message(self, args: dict[str, Any]) -> Message:
        channel, ts = str(args.get("channel") or ""), str(args.get("ts") or "")
        if not channel:
            raise SlackError("channel_not_found")
        message = self.messages.get((channel, ts))
        if message is None or message.deleted:
            raise SlackError("message_not_found")
        return message

    @staticmethod
    def _content(args: dict[str, Any]) -> tuple[str | None, str | None, list[dict[str, Any]] | None]:
        markdown = args.get("markdown_text")
        text = args.get("text")
        blocks = _blocks(args.get("blocks")) if args.get("blocks") is not None else None
        if markdown is not None and (text or blocks):
            raise SlackError("invalid_arguments")  # markdown_text cannot be combined with text or blocks
        if markdown is None and not text and not blocks:
            raise SlackError("no_text")
        if markdown is not None and len(markdown) > MARKDOWN_LIMIT:
            raise SlackError("msg_too_long")
        if blocks is not None:
            FakeSlack._check_blocks(blocks)
        return markdown, text, blocks

    @staticmethod
    def _check_blocks(blocks: list[dict[str, Any]]) -> None:
        if len(blocks) > MAX_BLOCKS:
            raise SlackError("invalid_blocks")
        markdown_total = 0
        for block in blocks:
            kind = block.get("type")
            if kind == "markdown":
                length = len(block.get("text") or "")
                if length > MARKDOWN_LIMIT:
                    raise SlackError("invalid_blocks")
                markdown_total += length
            elif kind == "section" and len((block.get("text") or {}).get("text", "")) > SECTION_LIMIT:
                raise SlackError("invalid_blocks")
            elif kind == "context":
                elements = block.get("elements") or []
                if not elements or len(elements) > 10:
                    raise SlackError("invalid_blocks")
                if any(len(e.get("text", "")) > SECTION_LIMIT for e in elements):
                    raise SlackError("invalid_blocks")
            elif kind == "context_actions":
                if not 1 <= len(block.get("elements") or []) <= 5:
                    raise SlackError("invalid_blocks")
            elif kind == "actions":
                elements = block.get("elements") or []
                if not 1 <= len(elements) <= 25:
                    raise SlackError("invalid_blocks")
                for element in elements:
                    if element.get("type") == "button" and (
                            len((element.get("text") or {}).get("text", "")) > 75
                            or len(str(element.get("value") or "")) > 2000):
                        raise SlackError("invalid_blocks")
        if markdown_total > MARKDOWN_LIMIT:
            raise SlackError("msg_blocks_too_long")

    def _post(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        channel = str(args.get("channel") or "")
        if not channel:
            raise SlackError("channel_not_found")
        markdown, text, blocks = self._content(args)
        ts = self._new_ts()
        message = Message(channel=channel, ts=ts, thread_ts=args.get("thread_ts"), markdown=markdown or "",
                          text=text, blocks=blocks or [], changes=[("chat.postMessage", now)])
        self.messages[(channel, ts)] = message
        return {"channel": channel, "ts": ts, "message": {"ts": ts, "text": text or markdown or ""}}

    def _post_ephemeral(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        channel, user = str(args.get("channel") or ""), str(args.get("user") or "")
        if not channel:
            raise SlackError("channel_not_found")
        if not user:
            raise SlackError("user_not_found")
        text = args.get("text")
        blocks = _blocks(args.get("blocks")) if args.get("blocks") is not None else []
        if args.get("markdown_text") is not None:
            if text or blocks:
                raise SlackError("invalid_arguments")
            text = args["markdown_text"]
        if not text and not blocks:
            raise SlackError("no_text")
        self._check_blocks(blocks)
        ts = self._new_ts()
        self.ephemerals.append(Ephemeral(channel=channel, user=user, text=str(text or ""),
                                         thread_ts=args.get("thread_ts"), ts=ts, blocks=blocks))
        return {"message_ts": ts}

    def _update(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        message = self._message(args)
        markdown, text, blocks = self._content(args)
        message.markdown = markdown or ""
        message.text = text
        message.blocks = blocks or []
        message.streaming = False
        message.changes.append(("chat.update", now))
        return {"channel": message.channel, "ts": message.ts, "text": text or markdown or ""}

    def _delete(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        message = self._message(args)
        message.deleted = True
        message.changes.append(("chat.delete", now))
        return {"channel": message.channel, "ts": message.ts}

    @staticmethod
    def _stream_text(args: dict[str, Any]) -> str:
        text = str(args.get("markdown_text") or "") + _chunk_text(args.get("chunks"))
        if len(text) > MARKDOWN_LIMIT:
            raise SlackError("msg_too_long")
        return text

    def _start_stream(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        channel = str(args.get("channel") or "")
        if not channel:
            raise SlackError("channel_not_found")
        if not args.get("thread_ts"):
            raise SlackError("invalid_arguments")
        if channel[:1] in ("C", "G"):
            if not args.get("recipient_team_id"):
                raise SlackError("missing_recipient_team_id")
            if not args.get("recipient_user_id"):
                raise SlackError("missing_recipient_user_id")
        text = self._stream_text(args)
        ts = self._new_ts()
        self.messages[(channel, ts)] = Message(channel=channel, ts=ts, thread_ts=str(args["thread_ts"]),
                                               markdown=text, streaming=True, changes=[("chat.startStream", now)])
        return {"channel": channel, "ts": ts}

    def _streaming_message(self, args: dict[str, Any]) -> Message:
        message = self._message(args)
        if not message.streaming:
            raise SlackError("message_not_in_streaming_state")
        return message

    def _append_stream(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        message = self._streaming_message(args)
        key = (message.channel, message.ts)
        if self._expire_after is not None and self._appends[key] >= self._expire_after:
            message.streaming = False
            raise SlackError("message_not_in_streaming_state")
        self._appends[key] += 1
        message.markdown += self._stream_text(args)
        message.changes.append(("chat.appendStream", now))
        return {"channel": message.channel, "ts": message.ts}

    def _stop_stream(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        message = self._streaming_message(args)
        text = self._stream_text(args)
        blocks = _blocks(args.get("blocks"))
        self._check_blocks(blocks)
        message.markdown += text
        message.blocks = blocks
        message.streaming = False
        message.changes.append(("chat.stopStream", now))
        return {"channel": message.channel, "ts": message.ts, "message": {"ts": message.ts}}

    def _set_status(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        channel, thread_ts = args.get("channel_id"), args.get("thread_ts")
        if not channel or not thread_ts:
            raise SlackError("invalid_arguments")
        self.statuses[(str(channel), str(thread_ts))].append(str(args.get("status", "")))
        return {}

    @staticmethod
    def _reaction_target(args: dict[str, Any]) -> tuple[tuple[str, str], str]:
        channel, ts, name = (str(args.get(k) or "") for k in ("channel", "timestamp", "name"))
        if not channel:
            raise SlackError("channel_not_found")
        if not ts:
            raise SlackError("no_item_specified")
        if not name or ":" in name:
            raise SlackError("invalid_name")  # the name goes without colons: "eyes", not ":eyes:"
        return (channel, ts), name

    def _react(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        key, name = self._reaction_target(args)
        if name in self.reactions[key]:
            raise SlackError("already_reacted")
        self.reactions[key].append(name)
        return {}

    def _need(self, scope: str) -> None:
        if scope in self.missing_scopes:
            raise SlackError("missing_scope")

    def _users_info(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        self._need("users:read")
        user_id = str(args.get("user") or "")
        if user_id == self.bot_user_id and user_id not in self.users:
            self.add_user(user_id, is_bot=True, name="kbbot")
        if not user_id:
            raise SlackError("user_not_found")
        user = self.users.get(user_id)
        if user is None:  # anyone not scripted with add_user: a person without an e-mail (U0BOB is Bob)
            name = user_id.removeprefix("U0").capitalize()
            user = {"id": user_id, "team_id": self.team_id, "name": name.lower(), "deleted": False,
                    "is_bot": False, "is_app_user": False, "is_admin": False, "is_owner": False,
                    "is_restricted": False, "is_ultra_restricted": False,
                    "profile": {"display_name": name, "real_name": name}}
        if "users:read.email" in self.missing_scopes:
            user = {**user, "profile": {k: v for k, v in user["profile"].items() if k != "email"}}
        return {"user": user}

    def _users_list(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        """The workspace's users as Slack pages them (``limit`` up to ``users_page``, an opaque cursor):
        the scripted ones and the bot; e-mails only with users:read.email."""
        self._need("users:read")
        if self.bot_user_id not in self.users:
            self.add_user(self.bot_user_id, is_bot=True, name="kbbot")
        people = list(self.users.values())
        start = int(str(args.get("cursor") or "0").removeprefix("dXNlcjo") or 0)
        limit = min(int(args.get("limit") or self.users_page), self.users_page)
        following = start + limit
        page = people[start:following]
        if "users:read.email" in self.missing_scopes:
            page = [{**u, "profile": {k: v for k, v in u["profile"].items() if k != "email"}} for u in page]
        cursor = f"dXNlcjo{following}" if following < len(people) else ""
        return {"members": page, "cache_ts": int(now), "response_metadata": {"next_cursor": cursor}}

    def _group_json(self, handle: str) -> dict[str, Any]:
        return {"id": "S" + handle.upper(), "team_id": self.team_id, "is_usergroup": True, "name": handle,
                "handle": handle, "date_delete": 0, "user_count": len(self.usergroups[handle])}

    def _usergroups_list(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        self._need("usergroups:read")
        include = str(args.get("include_users", "")).lower() in ("1", "true")
        return {"usergroups": [{**self._group_json(h), **({"users": list(m)} if include else {})}
                               for h, m in self.usergroups.items()]}

    def _usergroups_users(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        self._need("usergroups:read")
        wanted = str(args.get("usergroup") or "")
        for handle, members in self.usergroups.items():
            if "S" + handle.upper() == wanted:
                return {"users": list(members)}
        raise SlackError("no_such_subteam")

    def _conversation_members(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        self._need("channels:read")
        channel = str(args.get("channel") or "")
        if channel not in self.channel_members:
            raise SlackError("channel_not_found")
        members = self.channel_members[channel]
        start = int(str(args.get("cursor") or "0").removeprefix("dXNlcjo") or 0)
        limit = min(int(args.get("limit") or 100), self.members_page)
        following = start + limit
        cursor = f"dXNlcjo{following}" if following < len(members) else ""
        return {"members": members[start:following], "response_metadata": {"next_cursor": cursor}}

    def _conversation_info(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        channel = str(args.get("channel") or "")
        if channel not in self.channels and channel in self.channel_members:
            self.add_channel(channel)
        if channel not in self.channels:
            raise SlackError("channel_not_found")
        described = self.channels[channel]
        self._need("groups:read" if described["is_private"] else "channels:read")
        return {"channel": dict(described)}

    def _unreact(self, args: dict[str, Any], now: float) -> dict[str, Any]:
        key, name = self._reaction_target(args)
        if name not in self.reactions[key]:
            raise SlackError("no_reaction")
        self.reactions[key].remove(name)
        return {}
