"""Teams' Bot Framework auth (``adapters.teams.auth``) against the fake's OpenID configuration, signing keys
and login service: every activity's JWT checked, each kind of bad one refused with 401 and one log line
that never holds the token; the app's own token fetched once and kept."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from adapters.teams.auth import ActivityAuth, BotTokens, KeysUnavailable, Refused, TokenError
from tests.fakes.teams import FakeTeams


@pytest.fixture
async def teams() -> AsyncIterator[FakeTeams]:
    async with FakeTeams() as fake:
        yield fake


class Bot:
    """A bot's ``/api/messages`` checked as the Teams platform will check it; what it let through."""

    def __init__(self, auth: ActivityAuth):
        self.auth = auth
        self.heard: list[dict] = []
        self.url = ""

    async def messages(self, request: web.Request) -> web.Response:
        activity = await request.json()
        if (refusal := await self.auth.refusal(request, activity)) is not None:
            return refusal
        self.heard.append(activity)
        return web.json_response({})


async def serve(auth: ActivityAuth) -> tuple[Bot, web.AppRunner]:
    bot = Bot(auth)
    app = web.Application()
    app.router.add_post("/api/messages", bot.messages)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    bot.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return bot, runner


@pytest.fixture
async def bot(teams: FakeTeams) -> AsyncIterator[Bot]:
    auth = ActivityAuth(teams.app_id, openid_url=teams.openid_url, refetch_after_s=0)
    bot, runner = await serve(auth)
    try:
        yield bot
    finally:
        await runner.cleanup()
        await auth.close()


def question(teams: FakeTeams) -> dict:
    alice = teams.add_user("Alice Example")
    return teams.personal_message("How long do refunds take?", user=alice)


async def test_a_connector_token_is_accepted(teams: FakeTeams, bot: Bot):
    team = teams.add_team("Support", [bob := teams.add_user("Bob Example")])
    sent = [question(teams), teams.channel_message("Refunds?", user=bob, channel=team)]
    for activity in sent:
        status, _ = await teams.deliver(bot.url, activity)
        assert status == 200
    assert [a["id"] for a in bot.heard] == [a["id"] for a in sent]
    assert teams.key_fetches == 1
    claims = await bot.auth.check(f"Bearer {teams.token(activity)}", activity)
    assert claims["aud"] == teams.app_id and claims["serviceurl"] == teams.service_url


@pytest.mark.parametrize("kind", ["missing header", "wrong audience", "wrong issuer", "expired beyond skew",
                                  "not yet valid beyond skew", "wrong key", "unknown key", "other service url",
                                  "not a jwt"])
async def test_each_bad_token_is_refused_with_401_and_one_log_line(teams: FakeTeams, bot: Bot, kind: str, caplog):
    activity = question(teams)
    token = teams.bad_tokens(activity)[kind]
    with caplog.at_level(logging.INFO, logger="kbbot.webhooks"):
        status, body = await teams.deliver(bot.url, activity, token=token)
    assert (status, body) == (401, {"error": "Unauthorized"})
    assert bot.heard == []
    [line] = [r for r in caplog.records if r.name == "kbbot.webhooks"]
    assert line.levelno == logging.WARNING and activity["id"] in line.getMessage()
    if token:
        assert token not in caplog.text and token.split(".")[-1] not in caplog.text


async def test_clock_skew_of_five_minutes_is_allowed(teams: FakeTeams, bot: Bot):
    activity = question(teams)
    # Expired 4 minutes ago, and valid only from 4 minutes from now: both within the skew.
    for token in (teams.token(activity, age_s=3600 + 240), teams.token(activity, age_s=-240)):
        status, _ = await teams.deliver(bot.url, activity, token=token)
        assert status == 200
    assert len(bot.heard) == 2


async def test_a_key_not_endorsed_for_teams_is_refused(teams: FakeTeams, bot: Bot):
    teams.rotate_keys(endorsements=["skype", "webchat"])
    activity = question(teams)
    with pytest.raises(Refused, match="not endorsed for channel 'msteams'"):
        await bot.auth.check(f"Bearer {teams.token(activity)}", activity)
    # A token minted for another channel's activity is refused for that channel's name too.
    teams.rotate_keys(endorsements=["msteams"])
    await bot.auth.check(f"Bearer {teams.token(activity)}", activity)
    with pytest.raises(Refused, match="'webchat'"):
        await bot.auth.check(f"Bearer {teams.token(activity)}", {**activity, "channelId": "webchat"})


async def test_rotated_keys_are_picked_up(teams: FakeTeams, bot: Bot):
    activity = question(teams)
    assert (await teams.deliver(bot.url, activity))[0] == 200
    old = teams.token(activity)
    teams.rotate_keys()
    # Tokens name the new key: the bot reads the keys again and accepts them; the old key is gone.
    assert (await teams.deliver(bot.url, activity))[0] == 200
    assert (await teams.deliver(bot.url, activity, token=old))[0] == 401
    assert len(bot.heard) == 2


async def test_unknown_keys_refetch_the_keys_at_most_every_refetch_after_s(teams: FakeTeams):
    now = [1000.0]
    auth = ActivityAuth(teams.app_id, openid_url=teams.openid_url, refetch_after_s=60, clock=lambda: now[0])
    activity = question(teams)
    try:
        await auth.check(f"Bearer {teams.token(activity)}", activity)
        teams.rotate_keys()
        for _ in range(3):  # a stranger's made-up kids (or a rotation seconds ago) cost no fetch
            now[0] += 10
            with pytest.raises(Refused, match="not one of the Bot Framework's"):
                await auth.check(f"Bearer {teams.token(activity)}", activity)
        assert teams.key_fetches == 1
        now[0] += 31
        await auth.check(f"Bearer {teams.token(activity)}", activity)
        assert teams.key_fetches == 2
        # A day on, the keys are read again whatever the tokens name.
        now[0] += 24 * 3600 + 1
        await auth.check(f"Bearer {teams.token(activity)}", activity)
        assert teams.key_fetches == 3
    finally:
        await auth.close()


async def test_keys_that_cannot_be_read_answer_503(teams: FakeTeams, caplog):
    auth = ActivityAuth(teams.app_id, openid_url=teams.root_url + "/nowhere/openidconfiguration")
    bot, runner = await serve(auth)
    try:
        activity = question(teams)
        with caplog.at_level(logging.INFO, logger="kbbot.webhooks"):
            status, _ = await teams.deliver(bot.url, activity)
        assert status == 503 and bot.heard == []
        with pytest.raises(KeysUnavailable):
            await auth.check(f"Bearer {teams.token(activity)}", activity)
    finally:
        await runner.cleanup()
        await auth.close()


async def test_the_app_token_is_fetched_once_and_kept(teams: FakeTeams):
    tokens = BotTokens(teams.app_id, teams.app_secret, teams.tenant_id, login_url=teams.login_url)
    try:
        first = await tokens.get_app_token("https://api.botframework.com/.default", None)
        assert await tokens.get_app_token() == first
        [call] = teams.calls_to("POST", "/oauth2/v2.0/token")
        assert call.status == 200 and call.body["grant_type"] == "client_credentials"
        tokens.forget()
        assert await tokens.get_app_token() != first
    finally:
        await tokens.close()


async def test_a_token_near_its_expiry_is_renewed(teams: FakeTeams):
    teams.token_lifetime_s = 299  # inside the 5-minute margin at once
    tokens = BotTokens(teams.app_id, teams.app_secret, teams.tenant_id, login_url=teams.login_url)
    try:
        await tokens.get_app_token()
        await tokens.get_app_token()
        assert len(teams.calls_to("POST", "/oauth2/v2.0/token")) == 2
    finally:
        await tokens.close()


async def test_a_wrong_secret_is_a_token_error_that_does_not_show_the_secret(teams: FakeTeams):
    tokens = BotTokens(teams.app_id, "wrong-secret-value", teams.tenant_id, login_url=teams.login_url)
    try:
        with pytest.raises(TokenError, match="401 invalid_client: AADSTS7000215") as error:
            await tokens.get_app_token()
        assert "wrong-secret-value" not in str(error.value)
    finally:
        await tokens.close()


async def test_a_session_given_is_not_closed(teams: FakeTeams):
    async with aiohttp.ClientSession() as session:
        auth = ActivityAuth(teams.app_id, openid_url=teams.openid_url, session=session)
        activity = question(teams)
        await auth.check(f"Bearer {teams.token(activity)}", activity)
        await auth.close()
        assert not session.closed
