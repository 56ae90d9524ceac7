"""Shared pieces of the refresh tests: a runtime on a Weaviate collection and Redis prefix of its own,
a local website that serves ETag / Last-Modified and counts what it sends, and asking the answerer
(also as one user, as the leak tests of each source kind do)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

from aiohttp import web

from adapters.cli import SilentReply
from adapters.console.platform import console_inquiry
from bot.knowledge.refresh import Refresher
from bot.runtime import Runtime, build_runtime
from bot.settings import Settings, SourceSettings
from bot.types import Answer, Inquiry
from tests.conftest import make_settings

WEAVIATE_URL = os.environ.get("WEAVIATE_URL")
REDIS_URL = os.environ.get("REDIS_URL")
SERVICES_MISSING = None if WEAVIATE_URL and REDIS_URL else (
    "WEAVIATE_URL and REDIS_URL are not set: these tests need running Weaviate and Redis "
    "(eval \"$(scripts/services.sh env --export)\")")


def folder_source(name: str, path: Path, **options: Any) -> SourceSettings:
    return SourceSettings(name=name, path=str(path.resolve()), interval=options.pop("interval", "1h"), **options)


def url_source(name: str, urls: list[str], **options: Any) -> SourceSettings:
    return SourceSettings(name=name, urls=urls, interval=options.pop("interval", "1h"), **options)


class Stack:
    """One 'replica': settings, a started runtime on the test's collection, and its Refresher."""

    def __init__(self, data_dir: Path, collection: str, prefix: str, sources: list[SourceSettings]):
        env = {"WEAVIATE_URL": WEAVIATE_URL or "", "REDIS_URL": REDIS_URL or ""}
        self.settings = make_settings(data_dir, **env)
        self.settings.store.collection = collection
        self.settings.redis_prefix = prefix
        self.settings.sources = sources
        self.settings.refresh.fetch_timeout_s = 2
        self.settings.refresh.allow_hosts = ["127.0.0.1"]  # the local Site
        self.settings.refresh.connect_timeout_s = 1
        self.settings.refresh.lock_ttl_s = 3
        self.settings.refresh.lock_wait_s = 20
        self.runtime = build_runtime(self.settings)
        self.refresher: Refresher | None = None

    async def start(self) -> Stack:
        await self.runtime.start()
        self.refresher = Refresher(self.settings, self.runtime.store, self.runtime.indexer, redis=self.runtime.redis)
        return self

    @property
    def embedded(self) -> int:
        return self.runtime.document_embedder.embedded_texts

    async def ask(self, question: str) -> Answer:
        inquiry = console_inquiry(question, f"refresh-test-{uuid.uuid4().hex[:8]}")
        return await self.runtime.answerer.answer(inquiry, SilentReply())

    async def close(self) -> None:
        await self.runtime.close()


@dataclass
class Page:
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    etag: bool = True
    last_modified: bool = True
    delay_s: float = 0.0
    version: int = 1
    status: int = 200  # anything else is answered as it is, with the body, and no validators
    headers: dict[str, str] = field(default_factory=dict)  # sent as they are (e.g. Location, Content-Encoding)


@dataclass
class Served:
    path: str
    status: int
    body_bytes: int
    conditional: bool
    at: float = field(default_factory=time.monotonic)  # when the request arrived


@dataclass
class Site:
    """A website on 127.0.0.1: pages by path, with validators; ``log`` has every request."""

    pages: dict[str, Page] = field(default_factory=dict)
    log: list[Served] = field(default_factory=list)
    base: str = ""
    _runner: web.AppRunner | None = None

    def set(self, path: str, body: str | bytes, **options: Any) -> None:
        data = body.encode() if isinstance(body, str) else body
        old = self.pages.get(path)
        version = (old.version + 1) if old and old.body != data else (old.version if old else 1)
        self.pages[path] = Page(data, version=version, **options)

    def url(self, path: str) -> str:
        return self.base + path

    def served(self, path: str) -> list[Served]:
        return [s for s in self.log if s.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        page = self.pages.get(request.path)
        conditional = "If-None-Match" in request.headers or "If-Modified-Since" in request.headers
        if page is None:
            self.log.append(Served(request.path, 404, 0, conditional))
            return web.Response(status=404, text="not here")
        arrived = time.monotonic()
        if page.delay_s:
            await asyncio.sleep(page.delay_s)
        if page.status != 200:
            self.log.append(Served(request.path, page.status, len(page.body), conditional, arrived))
            return web.Response(status=page.status, body=page.body, headers=page.headers or None,
                                content_type=None if "Content-Type" in page.headers else "text/plain")
        tag = '"' + hashlib.sha1(page.body).hexdigest()[:16] + '"'
        modified = formatdate(1_700_000_000 + page.version * 3600, usegmt=True)
        headers = {}
        if page.etag:
            headers["ETag"] = tag
        if page.last_modified:
            headers["Last-Modified"] = modified
        match = request.headers.get("If-None-Match")
        since = request.headers.get("If-Modified-Since")
        if (page.etag and match == tag) or (not match and page.last_modified and since == modified):
            self.log.append(Served(request.path, 304, 0, conditional, arrived))
            return web.Response(status=304, headers=headers)
        self.log.append(Served(request.path, 200, len(page.body), conditional, arrived))
        return web.Response(body=page.body, headers={**headers, "Content-Type": page.content_type, **page.headers})

    async def __aenter__(self) -> Site:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def drop_prefix(redis_url: str, prefix: str) -> None:
    from bot.state.redis import connect_redis

    client = await connect_redis(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def isolated_stack(tmp_path: Path, name: str, files: dict[str, str] | None = None) -> AsyncIterator[Stack]:
    """A started Stack on a Weaviate collection and Redis prefix of its own, dropped afterwards. With
    ``files`` it has one folder source ``docs`` (``tmp_path/docs``, holding them); else no source."""
    assert REDIS_URL
    tag = uuid.uuid4().hex[:10]
    sources = []
    if files is not None:
        docs = tmp_path / "docs"
        docs.mkdir()
        for file_name, text in files.items():
            (docs / file_name).write_text(text, encoding="utf-8")
        sources.append(folder_source("docs", docs))
    s = Stack(tmp_path / "data", f"{name}{tag}", f"kbbot-test-{tag}:", sources)
    await s.start()
    try:
        yield s
    finally:
        s.runtime.store.drop()
        await s.close()
        await drop_prefix(REDIS_URL, s.settings.redis_prefix)


def world_settings(tmp_path: Path, kind: str, collection: str, principals: dict[str, list[str]],
                   allow_hosts: tuple[str, ...] = ("127.0.0.1",)) -> Settings:
    """A leak test's settings: real Weaviate (``kind`` "weaviate") or the embedded store, a collection and
    Redis prefix of their own, the local fakes' hosts allowed, and ``principals`` read afresh on each ask."""
    tag = uuid.uuid4().hex[:10]
    env = {"REDIS_URL": REDIS_URL} if REDIS_URL else {}
    if kind == "weaviate":
        env["WEAVIATE_URL"] = WEAVIATE_URL or ""
    settings = make_settings(tmp_path / "data", **env)
    settings.store.collection = f"{collection}{tag}"
    settings.redis_prefix = f"kbbot-test-{tag}:"
    settings.refresh.allow_hosts = list(allow_hosts)
    settings.refresh.fetch_timeout_s = 5
    settings.permissions.cache_s = 0
    settings.permissions.principals = principals
    return settings


@contextlib.asynccontextmanager
async def refreshed(settings: Settings, kind: str, source: str,
                    added: int | None = None) -> AsyncIterator[tuple[Runtime, Refresher]]:
    """A started runtime after a first good refresh of ``source`` (``added`` documents, if given); its
    collection and Redis keys are dropped afterwards."""
    runtime = build_runtime(settings)
    await runtime.start()
    refresher = Refresher(settings, runtime.store, runtime.indexer, redis=runtime.redis)
    try:
        record = await refresher.run(source)
        assert record is not None and record.ok and added in (None, record.added), record
        yield runtime, refresher
    finally:
        if kind == "weaviate":
            runtime.store.drop()
        await runtime.close()
        if REDIS_URL:
            await drop_prefix(REDIS_URL, settings.redis_prefix)


@dataclass
class RefreshedWorld:
    """A leak test's runtime after ``refreshed``; a kind's world adds its fake and names its documents."""

    runtime: Runtime
    refresher: Refresher

    def doc(self, name: str) -> str:
        raise NotImplementedError

    def readers(self, name: str) -> list[str]:
        return self.runtime.store.record(self.doc(name)).readers

    async def ask(self, caller: str, question: str) -> Answer:
        """``question`` asked privately by ``caller`` (mapped by ``permissions.principals`` as ``api:<caller>``)."""
        inquiry = Inquiry(platform="api", tenant=caller, channel=caller, thread_key=f"api:{caller}:{uuid.uuid4().hex}",
                          user_id=caller, text=question, private=True)
        return await self.runtime.answerer.answer(inquiry, SilentReply())


def cited(answer: Answer) -> list[str]:
    return [Path(c.doc_id).name if not c.doc_id.startswith("http") else c.doc_id for c in answer.citations]
