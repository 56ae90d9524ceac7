"""SharePoint Online and OneDrive as a source, through Microsoft Graph: the files of a site's document
libraries (or of one user's OneDrive), under an optional folder, with their permissions; and, when
enabled, the site's pages as HTML (``pages``), read by whom the operator names.

Kind ``sharepoint`` (``SHAREPOINT``): a ``sharepoint:`` section (``SharePointSettings``); its root is
``sharepoint:<name>``. Modules: ``client`` (``GraphClient``, ``AppToken``: MSAL's app-only token, httpx,
throttling, paging, downloads), ``source`` (``SharePointSource``: delta query, scope, what changed),
``permissions`` (``SharePointReaders``: Graph permissions -> principals), ``pages`` (``SitePages``). The app authenticates as
itself (client credentials) with a client secret or a certificate, read from the environment as
Confluence's token is; see docs/sharepoint.md.
"""

from __future__ import annotations

import os
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, StrictBool, field_validator, model_validator

from pipelines.acl import principal
from pipelines.sections import Problem, Section, Texts
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import SourceContext, SourceEntry, named_root
from pipelines.sources.sharepoint.client import GRAPH_SCOPE, GRAPH_URL, LOGIN_URL, AppToken, GraphClient
from pipelines.sources.sharepoint.permissions import SharePointReaders
from pipelines.sources.sharepoint.source import SharePointSource


class SharePointPages(Section):
    """The site's modern pages (``SitePages``) as HTML documents; off unless enabled."""

    enabled: StrictBool = False
    #: Who reads the site's pages (Graph v1.0 shows no permissions of a page), e.g. the site's members
    #: group ``group:<Entra object id>``; none: every page is held back (readable by nobody).
    readers: Texts = []

    @field_validator("readers")
    @classmethod
    def _readers(cls, readers: list[str]) -> list[str]:
        return [principal(p) for p in readers]


class SharePointSettings(Section):
    """A SharePoint site's document libraries, or a user's OneDrive, read through Microsoft Graph."""

    #: The Entra tenant (directory) id and the app registration's application (client) id.
    tenant_id: str = Field(min_length=1, pattern=r"\S")
    client_id: str = Field(min_length=1, pattern=r"\S")
    #: The environment variable holding the app's client secret.
    client_secret_env: str = Field("SHAREPOINT_CLIENT_SECRET", min_length=1, pattern=r"\S")
    #: Instead of a secret: the environment variable holding the certificate's private key (PEM), and the
    #: certificate's SHA-1 thumbprint (hex, as the app registration shows it).
    certificate_env: str | None = None
    certificate_thumbprint: str | None = None
    #: The site (``https://contoso.sharepoint.com/sites/handbook``), or (instead) a user whose OneDrive is
    #: read (``alice@contoso.com``).
    site: str | None = None
    user: str | None = None
    #: Library names of the site (``Documents``, ``Policies``); none: every document library.
    drives: Texts = []
    #: A folder inside each library (``Manuals/Pumps``); only the files under it are indexed.
    folder: str = ""
    #: Who reads a file shared by an "people in your organisation" link: a principal to grant in
    #: ``permissions.principals`` (``public`` only if everyone who can reach kbbot is in the organisation).
    organization_readers: Texts = ["sharepoint:organization"]
    #: Whether an "anyone with the link" sharing link makes a file public (readable by every asker).
    anyone_public: StrictBool = False
    #: SharePoint site groups (by name) -> the principals they stand for (Graph does not list their members),
    #: e.g. ``{"Handbook Members": [group:<the site's Microsoft 365 group id>]}``.
    site_groups: dict[str, list[str]] = {}
    #: The site's pages too (``pages: {enabled: true, readers: [group:<id>]}``); not for a OneDrive.
    pages: SharePointPages = Field(default_factory=SharePointPages)
    #: Hosts a ``/content`` redirect may send a download to (each name and the names below it).
    download_hosts: Texts = ["sharepoint.com"]
    #: Microsoft Graph, its token scope, and the login service (other clouds: see docs/sharepoint.md).
    graph_url: str = GRAPH_URL
    graph_scope: str = GRAPH_SCOPE
    login_url: str = LOGIN_URL
    #: 429/503 answers are retried after their Retry-After, this many times, never waiting longer than this.
    max_retries: int = Field(5, ge=0)
    max_retry_wait_s: Annotated[float, Field(gt=0)] = 120

    @field_validator("organization_readers")
    @classmethod
    def _organization_readers(cls, readers: list[str]) -> list[str]:
        if not readers:
            raise ValueError("must name at least one principal (sharepoint:organization, group:<id>, public)")
        return [principal(p) for p in readers]

    @field_validator("site_groups")
    @classmethod
    def _site_groups(cls, groups: dict[str, list[str]]) -> dict[str, list[str]]:
        checked = {}
        for name, principals in groups.items():
            if not str(name).strip():
                raise ValueError("has an empty group name")
            if isinstance(principals, str) or not principals:
                raise ValueError(f"[{name!r}] must be a non-empty list of principals")
            try:
                checked[str(name).strip()] = [principal(p) for p in principals]
            except ValueError as exc:
                raise ValueError(f"[{name!r}]: {exc}") from None
        return checked

    @field_validator("site", "graph_url", "login_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL (https://contoso.sharepoint.com/sites/handbook), got {url!r}")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _one_place(self) -> SharePointSettings:
        if bool(self.site) == bool(self.user):
            raise Problem("needs exactly one of site (a SharePoint site URL) or user (whose OneDrive)")
        if self.user and self.drives:
            raise Problem("drives names a site's libraries; a user has one OneDrive", at=("drives",))
        if self.user and self.pages.enabled:
            raise Problem("pages are a SharePoint site's; a OneDrive (user) has none", at=("pages", "enabled"))
        if bool(self.certificate_env) != bool(self.certificate_thumbprint):
            raise Problem("needs both certificate_env and certificate_thumbprint, or neither (a client secret)")
        return self


class MissingCredential(ValueError):
    """The environment variable that holds the app's secret or key is not set."""


def credential(site: SharePointSettings) -> str | dict[str, str]:
    """The app's client secret, or its certificate as MSAL takes it, read from the environment now."""
    if site.certificate_env:
        key = os.environ.get(site.certificate_env, "").strip()
        if not key:
            raise MissingCredential(f"the environment variable {site.certificate_env} (the app's certificate "
                                    "key) is not set")
        return {"private_key": key, "thumbprint": str(site.certificate_thumbprint).replace(":", "")}
    secret = os.environ.get(site.client_secret_env, "").strip()
    if not secret:
        raise MissingCredential(f"the environment variable {site.client_secret_env} (the app's client secret) "
                                "is not set")
    return secret


def connect(site: SharePointSettings, context: SourceContext) -> GraphClient:
    """The Graph client of ``site``. :raises MissingCredential: its secret or key is not set."""
    token = AppToken(site.tenant_id, site.client_id, credential(site), login_url=site.login_url,
                     scope=site.graph_scope, timeout_s=context.fetch_timeout_s)
    return GraphClient(token, graph_url=site.graph_url, download_hosts=site.download_hosts,
                       allow_hosts=context.allow_hosts, timeout_s=context.fetch_timeout_s,
                       connect_timeout_s=context.connect_timeout_s, max_bytes=context.max_bytes,
                       max_retries=site.max_retries, max_retry_wait_s=site.max_retry_wait_s,
                       user_agent=context.user_agent)


class SharePointEntry(SourceEntry):
    #: A SharePoint site or OneDrive (see ``SharePointSettings``), instead of path, urls or confluence.
    sharepoint: SharePointSettings | None = None


class SharePointKind:
    name = "sharepoint"
    label = "sharepoint (a SharePoint site or OneDrive)"
    settings = SharePointEntry
    named_roots = True
    keeps_states = True  # each drive's delta link, its folders, the version of each file and page indexed

    def selected(self, entry: SharePointEntry) -> bool:
        return entry.sharepoint is not None

    def roots(self, entry: SharePointEntry) -> list[str]:
        return [named_root(self.name, entry.name)]

    def build(self, entry: SharePointEntry, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> SharePointSource:
        site = entry.sharepoint
        assert site is not None
        client, missing = None, None
        try:
            client = connect(site, context)
        except MissingCredential as exc:
            missing = f"{exc}; nothing was read or revoked"
        readers = SharePointReaders(organization_readers=site.organization_readers,
                                    anyone_public=site.anyone_public, site_groups=site.site_groups)
        max_bytes = int(context.max_file_mb * 1024 * 1024) if context.max_file_mb else context.max_bytes
        return SharePointSource(entry.name, client, site=site.site, user=site.user, drives=site.drives,
                                folder=site.folder, readers=readers, states=states,
                                suffixes=frozenset(context.extensions), max_file_bytes=max_bytes,
                                max_documents=context.max_urls, concurrency=context.concurrency, missing=missing,
                                page_readers=list(site.pages.readers) if site.pages.enabled else None)

    def claims(self, entry: SharePointEntry, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]:
        return set()  # its doc ids name its root: no other source's document is one of its

    def capture(self, entry: SharePointEntry, context: SourceContext) -> None:
        return None  # kbbot does not write to SharePoint


SHAREPOINT = SharePointKind()
