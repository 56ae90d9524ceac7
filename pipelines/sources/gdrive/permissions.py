"""Who may read a Drive file: its ``permissions.list``, as kbbot's principals, failing closed."""

from __future__ import annotations

from typing import Any

from pipelines.records import PUBLIC
from pipelines.sources.gdrive.client import ApiError, DriveClient

#: Every role reads (a commenter or writer reads as a reader does).
READ_ROLES = frozenset({"owner", "organizer", "fileOrganizer", "writer", "commenter", "reader"})
FIELDS = "nextPageToken,permissions(id,type,role,emailAddress,domain,allowFileDiscovery,deleted)"


class ReadersUnknown(Exception):
    """Who may read the file cannot be established: it is indexed readable by nobody; the message says why."""


def domain_principal(domain: str) -> str:
    """Everyone of a Google Workspace domain: an asker holds it through an e-mail address of that domain."""
    return f"domain:{domain.strip().lower()}"


def principals(permissions: list[dict[str, Any]], *, anyone_public: bool = False) -> list[str]:
    """The principals of a file's permissions:

    - ``user`` -> ``user:<e-mail>``, ``group`` -> ``group:<group e-mail>``;
    - ``domain`` that people of the domain can find (``allowFileDiscovery``) -> ``domain:<domain>``;
    - ``anyone`` that can be found -> ``public`` only when the operator allows it (``anyone_public``);
    - a link-only grant (``allowFileDiscovery: false``) gives no one: whoever has the link is no one
      kbbot can name, and a link passed around is not a decision to publish;
    - a deleted account gives no one. A permission of a type kbbot does not know makes the readers
      unknown (``ReadersUnknown``): held back, never guessed.
    """
    found: set[str] = set()
    for permission in permissions:
        kind = str(permission.get("type") or "")
        if permission.get("deleted") or str(permission.get("role") or "") not in READ_ROLES:
            continue
        email = str(permission.get("emailAddress") or "").strip().lower()
        discoverable = bool(permission.get("allowFileDiscovery"))
        if kind in ("user", "group"):
            if email:
                found.add(f"{kind}:{email}")
        elif kind == "domain":
            if discoverable and permission.get("domain"):
                found.add(domain_principal(str(permission["domain"])))
        elif kind == "anyone":
            if discoverable and anyone_public:
                found.add(PUBLIC)
        else:
            raise ReadersUnknown(f"Drive gave a permission of a type kbbot does not know ({kind or 'none'}): "
                                 "held back until it is understood")
    return sorted(found)


class DrivePermissions:
    """``permissions.list`` of one file (``supportsAllDrives``: a shared drive's members come with it)."""

    def __init__(self, client: DriveClient, anyone_public: bool = False):
        self.client = client
        self.anyone_public = anyone_public

    def readers(self, file_id: str) -> list[str]:
        """The file's principals. :raises ReadersUnknown: Drive would not say (403) or named no one kbbot
        can map. :raises Gone: the file is gone. Other ``DriveError`` s pass up."""
        try:
            listed = list(self.client.pages(f"files/{file_id}/permissions",
                                            {"supportsAllDrives": "true", "pageSize": 100, "fields": FIELDS},
                                            "permissions"))
        except ApiError as exc:
            if exc.status == 403:
                raise ReadersUnknown(
                    f"Drive refused to list its permissions (HTTP 403 {exc.reason}): the service account may "
                    "read it but not see who else may; held back until it can (share it with the service account "
                    "as an editor, or use domain-wide delegation as a user who can share it)") from exc
            raise
        readers = principals(listed, anyone_public=self.anyone_public)
        if not readers:
            raise ReadersUnknown("Drive listed no permission kbbot can map to a reader (only link sharing, or "
                                 "'anyone' without gdrive.anyone_public): held back")
        return readers
