"""``DriveClient``: the one way kbbot talks to Google Drive v3: the service account's token
(google-auth, through an httpx transport of ours), every call with httpx, bounded backoff on rate
limits, and no connection to a host that is not Google's (or the configured API and token hosts)."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.netguard import guarded_transport, refusal
from pipelines.sources.confluence.client import retry_after_s
from pipelines.sources.kind import SourceError

log = logging.getLogger("pipelines.sources.gdrive")

#: Read-only access to content and metadata: ``files.export`` needs it (``drive.metadata.readonly`` does not cover it).
DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
DEFAULT_API = "https://www.googleapis.com"
#: Where Drive itself sends kbbot: the API, and the content hosts its downloads are redirected to.
GOOGLE_HOSTS = ("googleapis.com", "googleusercontent.com", "docs.google.com", "drive.google.com")
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_REDIRECTS = 5


class DriveError(SourceError):
    """Drive could not be read; the message is the reason shown to the operator."""


class CredentialsRefused(DriveError):
    """Google would not give the service account a token (key deleted or revoked, delegation missing)."""


class RateLimited(DriveError):
    """Drive kept answering "rate limited" beyond the retries allowed: the run stops, nothing is revoked."""


class Gone(DriveError):
    """The file no longer exists for the service account (404)."""


class Refused(Gone):
    """A request was sent (or redirected) off Google's hosts, or to an address kbbot must not fetch from:
    nothing was read from it, and a version indexed earlier is revoked like a file that is gone."""


class ApiError(DriveError):
    """Drive answered with an error for one request (``status``, ``reason`` from its error body)."""

    def __init__(self, message: str, status: int, reason: str = ""):
        super().__init__(message)
        self.status = status
        self.reason = reason


def error_reason(body: bytes) -> tuple[str, str]:
    """The first ``reason`` and the ``message`` of a Drive error body (``{"error": {"errors": [...]}}``)."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "", ""
    if not isinstance(error, dict):
        return str(error), ""
    reasons = [e.get("reason") for e in error.get("errors") or [] if isinstance(e, dict) and e.get("reason")]
    return (str(reasons[0]) if reasons else str(error.get("status") or "")), str(error.get("message") or "")


def host_is_google(host: str, extra: Collection[str] = ()) -> bool:
    host = host.lower().rstrip(".")
    if host in {h.lower() for h in extra}:
        return True
    return any(host == g or host.endswith("." + g) for g in GOOGLE_HOSTS)


class _AuthResponse:
    """What google-auth reads of a token endpoint's answer (``google.auth.transport.Response``)."""

    def __init__(self, response: httpx.Response):
        self.status = response.status_code
        self.headers = dict(response.headers)
        self.data = response.content


class HttpxAuthRequest:
    """A ``google.auth.transport.Request`` on our httpx client: the token request passes the same
    host rules and network guard as every Drive call (google-auth's own transport would not)."""

    def __init__(self, client: DriveClient):
        self.client = client

    def __call__(self, url: str, method: str = "GET", body: bytes | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float | None = None, **_: Any) -> _AuthResponse:
        from google.auth.exceptions import TransportError

        self.client.token_requests += 1
        try:
            self.client.check_host(url)
            response = self.client.http.request(method, url, content=body, headers=dict(headers or {}),
                                                follow_redirects=False)
        except (httpx.HTTPError, Refused) as exc:
            raise TransportError(f"cannot reach the token endpoint {_origin(url)} ({exc})") from exc
        return _AuthResponse(response)


class DriveClient:
    """GETs against Drive v3 as one service account (``credentials``: google-auth's, scoped and, with
    domain-wide delegation, with a subject)."""

    def __init__(self, credentials: Any, *, api_url: str = DEFAULT_API, timeout_s: float = 30,
                 connect_timeout_s: float = 10, max_bytes: int = 20_000_000, max_retries: int = 5,
                 max_retry_wait_s: float = 120, user_agent: str = "kbbot", allow_hosts: Collection[str] = (),
                 transport: httpx.BaseTransport | None = None, sleep: Callable[[float], None] = time.sleep):
        self.credentials = credentials
        self.api_url = api_url.rstrip("/")
        self.max_bytes = max_bytes
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self.sleep = sleep
        token_uri = str(getattr(credentials, "_token_uri", "") or "")
        #: The operator chose these two (settings, the key's ``token_uri``); any other host must be Google's.
        self.own_hosts = tuple(h for h in (urlsplit(self.api_url).hostname, urlsplit(token_uri).hostname) if h)
        # Redirects are followed here hop by hop, so each one is checked against Google's hosts first;
        # the network guard also refuses a Google-looking name that resolves to a private address.
        self.http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)),
                                 headers={"User-Agent": user_agent}, follow_redirects=False,
                                 transport=transport or guarded_transport([*self.own_hosts, *allow_hosts]))
        self.auth_request = HttpxAuthRequest(self)
        #: Drive calls sent, token requests, and rate-limited answers waited out (bench, the run's log line).
        self.requests = 0
        self.token_requests = 0
        self.throttled = 0

    def close(self) -> None:
        self.http.close()

    def check_host(self, url: str) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https") or not host_is_google(host, self.own_hosts):
            raise Refused(f"refused: {_origin(url)} is not a Google Drive host; nothing was read from it")

    def token(self, renew: bool = False) -> str:
        """A valid access token, asked for again when it expired (or ``renew``: the API refused it)."""
        from google.auth.exceptions import GoogleAuthError, RefreshError

        if renew or not self.credentials.valid:
            try:
                self.credentials.refresh(self.auth_request)
            except RefreshError as exc:
                raise CredentialsRefused(_refused_text(exc)) from exc
            except GoogleAuthError as exc:
                raise DriveError(f"no Google token: {exc}") from exc
        return str(self.credentials.token)

    def url(self, path: str) -> str:
        return f"{self.api_url}/drive/v3/{path.lstrip('/')}"

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> bytes:
        """The body of a 200 answer to ``GET /drive/v3/<path>`` (at most ``max_bytes``), following
        redirects to Google's hosts only; rate limits waited out; else ``ApiError`` / ``Gone`` / ``Refused``."""
        url = self.url(path)
        renewed = False
        attempt = 0
        while True:
            self.requests += 1
            status, body, headers = self._send(url, params)
            if status == 200:
                return body
            reason, message = error_reason(body)
            if status == 401 and not renewed:  # a token revoked before its expiry: one new token, once
                renewed = True
                self.token(renew=True)
                continue
            if status in RETRY_STATUSES or (status == 403 and reason in RATE_REASONS):
                wait = self._backoff(attempt, headers.get("retry-after"), status, reason, path)
                attempt += 1
                self.throttled += 1
                log.info("gdrive: HTTP %d %s, waiting %.1f s", status, reason, wait)
                self.sleep(wait)
                continue
            if status == 401:
                raise CredentialsRefused("HTTP 401: Drive refused the service account's token even after a new one "
                                         "was issued" + (f" ({message})" if message else ""))
            if status == 404:
                raise Gone(f"HTTP 404 for {urlsplit(url).path}: deleted, or no longer shared with the service account")
            detail = "; ".join(x for x in (reason, message) if x)
            raise ApiError(f"HTTP {status} for {urlsplit(url).path}" + (f" ({detail})" if detail else ""), status,
                           reason)

    def _backoff(self, attempt: int, retry_after: str | None, status: int, reason: str, path: str) -> float:
        """How long to wait before try ``attempt + 2``: Retry-After when given, else exponential with jitter."""
        asked = retry_after_s(retry_after)
        wait = asked if asked is not None else min(2.0 ** attempt, 32.0) + random.uniform(0, 1)  # noqa: S311
        if attempt >= self.max_retries or wait > self.max_retry_wait_s:
            raise RateLimited(f"HTTP {status}{' ' + reason if reason else ''} from {path.split('?')[0]}: rate limited; "
                             f"gave up after {attempt + 1} tries (next wait {wait:.0f} s, longest allowed "
                             f"{self.max_retry_wait_s:g} s)")
        return wait

    def _send(self, url: str, params: Mapping[str, Any] | None) -> tuple[int, bytes, httpx.Headers]:
        request_url, request_params = url, params
        for _ in range(MAX_REDIRECTS + 1):
            self.check_host(request_url)
            headers = {"Authorization": f"Bearer {self.token()}"} if _same_origin(request_url, self.api_url) else {}
            try:
                with self.http.stream("GET", request_url, params=request_params, headers=headers) as response:
                    if response.is_redirect and response.headers.get("location"):
                        request_url, request_params = str(response.url.join(response.headers["location"])), None
                        continue
                    return response.status_code, self._read(response, url), response.headers
            except httpx.TimeoutException as exc:
                raise DriveError(f"no answer from {_origin(request_url)} in time ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                refused = refusal(exc)
                if refused is not None:
                    raise Refused(f"{urlsplit(url).path}: {refused}") from exc
                raise DriveError(f"cannot reach {_origin(request_url)} ({type(exc).__name__}: {exc})") from exc
        raise DriveError(f"{urlsplit(url).path}: more than {MAX_REDIRECTS} redirects")

    def _read(self, response: httpx.Response, url: str) -> bytes:
        body = bytearray()
        for chunk in response.iter_bytes():
            body.extend(chunk)
            if len(body) > self.max_bytes:
                raise DriveError(f"larger than the {self.max_bytes / 1e6:.1f} MB download limit "
                                 "(refresh.max_bytes); not downloaded")
        return bytes(body)

    def json(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = self.get(path, params)
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise DriveError(f"/drive/v3/{path}: not a JSON answer; is {self.api_url} the Drive API?") from exc
        if not isinstance(data, dict):
            raise DriveError(f"/drive/v3/{path}: unexpected answer ({type(data).__name__})")
        return data

    def pages(self, path: str, params: Mapping[str, Any], key: str) -> Iterator[dict[str, Any]]:
        """Every item under ``key`` of a listing, page after page (``nextPageToken``)."""
        query = dict(params)
        while True:
            data = self.json(path, query)
            yield from data.get(key) or []
            following = data.get("nextPageToken")
            if not following:
                return
            query["pageToken"] = following


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.netloc or '').lower()}"


def _same_origin(url: str, base: str) -> bool:
    return _origin(url) == _origin(base)


def _refused_text(exc: Exception) -> str:
    text = str(exc.args[0] if exc.args else exc)
    hint = ("the service account's key may have been deleted or disabled: create a new key and set it "
            "(gdrive.service_account_file / service_account_env)")
    if "unauthorized_client" in text:
        hint = ("domain-wide delegation is not granted for this client id and the drive.readonly scope "
                "(Admin console > Security > API controls > Domain-wide delegation), or gdrive.subject is not a "
                "user of that domain")
    elif "invalid_grant" in text and ("email" in text.lower() or "subject" in text.lower()):
        hint = "gdrive.subject is not a user the service account may act as"
    return f"Google refused the service account's credentials ({text.strip()}): {hint}"
