"""What is Teams' own (what every chat platform does is ``tests/scenarios``): the JWT on every activity,
channels, personal and group chats, the streaming protocol and its fallbacks, 429s, the feedback loop's
invoke, commands and the settings. Against the Teams fake (``tests/fakes/teams.py``), driven as
``kbbot serve`` wires the platform (``tests.scenarios.platforms.serving``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.platforms import load_settings
from adapters.teams.text import neutralise
from bot.errors import SettingsError
from bot.types import Outcome
from tests.fakes.anthropic_server import Script
from tests.model_router import steps
from tests.scenarios.platforms import Place, TeamsDriver, serving

QUESTION = "How often should the bearings be greased?"


@pytest.fixture
async def teams() -> AsyncIterator[TeamsDriver]:
    async with TeamsDriver() as driver:
        yield driver


def bot_posts(driver: TeamsDriver, conversation: str) -> list:
    return [m for m in driver.fake.chat(conversation) if m.from_bot]


# --- who may post an activity -------------------------------------------------------------------------
async def test_an_activity_without_a_good_jwt_is_refused_with_401_and_one_log_line(kb_runtime, teams: TeamsDriver,
                                                                                 caplog: pytest.LogCaptureFixture):
    alice = teams.fake.users[teams.user_id("alice")]
    async with serving(kb_runtime, teams) as bot:
        activity = teams.fake.personal_message(QUESTION, user=alice)
        for why, token in teams.fake.bad_tokens(activity).items():
            caplog.clear()
            with caplog.at_level(logging.INFO):
                status, _ = await teams.fake.deliver(bot.url, activity, token=token, session=bot.session)
            assert status == 401, why
            refusals = [r for r in caplog.records if "refused" in r.getMessage()]
            assert len(refusals) == 1, (why, [r.getMessage() for r in caplog.records])
            assert "Bearer" not in refusals[0].getMessage() or why == "missing header"
        await bot.settle()
        assert not bot.turns and not bot_posts(teams, teams.private(alice.id).id), "nothing was answered"


# --- where questions are answered ----------------------------------------------------------------------
async def test_a_channel_mention_is_answered_in_its_reply_chain_without_streaming(kb_runtime, teams: TeamsDriver):
    alice = teams.user_id("alice")
    async with serving(kb_runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=alice, place=teams.shared)
        [turn] = bot.turns
        assert turn.inquiry.text == QUESTION, "the mention is not part of the question"
        assert turn.answer.outcome is Outcome.ANSWERED
    root = asked.event["id"]
    [answer] = teams.fake.bot_messages(teams.shared.id, root)
    assert answer.thread == root and answer.text.startswith(neutralise(turn.answer.text))
    assert answer.stream is None and not teams.fake.streams, "Teams streams only in personal chats"
    assert answer.citations and answer.feedback_loop == "default"
    assert turn.inquiry.thread_key.endswith(f";messageid={root}") and not turn.inquiry.private


async def test_a_follow_up_in_the_chain_keeps_its_history_and_a_new_post_starts_afresh(kb_runtime, teams: TeamsDriver):
    alice = teams.user_id("alice")
    async with serving(kb_runtime, teams) as bot:
        first = await bot.ask(QUESTION, user=alice, place=teams.shared)
        await bot.reply(first, "And which grease should I use?", user=alice)  # no mention: a follow-up
        await bot.ask("What does fault E-004 mean?", user=alice, place=teams.shared)
    chain, follow_up, other = bot.turns
    assert follow_up.inquiry.thread_key == chain.inquiry.thread_key != other.inquiry.thread_key
    history = await kb_runtime.history.load(chain.inquiry.thread_key)
    assert len(history) >= 2, "both questions of the chain are its history"
    assert len(teams.fake.bot_messages(teams.shared.id, first.event["id"])) == 2


async def test_a_group_chat_answers_mentions_only_and_directly(kb_runtime, teams: TeamsDriver):
    alice, bob = (teams.fake.users[teams.user_id(n)] for n in ("alice", "bob"))
    chat = teams.fake.group_chat([alice, bob], name="Maintenance")
    async with serving(kb_runtime, teams) as bot:
        for activity in (teams.fake.group_message("lunch?", user=bob, chat=chat, mention=False),
                         teams.fake.group_message(QUESTION, user=alice, chat=chat)):
            status, _ = await teams.fake.deliver(bot.url, activity, session=bot.session)
            assert status == 200
        await bot.settle()
    [turn] = bot.turns
    assert turn.inquiry.text == QUESTION and turn.inquiry.thread_key == f"teams:{teams.fake.tenant_id}:{chat}"
    [answer] = bot_posts(teams, chat)
    assert answer.thread is None and answer.stream is None and answer.citations


# --- streaming in personal chats -----------------------------------------------------------------------
async def test_a_personal_chat_streams_informative_then_updates_then_the_final_message(claude, teams: TeamsDriver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=60)
    teams.fake.pace_streams(1.0)  # Teams refuses a stream request sooner than a second after the last
    alice = teams.user_id("alice")
    async with serving(runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=alice)
    [turn] = bot.turns
    [stream] = teams.fake.streams.values()
    kinds = [(kind, sequence) for _, kind, sequence, status in stream.requests]
    assert kinds[0] == ("informative", 1) and stream.informative == ["Searching the knowledge base…"]
    updates = [sequence for kind, sequence in kinds if kind == "streaming"]
    assert len(updates) >= 2 and updates == list(range(2, 2 + len(updates)))
    assert kinds[-1] == ("final", None) and stream.done
    assert all(gap >= 1.0 for gap in stream.gaps()) and not teams.fake.refused()
    [answer] = teams.fake.bot_messages(asked.place.id)
    assert answer is stream.message and answer.text.startswith(neutralise(turn.answer.text))
    assert answer.ai_generated and answer.feedback_loop == "default"
    assert [c["position"] for c in answer.citations] == [c.index for c in turn.answer.citations]


async def test_a_tenant_that_refuses_streams_is_answered_by_edits_and_not_asked_again(claude, teams: TeamsDriver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 6), tokens_per_second=60)
    teams.fake.refuse_streaming()
    alice = teams.user_id("alice")
    async with serving(runtime, teams) as bot:
        first = await bot.ask(QUESTION, user=alice)
        refused = len([c for c in teams.fake.calls if c.status == 403])
        second = await bot.ask("What does fault E-004 mean?", user=alice)
    assert refused >= 1 and len([c for c in teams.fake.calls if c.status == 403]) == refused, \
        "the second answer did not try to stream"
    for asked in (first, second):
        answer = bot.answers(asked)[0]  # a personal chat's later answers follow too
        assert answer.native.stream is None and answer.sources and answer.feedback


async def test_a_stream_past_its_time_limit_goes_on_as_updates_of_its_message(claude, teams: TeamsDriver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 9), tokens_per_second=60)
    teams.fake.stream_time_limit_s = 1.5
    async with serving(runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=teams.user_id("alice"))
    [turn] = bot.turns
    [answer] = bot.answers(asked)
    assert answer.text.startswith(neutralise(turn.answer.text)) and answer.sources
    assert answer.native.changes[-1][0] == "edit", "finished by an update"


async def test_stop_in_a_personal_chat_ends_what_is_shown(claude, teams: TeamsDriver):
    model, runtime = claude
    model.responder = lambda req: Script(steps(req, 12), tokens_per_second=40)
    async with serving(runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=teams.user_id("alice"), settle=False)
        while not any(s.message.text for s in teams.fake.streams.values()):
            await asyncio.sleep(0.05)
        [stream] = teams.fake.streams.values()
        teams.fake.cancel_stream(stream.id)
        await bot.settle()
    stopped = [status for _, _, _, status in stream.requests if status == 403]
    assert len(stopped) == 1, "one refused request, then nothing more"
    assert not stream.done and bot.answers(asked)[0].text == stream.message.text


# --- rates -----------------------------------------------------------------------------------------------
async def test_a_429_is_slept_out_and_the_answer_arrives_whole(kb_runtime, teams: TeamsDriver):
    alice = teams.user_id("alice")
    teams.fake.rate_limit(teams.shared.id, times=2, retry_after=1)
    async with serving(kb_runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=alice, place=teams.shared)
    [turn] = bot.turns
    [answer] = bot.answers(asked)
    assert answer.text.startswith(neutralise(turn.answer.text)) and answer.sources
    refused = teams.refused()
    assert len(refused) == 2 and answer.native.changes[0][1] - refused[0] >= 1.0


# --- the feedback loop and commands -------------------------------------------------------------------------
async def test_thumbs_down_through_the_feedback_loop_records_the_answers_turn(kb_runtime, teams: TeamsDriver):
    alice, bob = teams.user_id("alice"), teams.user_id("bob")
    async with serving(kb_runtime, teams) as bot:
        asked = await bot.ask(QUESTION, user=alice, place=teams.shared)
        [shown] = bot.answers(asked)
        invoke = teams.fake.feedback(shown.native, user=teams.fake.users[bob], reaction="dislike", text="Wrong grease")
        status, body = await teams.fake.deliver(bot.url, invoke, session=bot.session)
        await bot.settle()
    assert (status, body) == (200, {})
    [item] = bot.feedback.items
    turn_id = bot.turns[0].answer.trace.turn_id
    assert (item.turn_id, item.rating, item.user_id, item.platform, item.message_id) == \
        (turn_id, "down", bob, "teams", shown.id)


async def test_commands_help_new_prefs_and_status_for_admins_only(kb_runtime, teams: TeamsDriver):
    alice, rita = teams.user_id("alice"), teams.user_id("rita")
    chat = teams.private(alice).id
    async with serving(kb_runtime, teams, admins=[rita]) as bot:
        await bot.ask(QUESTION, user=alice)
        for text in ("help", "/new", "prefs concise", "status"):
            await bot.ask(text, user=alice)
        await bot.ask("status", user=rita)
    said = [m.text for m in bot_posts(teams, chat)][1:]
    assert said[0].startswith("Hi! I am kbbot") and said[1].startswith("Started a new conversation")
    assert "concise" in said[2].lower()
    assert said[3].startswith("Sorry, status and refresh are for kbbot admins only")
    assert len(bot.turns) == 1, "commands are no questions"
    assert not await kb_runtime.history.load(bot.turns[0].inquiry.thread_key), "/new forgot the chat's history"
    assert [m.text for m in bot_posts(teams, teams.private(rita).id)][0].startswith("Knowledge version")


async def test_text_from_documents_cannot_make_tags_or_mentions():
    hostile = 'See <at>everyone</at> & <img src=x onerror=alert(1)> [1]'
    assert neutralise(hostile) == "See &lt;at>everyone&lt;/at> &amp; &lt;img src=x onerror=alert(1)> [1]"


# --- settings ------------------------------------------------------------------------------------------------
def test_the_apps_credentials_come_only_from_the_environment(tmp_path: Path):
    env = {"TEAMS_APP_ID": "7e1b0b52-0000-4000-8000-00000000b07a", "TEAMS_APP_SECRET": "s3cret",
           "TEAMS_TENANT_ID": "0d1e2f30-0000-4000-8000-0000000fe4a7", "KBBOT_DATA_DIR": str(tmp_path)}
    config = tmp_path / "kbbot.yaml"
    config.write_text("teams:\n  allowed_teams: [T1]\n  stream_mode: edit\n", encoding="utf-8")
    settings = load_settings(config, env=env)
    assert settings.teams.enabled and settings.teams.allowed_teams == ["T1"] and settings.teams.stream_mode == "edit"
    assert "s3cret" not in repr(settings.teams)
    config.write_text("teams:\n  app_secret: s3cret\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="TEAMS_APP_SECRET"):
        load_settings(config, env=env)
    assert load_settings(_empty(tmp_path), env={}).teams.enabled is False
    assert settings.teams.problems() == []
    no_secret = load_settings(_empty(tmp_path), env={k: v for k, v in env.items() if k != "TEAMS_APP_SECRET"})
    assert "TEAMS_APP_SECRET" in no_secret.teams.problems()[0]


def _empty(tmp_path: Path) -> Path:
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n", encoding="utf-8")
    return empty


# --- approvals and their re-check ----------------------------------------------------------------------
def card_actions(message) -> list[dict]:
    return [a for card in message.attachments for a in (card.get("content") or {}).get("actions") or []]


async def test_a_reviewer_approves_in_a_channel_and_decides_the_recheck_a_refresh_brings(tmp_path, teams: TeamsDriver):
    from adapters.teams.text import CARD, RECHECK_KEEP, REVIEW_APPROVE, REVIEW_WITHDRAW
    from tests.test_loop_rechecks import NEW
    from tests.test_loop_rechecks import QUESTION as FAULT
    from tests.test_loop_rechecks import knowledge as fault_knowledge

    alice, carol, rita = (teams.user_id(n) for n in ("alice", "carol", "rita"))

    async def click(message, verb: str, data: dict, user: str):
        invoke = teams.fake.card_action(message, user=teams.fake.users[user], verb=verb, data=data)
        status, body = await teams.fake.deliver(bot.url, invoke, session=bot.session)
        await bot.settle()
        assert status == 200
        return body

    async with fault_knowledge(tmp_path) as (runtime, docs), serving(runtime, teams, reviewers=[rita]) as bot:
        asked = await bot.ask(FAULT, user=alice, place=teams.shared)
        [shown] = bot.answers(asked)
        [approve] = card_actions(shown.native)
        turn_id = bot.turns[-1].answer.trace.turn_id
        assert (approve["verb"], approve["data"]) == (REVIEW_APPROVE, {"turn": turn_id})
        assert "reviewers" in (await click(shown.native, REVIEW_APPROVE, approve["data"], alice))["value"]
        swapped = await click(shown.native, REVIEW_APPROVE, approve["data"], rita)
        assert swapped["type"] == CARD and "Approved by Rita Example" in swapped["value"]["body"][0]["text"]
        assert [a["verb"] for a in swapped["value"]["actions"]] == [REVIEW_WITHDRAW]

        again = await bot.ask(FAULT, user=carol, place=teams.shared)
        assert bot.turns[-1].answer.outcome is Outcome.CACHED
        assert [a["verb"] for a in card_actions(bot.answers(again)[0].native)] == [REVIEW_WITHDRAW]

        (docs / "fault-e917.md").write_text(NEW, encoding="utf-8")
        assert (await bot.refresh("docs")).changed == 1
        [recheck] = [m for m in teams.fake.chat(teams.private(rita).id) if card_actions(m)]
        assert "blocked or has failed" in recheck.text
        keep = next(a for a in card_actions(recheck) if a["verb"] == RECHECK_KEEP)
        assert (await click(recheck, RECHECK_KEEP, keep["data"], rita))["value"].startswith("✅ Kept approved")
        assert not recheck.attachments, "the buttons went with the decision"


async def test_access_settings_refuse_other_users_once_and_other_teams_silently(kb_runtime, teams: TeamsDriver):
    alice, bob = teams.user_id("alice"), teams.user_id("bob")
    other_team = teams.fake.add_team("Elsewhere", [teams.fake.users[alice]])
    async with serving(kb_runtime, teams, allowed_users=[alice], allowed_teams=[teams.shared.id]) as bot:
        for _ in range(2):
            await bot.ask(QUESTION, user=bob)
        await bot.ask(QUESTION, user=alice, place=Place(other_team, private=False))
        assert not bot.turns
        await bot.ask(QUESTION, user=alice, place=teams.shared)
    assert [t.inquiry.user_id for t in bot.turns] == [alice]
    [told] = bot_posts(teams, teams.private(bob).id)
    assert told.text.startswith("Sorry, you are not on the list"), "told once, not twice"
    assert not bot_posts(teams, other_team)


# --- who reads a conversation ----------------------------------------------------------------------------
async def test_a_private_channels_roster_and_its_members_e_mails_decide_what_it_may_read(tmp_path, teams: TeamsDriver):
    from tests.refresh_helpers import folder_source
    from tests.scenarios.test_scenarios import CLAIMS, CLAIMS_QUESTION, DOCS, knowledge

    people = {n: teams.fake.users[teams.user_id(n)] for n in ("alice", "bob", "carol")}
    alice, carol = people["alice"], people["carol"]
    finance = teams.fake.add_channel(teams.shared.id, "Finance", members=[alice, carol], membership="private")
    guest = teams.fake.add_user("Gus Guest", email="gus@partner.example", role="guest")
    audit = teams.fake.add_channel(teams.shared.id, "Audit", members=[alice, carol, guest], membership="private")

    def restricted(settings, docs: Path) -> None:
        readers = [f"user:{alice.email}", f"user:{carol.email}"]
        settings.sources = [folder_source("docs", docs, acl={"finance/": readers})]
        settings.permissions.cache_s = 0

    async with knowledge(tmp_path, {**DOCS, "finance/claims.md": CLAIMS}, restricted) as (runtime, _), \
            serving(runtime, teams) as bot:
        for place in (finance, teams.shared.id, audit):
            await bot.ask(CLAIMS_QUESTION, user=alice.id, place=Place(place, private=False))
    in_finance, in_team, with_guest = (t.answer for t in bot.turns)
    assert in_finance.outcome is Outcome.ANSWERED and "4,800" in in_finance.text, "its two members may read it"
    assert in_team.outcome is Outcome.NOT_FOUND, "bob reads the team's channel"
    assert with_guest.outcome is Outcome.NOT_FOUND, "a guest's e-mail says nothing of what they may read"
    assert "4,800" not in "".join(m.text for m in teams.fake.chat(teams.shared.id) + teams.fake.chat(audit))


# --- the app package ------------------------------------------------------------------------------------------
def test_the_app_package_holds_the_manifest_for_the_bot_and_its_icons(tmp_path: Path):
    import io
    import json
    import zipfile

    from adapters.teams.manifest import PERMISSIONS, package
    from adapters.teams.platform import COMMANDS

    app_id = "7e1b0b52-0000-4000-8000-00000000b07a"
    with zipfile.ZipFile(io.BytesIO(package(app_id, name="Docs Bot"))) as archive:
        assert sorted(archive.namelist()) == ["color.png", "manifest.json", "outline.png"]
        manifest = json.loads(archive.read("manifest.json"))
        assert archive.read("color.png").startswith(b"\x89PNG") and archive.read("outline.png").startswith(b"\x89PNG")
    [bot] = manifest["bots"]
    assert bot["botId"] == app_id and set(bot["scopes"]) == {"personal", "team", "groupChat"}
    assert manifest["webApplicationInfo"] == {"id": app_id, "resource": f"api://botid-{app_id}"}
    assert manifest["id"] != app_id and manifest["id"] == json.loads(zipfile.ZipFile(io.BytesIO(package(app_id)))
                                                                  .read("manifest.json"))["id"], "stable per bot"
    titles = [c["title"] for c in bot["commandLists"][0]["commands"]]
    assert set(titles) <= set(COMMANDS) and len(titles) <= 10 and all(len(t) <= 32 for t in titles)
    assert [p["name"] for p in manifest["authorization"]["permissions"]["resourceSpecific"]] == PERMISSIONS
    assert manifest["supportsChannelFeatures"] == "tier1" and manifest["manifestVersion"] == "1.25"
    with pytest.raises(ValueError):
        package("not-a-guid")
