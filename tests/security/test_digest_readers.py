"""The weekly digest (issue 39, item 12), on the fake Slack with the turn records in SQLite and in Redis
(skipped without REDIS_URL): an owner's list names only documents that owner may read (the others are
withheld: no title, no source), and questions asked in direct messages stay out of the digest channel
(counted, without their text)."""

from __future__ import annotations

import time
import uuid

import pytest

from adapters.insights import digest_poster, make_digest
from adapters.slack.platform import SlackAdapter
from adapters.slack.settings import SlackSettings
from bot.runtime import build_runtime
from bot.state.turn_log.records import TurnRecord, ranked_chunks
from pipelines.query import retrieval_inputs
from tests.conftest import make_settings
from tests.refresh_helpers import REDIS_URL, folder_source
from tests.test_approvals import started
from tests.test_slack import fake_slack  # noqa: F401 - fixture

FAULT = "# Fault code E-917\n\nFault E-917 means the cooling fan of the HL-D50 drive is blocked. Clean the fan grille.\n"
CLAIMS = ("# HL-K8 warranty claims\n\nWarranty claims for the HL-K8 compressor are approved up to 4,800 euros by the "
          "service manager without further review.\n")
CLAIMS_GAP = "Who signs HL-K8 claims above the review limit?"
DM_GAP = "Which torque do the HL-D50 fan grille screws need?"
CHANNEL_GAP = "What colour is the HL-D50 drive cooling fan?"


@pytest.fixture(params=["sqlite", "redis"])
def state(request: pytest.FixtureRequest) -> str:
    if request.param == "redis" and not REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    return request.param


async def test_owners_see_only_what_they_may_read_and_dm_questions_stay_out_of_the_channel(state, tmp_path,
                                                                                          fake_slack):
    docs = tmp_path / "docs"
    for folder, name, text in (("drives", "fault.md", FAULT), ("finance", "claims.md", CLAIMS)):
        (docs / folder).mkdir(parents=True)
        (docs / folder / name).write_text(text, encoding="utf-8")
    settings = make_settings(tmp_path / "kb", **({"REDIS_URL": REDIS_URL or ""} if state == "redis" else {}))
    settings.redis_prefix = f"kbbot-test:{uuid.uuid4().hex[:12]}:"
    settings.sources = [folder_source("docs", docs, acl={"finance/": ["user:ceo@example.com"]},
                                      owners={"finance/": ["U0OWNER", "U0CEO"]})]
    settings.permissions.principals = {"slack:U0CEO": ["user:ceo@example.com"]}
    settings.slack.digest_to = "C0ADMINS"
    runtime = build_runtime(settings)
    async with started(settings, tmp_path / "state", runtime):
        assert (runtime.redis is not None) == (state == "redis")
        assert (await runtime.refresher().run("docs")).added == 2
        retrieval = runtime.retrieval_pipeline()

        async def gap(question: str, channel: str, nearest: str) -> None:
            # What a turn of someone who may read everything keeps (the CEO, say): its nearest passages.
            ranked = ranked_chunks(retrieval.run(retrieval_inputs(question))["rank"]["documents"])
            assert ranked[0]["source"].endswith(nearest), (question, ranked[0])
            for _ in range(2):
                await runtime.turns.log.add(TurnRecord(
                    turn_id=uuid.uuid4().hex, at=time.time() - 3600, platform="slack", tenant="T1", channel=channel,
                    thread_key=f"slack:T1:{channel}:1", user="U1", question=question, outcome="not_found",
                    answer="not found", ranked=ranked))

        await gap(CLAIMS_GAP, "C1", "claims.md")
        await gap(DM_GAP, "D0DAVE", "fault.md")  # a direct message
        await gap(CHANNEL_GAP, "C1", "fault.md")

        slack = SlackAdapter(None, SlackSettings(bot_token=fake_slack.token, signing_secret="s" * 32,
                                                 api_url=fake_slack.base_url), digest_to=settings.slack.digest_to)
        text = await make_digest(runtime, [slack], digest_poster([slack], settings)).send()

    [owner] = [m for m in fake_slack.messages.values() if m.channel == "U0OWNER"]
    assert CLAIMS_GAP in owner.text
    assert "HL-K8 warranty claims" not in owner.text and "claims.md" not in owner.text, \
        "a restricted document's title and source, to an owner who may not read it"
    [ceo] = [m for m in fake_slack.messages.values() if m.channel == "U0CEO"]
    assert "HL-K8 warranty claims" in ceo.text and "claims.md" in ceo.text, "who may read it sees where it is"

    [admins] = [m for m in fake_slack.messages.values() if m.channel == "C0ADMINS"]
    assert admins.text == text
    assert DM_GAP not in text and "D0DAVE" not in text, "a question asked in a direct message, in a channel"
    assert CHANNEL_GAP in text
    assert "asked in direct messages" in text, "counted, without its text"
