"""A local Google Drive (v3) and its OAuth token endpoint, as ``pipelines.sources.gdrive`` uses them.

- ``POST /token``: the JWT-bearer grant (``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``,
  ``assertion``): the assertion must be RS256-signed by the service account's key (generated here with
  ``cryptography``; ``service_account_info()`` is its JSON key, ``token_uri`` this endpoint), name the
  key (``kid``), the account (``iss``), Google's token endpoint or this one (``aud``) and the ``drive.readonly`` scope, and not
  be expired. ``revoke_key()``: the key is deleted (``invalid_grant``, and tokens issued are refused
  too); a ``sub`` not in ``delegated`` (domain-wide delegation) is ``unauthorized_client``;
- every ``/drive/v3`` call needs a token issued here (``Authorization: Bearer``), else 401;
- ``GET /drive/v3/files?q=...``: ``q`` as the source sends it (``'<id>' in parents``, ``trashed = false``
  joined by ``and``; anything else is 400), ``corpora``/``driveId``/``includeItemsFromAllDrives``/
  ``supportsAllDrives`` checked as Drive does (a shared drive's files only with both flags; ``driveId``
  if and only if ``corpora=drive``), pages of ``pageSize`` (capped at ``max_page``) with ``nextPageToken``;
- ``GET /drive/v3/files/{id}``: the file's metadata; ``alt=media``: its bytes (a Google Docs file:
  403 ``fileNotDownloadable``; ``redirect``: a 302 elsewhere);
- ``GET /drive/v3/files/{id}/export?mimeType=``: a Google Docs file's export, 403
  ``exportSizeLimitExceeded`` past ``export_limit`` bytes, 403 ``cannotExportFile`` when blocked;
- ``GET /drive/v3/changes/startPageToken`` and ``GET /drive/v3/changes?pageToken=``: every change (add,
  edit, trash, delete, move, sharing) is logged; a token is a position in the log; the last page has
  ``newStartPageToken``; after ``expire_tokens()`` those handed out before are refused (400 ``invalid``,
  location pageToken);
- ``GET /drive/v3/files/{id}/permissions``: pages of permissions; 403 ``insufficientFilePermissions``
  for a file with ``permissions_hidden``;
- ``throttle(n, status, reason, retry_after)``: the next ``n`` Drive calls answer 403/429 rate-limited.

``log`` has (method, path with query, status, monotonic time) per request.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.local_server import LocalServer

FOLDER = "application/vnd.google-apps.folder"
DOC = "application/vnd.google-apps.document"
SHEET = "application/vnd.google-apps.spreadsheet"
SLIDES = "application/vnd.google-apps.presentation"
EXPORT_OF = {DOC: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
             SHEET: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
             SLIDES: "application/vnd.openxmlformats-officedocument.presentationml.presentation"}
EDITOR = {DOC: "document", SHEET: "spreadsheets", SLIDES: "presentation"}
SCOPE = "https://www.googleapis.com/auth/drive.readonly"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: What google-auth puts in ``aud`` whatever the key's token_uri (Google's endpoint accepts it).
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
EPOCH = 1_000_000


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def user(email: str, role: str = "reader") -> dict[str, Any]:
    return {"type": "user", "role": role, "emailAddress": email}


def group(email: str, role: str = "reader") -> dict[str, Any]:
    return {"type": "group", "role": role, "emailAddress": email}


def domain(name: str, discoverable: bool = True) -> dict[str, Any]:
    return {"type": "domain", "role": "reader", "domain": name, "allowFileDiscovery": discoverable}


def anyone(discoverable: bool = True) -> dict[str, Any]:
    return {"type": "anyone", "role": "reader", "allowFileDiscovery": discoverable}


@dataclass
class FakeFile:
    id: str
    name: str
    mime: str
    parents: list[str]
    data: bytes = b""  # a binary file's bytes; a Google Docs file's export
    drive: str | None = None
    modified: int = 0
    trashed: bool = False
    permissions: list[dict[str, Any]] = field(default_factory=list)
    permissions_hidden: bool = False
    export_blocked: bool = False
    redirect: str | None = None

    @property
    def native(self) -> bool:
        return self.mime.startswith("application/vnd.google-apps.")

    def json(self) -> dict[str, Any]:
        if self.mime in EDITOR:
            link = f"https://docs.google.com/{EDITOR[self.mime]}/d/{self.id}/edit?usp=drivesdk"
        elif self.mime == FOLDER:
            link = f"https://drive.google.com/drive/folders/{self.id}"
        else:
            link = f"https://drive.google.com/file/d/{self.id}/view?usp=drivesdk"
        data: dict[str, Any] = {"kind": "drive#file", "id": self.id, "name": self.name, "mimeType": self.mime,
                                "parents": list(self.parents), "trashed": self.trashed, "webViewLink": link,
                                "modifiedTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(1.7e9 + self.modified))}
        if not self.native:
            data["md5Checksum"] = hashlib.md5(self.data).hexdigest()  # noqa: S324 - Drive's own checksum
            data["size"] = str(len(self.data))
        if self.drive:
            data["driveId"] = self.drive
        return data


def _error(status: int, reason: str, message: str, location: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"domain": "global", "reason": reason, "message": message}
    if location:
        error.update(locationType="parameter", location=location)
    return {"error": {"errors": [error], "code": status, "message": message}}


def parse_q(q: str) -> tuple[str, bool | None]:
    """The parent and the ``trashed`` value of ``'<id>' in parents and trashed = false``; ValueError else."""
    parent, trashed = None, None
    for clause in (c.strip() for c in q.split(" and ")):
        if clause.endswith(" in parents") and clause.startswith("'"):
            parent = clause[1:-len(" in parents")].rstrip("'").replace("\\'", "'")
        elif clause.replace(" ", "") in ("trashed=false", "trashed=true"):
            trashed = clause.replace(" ", "") == "trashed=true"
        else:
            raise ValueError(f"unsupported query clause: {clause}")
    if parent is None:
        raise ValueError("this fake lists children of one folder ('<id>' in parents)")
    return parent, trashed


class FakeDrive(LocalServer):
    def __init__(self, *, client_email: str = "kbbot-reader@kbbot-test.iam.gserviceaccount.com",
                 export_limit: int = 10_000_000, max_page: int = 1000):
        super().__init__()
        self.key = new_key()
        self.key_id = uuid.uuid4().hex
        self.client_email = client_email
        self.export_limit = export_limit
        self.max_page = max_page
        self.files: dict[str, FakeFile] = {}
        self.drives: set[str] = set()
        self.change_log: list[str] = []  # file ids, one per change
        #: Page tokens are ``epoch * EPOCH + position``: those of an earlier epoch are refused.
        self.epoch = 1
        self.tokens: set[str] = set()
        self.revoked = False
        #: Users the account may act as (domain-wide delegation).
        self.delegated: set[str] = set()
        self.log: list[tuple[str, str, int, float]] = []
        self._throttle: list[tuple[int, str, str | None]] = []
        self._clock = itertools.count(1)
        self._ids = itertools.count(1000)

    # --- the service account -------------------------------------------------------------------
    def service_account_info(self, key: rsa.RSAPrivateKey | None = None) -> dict[str, Any]:
        pem = (key or self.key).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()).decode()
        return {"type": "service_account", "project_id": "kbbot-test", "private_key_id": self.key_id,
                "private_key": pem, "client_email": self.client_email, "client_id": "104200000000000000001",
                "token_uri": f"{self.base_url}/token"}

    def revoke_key(self) -> None:
        """The key is deleted in the Cloud console: no new token, and those issued stop working."""
        self.revoked = True
        self.tokens.clear()

    # --- content ---------------------------------------------------------------------------------
    def new_id(self) -> str:
        return f"1Fk{next(self._ids)}xYz"

    def _changed(self, file: FakeFile) -> None:
        file.modified = next(self._clock)
        self.change_log.append(file.id)

    def folder(self, name: str, parent: str, drive: str | None = None) -> FakeFile:
        return self.add(name, parent, b"", mime=FOLDER, drive=drive)

    def add(self, name: str, parent: str, data: bytes, *, mime: str = "application/octet-stream",
            drive: str | None = None, permissions: list[dict[str, Any]] | None = None, **options: Any) -> FakeFile:
        file = FakeFile(self.new_id(), name, mime, [parent], data, drive=drive,
                        permissions=list(permissions if permissions is not None else [user("owner@example.com",
                                                                                           "owner")]), **options)
        self.files[file.id] = file
        self._changed(file)
        return file

    def edit(self, file: FakeFile, data: bytes) -> None:
        file.data = data
        self._changed(file)

    def trash(self, file: FakeFile) -> None:
        file.trashed = True
        self._changed(file)

    def delete(self, file: FakeFile) -> None:
        del self.files[file.id]
        self.change_log.append(file.id)

    def move(self, file: FakeFile, parent: str) -> None:
        file.parents = [parent]
        self.change_log.append(file.id)  # a move is a change of the file, not of its content

    def share(self, file: FakeFile, permissions: list[dict[str, Any]]) -> None:
        file.permissions = list(permissions)
        self.change_log.append(file.id)  # sharing changes the file's metadata, not its modifiedTime

    def expire_tokens(self) -> None:
        """Page tokens handed out so far are no longer accepted."""
        self.epoch += 1

    def page_token(self, position: int) -> str:
        return str(self.epoch * EPOCH + position)

    def throttle(self, n: int, status: int = 403, reason: str = "userRateLimitExceeded",
                 retry_after: str | None = None) -> None:
        self._throttle += [(status, reason, retry_after)] * n

    def calls(self, fragment: str = "/drive/v3/") -> list[tuple[str, str, int, float]]:
        return [entry for entry in self.log if fragment in entry[1]]

    # --- wire ------------------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token)
        app.router.add_get("/drive/v3/files", self._list)
        app.router.add_get("/drive/v3/files/{id}", self._get)
        app.router.add_get("/drive/v3/files/{id}/export", self._export)
        app.router.add_get("/drive/v3/files/{id}/permissions", self._permissions)
        app.router.add_get("/drive/v3/changes/startPageToken", self._start_token)
        app.router.add_get("/drive/v3/changes", self._changes)

    def _answer(self, request: web.Request, status: int, data: Any = None, *, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> web.Response:
        self.log.append((request.method, request.path_qs, status, time.monotonic()))
        if body is not None:
            return web.Response(status=status, body=body, headers=headers,
                                content_type="application/octet-stream")
        return web.json_response(data if data is not None else {}, status=status, headers=headers)

    async def _token(self, request: web.Request) -> web.Response:
        form = parse_qs((await request.read()).decode())
        if form.get("grant_type") != [JWT_BEARER] or len(form.get("assertion", [])) != 1:
            return self._answer(request, 400, {"error": "unsupported_grant_type", "error_description": "Invalid grant_type"})
        assertion = form["assertion"][0]
        try:
            header = jwt.get_unverified_header(assertion)
            claims = jwt.decode(assertion, self.key.public_key(), algorithms=["RS256"],
                                audience=[GOOGLE_TOKEN_AUDIENCE, f"{self.base_url}/token"], issuer=self.client_email,
                                options={"require": ["exp", "iat", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            return self._answer(request, 400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {exc}"})
        if self.revoked or header.get("kid") != self.key_id:
            return self._answer(request, 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        if SCOPE not in str(claims.get("scope", "")).split():
            return self._answer(request, 400, {"error": "invalid_scope", "error_description": "Invalid OAuth scope."})
        if "sub" in claims and claims["sub"] not in self.delegated:
            return self._answer(request, 401, {"error": "unauthorized_client", "error_description": (
                "Client is unauthorized to retrieve access tokens using this method, or client not authorized for "
                "any of the scopes requested.")})
        token = "ya29." + uuid.uuid4().hex
        self.tokens.add(token)
        return self._answer(request, 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    def _gate(self, request: web.Request) -> web.Response | None:
        if self._throttle:
            status, reason, retry_after = self._throttle.pop(0)
            return self._answer(request, status, _error(status, reason, "Rate Limit Exceeded"),
                                headers={"Retry-After": retry_after} if retry_after else None)
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.tokens:
            return self._answer(request, 401, {"error": {
                "code": 401, "status": "UNAUTHENTICATED", "message": "Request had invalid authentication credentials.",
                "errors": [{"message": "Invalid Credentials", "domain": "global", "reason": "authError",
                            "location": "Authorization", "locationType": "header"}]}})
        return None

    def _visible(self, file: FakeFile, query: Any) -> bool:
        """A shared drive's file is seen only by a caller that says it supports shared drives."""
        return not file.drive or query.get("supportsAllDrives") == "true"

    def _file(self, request: web.Request) -> FakeFile | web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        file_id = request.match_info["id"]
        file = self.files.get(file_id)
        if file is None or not self._visible(file, request.query):
            return self._answer(request, 404, _error(404, "notFound", f"File not found: {file_id}.", "fileId"))
        return file

    async def _list(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        query = request.query
        corpora, drive_id = query.get("corpora", "user"), query.get("driveId")
        if (corpora == "drive") != bool(drive_id):
            return self._answer(request, 400, _error(400, "invalid", "The driveId parameter must be specified if "
                                                     "and only if corpora is set to drive.", "driveId"))
        try:
            parent, trashed = parse_q(query.get("q", ""))
        except ValueError as exc:
            return self._answer(request, 400, _error(400, "invalid", f"Invalid Value: {exc}", "q"))
        all_drives = query.get("includeItemsFromAllDrives") == "true" and query.get("supportsAllDrives") == "true"
        found = [f for f in self.files.values() if parent in f.parents
                 and (trashed is None or f.trashed == trashed)
                 and (f.drive == drive_id if drive_id else (not f.drive or all_drives))
                 and (not f.drive or all_drives)]
        start = int(query.get("pageToken", "0") or 0)
        size = min(int(query.get("pageSize", "100")), self.max_page)
        data: dict[str, Any] = {"kind": "drive#fileList", "files": [f.json() for f in found[start:start + size]]}
        if start + size < len(found):
            data["nextPageToken"] = str(start + size)
        return self._answer(request, 200, data)

    async def _get(self, request: web.Request) -> web.Response:
        file = self._file(request)
        if isinstance(file, web.Response):
            return file
        if request.query.get("alt") != "media":
            return self._answer(request, 200, file.json())
        if file.native:
            return self._answer(request, 403, _error(403, "fileNotDownloadable", "Only files with binary content "
                                                     "can be downloaded. Use Export with Docs Editors files."))
        if file.redirect:
            self.log.append((request.method, request.path_qs, 302, time.monotonic()))
            raise web.HTTPFound(file.redirect)
        return self._answer(request, 200, body=file.data)

    async def _export(self, request: web.Request) -> web.Response:
        file = self._file(request)
        if isinstance(file, web.Response):
            return file
        if file.mime not in EXPORT_OF or request.query.get("mimeType") != EXPORT_OF[file.mime]:
            return self._answer(request, 400, _error(400, "badRequest", "The requested conversion is not supported.",
                                                     "convertTo"))
        if file.export_blocked:
            return self._answer(request, 403, _error(403, "cannotExportFile", "This file cannot be exported by the "
                                                     "user."))
        if len(file.data) > self.export_limit:
            return self._answer(request, 403, _error(403, "exportSizeLimitExceeded",
                                                     "This file is too large to be exported."))
        return self._answer(request, 200, body=file.data)

    async def _permissions(self, request: web.Request) -> web.Response:
        file = self._file(request)
        if isinstance(file, web.Response):
            return file
        if file.permissions_hidden:
            return self._answer(request, 403, _error(403, "insufficientFilePermissions", "The user does not have "
                                                     "sufficient permissions for this file."))
        start = int(request.query.get("pageToken", "0") or 0)
        size = min(int(request.query.get("pageSize", "100")), 100, self.max_page)
        listed = [{"kind": "drive#permission", "id": f"p{i}", **p} for i, p in enumerate(file.permissions)]
        data: dict[str, Any] = {"kind": "drive#permissionList", "permissions": listed[start:start + size]}
        if start + size < len(listed):
            data["nextPageToken"] = str(start + size)
        return self._answer(request, 200, data)

    async def _start_token(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        return self._answer(request, 200, {"kind": "drive#startPageToken",
                                           "startPageToken": self.page_token(len(self.change_log))})

    async def _changes(self, request: web.Request) -> web.Response:
        refused = self._gate(request)
        if refused is not None:
            return refused
        query = request.query
        token = query.get("pageToken", "")
        epoch, start = divmod(int(token), EPOCH) if token.isdigit() else (0, 0)
        if epoch != self.epoch or start > len(self.change_log):
            return self._answer(request, 400, _error(400, "invalid", "Invalid Value", "pageToken"))
        drive_id = query.get("driveId")
        size = min(int(query.get("pageSize", "100")), self.max_page)
        window = self.change_log[start:start + size]
        changes = []
        for file_id in window:
            file = self.files.get(file_id)
            if drive_id and (file is None or file.drive != drive_id) and file is not None:
                continue
            if file is not None and not self._visible(file, query):
                continue
            change: dict[str, Any] = {"kind": "drive#change", "changeType": "file", "fileId": file_id,
                                      "removed": file is None, "time": "2026-01-01T00:00:00.000Z"}
            if file is not None:
                change["file"] = file.json()
            changes.append(change)
        data: dict[str, Any] = {"kind": "drive#changeList", "changes": changes}
        if start + size < len(self.change_log):
            data["nextPageToken"] = self.page_token(start + size)
        else:
            data["newStartPageToken"] = self.page_token(len(self.change_log))
        return self._answer(request, 200, data)


def service_account_json(drive: FakeDrive, **changes: Any) -> str:
    return json.dumps({**drive.service_account_info(), **changes})
