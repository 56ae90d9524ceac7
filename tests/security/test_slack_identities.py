"""Who a Slack channel's answer is for, and who a Slack user is (issue 39, items 2, 4 and 15), through the
fake Slack speaking the Web API's wire format (conversations.info, users.info, usergroups.list) and the
runtime's own ``Audiences`` with the ``SlackDirectory`` that ``kbbot serve`` registers:

- only a private channel shared with no other organisation and without guests is read as its members;
  a public channel, a Slack Connect channel, one with a guest, or one Slack will not describe reads
  public documents and those granted to the channel (item 2);
- a Slack user group is ``slackgroup:<handle>``, a source group only through ``permissions.slack_groups``
  (item 4);
- a removal from a Slack user group is in force ``permissions.cache_s`` after it (item 15).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import yaml
from slack_sdk.web.async_client import AsyncWebClient

from adapters.platforms import load_settings
from adapters.slack.directory import SlackDirectory
from bot.runtime import build_runtime
from bot.settings import SettingsError
from bot.types import Inquiry
from tests.conftest import REPO, make_settings
from tests.fakes.slack_server import FakeSlack

TEAM = "T0AUD"
ALICE, CAROL, GUEST, LONER = "UALICE", "UCAROL", "UGUEST", "ULONER"
#: A page only Alice and Carol may read.
PAGE = {"readers": ["user:alice@example.com", "user:carol@example.com"]}


def audiences_of(tmp_path: Path, slack: FakeSlack, cache_s: float = 300, **directory: object):
    """The runtime's ``Audiences`` with the Slack directory registered as ``kbbot serve`` does."""
    settings = make_settings(tmp_path / "data")
    settings.permissions.cache_s = cache_s
    runtime = build_runtime(settings)
    client = AsyncWebClient(token=slack.token, base_url=slack.base_url)
    runtime.audiences.register("slack", SlackDirectory(client, cache_s=cache_s, **directory))
    return runtime.audiences


def in_hr(principals: frozenset[str] | None) -> bool:
    return bool(principals) and bool({"group:hr", "slackgroup:hr"} & set(principals or ()))


def asked_in(channel: str, user: str = CAROL) -> Inquiry:
    return Inquiry("slack", TEAM, channel, f"slack:{TEAM}:{channel}:1", user, "q")


async def test_only_a_private_unshared_channel_without_guests_is_read_as_its_members(tmp_path):
    """Everyone in each channel may read the page (the guests' e-mails are Alice's and Carol's); only in
    the private channel without guests or another organisation is that what decides. Anyone in the workspace may open a public
    channel and read its history, another organisation's people read a Slack Connect channel, and a
    guest's e-mail says nothing of what they may read at the sources."""
    async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
        slack.add_user(ALICE, "alice@example.com")
        slack.add_user(CAROL, "carol@example.com")
        slack.add_user(GUEST, "alice@example.com", guest="multi")  # a guest's e-mail proves nothing
        slack.add_user(LONER, "carol@example.com", guest="single")
        hr = [ALICE, CAROL, "UKBBOT"]
        slack.add_channel("CPRIVATE", hr, private=True)
        slack.add_channel("CSISTER", hr, private=True, org_shared=True)  # another workspace of the same org
        slack.add_channel("CPUBLIC", hr)
        slack.add_channel("CCONNECT", hr, private=True, ext_shared=True)
        slack.add_channel("CINVITED", hr, private=True, pending_ext_shared=True)
        slack.add_channel("CGUEST", [*hr, GUEST], private=True)
        slack.add_channel("CSINGLE", [*hr, LONER], private=True)
        slack.channel_members["CGONE"] = hr  # listed, but conversations.info is refused below
        slack.channel_members["CNOSCOPE"] = hr
        audiences = audiences_of(tmp_path, slack)

        for channel in ("CPRIVATE", "CSISTER"):
            audience = await audiences.of(asked_in(channel))
            assert audience.admits(PAGE), channel

        seen = {c: await audiences.of(asked_in(c)) for c in ("CPUBLIC", "CCONNECT", "CINVITED", "CGUEST", "CSINGLE")}
        slack.fail("conversations.info", error="internal_error", times=1)
        seen["CGONE"] = await audiences.of(asked_in("CGONE"))
        slack.missing_scopes.add("groups:read")
        slack.add_channel("CNOSCOPE", private=True)
        seen["CNOSCOPE"] = await audiences.of(asked_in("CNOSCOPE"))
        for channel, audience in seen.items():
            assert not audience.admits(PAGE), channel
            assert audience.admits({"readers": ["public"]}) and audience.admits(
                {"readers": [f"channel:{channel.lower()}"]}), channel
            # Carol may read the page alone: the offer of a direct message stays.
            alone = audience.alone()
            assert alone is not None and alone.admits(PAGE), channel


async def test_a_slack_user_group_is_a_source_group_only_through_the_settings(tmp_path):
    """Whoever may create or edit Slack user groups makes a Slack group named like a restricted source
    group (``finance``) and joins it: that grants nothing; only ``permissions.slack_groups`` does."""
    async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
        slack.add_user(ALICE, "alice@example.com")
        slack.add_user(CAROL, "carol@example.com")
        slack.usergroups = {"finance": [ALICE], "hr": [CAROL]}
        unmapped = audiences_of(tmp_path / "unmapped", slack)
        assert await unmapped.principals_of("slack", TEAM, ALICE) == {"user:alice@example.com", "slackgroup:finance",
                                                                     "domain:example.com"}
        mapped = audiences_of(tmp_path / "mapped", slack, groups={"hr": ["group:hr"]})
        alice = await mapped.principals_of("slack", TEAM, ALICE)
        carol = await mapped.principals_of("slack", TEAM, CAROL)
    # The e-mail's domain (Google Drive files shared with the whole domain), never a group of the same name.
    assert alice == {"user:alice@example.com", "slackgroup:finance", "domain:example.com"}
    assert carol == {"user:carol@example.com", "slackgroup:hr", "group:hr", "domain:example.com"}


def settings_with(tmp_path: Path, permissions: dict) -> Path:
    folder = tmp_path / "config"
    shutil.copytree(REPO / "config", folder)
    path = folder / "kbbot.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["permissions"].update(permissions)
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


def test_slack_groups_settings_are_checked_and_spelled_one_way(tmp_path):
    path = settings_with(tmp_path, {"slack_groups": {"@Finance": ["Group:Finance", "boss@example.com"]}})
    settings = load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path / "data")})
    assert settings.permissions.slack_groups == {"finance": ["group:finance", "user:boss@example.com"]}
    assert load_settings(REPO / "config" / "kbbot.yaml", env={}).permissions.slack_groups == {}


@pytest.mark.parametrize(("groups", "message"), [
    ({"finance": []}, "permissions.slack_groups ['finance'] must be a non-empty list of principals, e.g. "
                      "[group:finance]"),
    ({"finance": "group:finance"}, "permissions.slack_groups.finance must be a list, got 'group:finance'"),
    ({"finance": ["public"]}, "a Slack group stands for source groups or users (group:<name>, user:<e-mail>, "
                              "space:<key>"),
    ({"finance": ["channel:c1"]}, "a Slack group stands for source groups or users"),
    ({"finance": ["finance"]}, "'finance' is not a principal"),
    ({"fin ance": ["group:finance"]}, "['fin ance']: a key is a Slack user group's handle"),
])
def test_bad_slack_groups_settings_are_one_clear_error(tmp_path, groups, message):
    path = settings_with(tmp_path / str(abs(hash(str(groups)))), {"slack_groups": groups})
    with pytest.raises(SettingsError) as error:
        load_settings(path, env={"KBBOT_DATA_DIR": str(tmp_path / "data")})
    assert message in str(error.value)


async def test_a_removal_from_a_slack_group_is_in_force_after_cache_s(tmp_path):
    """One cache, one bound: the directory's user groups were read at 0 s, Carol was removed from hr
    just after, and her identity was next asked for at 0.6 s, from that list. At 1.2 s, past
    ``cache_s`` (1 s) after the removal, she is no longer in hr: no second cache, filled at 0.6 s from
    the first, keeps her in it until 1.6 s."""
    async with FakeSlack(team_id=TEAM, bot_user_id="UKBBOT") as slack:
        slack.add_user(ALICE, "alice@example.com")
        slack.add_user(CAROL, "carol@example.com")
        slack.usergroups = {"hr": [ALICE, CAROL]}
        audiences = audiences_of(tmp_path, slack, cache_s=1)
        started = time.monotonic()
        assert in_hr(await audiences.principals_of("slack", TEAM, ALICE))
        slack.usergroups["hr"].remove(CAROL)
        await asyncio.sleep(0.6 - (time.monotonic() - started))
        assert in_hr(await audiences.principals_of("slack", TEAM, CAROL)), "within cache_s the list of 0 s may stand"
        await asyncio.sleep(1.2 - (time.monotonic() - started))
        assert not in_hr(await audiences.principals_of("slack", TEAM, CAROL))
        # The same bound for a channel's members: Carol left the private channel at 1.2 s.
        slack.add_channel("CPRIV", [ALICE, CAROL], private=True)
        assert len((await audiences.of(asked_in("CPRIV", ALICE))).each) == 2
        slack.channel_members["CPRIV"].remove(CAROL)
        await asyncio.sleep(1.1)
        assert len((await audiences.of(asked_in("CPRIV", ALICE))).each) == 1
