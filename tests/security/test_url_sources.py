"""Attacks on URL sources (issue 15, findings 1, 2 and 10): internal addresses reached through the
source, a sitemap or a redirect; a gzip bomb; unbounded sitemap fan-out. Each runs a real ``UrlSource``
against a local website (``tests.refresh_helpers.Site``) and reads what the refresh would index."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest

from pipelines.acl import readers_for
from pipelines.netguard import address_kind
from pipelines.sources.fetcher import Fetcher
from pipelines.sources.kind import SourceItem
from pipelines.sources.robots import Robots
from pipelines.sources.sitemaps import sitemap_urls
from pipelines.sources.urls import UrlSource
from tests.refresh_helpers import Site
from tests.security.peak import allocation_peak

SECRET = "<html><body><h1>Internal</h1><p>aws_secret_access_key = wJalrXUtnFEMI</p></body></html>"
PUBLIC = "<html><body><h1>Manual</h1><p>Regrease the bearings every 3,000 hours.</p></body></html>"


def urlset(*locs: str) -> str:
    return ('<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<url><loc>{loc}</loc></url>" for loc in locs) + "</urlset>")


def index(*locs: str) -> str:
    return ('<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs) + "</sitemapindex>")


def scan(urls: list[str], *, allow_hosts: list[str], robots: bool = False, **options: object) -> tuple[
        UrlSource, list[SourceItem]]:
    """The items one refresh of ``urls`` yields (run in a thread: the site answers on this loop)."""
    fetcher = Fetcher(timeout_s=3, connect_timeout_s=1, allow_hosts=allow_hosts,
                      max_bytes=int(options.pop("max_bytes", 20_000_000)))
    source = UrlSource("web", urls, fetcher, robots=Robots(fetcher) if robots else None, **options)
    try:
        return source, list(source.scan({}, "default"))
    finally:
        fetcher.close()


def by_source(items: list[SourceItem]) -> dict[str, SourceItem]:
    return {item.source: item for item in items}


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.10", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("224.0.0.251", "multicast"),
    ("0.0.0.0", "unspecified"), ("::ffff:127.0.0.1", "loopback"), ("100.64.0.1", "non-public"),
    ("93.184.215.14", None), ("2606:4700::6810:85e5", None),
])
def test_address_kinds(address: str, kind: str | None):
    import ipaddress

    assert address_kind(ipaddress.ip_address(address)) == kind


async def test_a_page_on_an_internal_address_is_refused_with_the_reason_and_the_rest_is_fetched():
    async with Site() as site:
        site.set("/secret.html", SECRET)
        site.set("/manual.html", PUBLIC)
        port = site.base.rsplit(":", 1)[1]
        internal = f"http://localhost:{port}/secret.html"  # a name, resolved to 127.0.0.1
        metadata = "http://169.254.169.254/latest/meta-data/"
        source, items = await asyncio.to_thread(scan, [internal, metadata, site.url("/manual.html")],
                                                allow_hosts=["127.0.0.1"])
    got = by_source(items)
    assert got[site.url("/manual.html")].data is not None, "an allowed host is still fetched"
    for url, kind in ((internal, "loopback"), (metadata, "link-local")):
        assert got[url].data is None and got[url].gone, "refused: a version indexed earlier is revoked"
        assert f"a {kind} address" in (got[url].error or "") and "refresh.allow_hosts" in (got[url].error or "")
    assert [s.path for s in site.log] == ["/manual.html"], "nothing was requested from the refused host"


async def test_a_redirect_to_an_internal_address_is_refused_at_the_hop():
    async with Site() as site:
        port = site.base.rsplit(":", 1)[1]
        site.set("/secret.html", SECRET)
        site.set("/moved.html", b"", status=302, headers={"Location": f"http://localhost:{port}/secret.html"})
        _, items = await asyncio.to_thread(scan, [site.url("/moved.html")], allow_hosts=["127.0.0.1"])
    item = items[0]
    assert item.data is None and "resolves to 127.0.0.1, a loopback address" in (item.error or "")
    assert [s.path for s in site.log] == ["/moved.html"], "the redirect target was never requested"


async def test_a_redirect_to_a_path_robots_txt_disallows_is_not_followed():
    async with Site() as site:
        site.set("/robots.txt", "User-agent: *\nDisallow: /private/\n", content_type="text/plain")
        site.set("/private/secret.html", SECRET)
        site.set("/moved.html", b"", status=301, headers={"Location": "/private/secret.html"})
        _, items = await asyncio.to_thread(scan, [site.url("/moved.html")], allow_hosts=["127.0.0.1"], robots=True)
    item = items[0]
    assert item.data is None and item.gone
    assert "disallowed by the robots.txt" in (item.error or "") and "redirected to" in (item.error or "")
    assert not site.served("/private/secret.html")


async def test_a_sitemap_may_list_pages_of_its_own_host_only():
    async with Site() as site:
        port = site.base.rsplit(":", 1)[1]
        foreign = [f"http://localhost:{port}/secret.html", "http://169.254.169.254/latest/meta-data/"]
        site.set("/sitemap.xml", urlset(site.url("/manual.html"), *foreign), content_type="application/xml")
        site.set("/manual.html", PUBLIC)
        site.set("/secret.html", SECRET)
        source, items = await asyncio.to_thread(scan, [site.url("/sitemap.xml")], allow_hosts=["127.0.0.1"])
    got = by_source(items)
    assert got[site.url("/manual.html")].data is not None
    for url in foreign:
        assert got[url].data is None and "may only list pages of 127.0.0.1" in (got[url].error or "")
    assert not site.served("/secret.html")
    assert source.listed_completely, "a refused entry is reported, the listing itself did not fail"


async def test_allow_hosts_lets_an_intranet_host_through():
    async with Site() as site:
        port = site.base.rsplit(":", 1)[1]
        site.set("/secret.html", "<html><body><p>Intranet wiki page.</p></body></html>")
        url = f"http://localhost:{port}/secret.html"
        _, items = await asyncio.to_thread(scan, [url], allow_hosts=["LOCALHOST"])
    assert items[0].data is not None and items[0].error is None


def _bomb(mb: int, wbits: int) -> bytes:
    """``mb`` MB of XML whitespace compressed (gzip: wbits 31, zlib deflate: 15), as the audit's 0.31 MB."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b" " * (1 << 20)
    head = packer.compress(urlset("https://example.com/a").encode().replace(b"</urlset>", b""))
    return head + b"".join(packer.compress(block) for _ in range(mb)) + packer.flush()


def test_a_gzip_bomb_sitemap_is_refused_while_decompressing():
    bomb = _bomb(300, 31)  # 300 MB of XML in 0.31 MB
    assert len(bomb) < 400_000
    with allocation_peak() as peak, pytest.raises(Exception, match=r"decompresses to more than 20.0 MB"):
        sitemap_urls(bomb, 20_000_000)
    assert peak[0] < 50, f"{peak[0]:.0f} MB allocated"
    assert sitemap_urls(gzip.compress(urlset("https://example.com/a").encode()))[0] == ["https://example.com/a"]


async def test_a_gzip_bomb_http_body_is_cut_while_reading():
    payload = _bomb(300, 15)  # Content-Encoding: deflate
    async with Site() as site:
        site.set("/page.html", payload, headers={"Content-Encoding": "deflate"})
        site.set("/ok.html", gzip.compress(PUBLIC.encode()), headers={"Content-Encoding": "gzip"})
        with allocation_peak() as peak:
            _, items = await asyncio.to_thread(scan, [site.url("/page.html"), site.url("/ok.html")],
                                               allow_hosts=["127.0.0.1"], max_bytes=5_000_000)
        grown_mb = peak[0]
    got = by_source(items)
    assert "too large (over the 5.0 MB limit); download stopped" in (got[site.url("/page.html")].error or "")
    assert got[site.url("/ok.html")].data == PUBLIC.encode(), "a normal gzip body is still decoded"
    assert grown_mb < 50, f"{grown_mb:.0f} MB allocated"


async def test_sitemap_fan_out_is_bounded_in_requests():
    async with Site() as site:
        children = [site.url(f"/s{i}.xml") for i in range(110)]
        site.set("/index.xml", index(*children), content_type="application/xml")
        for i in range(len(children)):
            site.set(f"/s{i}.xml", urlset(site.url(f"/p{i}.html")), content_type="application/xml")
        source, _ = await asyncio.to_thread(scan, [site.url("/index.xml")], allow_hosts=["127.0.0.1"],
                                            max_urls=1, max_sitemaps=100)
        one_page = len([s for s in site.log if s.path.endswith(".xml")])
        source, _ = await asyncio.to_thread(scan, [site.url("/index.xml")], allow_hosts=["127.0.0.1"],
                                            max_urls=10_000, max_sitemaps=20)
        capped = len([s for s in site.log if s.path.endswith(".xml")]) - one_page
    assert one_page == 2, "max_urls=1: the index and the first sitemap, then listing stops"
    assert capped == 20, "max_sitemaps=20 sitemap requests at most"
    assert any("refresh.max_sitemaps" in reason for _, reason in source.listing_failures)


HR_PAGE = "<html><body><h1>Pay</h1><p>Technicians are paid on scale T9.</p></body></html>"


async def test_the_acl_is_matched_on_the_url_a_redirect_ends_at():
    """Issue 39, item 11: ``/go/pay`` redirecting to ``/hr/pay.html`` has the readers of ``/hr/``."""
    async with Site() as site:
        site.set("/hr/pay.html", HR_PAGE)
        site.set("/go/pay", b"", status=302, headers={"Location": "/hr/pay.html"})
        site.set("/hr/moved.html", b"", status=301, headers={"Location": "/manual.html"})
        site.set("/manual.html", PUBLIC)
        _, items = await asyncio.to_thread(scan, [site.url("/go/pay"), site.url("/hr/moved.html")],
                                           allow_hosts=["127.0.0.1"], acl={site.url("/hr/"): ["group:hr"]})
    got = by_source(items)
    assert b"scale T9" in (got[site.url("/go/pay")].data or b"")
    assert got[site.url("/go/pay")].principals == ["group:hr"]
    assert got[site.url("/hr/moved.html")].principals == ["public"], "what it serves is the public page"


async def test_acl_prefixes_match_any_case_of_scheme_and_host_whole_segments_and_normalised_paths():
    async with Site() as site:
        for name in ("a", "b", "c"):
            site.set(f"/hr/{name}.html", HR_PAGE)
        site.set("/hrm.html", PUBLIC)
        port = site.base.rsplit(":", 1)[1]
        listed = {"scheme": f"HTTP://127.0.0.1:{port}/hr/a.html",
                  "dots": site.url("/manuals/../hr/b.html"),
                  "encoded": site.url("/%68r/c.html"),
                  "other segment": site.url("/hrm.html")}
        acl = {f"http://127.0.0.1:{port}/hr": ["group:hr"]}  # no trailing slash: the segment hr
        _, items = await asyncio.to_thread(scan, list(listed.values()), allow_hosts=["127.0.0.1"], acl=acl)
    got = {item.source: item for item in items}
    readers = {name: got[url].principals for name, url in listed.items() if got[url].data}
    assert readers == {"scheme": ["group:hr"], "dots": ["group:hr"], "encoded": ["group:hr"],
                       "other segment": ["public"]}
    # Servers that resolve encoded dot segments, a default port, a trailing dot on the host:
    hr = {"https://Intranet.Example.com./hr": ["group:hr"]}
    for url in ("https://intranet.example.com/manuals/%2E%2e/hr/d.html", "HTTPS://INTRANET.example.com:443/hr",
                "https://intranet.example.com/./hr/%2Fx"):
        assert readers_for(hr, url) == ["group:hr"], url
    for url in ("https://intranet.example.com/hrm", "https://intranet.example.com/HR/x",
                "https://intranet.example.com:8443/hr/x", "http://intranet.example.com/hr/x"):
        assert readers_for(hr, url) == ["public"], url


async def test_a_permissions_only_refresh_keeps_the_readers_of_the_url_a_redirect_ended_at(tmp_path):
    from bot.knowledge.refresh import Refresher
    from bot.runtime import build_runtime
    from tests.conftest import make_settings
    from tests.refresh_helpers import url_source

    async with Site() as site:
        site.set("/hr/pay.html", HR_PAGE)
        site.set("/go/pay", b"", status=302, headers={"Location": "/hr/pay.html"})
        settings = make_settings(tmp_path / "data")
        settings.refresh.allow_hosts = ["127.0.0.1"]
        settings.sources = [url_source("site", [site.url("/go/pay")], respect_robots=False,
                                       acl={site.url("/hr/"): ["group:hr"]})]
        runtime = build_runtime(settings)
        await runtime.start()
        try:
            refresher = Refresher(settings, runtime.store, runtime.indexer)
            for permissions_only in (False, True):
                record = await refresher.run("site", permissions_only=permissions_only)
                assert record is not None and record.ok, record
                assert runtime.store.record(site.url("/go/pay")).readers == ["group:hr"], permissions_only
        finally:
            await runtime.close()
