"""``kbbot serve`` against the Teams fake, and what each person sees (the run shown in docs/teams.md).

    uv run python -m tests.fakes.teams_demo

The fake Teams (``tests.fakes.teams``) serves the Bot Connector, the login service and the signing keys
from a thread of its own; ``kbbot serve`` (``adapters.server.serve``, as the ``kbbot serve`` command runs
it) reads the repository's settings with the Teams variables pointing at the fake and the sample
knowledge base indexed (extractive answers: no model needed). People then ask in a personal chat and in a
channel, follow up, rate an answer and ask for help; the transcript is each conversation as its members
see it.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes.teams import FakeTeams, Message

REPO = Path(__file__).resolve().parents[2]


def shown(message: Message, people: dict[str, str]) -> str:
    who = "kbbot" if message.from_bot else people.get(message.sender, message.sender)
    text = message.text.replace("<at>kbbot</at>", "@kbbot")
    lines = [f"{who}: {text}"]
    for citation in message.citations:
        lines.append(f"    [{citation['position']}] {citation['appearance']['name']}")
    extras = [label for label, on in (("AI generated", message.ai_generated),
                                      ("👍/👎", message.feedback_loop is not None),
                                      (f"streamed: {sum(1 for w, _ in message.changes if w == 'stream')} update(s), then the final message",
                                       message.stream is not None)) if on]
    if extras:
        lines.append(f"    ({', '.join(extras)})")
    return "\n".join(lines)


async def demo() -> str:
    from adapters.platforms import load_settings
    from adapters.server import serve
    from bot.runtime import build_runtime

    fake = FakeTeams()
    with fake.run_in_thread():
        alice, bob, carol = (fake.add_user(n) for n in ("Alice Wang", "Bob Meyer", "Carol Diaz"))
        people = {u.id: u.name for u in (alice, bob, carol)}
        team = fake.add_team("Field Service", [alice, bob, carol])
        data = Path(tempfile.mkdtemp(prefix="kbbot-teams-demo-"))
        env = {"KBBOT_DATA_DIR": str(data), "TEAMS_APP_ID": fake.app_id, "TEAMS_APP_SECRET": fake.app_secret,
               "TEAMS_TENANT_ID": fake.tenant_id, "TEAMS_OPENID_URL": fake.openid_url,
               "TEAMS_LOGIN_URL": fake.login_url, "TEAMS_SERVICE_URL": fake.service_url}
        settings = load_settings(REPO / "config" / "kbbot.yaml", env=env)
        settings.teams.stream_interval_s = 1.0
        runtime = build_runtime(settings)
        runtime.indexer.index([REPO / "examples" / "kb"])
        stop, listening = asyncio.Event(), asyncio.get_running_loop().create_future()
        server = asyncio.create_task(serve(runtime, env=env, host="127.0.0.1", port=0, stop=stop, schedule=False,
                                           on_listening=listening.set_result))
        url = f"http://127.0.0.1:{await listening}"
        async with aiohttp.ClientSession() as session:
            async def deliver(activity: dict[str, Any], wait_s: float = 6.0) -> Any:
                status, body = await fake.deliver(url, activity, session=session)
                assert status == 200, (status, body)
                await asyncio.sleep(wait_s)  # the answer streams on after the 200
                return body

            await deliver(fake.personal_message("How often should the HL-M200 bearings be greased?", user=alice))
            post = fake.channel_message("What does fault code E-004 mean?", user=bob, channel=team)
            await deliver(post)
            await deliver(fake.channel_message("And how do I reset it?", user=carol, channel=team, root=post["id"],
                                               mention=False))
            [answer, *_] = fake.bot_messages(team, post["id"])
            await deliver(fake.feedback(answer, user=bob, reaction="like"), 0.5)
            await deliver(fake.personal_message("help", user=alice), 1.0)
            status, _ = await fake.deliver(url, fake.feedback(answer, user=carol, reaction="dislike"),
                                           token="not-a-jwt", session=session)
        stop.set()
        await server
    parts = ["Alice's personal chat with kbbot:\n" + "\n".join(shown(m, people) for m in fake.chat(
        fake.personal_chat(alice)))]
    parts.append("The Field Service channel, Bob's post and its replies (Alice, Bob and Carol see it):\n"
                 + "\n".join(shown(m, people) for m in fake.thread(team, post["id"])))
    parts.append(f"A 👎 whose token is not the Bot Framework's: HTTP {status}")
    return "\n\n".join(parts)


def main() -> None:
    print(asyncio.run(demo()))


if __name__ == "__main__":
    main()
