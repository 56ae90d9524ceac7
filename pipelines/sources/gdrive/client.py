"""``DriveClient``: the one way kbbot talks to Google Drive v3: the service account's token
(google-auth, through an httpx transport of ours), every call with httpx, bounded backoff on rate
limits, and no connection to a host that is not Google's (or the configured API and token hosts)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipelines.netguard import guarded_transport
from pipelines.sources.http import RetryPolicy, json_object, on_hosts, origin, reaching, read_capped
from pipelines.sources.kind import SourceError

#: Read-only access to content and metadata: ``files.export`` needs it (``drive.metadata.readonly`` does not cover it).
DRIVE_SCOPE = "https://www.googleapis.com/auth/drive.readonly"
DEFAULT_API = "https://www.googleapis.com"
#: Where Drive itself sends kbbot: the API, and the content hosts its downloads are redirected to.
GOOGLE_HOSTS = ("googleapis.com", "googleusercontent.com", "docs.google.com", "drive.google.com")
#: Drive says "rate limited" with a 403 of these reasons as well as with a 429.
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
            raise TransportError(f"cannot reach the token endpoint {origin(url)} ({exc})") from exc
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
        self.retry = RetryPolicy("Google Drive", max_retries=max_retries, max_wait_s=max_retry_wait_s,
                                 statuses=RETRY_STATUSES, reasons=RATE_REASONS, error=RateLimited)
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
        #: Drive calls sent and token requests (bench, the run's log line).
        self.requests = 0
        self.token_requests = 0

    def close(self) -> None:
        self.http.close()

    def check_host(self, url: str) -> None:
        if not on_hosts(url, GOOGLE_HOSTS, exact=self.own_hosts):
            raise Refused(f"refused: {origin(url)} is not a Google Drive host; nothing was read from it")

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
        waits: list[float] = []
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
            if self.retry.applies(status, reason):
                self.sleep(self.retry.wait_s(waits, status, headers.get("retry-after"), path.split("?")[0], reason))
                continue
            if status == 401:
                raise CredentialsRefused("HTTP 401: Drive refused the service account's token even after a new one "
                                         "was issued" + (f" ({message})" if message else ""))
            if status == 404:
                raise Gone(f"HTTP 404 for {urlsplit(url).path}: deleted, or no longer shared with the service account")
            detail = "; ".join(x for x in (reason, message) if x)
            raise ApiError(f"HTTP {status} for {urlsplit(url).path}" + (f" ({detail})" if detail else ""), status,
                           reason)

    def _send(self, url: str, params: Mapping[str, Any] | None) -> tuple[int, bytes, httpx.Headers]:
        request_url, request_params = url, params
        for _ in range(MAX_REDIRECTS + 1):
            self.check_host(request_url)
            headers = {"Authorization": f"Bearer {self.token()}"} if origin(request_url) == origin(self.api_url) else {}
            with (reaching(request_url, DriveError, Refused, urlsplit(url).path),
                  self.http.stream("GET", request_url, params=request_params, headers=headers) as response):
                if response.is_redirect and response.headers.get("location"):
                    request_url, request_params = str(response.url.join(response.headers["location"])), None
                    continue
                body = read_capped(response, self.max_bytes, urlsplit(url).path, DriveError)
                return response.status_code, body, response.headers
        raise DriveError(f"{urlsplit(url).path}: more than {MAX_REDIRECTS} redirects")

    def json(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return json_object(self.get(path, params), f"/drive/v3/{path}", DriveError, f"is {self.api_url} the Drive API?")

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
