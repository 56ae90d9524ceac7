"""robots.txt for URL sources (RFC 9309): the parser on the RFC's rules, then refreshes against a local
website and real Weaviate and Redis: a disallowed page is skipped and revoked, a robots.txt that
answers 5xx keeps the whole host as it was, Crawl-delay spaces the requests, 4xx allows everything,
and ``respect_robots: false`` reads none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipelines.sources.fetcher import Fetcher
from pipelines.sources.robots import Robots, parse_robots, product_token
from tests.refresh_helpers import (
    SERVICES_MISSING,
    Site,
    Stack,
    cited,
    isolated_stack,
    url_source,
)

needs_services = pytest.mark.skipif(bool(SERVICES_MISSING), reason=SERVICES_MISSING or "")

FAULT = "<html><body><article><h1>Fault E-917</h1><p>Fault E-917 means the cooling fan of the HL-D50 drive is " \
        "blocked. Clean the fan grille.</p></article></body></html>"
GREASE = "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 operating hours.\n"
VIBRATION = "<html><body><article><h1>Vibration</h1><p>The HL-M200 motor vibration must stay below 2.8 mm/s RMS " \
            "at the bearing housing.</p></article></body></html>"


# --- the parser ------------------------------------------------------------------------------------
def allowed(text: str, *paths: str, token: str = "kbbot") -> list[bool]:
    rules = parse_robots(text, token)
    return [rules.allows("https://example.com" + p) for p in paths]


def test_our_product_token_comes_from_the_user_agent():
    assert product_token("kbbot/0.1 (knowledge refresh)") == "kbbot"
    assert product_token("KBBot") == "kbbot"
    assert product_token("") == ""


def test_the_group_naming_us_wins_over_star_and_groups_naming_us_are_merged():
    text = ("User-agent: *\nDisallow: /\n\n"
            "User-agent: KBBOT\nUser-agent: otherbot\nDisallow: /private\n\n"
            "User-agent: kbbot\nDisallow: /drafts/\n")
    assert allowed(text, "/manual.html", "/private/a.html", "/drafts/x") == [True, False, False]
    assert allowed(text, "/manual.html", token="somebody") == [False]
    assert allowed("User-agent: otherbot\nDisallow: /\n", "/a") == [True], "no group for us: no restrictions"


def test_the_longest_match_decides_an_allow_wins_a_tie_and_wildcards_work():
    text = ("User-agent: *\nDisallow: /\nAllow: /docs/\nDisallow: /docs/*.pdf$\nDisallow: /*?print=\n"
            "Allow: /same\nDisallow: /same\n")
    assert allowed(text, "/", "/other.html", "/docs/a.html", "/docs/a.pdf", "/docs/a.pdf?x=1",
                   "/docs/a.html?print=1", "/same/x") == [False, False, True, False, True, False, True]
    assert allowed("User-agent: *\nDisallow: /$\nDisallow: /*.pdf$\nDisallow: /a*b*c\n",
                   "/", "/index.html", "/x.pdf.pdf", "/x.pdf.html", "/a-b-c-d", "/a-c-b") == [
        False, True, False, True, False, True]
    assert allowed("User-agent: *\nDisallow: *\n", "/anything") == [False]
    # many wildcards against a long URL: matched in linear time (a regex would backtrack for ages)
    assert allowed("User-agent: *\nDisallow: /" + "*a" * 40 + "*b\n", "/" + "a" * 5000) == [True]
    # first-match order (urllib.robotparser) would say no here: the longer Allow wins
    assert allowed("User-agent: *\nDisallow: /private\nAllow: /private/public\n", "/private/public/a") == [True]


def test_percent_encoding_comments_bom_empty_rules_and_junk_are_handled_leniently():
    text = ("\ufeff# our robots\nDisallow: /before-any-group\nUser-agent: * # everyone\nDisallow: /caf%C3%A9\n"
            "Disallow:\nthis line means nothing\nSitemap: https://example.com/sitemap.xml\nDisallow: /x%2Fy\n")
    # RFC 9309 2.2.2: an encoded reserved character (%2F) is not the character itself.
    assert allowed(text, "/café/menu", "/caf%c3%a9", "/before-any-group", "/x%2Fy", "/x/y", "/fine") == [
        False, False, True, False, True, True]
    assert allowed("User-agent: *\nDisallow: /\n", "/robots.txt") == [True]


def test_crawl_delay_is_read_for_our_group_and_bad_values_are_ignored():
    assert parse_robots("User-agent: *\nCrawl-delay: 2.5\n", "kbbot").crawl_delay_s == 2.5
    assert parse_robots("User-agent: kbbot\nCrawl-delay: soon\nCrawl-delay: -1\n", "kbbot").crawl_delay_s is None
    assert parse_robots("User-agent: other\nCrawl-delay: 9\nUser-agent: *\nCrawl-delay: 1\n",
                        "kbbot").crawl_delay_s == 1


async def test_a_huge_crawl_delay_is_bounded_and_robots_txt_is_read_once_per_host():
    async with Site() as site:
        site.set("/robots.txt", "User-agent: *\nCrawl-delay: 3600\nDisallow: /private/\n", content_type="text/plain")
        fetcher = Fetcher(timeout_s=2, user_agent="kbbot/0.1 (test)", allow_hosts=["127.0.0.1"])
        try:
            robots = Robots(fetcher, max_crawl_delay_s=0.2)
            # the fetcher is synchronous; the site answers on this event loop
            host = await asyncio.to_thread(robots.host, site.url("/a.html"))
            again = await asyncio.to_thread(robots.host, site.url("/private/b.html"))
        finally:
            fetcher.close()
        assert host is again and host.delay_s == 0.2
        assert not host.allows(site.url("/private/b.html")) and host.allows(site.url("/a.html"))
        assert len(site.served("/robots.txt")) == 1


async def test_a_huge_or_garbled_robots_txt_is_read_as_far_as_the_rfc_asks():
    async with Site() as site:
        site.set("/robots.txt", b"User-agent: *\nDisallow: /a\n\xff\xfe\x00garbage\n" + b"#" * 600_000
                 + b"\nDisallow: /b\n", content_type="text/plain")
        fetcher = Fetcher(timeout_s=2, allow_hosts=["127.0.0.1"])
        try:
            host = await asyncio.to_thread(Robots(fetcher).host, site.url("/"))
        finally:
            fetcher.close()
        assert host.unreachable is None
        assert not host.allows(site.url("/a/x")) and host.allows(site.url("/b/x")), "only the first 500 KiB count"


# --- refreshes -------------------------------------------------------------------------------------
@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with isolated_stack(tmp_path, "Robots") as s:
        yield s


def robots_txt(site: Site, text: str, **options: object) -> None:
    site.set("/robots.txt", text, content_type="text/plain", **options)


@needs_services
async def test_a_disallowed_page_is_skipped_counted_logged_and_revoked(stack: Stack,
                                                                      caplog: pytest.LogCaptureFixture):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        site.set("/private/e917.html", FAULT)
        site.set("/grease.md", GREASE, content_type="text/markdown")
        site.set("/vibration.html", VIBRATION)
        site.set("/sitemap.xml", '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                                 f"<url><loc>{site.url('/vibration.html')}</loc></url></urlset>",
                 content_type="application/xml")
        robots_txt(site, "User-agent: *\nDisallow: /drafts/\n")
        stack.settings.sources = [url_source("site", [site.url("/private/e917.html"), site.url("/grease.md"),
                                                      site.url("/sitemap.xml")])]
        first = await refresher.run("site")
        assert first is not None and first.ok and (first.added, first.disallowed) == (3, 0), first
        assert len(site.served("/robots.txt")) == 1, "read once for the run, whatever the concurrency"
        answer = await stack.ask("What does fault E-917 mean?")
        assert site.url("/private/e917.html") in cited(answer)

        # The site now keeps us out of /private/ (and a group for us overrides the * group).
        robots_txt(site, "User-agent: *\nDisallow: /\n\nUser-agent: kbbot\nDisallow: /private/\n")
        served_before = len(site.log)
        caplog.set_level("INFO", logger="pipelines.sources")
        second = await refresher.run("site")
        assert second is not None and second.ok, second
        assert (second.disallowed, second.removed, second.unchanged, second.failed) == (1, 1, 2, []), second
        assert "1 disallowed by robots.txt" in second.summary()
        requested = [s.path for s in site.log[served_before:]]
        assert "/private/e917.html" not in requested, "a disallowed page is not even asked for"
        assert requested.count("/robots.txt") == 1
        assert any(f"disallows {site.url('/private/e917.html')} for kbbot: skipped (its indexed version is "
                   "revoked)" in r.getMessage() for r in caplog.records)
        assert set(stack.runtime.store.records()) == {site.url("/grease.md"), site.url("/vibration.html")}
        answer = await stack.ask("What does fault E-917 mean?")
        assert site.url("/private/e917.html") not in cited(answer) and "cooling fan" not in answer.text

        # A sitemap robots.txt disallows is a sitemap that failed: its last listing stands.
        robots_txt(site, "User-agent: kbbot\nDisallow: /private/\nDisallow: /sitemap.xml\n")
        third = await refresher.run("site")
        assert third is not None and third.ok and third.removed == 0 and third.unchanged == 2
        [failure] = third.failed
        assert failure["source"] == site.url("/sitemap.xml")
        assert failure["reason"].startswith(f"disallowed by the robots.txt of {site.base} for kbbot")
        assert (await refresher.last_run("site")).disallowed == 1  # type: ignore[union-attr]


@needs_services
async def test_a_robots_txt_answering_5xx_keeps_the_whole_host_as_it_was(stack: Stack):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        site.set("/e917.html", FAULT)
        site.set("/grease.md", GREASE, content_type="text/markdown")
        stack.settings.sources = [url_source("site", [site.url("/e917.html"), site.url("/grease.md")])]
        first = await refresher.run("site")  # no robots.txt (404): everything allowed
        assert first is not None and first.ok and first.added == 2
        version = stack.runtime.store.knowledge_version

        robots_txt(site, "oops", status=503)
        del site.pages["/grease.md"]  # would be revoked, were the host read
        served_before = len(site.log)
        run = await refresher.run("site")
        assert run is not None and not run.ok, "the run says the host was skipped"
        assert run.error == (f"robots.txt of {site.base} unreachable (HTTP 503): not fetched this run, its pages "
                             "keep their indexed versions")
        assert [s.path for s in site.log[served_before:]] == ["/robots.txt"], "no page of the host is asked for"
        assert (run.removed, run.disallowed, run.orphaned) == (0, 0, 0)
        assert {f["source"] for f in run.failed} == {site.url("/e917.html"), site.url("/grease.md")}
        assert all("robots.txt of" in f["reason"] and "HTTP 503" in f["reason"] for f in run.failed)
        assert set(stack.runtime.store.records()) == {site.url("/e917.html"), site.url("/grease.md")}
        assert stack.runtime.store.knowledge_version == version
        answer = await stack.ask("What does fault E-917 mean?")
        assert site.url("/e917.html") in cited(answer) and "cooling fan" in answer.text

        # The conditional-request validators survived the skipped run: the next one costs no download.
        robots_txt(site, "not found", status=404)
        site.set("/grease.md", GREASE, content_type="text/markdown")
        served_before = len(site.log)
        healed = await refresher.run("site")
        assert healed is not None and healed.ok and healed.unchanged == 2, healed
        assert {(s.path, s.status) for s in site.log[served_before:]} == {
            ("/robots.txt", 404), ("/e917.html", 304), ("/grease.md", 304)}

        # 4xx other than 404 (here 403) means no restrictions as well (RFC 9309 2.3.1.3).
        robots_txt(site, "forbidden", status=403)
        assert (await refresher.run("site")).ok  # type: ignore[union-attr]


@needs_services
async def test_crawl_delay_spaces_the_requests_to_the_host(stack: Stack):
    refresher = stack.refresher
    assert refresher is not None
    stack.settings.refresh.concurrency = 4
    delay = 0.5
    async with Site() as site:
        pages = [f"/page-{i}.md" for i in range(5)]
        for i, path in enumerate(pages):
            site.set(path, f"# Step {i}\n\nTighten terminal X{i} of the HL-M200 to {i + 1} N·m.\n",
                     content_type="text/markdown")
        robots_txt(site, f"User-agent: *\nCrawl-delay: {delay}\n")
        stack.settings.sources = [url_source("site", [site.url(p) for p in pages])]
        run = await refresher.run("site")
        assert run is not None and run.ok and run.added == 5
        times = [s.at for s in site.log]
        assert [s.path for s in site.log][0] == "/robots.txt"
        gaps = [b - a for a, b in zip(times, times[1:])]
        # Measured where the requests arrive, so a little scheduling jitter is allowed for; without the
        # delay, four fetches at once arrive within milliseconds of each other.
        assert len(gaps) == 5 and min(gaps) >= delay - 0.15, gaps
        assert times[-1] - times[0] >= 5 * delay - 0.15


@needs_services
async def test_respect_robots_false_reads_no_robots_txt(stack: Stack):
    refresher = stack.refresher
    assert refresher is not None
    async with Site() as site:
        site.set("/e917.html", FAULT)
        robots_txt(site, "User-agent: *\nDisallow: /\n")
        stack.settings.sources = [url_source("site", [site.url("/e917.html")], respect_robots=False)]
        run = await refresher.run("site")
        assert run is not None and run.ok and (run.added, run.disallowed) == (1, 0)
        assert site.served("/robots.txt") == []
