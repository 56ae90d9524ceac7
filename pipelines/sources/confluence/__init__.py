"""Confluence as a source: the pages of some spaces (or of a CQL query) and their attachments.

Kind ``confluence`` (``CONFLUENCE``): a ``confluence:`` section (``ConfluenceSettings``); its root is
``confluence:<name>``. Modules: ``client`` (``ConfluenceClient``, built by ``connect`` alone, for the
source and for the draft pages of "Add to the knowledge base", ``ConfluenceCapture``), ``source``
(``ConfluenceSource``), ``permissions`` (``ConfluencePermissions``).

``ConfluenceSource`` is a ``pipelines.sources.kind.Source``. It speaks the REST API that Confluence
Cloud (``https://<site>.atlassian.net/wiki``, e-mail + API token) and Data Center
(``https://confluence.example.com``, a personal access token as Bearer) share:

- one listing per run, ``GET /rest/api/content/search`` with CQL (``space in (...) and type = page``,
  or the configured CQL ``and type = page``), following ``_links.next`` page after page, with each
  page's version number; attachments likewise, one listing for the spaces the pages are in, kept
  when their page is listed and their file type is indexed;
- a page or attachment whose version is the one indexed last time (``FetchState``, kept by the
  caller between runs, trusted only while the store still holds what it produced) costs nothing
  more: no body, no download, no conversion, no embedding;
- a changed page's body (storage format) becomes Markdown with its headings (``markdownify``), so
  the splitter keeps the page's section structure; an attachment is converted like a file;
- what the listing no longer has (deleted, moved out of scope, restricted from the API user) is
  revoked by the indexer, since the listing is complete or the run fails; a page that answers 403 or
  404 between the listing and its download is gone too;
- every document's source is its web link (the page, or the attachment's download), so a citation
  links to it (a PDF attachment at the cited page);
- every connection, redirect hops included, passes ``pipelines.netguard`` as URL sources' do: the
  site's own host is allowed, any other must be a public address or in ``refresh.allow_hosts``; a
  page redirected elsewhere is refused with the reason (and revoked, like a page that is gone);
- 429 and 503 answers are retried after their ``Retry-After`` (seconds or an HTTP date), at most
  ``max_retries`` times and never waiting longer than ``max_retry_wait_s`` at once; beyond that
  the run fails with the reason and every document keeps its version.
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, StrictBool, field_validator, model_validator

from pipelines.acl import principal
from pipelines.sections import Problem, Section, Texts
from pipelines.sources.confluence.client import ConfluenceClient, ConfluenceError
from pipelines.sources.confluence.source import ConfluenceSource
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import Captured, SourceContext, SourceEntry, named_root


class ConfluenceSettings(Section):
    """A Confluence site (Cloud or Data Center) as a source: the pages of some spaces or of a CQL query."""

    #: The base URL: ``https://<site>.atlassian.net/wiki`` (Cloud) or ``https://confluence.example.com``.
    url: str = ""
    #: Space keys, or (instead) a CQL query selecting the pages (``type = page`` is added).
    spaces: Texts = []
    cql: str | None = None
    #: The environment variable holding the API token (Cloud) or personal access token (Data Center).
    token_env: str = Field("CONFLUENCE_TOKEN", min_length=1, pattern=r"\S")
    #: Cloud only: the account e-mail the API token belongs to (Basic auth); unset: the token is a Bearer PAT.
    user: str | None = None
    #: Index the pages' attachments of the indexed file types.
    attachments: StrictBool = True
    #: Record who may read each page (read restrictions of the page and its ancestors, the space's
    #: permissions); false: every page is readable by everyone of the source's knowledge space.
    permissions: StrictBool = True
    #: Groups meaning "every Confluence account": a space (or page restriction) naming one is readable by
    #: ``everyone_readers``, which page restrictions narrow.
    everyone_groups: Texts = ["confluence-users"]
    #: Who reads what every Confluence account may: a principal to grant in ``permissions.principals``
    #: (``public`` only if everyone who can reach kbbot has a Confluence account).
    everyone_readers: Texts = ["confluence:everyone"]
    #: Spaces whose read permissions the API user cannot see (Data Center; Cloud without the right):
    #: space key (or ``"*"``: any such space) -> principals, e.g. ``{OPS: [space:ops]}`` or
    #: ``{"*": [confluence:everyone]}`` (page restrictions then decide). A hidden space not listed is
    #: held back: readable by nobody.
    hidden_space_readers: dict[str, list[str]] = {}

    @field_validator("everyone_readers")
    @classmethod
    def _everyone_readers(cls, readers: list[str]) -> list[str]:
        if not readers:
            raise ValueError("must name at least one principal (confluence:everyone, public, group:<name>)")
        return [principal(p) for p in readers]

    @field_validator("hidden_space_readers")
    @classmethod
    def _hidden_space_readers(cls, spaces: dict[str, list[str]]) -> dict[str, list[str]]:
        checked = {}
        for key, principals in spaces.items():
            if not str(key).strip():
                raise ValueError("has an empty space key; use the key (OPS) or \"*\"")
            if isinstance(principals, str) or not principals:
                raise ValueError(f"[{key!r}] must be a non-empty list of principals")
            try:
                checked[str(key).strip().upper()] = [principal(p) for p in principals]
            except ValueError as exc:
                raise ValueError(f"[{key!r}]: {exc}") from None
        return checked
    #: 429/503 answers are retried after their Retry-After, this many times, never waiting longer than this.
    max_retries: int = Field(5, ge=0)
    max_retry_wait_s: Annotated[float, Field(gt=0)] = 120

    @field_validator("url")
    @classmethod
    def _site(cls, url: str) -> str:
        parts = urlsplit(url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be the site's http(s) base URL (Cloud: https://<site>.atlassian.net/wiki), "
                             f"got {url!r}")
        return url

    @model_validator(mode="after")
    def _spaces_or_cql(self) -> ConfluenceSettings:
        if bool(self.spaces) == bool(self.cql and self.cql.strip()):
            raise Problem("needs exactly one of spaces (space keys) or cql (a CQL query)")
        return self


class MissingToken(ConfluenceError):
    """The environment variable that holds the site's token is not set."""


def connect(site: ConfluenceSettings, context: SourceContext) -> ConfluenceClient:
    """The client of ``site``, its token read from the environment now (``site.token_env``).
    :raises MissingToken: the variable is not set."""
    token = os.environ.get(site.token_env, "").strip()
    if not token:
        raise MissingToken(f"the environment variable {site.token_env} (the Confluence token) is not set")
    return ConfluenceClient(site.url, token, user=site.user, timeout_s=context.fetch_timeout_s,
                            connect_timeout_s=context.connect_timeout_s, max_bytes=context.max_bytes,
                            max_retries=site.max_retries, max_retry_wait_s=site.max_retry_wait_s,
                            user_agent=context.user_agent, allow_hosts=context.allow_hosts)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ConfluenceCapture:
    """A draft page per captured reply in ``space`` (``client()``: a ``ConfluenceClient``, one per draft)."""

    def __init__(self, client: Callable[[], ConfluenceClient], space: str):
        self.client = client
        self.space = space

    @staticmethod
    def storage(reply: Captured) -> str:
        where = f'<a href="{html.escape(reply.link)}">the thread</a>' if reply.link.startswith(("http://", "https://")) \
            else html.escape(reply.thread_key or "the thread")
        paragraphs = "".join(f"<p>{html.escape(p.strip())}</p>" for p in reply.text.split("\n\n") if p.strip())
        return (f"{paragraphs}<hr/><p>Answered by {html.escape(reply.author)} on {reply.date} in {where}. "
                f"Added to the knowledge base by {html.escape(reply.reviewer)}.</p>")

    def write(self, reply: Captured) -> str:
        client = self.client()
        try:
            page = client.create_draft(self.space, _one_line(reply.question)[:255], self.storage(reply))
            return client.url(str((page.get("_links") or {}).get("webui") or f"pages/{page['id']}"))
        finally:
            client.close()


class ConfluenceEntry(SourceEntry):
    #: A Confluence site (see ``ConfluenceSettings``), instead of path or urls.
    confluence: ConfluenceSettings | None = None


class ConfluenceKind:
    name = "confluence"
    label = "confluence (a Confluence site)"
    settings = ConfluenceEntry
    named_roots = True
    keeps_states = True  # the page versions indexed

    def selected(self, entry: ConfluenceEntry) -> bool:
        return entry.confluence is not None

    def roots(self, entry: ConfluenceEntry) -> list[str]:
        return [named_root(self.name, entry.name)]

    def build(self, entry: ConfluenceEntry, context: SourceContext, states: dict[str, FetchState], *,
              permissions_only: bool = False) -> ConfluenceSource:
        # Permissions only: the same source; the indexer has it read who may read, and no body.
        site = entry.confluence
        assert site is not None
        client, missing = None, None
        try:
            client = connect(site, context)
        except MissingToken as exc:
            missing = f"{exc}; nothing was read or revoked"
        return ConfluenceSource(entry.name, client, spaces=site.spaces, cql=site.cql, attachments=site.attachments,
                                states=states, max_documents=context.max_urls, permissions=site.permissions,
                                everyone_groups=site.everyone_groups, everyone_readers=site.everyone_readers,
                                hidden_spaces=site.hidden_space_readers, missing=missing)

    def claims(self, entry: ConfluenceEntry, doc_ids: list[str], states: dict[str, FetchState],
               context: SourceContext) -> set[str]:
        return set()  # its doc ids name its root: no other source's document is one of its

    def capture(self, entry: ConfluenceEntry, context: SourceContext) -> ConfluenceCapture | None:
        """Drafts in the first of its spaces; None for a source selected by CQL (no space to write to)."""
        site = entry.confluence
        if site is None or not site.spaces:
            return None
        return ConfluenceCapture(lambda: connect(site, context), site.spaces[0])


CONFLUENCE = ConfluenceKind()
