"""A Teams user's Entra groups from Microsoft Graph (``teams.graph_groups``): what they open, and that
Graph failing opens nothing. Against the Graph fake (``tests/fakes/graph.py``) and, end to end, the Teams
fake as ``kbbot serve`` wires both."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.teams.auth import BotTokens
from adapters.teams.graph import GRAPH_SCOPE, GraphGroups, GraphUnavailable
from bot.types import Outcome
from tests.fakes.graph import FakeGraph
from tests.refresh_helpers import folder_source
from tests.scenarios.platforms import Place, TeamsDriver, serving
from tests.scenarios.test_scenarios import CLAIMS, CLAIMS_QUESTION, DOCS, knowledge


@pytest.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    async with FakeGraph() as fake:
        yield fake


@pytest.fixture
async def teams() -> AsyncIterator[TeamsDriver]:
    async with TeamsDriver() as driver:
        yield driver


def groups_client(graph: FakeGraph, **options) -> GraphGroups:
    tokens = BotTokens(graph.app_id, graph.app_secret, graph.tenant_id, login_url=graph.login_url, scope=GRAPH_SCOPE)
    return GraphGroups(tokens, graph_url=graph.graph_url, **options)


# --- Graph itself ------------------------------------------------------------------------------------------
async def test_a_users_nested_groups_are_read_page_by_page(graph: FakeGraph):
    alice = graph.add_user(mail="alice@contoso.example")
    finance = graph.add_group("Finance", members=[alice])
    emea = graph.add_group("Finance EMEA", members=[finance])  # alice through Finance
    direct = [graph.add_group(f"Team {n}", members=[alice]) for n in range(3)]
    graph.add_group("Elsewhere")
    graph.max_page_size = 2
    client = groups_client(graph)
    try:
        assert await client.of(alice) == {finance, emea, *direct}
        assert await client.of(graph.add_user()) == frozenset(), "no groups"
        assert await client.of("0c0c0c0c-0000-4000-8000-000000000000") == frozenset(), "unknown to Graph (404)"
    finally:
        await client.close()
    pages = graph.calls_to("/transitiveMemberOf/microsoft.graph.group")[:3]
    assert [c.status for c in pages] == [200, 200, 200] and len(graph.calls_to(f"{alice}/transitiveMemberOf/"
                                                                                "microsoft.graph.group")) == 3
    assert all(c.headers.get("ConsistencyLevel") == "eventual" for c in pages)
    assert pages[0].query["$select"] == "id" and "$skiptoken" in pages[1].query


async def test_a_next_link_off_the_graph_host_is_not_followed(graph: FakeGraph):
    alice = graph.add_user()
    for n in range(3):
        graph.add_group(f"G{n}", members=[alice])
    graph.max_page_size = 2
    graph.next_link_root = "http://127.0.0.2:9"
    client = groups_client(graph)
    try:
        with pytest.raises(GraphUnavailable, match="off the Graph host"):
            await client.of(alice)
    finally:
        await client.close()
    assert len(graph.calls) == 1


async def test_429_and_503_are_waited_out_within_the_bound_and_beyond_it_pause_every_lookup(graph: FakeGraph):
    alice = graph.add_user()
    finance = graph.add_group("Finance", members=[alice])
    client = groups_client(graph, max_wait_s=1.0)
    try:
        graph.throttle(times=1, retry_after=0.2)
        graph.throttle(times=1, retry_after=0.2, status=503)
        assert await client.of(alice) == {finance}
        graph.throttle(times=1, retry_after=60)
        with pytest.raises(GraphUnavailable) as raised:
            await client.of(alice)
        assert raised.value.cause == "throttled"
        asked = len(graph.calls)
        with pytest.raises(GraphUnavailable, match="paused"):
            await client.of(alice)
        assert len(graph.calls) == asked, "nobody asks Graph while it said to wait"
    finally:
        await client.close()


async def test_consent_missing_is_a_403_that_says_which_permission(graph: FakeGraph):
    alice = graph.add_user()
    graph.forbid()
    client = groups_client(graph)
    try:
        with pytest.raises(GraphUnavailable, match="GroupMember.Read.All") as raised:
            await client.of(alice)
        assert raised.value.cause == "403 forbidden"
    finally:
        await client.close()


# --- end to end: who reads what ----------------------------------------------------------------------------
def restricted_to(group: str, cache_s: float = 0):
    def configure(settings, docs: Path) -> None:
        settings.sources = [folder_source("docs", docs, acl={"finance/": [f"group:{group}"]})]
        settings.permissions.cache_s = cache_s
    return configure


def with_graph(graph: FakeGraph) -> dict:
    return {"graph_groups": True, "graph_url": graph.graph_url, "graph_login_url": graph.login_url}


def in_directory(graph: FakeGraph, teams: TeamsDriver, *names: str) -> dict[str, str]:
    """Each person's Graph user, under their Entra object id as the Teams fake gives it."""
    users = {n: teams.fake.users[teams.user_id(n)] for n in names}
    for user in users.values():
        graph.add_user(user.aad_object_id, mail=user.email)
    return {n: u.aad_object_id for n, u in users.items()}


def answers(bot) -> list:
    return [t.answer for t in bot.turns]


async def test_a_member_of_a_nested_group_reads_its_document_and_others_do_not(tmp_path, teams: TeamsDriver,
                                                                               graph: FakeGraph):
    ids = in_directory(graph, teams, "alice", "bob")
    finance = graph.add_group("Finance", members=[ids["alice"]])
    claims = graph.add_group("Claims approvers", members=[finance])
    async with knowledge(tmp_path, {**DOCS, "finance/claims.md": CLAIMS}, restricted_to(claims)) as (runtime, _), \
            serving(runtime, teams, **with_graph(graph)) as bot:
        for name in ("alice", "bob"):
            await bot.ask(CLAIMS_QUESTION, user=teams.user_id(name), place=teams.private(teams.user_id(name)))
    alice, bob = answers(bot)
    assert alice.outcome is Outcome.ANSWERED and "4,800" in alice.text
    assert bob.outcome is Outcome.NOT_FOUND
    assert "4,800" not in "".join(m.text for m in teams.fake.chat(teams.private(teams.user_id("bob")).id))


async def test_without_graph_groups_the_same_user_reads_nothing_restricted(tmp_path, teams: TeamsDriver,
                                                                          graph: FakeGraph):
    ids = in_directory(graph, teams, "alice")
    claims = graph.add_group("Claims approvers", members=[ids["alice"]])
    alice = teams.user_id("alice")
    async with knowledge(tmp_path, {**DOCS, "finance/claims.md": CLAIMS}, restricted_to(claims)) as (runtime, _), \
            serving(runtime, teams, graph_url=graph.graph_url, graph_login_url=graph.login_url) as bot:
        await bot.ask(CLAIMS_QUESTION, user=alice, place=teams.private(alice))
    assert answers(bot)[0].outcome is Outcome.NOT_FOUND and not graph.calls, "off by default"


@pytest.mark.parametrize("failure", ["forbidden", "down", "throttled"])
async def test_graph_failing_fails_closed_in_chats_and_channels_with_one_warning(tmp_path, teams: TeamsDriver,
                                                                                 graph: FakeGraph, failure: str,
                                                                                 caplog: pytest.LogCaptureFixture):
    ids = in_directory(graph, teams, "alice", "carol")
    claims = graph.add_group("Claims approvers", members=[ids["alice"], ids["carol"]])
    alice, carol = (teams.fake.users[teams.user_id(n)] for n in ("alice", "carol"))
    finance = Place(teams.fake.add_channel(teams.shared.id, "Finance", members=[alice, carol], membership="private"),
                    private=False)
    async with knowledge(tmp_path, {**DOCS, "finance/claims.md": CLAIMS}, restricted_to(claims)) as (runtime, _), \
            serving(runtime, teams, **with_graph(graph)) as bot:
        await bot.ask(CLAIMS_QUESTION, user=alice.id, place=finance)
        assert answers(bot)[-1].outcome is Outcome.ANSWERED, "both members are in the group"
        if failure == "forbidden":
            graph.forbid()
        elif failure == "throttled":
            graph.throttle(times=100, retry_after=120)
        else:
            await graph.stop()
        with caplog.at_level(logging.WARNING, logger="kbbot.teams"):
            for place in (teams.private(alice.id), finance, finance):
                await bot.ask(CLAIMS_QUESTION, user=alice.id, place=place)
    in_chat, in_channel, again = answers(bot)[1:]
    assert in_chat.outcome is Outcome.NOT_FOUND, "the asker alone: without their groups"
    assert in_channel.outcome is Outcome.NOT_FOUND and again.outcome is Outcome.NOT_FOUND, "the channel gains nothing"
    warnings = [r.getMessage() for r in caplog.records if "Microsoft Graph gives no groups" in r.getMessage()]
    assert len(warnings) == 1, warnings
    shown = teams.fake.chat(teams.private(alice.id).id)
    assert "4,800" not in "".join(m.text for m in shown)


async def test_a_users_groups_are_remembered_for_cache_s(tmp_path, teams: TeamsDriver, graph: FakeGraph):
    ids = in_directory(graph, teams, "alice")
    claims = graph.add_group("Claims approvers", members=[ids["alice"]])
    alice = teams.user_id("alice")
    configure = restricted_to(claims, cache_s=300)
    async with knowledge(tmp_path, {**DOCS, "finance/claims.md": CLAIMS}, configure) as (runtime, _), \
            serving(runtime, teams, **with_graph(graph)) as bot:
        for _ in range(2):
            await bot.ask(CLAIMS_QUESTION, user=alice, place=teams.private(alice))
        graph.remove_member(claims, ids["alice"])
        await bot.ask(CLAIMS_QUESTION, user=alice, place=teams.private(alice))
    assert len(graph.calls_to("/transitiveMemberOf/microsoft.graph.group")) == 1
    assert [a.outcome for a in answers(bot)][:1] == [Outcome.ANSWERED], "alice is in the group"
    assert all(a.outcome in (Outcome.ANSWERED, Outcome.CACHED) for a in answers(bot)), \
        "a removal counts after cache_s, as the other directories"


def test_graph_groups_is_off_by_default_and_needs_the_apps_tenant(tmp_path: Path):
    from adapters.platforms import load_settings

    env = {"TEAMS_APP_ID": "7e1b0b52-0000-4000-8000-00000000b07a", "TEAMS_APP_SECRET": "s3cret",
           "KBBOT_DATA_DIR": str(tmp_path), "TEAMS_GRAPH_URL": "https://graph.microsoft.us"}
    config = tmp_path / "kbbot.yaml"
    config.write_text("teams: {}\n", encoding="utf-8")
    assert load_settings(config, env=env).teams.graph_groups is False
    config.write_text("teams:\n  graph_groups: true\n", encoding="utf-8")
    settings = load_settings(config, env=env).teams
    assert settings.graph_url == "https://graph.microsoft.us" and settings.graph_login_url is None
    assert "TEAMS_TENANT_ID" in settings.problems()[0]
    assert load_settings(config, env={**env, "TEAMS_TENANT_ID": "0d1e2f30-0000-4000-8000-0000000fe4a7"}
                         ).teams.problems() == []
