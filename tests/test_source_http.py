"""The HTTP layer the source kinds share: when a throttled call is tried again, and where a redirect or a
download URL may go. The kinds' own tests drive it through their fakes; these pin its edges."""

from __future__ import annotations

import pytest

from pipelines.sources.http import RetryPolicy, on_hosts, retry_after_s
from pipelines.sources.kind import SourceError


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s("7") == 7.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def test_backoff_grows_with_jitter_and_gives_up_with_the_service_status_and_time_waited():
    policy = RetryPolicy("Google Drive", max_retries=3, max_wait_s=120)
    waits: list[float] = []
    for attempt in range(3):
        wait = policy.wait_s(waits, 503, None, "/files")
        assert 2 ** attempt <= wait < 2 ** attempt + 1
    with pytest.raises(SourceError) as caught:
        policy.wait_s(waits, 503, None, "/files")
    message = str(caught.value)
    assert "HTTP 503 for /files" in message and "throttled by Google Drive" in message and "4 tries" in message
    assert f"{sum(waits):.0f} s of waiting" in message and policy.throttled == 3


def test_retry_after_is_obeyed_unless_longer_than_allowed():
    policy = RetryPolicy("Microsoft Graph", max_wait_s=60)
    waits: list[float] = []
    assert policy.wait_s(waits, 429, "30", "/x") == 30 and policy.pause_left() > 29
    with pytest.raises(SourceError, match="next wait 3600 s, longest allowed 60 s"):
        policy.wait_s(waits, 429, "3600", "/x")


def test_a_403_is_a_rate_limit_only_for_the_reasons_named():
    policy = RetryPolicy("Google Drive", statuses={429}, reasons={"rateLimitExceeded"})
    assert policy.applies(429) and policy.applies(403, "rateLimitExceeded")
    assert not policy.applies(403, "insufficientFilePermissions") and not policy.applies(503)


@pytest.mark.parametrize("url, ok", [
    ("https://contoso.sharepoint.com/x", True), ("https://SharePoint.com./x", True),
    ("https://evilsharepoint.com/x", False), ("ftp://contoso.sharepoint.com/x", False),
    ("http://127.0.0.1:8080/token", True), ("http://127.0.0.2/token", False), ("https://a.127.0.0.1/", False),
])
def test_urls_are_on_the_hosts_or_below_them_and_on_exact_hosts_only_exactly(url, ok):
    assert on_hosts(url, ["sharepoint.com"], exact=["127.0.0.1"]) is ok
