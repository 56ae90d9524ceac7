"""``GraphClient``: how the SharePoint source talks to Microsoft Graph. The app's token from MSAL (client
credentials: a client secret or a certificate; MSAL is blocking, so it runs in a worker thread), plain
``httpx.AsyncClient`` for the calls (the Graph SDK is hundreds of megabytes for a handful of GETs), every
connection through the network guard, 429/503 waited out as ``Retry-After`` asks (every call of the run
pauses, as Graph asks of an app it throttles: ``RetryPolicy.paused_until``), ``@odata.nextLink``
followed on the Graph host only, and ``/content``'s redirect followed without the token, only to
SharePoint's download hosts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.netguard import guarded_async_transport
from pipelines.sources.http import RetryPolicy, aread_capped, json_object, on_hosts, origin, reaching
from pipelines.sources.kind import SourceError

GRAPH_URL = "https://graph.microsoft.com"
LOGIN_URL = "https://login.microsoftonline.com"
GRAPH_SCOPE = "https://graph.microsoft.com/.default"


class GraphError(SourceError):
    """Graph could not be read; the message is the reason shown to the operator."""


class TokenRefused(GraphError):
    """The login service gave no token (an expired or wrong secret, an unknown app or tenant)."""


class Forbidden(GraphError):
    """403: the app's permissions do not reach what was asked (no admin consent, or consent revoked)."""


class ItemGone(GraphError):
    """404: the item (or drive) is no longer there for the app."""


class DeltaExpired(GraphError):
    """410 on a delta link: Graph no longer knows the token; the drive must be enumerated again."""


class Refused(GraphError):
    """A download that must not be fetched (a host that is not SharePoint's, or an internal address)."""


class AppToken:
    """The app's Graph token by MSAL's client credentials, renewed by MSAL's own cache (forced after a 401)."""

    def __init__(self, tenant_id: str, client_id: str, credential: str | dict[str, str], *,
                 login_url: str = LOGIN_URL, scope: str = GRAPH_SCOPE, timeout_s: float = 30):
        self.tenant_id = tenant_id
        self.client_id = client_id
        self._credential = credential
        self.authority = f"{login_url.rstrip('/')}/{tenant_id}"
        self.scope = scope
        self.timeout_s = timeout_s
        self._app: Any = None
        self._lock = asyncio.Lock()
        self.requests = 0

    def _acquire(self, force: bool) -> str:
        import msal  # only a SharePoint source needs it

        if self._app is None:
            try:
                # instance_discovery off: the authority is the operator's (a sovereign cloud's login host
                # needs no vouching by login.microsoftonline.com, which the public one never asks).
                self._app = msal.ConfidentialClientApplication(
                    self.client_id, client_credential=self._credential, authority=self.authority,
                    instance_discovery=False, timeout=self.timeout_s)
            except ValueError as exc:  # MSAL's wording for an unreachable or unknown authority
                raise TokenRefused(f"the login service {self.authority} could not be used: "
                                   f"{str(exc).splitlines()[0][:300]}") from None
            except Exception as exc:  # noqa: BLE001 - requests' errors, a key MSAL cannot load
                raise TokenRefused(f"the login service {self.authority} could not be used "
                                   f"({type(exc).__name__}: {str(exc)[:200]})") from None
        if force:
            self._app.remove_tokens_for_client()
        self.requests += 1
        try:
            result = self._app.acquire_token_for_client(scopes=[self.scope])
        except Exception as exc:  # noqa: BLE001 - network errors from requests
            raise TokenRefused(f"no token from {self.authority} ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not result or "access_token" not in result:
            # The AADSTS number says what to fix (7000222: the secret expired; 700016: no such app).
            description = str((result or {}).get("error_description") or "").splitlines()[0][:300]
            raise TokenRefused(f"the login service refused the app's credentials: {(result or {}).get('error')}: "
                               f"{description}")
        return str(result["access_token"])

    async def get(self, *, force: bool = False) -> str:
        async with self._lock:
            return await asyncio.to_thread(self._acquire, force)


def _graph_error(response: httpx.Response) -> str:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    code, message = str(error.get("code") or "")[:64], " ".join(str(error.get("message") or "").split())[:200]
    return f"{code}: {message}" if message else code


class GraphClient:
    """GETs against Graph with the app's token; see the module docstring."""

    def __init__(self, token: AppToken, *, graph_url: str = GRAPH_URL, download_hosts: Collection[str] = (),
                 allow_hosts: Collection[str] = (), timeout_s: float = 30, connect_timeout_s: float = 10,
                 max_bytes: int = 20_000_000, max_retries: int = 5, max_retry_wait_s: float = 120,
                 user_agent: str = "kbbot", transport: httpx.AsyncBaseTransport | None = None):
        self.token = token
        self.graph_url = graph_url.rstrip("/")
        self.origin = origin(self.graph_url)
        self.download_hosts = tuple(download_hosts)
        self.max_bytes = max_bytes
        self.retry = RetryPolicy("Microsoft Graph", max_retries=max_retries, max_wait_s=max_retry_wait_s,
                                 error=GraphError)
        graph_host = urlsplit(self.graph_url).hostname or ""
        # Graph is the operator's choice (a sovereign cloud, the tests' fake); a download host must
        # also be a public address unless refresh.allow_hosts names it.
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
            headers={"User-Agent": user_agent, "Accept": "application/json"}, follow_redirects=False,
            transport=transport or guarded_async_transport([graph_host, *allow_hosts]))
        #: Calls sent (Graph and downloads), for the log and the bench.
        self.requests = 0
        self.downloads = 0

    async def close(self) -> None:
        await self.http.aclose()

    def url(self, link: str) -> str:
        """A Graph path (``/v1.0/...``) or a link Graph gave (``@odata.nextLink``) as a URL on the Graph host;
        a link to another host would carry the app's token away."""
        if link.startswith(("http://", "https://")):
            if origin(link) != self.origin:
                raise GraphError(f"Graph pointed to another host ({urlsplit(link).netloc[:80]}); not followed")
            return link
        return self.graph_url + "/" + link.lstrip("/")

    async def _send(self, url: str, *, authorized: bool, headers: dict[str, str] | None = None) -> httpx.Response:
        """One GET, retried on 429/503 and, once with a new token, on 401; the response is streamed (the
        caller reads or closes it)."""
        what = urlsplit(url).path
        renewed = False
        waits: list[float] = []
        while True:
            await asyncio.sleep(self.retry.pause_left())
            request_headers = dict(headers or {})
            if authorized:
                request_headers["Authorization"] = f"Bearer {await self.token.get(force=renewed)}"
            self.requests += 1
            with reaching(url, GraphError, Refused):
                response = await self.http.send(self.http.build_request("GET", url, headers=request_headers),
                                                stream=True)
            if self.retry.applies(response.status_code):
                await response.aclose()
                self.retry.wait_s(waits, response.status_code, response.headers.get("Retry-After"), what)
                continue  # the pause at the top of the loop waits
            if response.status_code == 401 and authorized and not renewed:
                await response.aclose()
                renewed = True
                continue
            return response

    async def _check(self, response: httpx.Response, what: str) -> None:
        status = response.status_code
        if 200 <= status < 400:
            return
        await response.aread()
        detail = _graph_error(response)
        if status == 401:
            raise GraphError(f"HTTP 401 for {what}: Microsoft Graph refused the app's token ({detail})")
        if status == 403:
            raise Forbidden(f"HTTP 403 for {what}: the app may not read it ({detail}); has an admin consented "
                            "to Files.Read.All, or granted Sites.Selected read on this site?")
        if status == 404:
            raise ItemGone(f"HTTP 404 for {what}: deleted, or not visible to the app ({detail})")
        if status == 410:  # Graph's long message adds nothing to its code
            raise DeltaExpired(f"HTTP 410 {detail.split(':')[0] or 'Gone'}")
        raise GraphError(f"HTTP {status} for {what}" + (f": {detail}" if detail else ""))

    async def json(self, link: str, params: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None) -> dict[str, Any]:
        url = self.url(link)
        if params:
            url = str(httpx.URL(url, params=params))
        response = await self._send(url, authorized=True, headers=headers)
        try:
            await self._check(response, urlsplit(url).path)
            body = await self._read(response, what=urlsplit(url).path)
        finally:
            await response.aclose()
        return json_object(body, urlsplit(url).path, GraphError, f"is {self.graph_url} Microsoft Graph?")

    async def pages(self, link: str, params: dict[str, str] | None = None,
                    headers: dict[str, str] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Each page of a collection, following ``@odata.nextLink`` (on the Graph host only)."""
        page = await self.json(link, params, headers)
        while True:
            yield page
            following = page.get("@odata.nextLink")
            if not following:
                return
            page = await self.json(str(following), headers=headers)

    async def values(self, link: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return [v for page in [p async for p in self.pages(link, params)] for v in page.get("value") or []
                if isinstance(v, dict)]

    async def _read(self, response: httpx.Response, *, what: str, limit: int | None = None) -> bytes:
        return await aread_capped(response, self.max_bytes if limit is None else limit, what, GraphError)

    async def download(self, drive_id: str, item_id: str, *, limit: int | None = None) -> bytes:
        """An item's bytes: ``/content`` answers 302 to a pre-authenticated download URL, fetched without
        the app's token and only on SharePoint's hosts (``download_hosts``); ``Refused`` elsewhere."""
        what = f"/drives/{drive_id}/items/{item_id}/content"
        response = await self._send(self.url(f"v1.0{what}"), authorized=True)
        try:
            await self._check(response, what)
            if response.status_code == 200:  # served directly (no redirect): Graph itself, token already sent
                self.downloads += 1
                return await self._read(response, what=what, limit=limit)
            location = response.headers.get("Location") or ""
        finally:
            await response.aclose()
        if response.status_code not in (301, 302, 303, 307, 308) or not location:
            raise GraphError(f"HTTP {response.status_code} for {what} without a download location")
        if not on_hosts(location, self.download_hosts):
            raise Refused(f"refused: its download URL is on {urlsplit(location).hostname or '?'}, not a SharePoint host "
                          f"({', '.join(self.download_hosts) or 'none'}; sharepoint.download_hosts)")
        self.downloads += 1
        got = await self._send(location, authorized=False)
        try:
            if got.status_code != 200:
                await got.aread()
                raise GraphError(f"HTTP {got.status_code} from the download URL of {what}")
            return await self._read(got, what=what, limit=limit)
        finally:
            await got.aclose()
