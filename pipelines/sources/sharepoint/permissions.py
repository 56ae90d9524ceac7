"""``SharePointReaders``: who may read a drive item, from its effective permissions
(``GET /drives/{d}/items/{i}/permissions``: its own and those it inherits from its folders and site).

Every permission grants reading (``read``, ``write``, ``owner``: who may edit may read). Its grantees:

- an Entra user: ``user:<e-mail>`` (a user Graph shows without an e-mail cannot be named: left out);
- an Entra group (security or Microsoft 365): ``group:<object id>``, the principal Teams users hold for
  each group they are in (``teams.graph_groups``);
- a SharePoint user (``siteUser``): from its claims login name, ``i:0#.f|membership|<upn>`` as a user,
  ``c:0t.c|tenant|<id>`` / ``c:0o.c|federateddirectoryclaimprovider|<id>`` as a group, "Everyone" and
  "Everyone except external users" as the organisation;
- a SharePoint site group (``siteGroup``, ``sharePointGroup``): ``group:<site url>::<name>``, whose
  members Graph does not list: ``site_groups`` maps a name to the principals it stands for (e.g. the
  site's Microsoft 365 group), else only an asker granted that principal reads it;
- a sharing link: "people in your organisation" gives ``organization_readers`` (an explicit principal,
  ``sharepoint:organization`` by default, never ``public``); "anyone with the link" gives ``public``
  only when ``anyone_public`` is set (else nothing beyond the people it was sent to); a link for
  specific people gives those people (``grantedToIdentitiesV2``);
- applications and devices read nothing for a person.

A grantee kbbot cannot name is left out (fail closed); an item no one kbbot can name may read, or whose
permissions Graph shows none of, is held back: readable by nobody, with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from pipelines.records import PUBLIC

#: Claims of SharePoint's built-in "Everyone" (with external users) and "Everyone except external users".
EVERYONE_CLAIMS = ("c:0(.s|true", "c:0-.f|rolemanager|spo-grid-all-users")
NO_PERMISSIONS = ("Microsoft Graph shows no permissions of it to the app: held back until it does (an app with "
                  "Sites.Selected needs a read grant on the site; see docs/sharepoint.md)")


def _identities(permission: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The identity sets a permission grants: ``grantedToV2`` and ``grantedToIdentitiesV2``, or the deprecated
    ``grantedTo`` / ``grantedToIdentities`` where Graph gives no V2."""
    one = permission.get("grantedToV2") or permission.get("grantedTo")
    if isinstance(one, dict):
        yield one
    many = permission.get("grantedToIdentitiesV2") or permission.get("grantedToIdentities") or []
    yield from (i for i in many if isinstance(i, dict))


class SharePointReaders:
    """``of(permissions, site_url)`` -> (principals, why held back); see the module docstring."""

    def __init__(self, *, organization_readers: Collection[str] = ("sharepoint:organization",),
                 anyone_public: bool = False, site_groups: Mapping[str, Collection[str]] | None = None):
        self.organization_readers = sorted(organization_readers)
        self.anyone_public = anyone_public
        self.site_groups = {k.strip().lower(): sorted(v) for k, v in (site_groups or {}).items()}

    def login(self, login_name: str) -> list[str] | None:
        """A SharePoint claims login name as principals; None: not one kbbot can name."""
        name = login_name.strip().lower()
        if name.startswith(EVERYONE_CLAIMS):
            return list(self.organization_readers)
        kind, _, value = name.rpartition("|")
        if not value:
            return None
        if kind == "i:0#.f|membership" and "@" in value:
            return [f"user:{value}"]
        if kind in ("c:0t.c|tenant", "c:0o.c|federateddirectoryclaimprovider") and not value.endswith("_o"):
            return [f"group:{value}"]  # "_o": a Microsoft 365 group's owners, not its members
        return None

    def identity(self, identity: Mapping[str, Any], site_url: str) -> list[str] | None:
        """The principals one identity set names; [] for an app or device; None: someone kbbot cannot name."""
        found: list[str] = []
        unknown = False
        for facet, who in identity.items():
            if not isinstance(who, dict) or facet.startswith("@"):
                continue
            if facet == "user":
                email = str(who.get("email") or who.get("userPrincipalName") or "").strip().lower()
                found += [f"user:{email}"] if "@" in email else []
                unknown |= "@" not in email
            elif facet == "group":
                ident = str(who.get("id") or "").strip().lower()
                found += [f"group:{ident}"] if ident else []
                unknown |= not ident
            elif facet == "siteUser":
                named = self.login(str(who.get("loginName") or ""))
                email = str(who.get("email") or "").strip().lower()
                named = named or ([f"user:{email}"] if "@" in email else None)
                found += named or []
                unknown |= named is None
            elif facet in ("siteGroup", "sharePointGroup"):
                name = " ".join(str(who.get("displayName") or who.get("loginName") or "").split()).lower()
                if name:
                    found += [f"group:{site_url.rstrip('/').lower()}::{name}", *self.site_groups.get(name, [])]
                unknown |= not name
        if not found and not unknown and not (identity.keys() & {"user", "group", "siteUser", "siteGroup",
                                                                  "sharePointGroup"}):
            return []  # an application or a device
        return found if found or not unknown else None

    def of(self, permissions: list[Mapping[str, Any]], site_url: str) -> tuple[list[str], str]:
        """The principals who may read an item with ``permissions``; with none, why it is held back."""
        readers: set[str] = set()
        unnamed = 0
        for permission in permissions:
            if not permission.get("roles"):
                continue
            scope = str((permission.get("link") or {}).get("scope") or "").lower()
            if scope == "organization":
                readers.update(self.organization_readers)
            elif scope == "anonymous" and self.anyone_public:
                readers.add(PUBLIC)
            for identity in _identities(permission):
                named = self.identity(identity, site_url)
                if named is None:
                    unnamed += 1
                else:
                    readers.update(named)
        if readers:
            return sorted(readers), ""
        if not permissions:
            return [], NO_PERMISSIONS
        if unnamed:
            return [], (f"SharePoint grants it only to {unnamed} people or groups kbbot cannot name (no e-mail "
                        "or claims it knows): held back")
        return [], "SharePoint grants it to no person or group kbbot can name (only links or apps): held back"
