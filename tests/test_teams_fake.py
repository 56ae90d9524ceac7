"""The Teams fake driven by the Teams SDK's own client (``microsoft_teams.api.ApiClient``, with kbbot's
``BotTokens`` as its token provider) and parsed by the SDK's own activity models: the fake's wire format is
the SDK's, both ways."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from microsoft_teams.api import (
    ActivityTypeAdapter,
    AdaptiveCardInvokeActivity,
    ApiClient,
    ApiClientSettings,
    ChannelData,
    MessageActivity,
    MessageActivityInput,
    MessageSubmitActionInvokeActivity,
    TypingActivityInput,
)
from microsoft_teams.api.auth.cloud_environment import PUBLIC
from microsoft_teams.api.models.entity import CitationAppearance
from microsoft_teams.common import Client, ClientOptions

from adapters.teams.auth import BotTokens
from tests.fakes.teams import FakeTeams


@pytest.fixture
async def teams() -> AsyncIterator[FakeTeams]:
    async with FakeTeams() as fake:
        yield fake


@pytest.fixture
async def tokens(teams: FakeTeams) -> AsyncIterator[BotTokens]:
    tokens = BotTokens(teams.app_id, teams.app_secret, teams.tenant_id, login_url=teams.login_url)
    try:
        yield tokens
    finally:
        await tokens.close()


@pytest.fixture
async def api(teams: FakeTeams, tokens: BotTokens) -> AsyncIterator[ApiClient]:
    """The SDK's client as the Teams platform builds it: options passed, none read from the environment
    (OAUTH_URL), the httpx logger's level as kbbot set it (the SDK's ``Client`` resets it)."""
    level = logging.getLogger("httpx").level
    http = Client(ClientOptions(timeout=10))
    logging.getLogger("httpx").setLevel(level)
    client = ApiClient(teams.service_url, http, ApiClientSettings(oauth_url=PUBLIC.token_service_url), cloud=PUBLIC,
                       token_provider=tokens)
    try:
        yield client
    finally:
        await http.http.aclose()


def error_of(exc: httpx.HTTPStatusError) -> tuple[int, str, str]:
    error = exc.response.json().get("error") or {}
    return exc.response.status_code, error.get("code", ""), error.get("message", "")


def test_the_sdk_parses_each_activity_the_fake_delivers(teams: FakeTeams):
    alice = teams.add_user("Alice Example")
    team = teams.add_team("Support", [alice])
    chat = teams.group_chat([alice, teams.add_user("Bob Example")], name="Refunds")
    post = teams.channel_message("How long do refunds take?", user=alice, channel=team)
    parsed = ActivityTypeAdapter.validate_python(post)
    assert isinstance(parsed, MessageActivity)
    assert parsed.conversation.id == f"{team};messageid={post['id']}"
    assert parsed.conversation.conversation_type == "channel" and parsed.channel_data.team.id == team
    assert parsed.is_recipient_mentioned() and parsed.strip_mentions_text().text == "How long do refunds take?"
    reply = ActivityTypeAdapter.validate_python(teams.channel_message("And exchanges?", user=alice, channel=team,
                                                                      root=post["id"]))
    assert reply.conversation.id == f"{team};messageid={post['id']}"
    personal = ActivityTypeAdapter.validate_python(teams.personal_message("Hi", user=alice))
    assert personal.conversation.conversation_type == "personal" and not personal.is_recipient_mentioned()
    group = ActivityTypeAdapter.validate_python(teams.group_message("Hi", user=alice, chat=chat))
    assert group.conversation.conversation_type == "groupChat" and group.conversation.id == chat
    teams._keep_user_message(post)
    shown = teams.thread(post["conversation"]["id"])[0]
    feedback = ActivityTypeAdapter.validate_python(teams.feedback(shown, user=alice, reaction="dislike", text="Wrong"))
    assert isinstance(feedback, MessageSubmitActionInvokeActivity)
    assert feedback.value.action_value.reaction == "dislike" and feedback.reply_to_id == post["id"]
    click = ActivityTypeAdapter.validate_python(teams.card_action(shown, user=alice, verb="approve", data={"t": 1}))
    assert isinstance(click, AdaptiveCardInvokeActivity) and click.value.action.verb == "approve"


async def test_send_reply_in_a_thread_update_and_delete(teams: FakeTeams, api: ApiClient):
    alice = teams.add_user("Alice Example")
    team = teams.add_team("Support", [alice])
    post = teams.channel_message("How long do refunds take?", user=alice, channel=team)
    teams._keep_user_message(post)
    thread = post["conversation"]["id"]

    # Posting to the threaded id replies in the post's chain; to the bare channel id, a new post.
    answer = await api.conversations.create_activity(thread, MessageActivityInput(text="Refunds take"))
    other = await api.conversations.create_activity(team, MessageActivityInput(text="A new post"))
    assert [m.text for m in teams.thread(thread)] == [post["text"], "Refunds take"]
    assert teams.thread(team, other.id)[0].text == "A new post"
    # Replying to an activity of the bare channel goes to that activity's chain.
    await api.conversations.reply_to_activity(team, post["id"], MessageActivityInput(text="Also: exchanges"))
    assert [m.text for m in teams.bot_messages(thread)] == ["Refunds take", "Also: exchanges"]

    done = MessageActivityInput(text="Refunds take 14 days [1].").add_ai_generated().add_feedback().add_citation(
        1, CitationAppearance(name="Refund policy", abstract="Refunds within 14 days", url="https://kb.example/r"))
    await api.conversations.update_activity(thread, answer.id, done)
    shown = teams.message(thread, answer.id)
    assert shown.text == "Refunds take 14 days [1]." and shown.edits == ["Refunds take"]
    assert shown.citations[0]["appearance"]["name"] == "Refund policy"
    assert shown.ai_generated and shown.feedback_loop == "default"

    await api.conversations.delete_activity(thread, answer.id)
    assert [m.text for m in teams.bot_messages(thread)] == ["Also: exchanges"]
    assert [what for what, _ in shown.changes] == ["post", "edit", "delete"]
    with pytest.raises(httpx.HTTPStatusError) as gone:
        await api.conversations.update_activity(thread, answer.id, MessageActivityInput(text="again"))
    assert error_of(gone.value)[:2] == (404, "ActivityNotFoundInConversation")
    # Every call carried the app token, fetched once.
    assert len(teams.calls_to("POST", "/oauth2/v2.0/token")) == 1


async def test_stream_in_a_personal_chat(teams: FakeTeams, api: ApiClient):
    alice = teams.add_user("Alice Example")
    chat = teams.personal_chat(alice)
    teams.pace_streams(None)  # record the gaps only

    first = await api.conversations.create_activity(chat, TypingActivityInput(text="Searching the docs…")
                                                    .with_channel_data(ChannelData(stream_type="informative")).add_stream_update(1))
    stream = teams.streams[first.id]
    sequence = 2
    for text in ("Refunds", "Refunds take 14", "Refunds take 14 days"):
        await api.conversations.create_activity(chat, TypingActivityInput(text=text).with_id(first.id)
                                                .add_stream_update(sequence))
        sequence += 1
    assert stream.informative == ["Searching the docs…"] and stream.message.text == "Refunds take 14 days"
    # A request out of order is dropped, as Teams documents (202 with an error code).
    stale = await api.conversations.create_activity(chat, TypingActivityInput(text="Refunds").with_id(first.id)
                                                    .add_stream_update(2))
    assert stale.id == "DO_NOT_USE_PLACEHOLDER_ID" and stream.message.text == "Refunds take 14 days"

    final = MessageActivityInput(text="Refunds take 14 days [1].").add_ai_generated().add_feedback().add_citation(
        1, CitationAppearance(name="Refund policy", abstract="Refunds within 14 days"))
    final.id = first.id
    await api.conversations.create_activity(chat, final.add_stream_final())
    [shown] = teams.bot_messages(chat)
    assert shown.id == first.id and shown.text == "Refunds take 14 days [1]."
    assert shown.citations and shown.feedback_loop == "default" and stream.done
    assert [what for what, _ in shown.changes] == ["stream", "stream", "stream", "final"]
    assert len(stream.gaps()) == 5

    # The message is complete: streaming on it again is refused; editing it is not.
    with pytest.raises(httpx.HTTPStatusError) as again:
        await api.conversations.create_activity(chat, TypingActivityInput(text="more").with_id(first.id)
                                                .add_stream_update(9))
    assert error_of(again.value) == (403, "ContentStreamNotAllowed",
                                     "Content stream is not allowed on an already completed streamed message")
    await api.conversations.update_activity(chat, first.id, MessageActivityInput(text="Refunds: 14 days."))
    assert teams.message(chat, first.id).edits == ["Refunds take 14 days [1]."]


async def test_streams_are_refused_outside_personal_chats_and_when_stopped_or_too_fast(teams: FakeTeams,
                                                                                      api: ApiClient):
    alice = teams.add_user("Alice Example")
    team = teams.add_team("Support", [alice])
    with pytest.raises(httpx.HTTPStatusError) as channel:
        await api.conversations.create_activity(team, TypingActivityInput(text="Refunds").add_stream_update(1))
    assert error_of(channel.value) == (403, "ContentStreamNotAllowed", "Content stream is not allowed")

    chat = teams.personal_chat(alice)
    teams.pace_streams(1.0)
    first = await api.conversations.create_activity(chat, TypingActivityInput(text="Re").add_stream_update(1))
    with pytest.raises(httpx.HTTPStatusError) as fast:
        await api.conversations.create_activity(chat, TypingActivityInput(text="Refunds").with_id(first.id)
                                                .add_stream_update(2))
    assert error_of(fast.value)[:2] == (429, "TooManyRequests")
    teams.cancel_stream(first.id)  # the user pressed Stop
    with pytest.raises(httpx.HTTPStatusError) as stopped:
        await api.conversations.create_activity(chat, TypingActivityInput(text="Refunds").with_id(first.id)
                                                .add_stream_update(2))
    assert error_of(stopped.value)[2] == "Content stream was cancelled by user."
    assert [status for *_, status in teams.streams[first.id].requests] == [201, 429, 403]


async def test_a_stream_past_its_time_limit_is_refused(teams: FakeTeams, api: ApiClient):
    chat = teams.personal_chat(teams.add_user("Alice Example"))
    teams.stream_time_limit_s = 0.0
    first = await api.conversations.create_activity(chat, TypingActivityInput(text="Re").add_stream_update(1))
    with pytest.raises(httpx.HTTPStatusError) as late:
        await api.conversations.create_activity(chat, TypingActivityInput(text="Refunds").with_id(first.id)
                                                .add_stream_update(2))
    assert error_of(late.value)[2] == "Content stream finished due to exceeded streaming time."
    # What the SDK's HttpStream does then, and kbbot's sink will: the text put on the stream's message.
    await api.conversations.update_activity(chat, first.id, MessageActivityInput(text="Refunds take 14 days."))
    assert [m.text for m in teams.chat(chat)] == ["Refunds take 14 days."]


async def test_members_by_id_paged_and_by_channel(teams: FakeTeams, api: ApiClient):
    people = [teams.add_user(f"Person {i:03d}") for i in range(120)]
    team = teams.add_team("Support", people)
    private = teams.add_channel(team, "Escalations", members=people[:2], membership="private")

    alice = await api.conversations.get_member_by_id(team, people[0].id)
    assert alice.email == people[0].email and alice.user_principal_name == people[0].upn
    assert alice.aad_object_id == people[0].aad_object_id

    pages, token = [], None
    while True:
        page = await api.conversations.get_paged_members(team, page_size=50, continuation_token=token)
        pages.append([m.id for m in page.members])
        token = page.continuation_token
        if not token:
            break
    assert [len(p) for p in pages] == [50, 50, 20] and sum(pages, []) == [p.id for p in people]
    # A page smaller than Teams' smallest (50) is raised to it.
    assert len((await api.conversations.get_paged_members(team, page_size=10)).members) == 50

    assert [m.id for m in (await api.conversations.get_paged_members(private)).members] == [p.id for p in people[:2]]
    with pytest.raises(httpx.HTTPStatusError) as outsider:
        await api.conversations.get_member_by_id(private, people[5].id)
    assert error_of(outsider.value)[:2] == (404, "MemberNotFoundInConversation")

    channels = await api.teams.get_conversations(team)
    assert [(c.id, c.name) for c in channels] == [(team, None), (private, "Escalations")]


async def test_429_on_demand_per_conversation(teams: FakeTeams, api: ApiClient):
    alice = teams.add_user("Alice Example")
    chat, other = teams.personal_chat(alice), teams.personal_chat(teams.add_user("Bob Example"))
    teams.rate_limit(chat, times=1, retry_after=2)
    await api.conversations.create_activity(other, MessageActivityInput(text="not throttled"))
    with pytest.raises(httpx.HTTPStatusError) as throttled:
        await api.conversations.create_activity(chat, MessageActivityInput(text="Refunds"))
    assert throttled.value.response.status_code == 429 and throttled.value.response.headers["Retry-After"] == "2"
    await api.conversations.create_activity(chat, MessageActivityInput(text="Refunds"))
    assert [m.text for m in teams.chat(chat)] == ["Refunds"] and len(teams.refused()) == 1


async def test_documented_limits_are_enforced_per_conversation(teams: FakeTeams, api: ApiClient):
    chat = teams.personal_chat(teams.add_user("Alice Example"))
    teams.enforce_documented_limits([(3, 60.0)])
    for i in range(3):
        await api.conversations.create_activity(chat, MessageActivityInput(text=f"{i}"))
    with pytest.raises(httpx.HTTPStatusError) as over:
        await api.conversations.create_activity(chat, MessageActivityInput(text="3"))
    assert over.value.response.status_code == 429


async def test_an_expired_app_token_is_refused_until_a_new_one_is_fetched(teams: FakeTeams, api: ApiClient,
                                                                         tokens: BotTokens):
    chat = teams.personal_chat(teams.add_user("Alice Example"))
    await api.conversations.create_activity(chat, MessageActivityInput(text="one"))
    teams.expire_access_tokens()
    with pytest.raises(httpx.HTTPStatusError) as denied:
        await api.conversations.create_activity(chat, MessageActivityInput(text="two"))
    assert denied.value.response.status_code == 401
    tokens.forget()  # what the platform does on a 401
    await api.conversations.create_activity(chat, MessageActivityInput(text="two"))
    assert [m.text for m in teams.chat(chat)] == ["one", "two"]


def test_the_sdks_client_resets_the_httpx_loggers_level():
    """Why the ``api`` fixture restores it: kbbot keeps httpx at WARNING (``bot.logs``), so that its INFO
    line per request stays out of the logs; the Teams SDK's ``Client`` sets it to its own logger's level."""
    httpx_logger = logging.getLogger("httpx")
    before = httpx_logger.level
    try:
        httpx_logger.setLevel(logging.WARNING)
        Client(ClientOptions())
        assert httpx_logger.level != logging.WARNING
    finally:
        httpx_logger.setLevel(before)
