"""The admin page's session behind a proxy and after logging out (issue 26, finding 12): the cookie
was not ``Secure`` behind a TLS-terminating proxy, and logging out left the signed 12-hour cookie
valid. ``kbbot serve``'s web app with the admin page over HTTP (``tests/admin_site.py``)."""

from __future__ import annotations

import logging
import os
import re
import uuid

import aiohttp
import pytest

from bot.state.turn_log.store import RedisTurnLog
from tests.admin_site import TOKEN, admin_site
from tests.fakes.slack_server import FakeSlack
from tests.test_slack import BOT, TEAM

PROXY = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7, 203.0.113.9"}


@pytest.fixture
async def fake_slack():
    async with FakeSlack(team_id=TEAM, bot_user_id=BOT) as fake:
        yield fake


async def login(session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
    async with session.post(f"{url}/admin/login", data={"token": TOKEN, "next": "/admin/turns"}, headers=headers,
                            allow_redirects=False) as resp:
        await resp.read()
        assert resp.status == 303
        return resp


async def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_and_only_then(kb_runtime, fake_slack, caplog):
    caplog.set_level(logging.INFO, logger="kbbot.admin")
    async with admin_site(kb_runtime, fake_slack) as site, aiohttp.ClientSession() as http:
        untrusted = (await login(http, site.url, PROXY)).cookies["kbbot_admin"]
        assert not untrusted["secure"], "anyone may send X-Forwarded-Proto: it is ignored"
        kb_runtime.settings.server.trusted_proxies = ["127.0.0.0/8"]
        behind_tls = (await login(http, site.url, PROXY)).cookies["kbbot_admin"]
        assert behind_tls["secure"] and behind_tls["httponly"] and behind_tls["samesite"] == "Strict"
        plain = (await login(http, site.url, {"X-Forwarded-Proto": "http"})).cookies["kbbot_admin"]
        assert not plain["secure"]
    logins = [r.getMessage() for r in caplog.records if r.getMessage().startswith("admin: login from")]
    # The client is the last address the trusted proxy did not write itself.
    assert logins == ["admin: login from 127.0.0.1", "admin: login from 203.0.113.9", "admin: login from 127.0.0.1"]


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "the page has a form with the CSRF token"
    return match.group(1)


async def test_a_cookie_from_before_a_logout_opens_nothing(kb_runtime, fake_slack):
    async with admin_site(kb_runtime, fake_slack) as site, aiohttp.ClientSession() as http:
        cookie = {"Cookie": f"kbbot_admin={(await login(http, site.url)).cookies['kbbot_admin'].value}"}
        async with http.get(f"{site.url}/admin/sources", headers=cookie, allow_redirects=False) as resp:
            assert resp.status == 200
            csrf = _csrf(await resp.text())
        async with http.post(f"{site.url}/admin/logout", data={"csrf": csrf}, headers=cookie,
                             allow_redirects=False) as resp:
            assert resp.status == 303 and resp.cookies["kbbot_admin"].value == ""
        # The same cookie, kept by a shared browser or copied: signed and in date, but logged out.
        async with http.get(f"{site.url}/admin/turns", headers=cookie, allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"].startswith("/admin/login")
        async with http.post(f"{site.url}/admin/sources/examples/refresh", data={"csrf": csrf}, headers=cookie,
                             allow_redirects=False) as resp:
            assert resp.status == 403
        again = {"Cookie": f"kbbot_admin={(await login(http, site.url)).cookies['kbbot_admin'].value}"}
        async with http.get(f"{site.url}/admin/turns", headers=again, allow_redirects=False) as resp:
            assert resp.status == 200, "a new login works"


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="REDIS_URL is not set (make test starts Redis)")
async def test_a_revoked_session_is_known_to_every_replica_until_it_would_have_expired():
    from bot.state.redis import connect_redis

    client = await connect_redis(os.environ["REDIS_URL"])
    prefix = f"kbbot-test-{uuid.uuid4().hex}:"
    try:
        one, other = RedisTurnLog(client, prefix), RedisTurnLog(client, prefix)
        await one.revoke_session("s1", 12 * 3600)
        assert await other.session_revoked("s1") and not await other.session_revoked("s2")
        ttl = await client.ttl(f"{prefix}admin:revoked:s1")
        assert 12 * 3600 - 5 <= ttl <= 12 * 3600, "kept as long as the cookie could still be used, no longer"
    finally:
        keys = await client.keys(f"{prefix}*")
        if keys:
            await client.delete(*keys)
        await client.aclose()
