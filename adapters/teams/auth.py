"""Bot Framework auth for Teams, both ways: the JWT on every activity Teams posts to ``/api/messages``
(``ActivityAuth``), and the app token kbbot's own calls to the Bot Connector carry (``BotTokens``).

Inbound, each rule of Microsoft's "Authenticate requests from the Bot Connector service" is checked:
``Authorization: Bearer``; RS256 signed by a key of the JWKS that the OpenID configuration names; issuer
``https://api.botframework.com``; audience the app id; ``exp``/``nbf`` within 5 minutes of skew; the
``serviceurl`` claim equal to the activity's ``serviceUrl``; and, where the key carries endorsements, the
activity's ``channelId`` among them. The Teams SDK's ``TokenValidator`` was not used: it skips the
endorsements, never reads the OpenID configuration (it derives the keys' URL from its name) and fetches
the keys with PyJWT's ``PyJWKClient``, blocking urllib on the event loop (a JWKS served from the same
loop never answers). Here the keys are fetched with aiohttp, cached, and fetched again when a token
names a key not yet seen (Microsoft rotates them) or when they are a day old.

Outbound, the SDK's own token path (MSAL's ``ConfidentialClientApplication``) needs an https authority
and asks ``login.microsoftonline.com`` to vouch for any other host, so no local fake can stand in for
it. ``BotTokens`` does the same OAuth client-credentials request with aiohttp and is handed to the SDK's
``ApiClient`` as its ``token_provider``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
from aiohttp import web

log = logging.getLogger("kbbot.webhooks")

#: Microsoft's public cloud (sovereign clouds have their own; see docs/teams.md).
OPENID_CONFIGURATION_URL = "https://login.botframework.com/v1/.well-known/openidconfiguration"
BOT_FRAMEWORK_ISSUER = "https://api.botframework.com"
LOGIN_URL = "https://login.microsoftonline.com"
BOT_SCOPE = "https://api.botframework.com/.default"
#: The clock skew Microsoft documents for these tokens.
SKEW_S = 300


class Refused(Exception):
    """An activity whose token does not prove it came from the Bot Connector for this app."""


class KeysUnavailable(Exception):
    """The signing keys could not be read: no activity can be checked, whoever sent it."""


@dataclass
class _Keys:
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    #: kid -> the channels the key is endorsed for (absent: the key carries no endorsements).
    endorsements: dict[str, list[str]] = field(default_factory=dict)
    fetched_at: float = float("-inf")


class ActivityAuth:
    """Checks the Bot Framework JWT of each inbound activity for app ``app_id``.

    ``refetch_after_s``: a token naming an unknown key fetches the keys again at most this often, so a
    stranger's made-up ``kid`` cannot turn every request into a fetch. ``max_age_s``: keys older than this
    are fetched again on the next activity.
    """

    def __init__(self, app_id: str, *, openid_url: str = OPENID_CONFIGURATION_URL,
                 issuer: str = BOT_FRAMEWORK_ISSUER, skew_s: float = SKEW_S, refetch_after_s: float = 60.0,
                 max_age_s: float = 24 * 3600.0, timeout_s: float = 10.0,
                 session: aiohttp.ClientSession | None = None, clock: Any = time.monotonic):
        if not app_id:
            raise ValueError("a Teams app id is needed to check who sends activities")
        self.app_id = app_id
        self.openid_url = openid_url
        self.issuer = issuer
        self.skew_s = skew_s
        self.refetch_after_s = refetch_after_s
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None
        self._clock = clock
        self._keys = _Keys()
        self._fetching = asyncio.Lock()
        #: After a failed fetch, none before this time (``refetch_after_s`` later).
        self._retry_at = float("-inf")

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    # --- the check -------------------------------------------------------------------------------
    async def check(self, authorization: str | None, activity: Mapping[str, Any]) -> dict[str, Any]:
        """The token's claims when ``authorization`` (the header) proves ``activity`` came from the Bot
        Connector for this app; else ``Refused`` (why, never the token), or ``KeysUnavailable``."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme != "Bearer" or not token.strip():
            raise Refused("no Authorization: Bearer header")
        token = token.strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Refused("the token is not a JWT") from None
        if header.get("alg") != "RS256":
            raise Refused(f"the token is signed with {str(header.get('alg'))[:16]!r}, not RS256")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Refused("the token names no signing key")
        key = await self._key(kid)
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["RS256"], audience=self.app_id, issuer=self.issuer, leeway=self.skew_s,
                options={"require": ["exp", "iss", "aud"]})
        except jwt.InvalidTokenError as exc:
            # PyJWT's messages name the rule broken ("Signature has expired", "Invalid audience"), never the token.
            raise Refused(str(exc)) from None
        service_url = str(activity.get("serviceUrl") or "")
        if str(claims.get("serviceurl") or "").rstrip("/") != service_url.rstrip("/") or not service_url:
            # The connector posts kbbot's answers to serviceUrl: a token for another one must not redirect them.
            raise Refused("the token's serviceurl is not the activity's serviceUrl")
        endorsed = self._keys.endorsements.get(kid)
        channel = str(activity.get("channelId") or "")
        if endorsed is not None and channel not in endorsed:
            raise Refused(f"the signing key is not endorsed for channel {channel[:32]!r}")
        return claims

    async def refusal(self, request: web.Request, activity: Mapping[str, Any]) -> web.Response | None:
        """None when ``request`` carries a good token for ``activity``; else the response to give it
        (401, or 503 while the keys cannot be read), after one log line."""
        try:
            await self.check(request.headers.get("Authorization"), activity)
        except Refused as exc:
            log.warning("Teams: refused %s activity %s from %s: %s", _field(activity.get("type")),
                        _field(activity.get("id")), request.remote, exc)
            return web.json_response({"error": "Unauthorized"}, status=401)
        except KeysUnavailable as exc:
            log.error("Teams: cannot check activities: %s", exc)
            return web.json_response({"error": "Service Unavailable"}, status=503)
        return None

    # --- the keys --------------------------------------------------------------------------------
    async def _key(self, kid: str) -> jwt.PyJWK:
        now = self._clock()
        stale = now - self._keys.fetched_at > self.max_age_s
        unknown = kid not in self._keys.keys
        if (stale or (unknown and now - self._keys.fetched_at >= self.refetch_after_s)) and now >= self._retry_at:
            async with self._fetching:
                # Another activity may have fetched them while this one waited.
                if self._keys.fetched_at < now and now >= self._retry_at:
                    try:
                        self._keys = await self._fetch()
                    except KeysUnavailable as exc:
                        self._retry_at = now + self.refetch_after_s
                        if not self._keys.keys:
                            raise
                        # Keys read before still check most activities.
                        log.warning("Teams: kept the signing keys read before: %s", exc)
        if not self._keys.keys:
            raise KeysUnavailable("no signing keys yet: the last fetch failed")
        key = self._keys.keys.get(kid)
        if key is None:
            raise Refused("the token's signing key is not one of the Bot Framework's")
        return key

    async def _fetch(self) -> _Keys:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            configuration = await self._get_json(self.openid_url)
            jwks_uri = configuration.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                raise KeysUnavailable(f"{self.openid_url} names no jwks_uri")
            jwks = await self._get_json(jwks_uri)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise KeysUnavailable(f"reading the signing keys failed: {type(exc).__name__}: {exc}") from None
        found = _Keys(fetched_at=self._clock())
        for entry in jwks.get("keys") or []:
            kid = entry.get("kid") if isinstance(entry, dict) else None
            if not kid:
                continue
            try:
                found.keys[kid] = jwt.PyJWK(entry, algorithm="RS256")
            except jwt.PyJWKError:
                continue  # a key of a kind these tokens never use
            if isinstance(entry.get("endorsements"), list):
                found.endorsements[kid] = [str(e) for e in entry["endorsements"]]
        if not found.keys:
            raise KeysUnavailable(f"{jwks_uri} holds no RS256 signing key")
        return found

    async def _get_json(self, url: str) -> dict[str, Any]:
        assert self._session is not None
        async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
            response.raise_for_status()
            body = json.loads(await response.read())
        if not isinstance(body, dict):
            raise ValueError(f"{url} answered no JSON object")
        return body


def _field(value: Any) -> str:
    """An activity's field as a log shows it: short, on one line (a stranger wrote it)."""
    return "".join(c for c in str(value if value is not None else "?") if c.isprintable())[:64]


# --- outbound ------------------------------------------------------------------------------------
class TokenError(Exception):
    """The login service refused the app's credentials (its error code, never the secret)."""


class BotTokens:
    """The app's Bot Connector access token by OAuth client credentials, kept until 5 minutes before it
    expires. Given to ``microsoft_teams.api.ApiClient(token_provider=...)``: the SDK calls
    ``get_app_token(scope, tenant_id)`` before each request.

    ``tenant``: the app's Entra tenant (new Azure Bot registrations are single-tenant since 2025-07-31);
    ``botframework.com`` for a multi-tenant registration.
    """

    def __init__(self, app_id: str, secret: str, tenant: str = "botframework.com", *, login_url: str = LOGIN_URL,
                 scope: str = BOT_SCOPE, margin_s: float = 300.0, timeout_s: float = 10.0,
                 session: aiohttp.ClientSession | None = None, clock: Any = time.monotonic):
        self.app_id = app_id
        self._secret = secret
        self.tenant = tenant or "botframework.com"
        self.login_url = login_url.rstrip("/")
        self.scope = scope
        self.margin_s = margin_s
        self.timeout_s = timeout_s
        self._session = session
        self._own_session = session is None
        self._clock = clock
        self._tokens: dict[str, tuple[str, float]] = {}
        self._lock = asyncio.Lock()

    async def get_app_token(self, scope: str | None = None, tenant_id: str | None = None) -> str:
        # The SDK asks for its cloud's bot scope; kbbot's own scope setting wins (sovereign clouds).
        scope = self.scope if not scope or scope == BOT_SCOPE else scope
        async with self._lock:
            token, expires_at = self._tokens.get(scope, ("", 0.0))
            if token and self._clock() < expires_at - self.margin_s:
                return token
            token, lifetime = await self._request(scope)
            self._tokens[scope] = (token, self._clock() + lifetime)
            return token

    def forget(self) -> None:
        """Drop the tokens held (the connector said 401: the next call asks for a new one)."""
        self._tokens.clear()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _request(self, scope: str) -> tuple[str, float]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        form = {"grant_type": "client_credentials", "client_id": self.app_id, "client_secret": self._secret,
                "scope": scope}
        url = f"{self.login_url}/{self.tenant}/oauth2/v2.0/token"
        async with self._session.post(url, data=form) as response:
            try:
                body = json.loads(await response.read())
            except ValueError:
                body = {}
            if response.status != 200 or not body.get("access_token"):
                # AAD's error codes (invalid_client, unauthorized_client) say what to fix; its description
                # starts with the AADSTS number to look up.
                description = str(body.get("error_description") or "").split("\r\n")[0][:200]
                raise TokenError(f"{url} answered {response.status} {body.get('error') or ''}: {description}")
        return str(body["access_token"]), float(body.get("expires_in") or 3600)
