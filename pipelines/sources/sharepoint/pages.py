"""``SitePages``: a SharePoint site's modern pages (``sitePage``), as HTML documents.

- **listing**: ``GET /sites/{site}/pages/microsoft.graph.sitePage``, paged, without ``$expand``: Graph
  fails the whole list's ``$expand=canvasLayout`` when one page of the site is corrupt;
- **what changed**: a page whose ``eTag`` and ``lastModifiedDateTime`` are those indexed costs nothing;
  another is read alone (``/pages/{id}/microsoft.graph.sitePage?$expand=canvasLayout``), its text web
  parts' ``innerHtml`` (horizontal sections' columns, then the vertical section) joined into one HTML
  document, which kbbot's HTML converter reads; the title is the page's ``title``, the citation its
  ``webUrl``; a page no longer listed is not yielded, so the indexer revokes it;
- **readers**: Graph v1.0 shows no permissions of a page, so the operator names who reads the site's
  pages (``sharepoint.pages.readers``, e.g. the site's members group); with none named, every page is
  held back (readable by nobody), never public.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from pipelines.records import INDEX_FORMAT, content_hash
from pipelines.sources.fetcher import FetchState
from pipelines.sources.kind import SourceItem
from pipelines.sources.sharepoint.client import GraphClient, GraphError, ItemGone
from pipelines.store import DocRecord

NO_READERS = ("SharePoint site pages: Graph shows no permissions of a page, and sharepoint.pages.readers "
              "names no one: held back until it does (see docs/sharepoint.md)")
TEXT_PART = "#microsoft.graph.textWebPart"


def _webparts(layout: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for section in layout.get("horizontalSections") or []:
        for column in (section or {}).get("columns") or []:
            yield from (w for w in (column or {}).get("webparts") or [] if isinstance(w, dict))
    vertical = layout.get("verticalSection") or {}
    yield from (w for w in vertical.get("webparts") or [] if isinstance(w, dict))


def page_html(page: dict[str, Any]) -> str:
    """The page's text web parts as one HTML document (its title as the heading)."""
    title = html.escape(str(page.get("title") or page.get("name") or ""))
    parts = [str(w.get("innerHtml") or "") for w in _webparts(page.get("canvasLayout") or {})
             if w.get("@odata.type") == TEXT_PART or "innerHtml" in w]
    body = "\n".join(f"<section>{p}</section>" for p in parts if p.strip())
    return f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n<h1>{title}</h1>\n{body}\n</body></html>\n"


@dataclass
class PageWork:
    """One page this run yields: read again (``fetch``) or kept as it is."""

    doc_id: str
    page_id: str
    title: str
    web_url: str
    version: str  # its eTag and lastModifiedDateTime, as listed
    fetch: bool
    record: DocRecord | None = None

    def state(self, digest: str | None) -> FetchState:
        """Its state with ``digest`` the content indexed (None: none yet, so it is read again next run)."""
        return FetchState(etag=f"{self.version}:{INDEX_FORMAT}" if digest else None, content_hash=digest,
                          final_url=self.web_url, urls=[f"page={self.page_id}", f"title={self.title}"])

    @classmethod
    def of(cls, doc_id: str, state: FetchState, record: DocRecord | None) -> PageWork | None:
        info = dict(p.split("=", 1) for p in state.urls if "=" in p)
        if not info.get("page"):
            return None
        tag = state.etag or ""
        version = tag.rsplit(":", 1)[0] if tag.endswith(f":{INDEX_FORMAT}") else ""
        return cls(doc_id, info["page"], info.get("title", ""), state.final_url or "", version, False, record)


class SitePages:
    """The pages of one site for one run of a ``SharePointSource`` (``root``, its kept ``states``)."""

    def __init__(self, client: GraphClient, root: str, readers: list[str], states: dict[str, FetchState],
                 updated: dict[str, FetchState]):
        self.client = client
        self.root = root
        self.readers = sorted(readers)
        self.states = states
        self.updated = updated

    def doc_id(self, page_id: str) -> str:
        return f"{self.root}:page:{page_id}"

    def is_page(self, doc_id: str) -> bool:
        return doc_id.startswith(f"{self.root}:page:")

    def known(self, mine: dict[str, DocRecord]) -> list[PageWork]:
        """The pages indexed, as the last run left them (a run that reads no listing keeps them)."""
        found = []
        for doc_id, state in self.states.items():
            work = PageWork.of(doc_id, state, mine.get(doc_id)) if self.is_page(doc_id) else None
            if work is not None and work.record is not None:
                found.append(work)
        return found

    async def listed(self, site_id: str, site_url: str, mine: dict[str, DocRecord], space: str) -> list[PageWork]:
        """Every page of the site; those changed since they were indexed (or never were) to be read."""
        works = []
        async for listing in self.client.pages(f"v1.0/sites/{site_id}/pages/microsoft.graph.sitePage"):
            for page in listing.get("value") or []:
                if not isinstance(page, dict) or not page.get("id"):
                    continue
                page_id = str(page["id"])
                doc_id = self.doc_id(page_id)
                version = f"{page.get('eTag') or ''}|{page.get('lastModifiedDateTime') or ''}"
                # Graph's examples show a page's webUrl relative to its site: made absolute either way.
                web_url = urljoin(site_url.rstrip("/") + "/", str(page.get("webUrl") or ""))
                record = mine.get(doc_id)
                before = PageWork.of(doc_id, self.states[doc_id], record) if doc_id in self.states else None
                unchanged = (before is not None and record is not None and before.version == version
                             and self.states[doc_id].content_hash == record.content_hash and record.space == space)
                title = str(page.get("title") or page.get("name") or page_id)
                works.append(PageWork(doc_id, page_id, title, web_url, version, not unchanged, record))
        return works

    def _item(self, work: PageWork) -> SourceItem:
        item = SourceItem(doc_id=work.doc_id, source=work.web_url, root=self.root, suffix=".html", name=work.title,
                          meta={"title": work.title})
        item.readers = list(self.readers) if self.readers else None
        item.held = "" if self.readers else NO_READERS
        return item

    def kept(self, work: PageWork) -> SourceItem:
        """A page not changed: its content stands, its readers are the ones configured now."""
        item = self._item(work)
        item.not_modified = True
        if work.doc_id in self.states:
            self.updated[work.doc_id] = self.states[work.doc_id]
        return item

    async def fetch(self, site_id: str, work: PageWork) -> SourceItem:
        item = self._item(work)
        try:
            page = await self.client.json(f"v1.0/sites/{site_id}/pages/{work.page_id}/microsoft.graph.sitePage",
                                          params={"$expand": "canvasLayout"})
        except ItemGone as exc:
            item.gone, item.error = True, str(exc)
            return item
        except GraphError as exc:  # the version indexed (if any) stands; read again next run
            item.error = f"page not read: {exc}"
            old = self.states.get(work.doc_id)
            self.updated[work.doc_id] = old if old is not None else work.state(None)
            return item
        data = page_html(page).encode()
        item.data = data
        self.updated[work.doc_id] = work.state(content_hash(data))
        return item
