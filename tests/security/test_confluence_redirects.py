"""A Confluence source redirected to an internal address (issue 26, finding 13): the Confluence client
followed redirects without the guard URL sources connect through. A real ``ConfluenceSource`` against
the local Confluence (``tests/fakes/confluence_server.py``), one page of which answers with a 302 to
another local service, read as a refresh would."""

from __future__ import annotations

import asyncio
import json

from pipelines.sources.confluence.client import ConfluenceClient
from pipelines.sources.confluence.source import ConfluenceSource
from pipelines.sources.kind import SourceItem
from tests.fakes.confluence_server import FakeConfluence
from tests.refresh_helpers import Site

SECRET = json.dumps({"id": "1", "type": "page", "title": "Controller", "version": {"number": 1},
                     "body": {"storage": {"value": "<p>aws_secret_access_key = wJalrXUtnFEMI</p>"}}})


def scan(server: FakeConfluence, allow_hosts: list[str]) -> dict[str, SourceItem]:
    """The items one refresh of the OPS space yields (in a thread: the servers answer on this loop)."""
    client = ConfluenceClient(server.base_url, "conf-token", timeout_s=3, connect_timeout_s=1,
                              allow_hosts=allow_hosts)
    source = ConfluenceSource("wiki", client, spaces=["OPS"], attachments=False)
    try:
        return {item.name: item for item in source.scan({}, "default")}
    finally:
        source.close()


async def test_a_page_redirected_to_an_internal_address_is_refused_at_the_hop():
    internal = Site()
    internal.set("/latest/meta-data/iam", SECRET)
    async with internal, FakeConfluence(cloud=False) as server:
        server.add_page("OPS", "Manual", "<p>Regrease the bearings every 3,000 hours.</p>")
        planted = server.add_page("OPS", "Controller", "<p>ordinary</p>")
        # The site is 127.0.0.1; the redirect names another host that resolves to the loopback.
        planted.redirect = internal.url("/latest/meta-data/iam").replace("127.0.0.1", "localhost")

        items = await asyncio.to_thread(scan, server, [])

    assert internal.served("/latest/meta-data/iam") == [], "the internal address was never requested"
    refused = items["Controller"]
    assert refused.gone and refused.data is None
    assert "refused: localhost resolves to 127.0.0.1, a loopback address" in (refused.error or ""), refused.error
    assert "refresh.allow_hosts" in (refused.error or "")
    assert b"3,000 hours" in (items["Manual"].data or b""), "the site itself (a loopback address too) is read"


async def test_a_redirect_to_a_host_the_admin_allows_is_followed():
    internal = Site()
    internal.set("/wiki-mirror/page", SECRET)
    async with internal, FakeConfluence(cloud=False) as server:
        page = server.add_page("OPS", "Controller", "<p>ordinary</p>")
        page.redirect = internal.url("/wiki-mirror/page").replace("127.0.0.1", "localhost")

        items = await asyncio.to_thread(scan, server, ["LOCALHOST"])

    assert len(internal.served("/wiki-mirror/page")) == 1
    assert b"wJalrXUtnFEMI" in (items["Controller"].data or b"")
