"""Google Drive as a source: the files of one folder tree, in My Drive (shared with the service account)
or in a shared drive, through the Drive v3 API.

Kind ``gdrive`` (``GDRIVE``): a ``gdrive:`` section (``DriveSettings``); its root is ``gdrive:<name>``.
Modules: ``client`` (``DriveClient``: token, calls, backoff, hosts), ``source`` (``DriveSource``),
``permissions`` (``DrivePermissions``).

- Authentication: a service account's JSON key (``service_account_file``, or the key itself in the
  variable ``service_account_env``), scope ``drive.readonly``; with ``subject``, domain-wide delegation
  as that user. google-auth signs the JWT-bearer grant and posts it to the key's ``token_uri``, through
  kbbot's own httpx client (the same host rules as every call). The source runs in the refresh's
  worker thread (``asyncio.to_thread``), so neither the token nor any call blocks the event loop.
- First run (and whenever the kept states cannot be trusted): ``changes.getStartPageToken`` *before*
  the crawl, so nothing changed during it is missed; then ``files.list`` folder by folder
  (``'<id>' in parents and trashed = false``; a shared drive with ``corpora=drive``, ``driveId``,
  ``includeItemsFromAllDrives``, ``supportsAllDrives``). The page token is kept in the run's states.
- Later runs read ``changes.list`` from that token: a removed or trashed file, or one no longer under
  the folder (itself, or a folder above it moved out), is revoked; a changed file is read again (only
  its readers when its content tag, checksum or modification time, is the same: written in place,
  nothing embedded); a folder moved in is crawled. Nothing changed: one ``changes.list`` call. A token
  Drive no longer accepts: one full resync, with a line saying so in the run's report.
- Content: Google Docs, Sheets and Slides exported to docx, xlsx, pptx (``files.export``; too large
  or not exportable: a line in the report, the rest indexed); other files downloaded (``alt=media``)
  and converted by their suffix, if it is an indexed type and not over ``indexing.max_file_mb``.
- Readers from ``permissions.list`` (``permissions``); cited by the file's ``webViewLink``, titled by
  its name.
- 429, 5xx and 403 ``rateLimitExceeded`` / ``userRateLimitExceeded``: exponential backoff with jitter,
  or ``Retry-After`` when Drive sends it, at most ``max_retries`` times and ``max_retry_wait_s`` at
  once; beyond that the run fails and nothing is revoked. Connections go only to Google's hosts (and the
  configured API and token hosts), redirects included, through ``pipelines.netguard``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, StrictBool, field_validator, model_validator

from pipelines.sections import Problem, Section
from pipelines.sources.fetcher import FetchState
from pipelines.sources.gdrive.client import DEFAULT_API, DRIVE_SCOPE, DriveClient, DriveError
from pipelines.sources.gdrive.source import DriveSource
from pipelines.sources.kind import SourceContext, SourceEntry, named_root


class DriveSettings(Section):
    """A Google Drive folder (or shared drive) as a source."""

    #: The folder's id (``https://drive.google.com/drive/folders/<id>``); a whole shared drive: its id.
    folder: str = Field(min_length=1, pattern=r"^[\w-]+$")
    #: The shared drive the folder is in (its id); unset: a folder in My Drive shared with the account.
    drive: str | None = Field(None, pattern=r"^[\w-]+$")
    #: The service account's JSON key: a file, or (unless a file is set) the variable holding the key itself.
    service_account_file: str | None = None
    service_account_env: str = Field("GOOGLE_SERVICE_ACCOUNT_JSON", min_length=1, pattern=r"\S")
    #: Domain-wide delegation: the user the service account acts as (its e-mail); unset: the account itself.
    subject: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+$")
    #: A file anyone may find ("anyone", discoverable) is public in kbbot; false: such a grant gives no one.
    anyone_public: StrictBool = False
    #: The Drive API's base URL (a test's fake; a Private Service Connect endpoint).
    api_url: str = DEFAULT_API
    #: Rate-limited answers are waited out this many times, never longer than this at once.
    max_retries: int = Field(5, ge=0)
    max_retry_wait_s: Annotated[float, Field(gt=0)] = 120

    @field_validator("api_url")
    @classmethod
    def _api(cls, url: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be the API's http(s) base URL ({DEFAULT_API}), got {url!r}")
        return url


class MissingKey(DriveError):
    """The service account's key is not set or cannot be read."""


#: Credentials by key and subject, so their token (an hour) serves the runs after the one that asked for it.
_CREDENTIALS: dict[tuple[str, ...], Any] = {}
_CREDENTIALS_LOCK = threading.Lock()


def service_account_info(settings: DriveSettings) -> dict[str, Any]:
    """The key's JSON. :raises MissingKey: not set, unreadable or not a service account key."""
    if settings.service_account_file:
        where = f"the service account key file {settings.service_account_file}"
        try:
            text = Path(settings.service_account_file).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise MissingKey(f"cannot read {where} ({exc.strerror or exc})") from exc
    else:
        where = f"the environment variable {settings.service_account_env}"
        text = os.environ.get(settings.service_account_env, "").strip()
        if not text:
            raise MissingKey(f"{where} (the service account's JSON key) is not set")
    try:
        info = json.loads(text)
    except ValueError as exc:
        raise MissingKey(f"{where} is not a JSON key ({exc.msg})") from exc
    missing = [k for k in ("client_email", "private_key", "token_uri") if not (isinstance(info, dict) and info.get(k))]
    if missing or info.get("type") != "service_account":
        raise MissingKey(f"{where} is not a service account key (type service_account with "
                         f"{', '.join(missing) or 'client_email, private_key, token_uri'})")
    return info


def credentials(settings: DriveSettings) -> Any:
    from google.oauth2 import service_account

    info = service_account_info(settings)
    key = (info["client_email"], str(info.get("private_key_id") or info["private_key"]), info["token_uri"],
           settings.subject or "")
    with _CREDENTIALS_LOCK:
        if key not in _CREDENTIALS:
            try:
                found = service_account.Credentials.from_service_account_info(info, scopes=[DRIVE_SCOPE])
            except ValueError as exc:
                raise MissingKey(f"the service account key cannot be used ({exc})") from exc
            _CREDENTIALS[key] = found.with_subject(settings.subject) if settings.subject else found
        return _CREDENTIALS[key]


def connect(settings: DriveSettings, context: SourceContext) -> DriveClient:
    """The client of ``settings``, its key read now. :raises MissingKey: see ``service_account_info``."""
    return DriveClient(credentials(settings), api_url=settings.api_url, timeout_s=context.fetch_timeout_s,
                       connect_timeout_s=context.connect_timeout_s, max_bytes=context.max_bytes,
                       max_retries=settings.max_retries, max_retry_wait_s=settings.max_retry_wait_s,
                       user_agent=context.user_agent, allow_hosts=context.allow_hosts)


class DriveEntry(SourceEntry):
    #: A Google Drive folder (see ``DriveSettings``), instead of path, urls or confluence.
    gdrive: DriveSettings | None = None

    @model_validator(mode="after")
    def _no_acl(self) -> DriveEntry:
        if self.gdrive is not None and getattr(self, "acl", None):
            raise Problem(": acl applies to folders and URLs; a Google Drive source records the permissions "
                          "Drive has")
        return self


class DriveKind:
    name = "gdrive"
    label = "gdrive (a Google Drive folder)"
    settings = DriveEntry
    named_roots = True
    keeps_states = True  # the page token, the folder tree, each file's content tag

    def selected(self, entry: DriveEntry) -> bool:
        return entry.gdrive is not None

    def roots(self, entry: DriveEntry) -> list[str]:
        return [named_root(self.name, entry.name)]

    def build(self, entry: DriveEntry, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> DriveSource:
        # Permissions only: the same source; the indexer has it read who may read, and no content.
        settings = entry.gdrive
        assert settings is not None
        client, missing = None, None
        try:
            client = connect(settings, context)
        except MissingKey as exc:
            missing = f"{exc}; nothing was read or revoked"
        return DriveSource(entry.name, client, folder=settings.folder, drive=settings.drive, states=states,
                           extensions=context.extensions, max_file_mb=context.max_file_mb,
                           max_documents=context.max_urls, anyone_public=settings.anyone_public, missing=missing)

    def claims(self, entry: DriveEntry, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]:
        return set()  # its doc ids name its root: no other source's document is one of its

    def capture(self, entry: DriveEntry, context: SourceContext) -> None:
        return None  # kbbot does not write to Drive


GDRIVE = DriveKind()
