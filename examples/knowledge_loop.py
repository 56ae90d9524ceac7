"""The knowledge loop, run with ``kbbot serve`` against the fake Slack (``tests/fakes/slack_server.py``).

    .venv/bin/python -m examples.knowledge_loop

Starts the fake Slack Web API, writes a small knowledge base and a config (a folder source, an admin and
a reviewer, ``insights.capture_source``), runs ``kbbot serve`` in a subprocess on the embedded defaults
(extractive answers, in-memory store, state in its data directory), sends it signed Events API requests
and slash commands as Slack would, and prints what each person sees: a question kbbot cannot answer, an
expert's reply offered to the reviewer, a refresh that brings the answer (one follow-up in the thread;
none after the next refresh), the reply added to the knowledge base and cited on the next ask, and
``kbbot report``'s gaps closed.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from slack_sdk.signature import SignatureVerifier

from tests.fakes.slack_server import FakeSlack

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM, BOT, CHANNEL = "T0KBBOT", "UKBBOT", "C0SUPPORT"
ALICE, BOB, RITA = "U0ALICE", "U0BOB", "U0RITA"
QUESTION = "What is the part number of the HL-M200 shaft seal kit?"
DOCS = {
    "warranty.md": "# Extended warranty\n\nThe HL-M200 motor has an extended warranty of 60 months when registered.\n",
    "vibration.md": "# Vibration limits\n\nThe HL-M200 motor vibration must stay below 2.8 mm/s RMS.\n",
    "grease.txt": "Bearing grease\nRegrease the HL-M300 bearings with 20 g of polyurea grease every 3,000 hours.\n",
}
SEAL = ("# HL-M200 shaft seal kit\n\nThe shaft seal kit of the HL-M200 motor has the part number SK-2040. "
        "Replace the shaft seal every 16,000 operating hours.\n")
REPLY = "Use kit SK-2040 and order it from the spare parts desk; it takes two days to arrive."
REPO = Path(__file__).resolve().parent.parent
CONFIG = """
prompt:
  system_template: {repo}/config/prompts/system.md
  user_template: {repo}/config/prompts/user.md
answering:
  topics: {repo}/config/topics.yaml
sources:
  - name: docs
    path: {docs}
    interval: 24h
slack:
  admins: [{alice}]
  reviewers: [{rita}]
  stream_mode: edit
insights:
  capture_source: docs
  digest:
    cron: null
"""
_ts = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Kbbot:
    def __init__(self, url: str, fake: FakeSlack):
        self.url, self.fake = url, fake
        self.http = httpx.Client(timeout=30)
        self.events = itertools.count(1)

    def _post(self, body: str, content_type: str) -> httpx.Response:
        ts = str(int(time.time()))
        headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": ts,
                   "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
        return self.http.post(f"{self.url}/slack/events", content=body.encode(), headers=headers)

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        event = {"team": TEAM, "channel": CHANNEL, "ts": f"{1_800_000_000 + next(_ts)}.000200", **event}
        body = {"token": "legacy", "team_id": TEAM, "api_app_id": "AKBBOT", "type": "event_callback",
                "event_id": f"Ev{next(self.events):08d}", "event_time": int(time.time()),
                "authorizations": [{"team_id": TEAM, "user_id": BOT, "is_bot": True}], "event": event}
        assert self._post(json.dumps(body), "application/json").status_code == 200
        return event

    def command(self, text: str, user: str) -> str:
        key = f"cmd{next(self.events)}"
        body = urlencode({"token": "legacy", "team_id": TEAM, "channel_id": CHANNEL, "user_id": user,
                          "command": "/kbbot", "text": text, "response_url": self.fake.response_url(key),
                          "trigger_id": "1.2.3", "api_app_id": "AKBBOT"})
        raw = self._post(body, "application/x-www-form-urlencoded").text
        said = json.loads(raw).get("text", "") if raw.startswith("{") else raw
        deadline = time.time() + 120
        while text.startswith("refresh") and not self.fake.responses.get(key) and time.time() < deadline:
            time.sleep(0.2)
        responses = self.fake.responses.get(key) or []
        return "\n".join([said, *[str(r.get("text", "")) for r in responses]]).strip()

    def click(self, ephemeral: Any, action_id: str, user: str) -> None:
        value = next(e["value"] for b in ephemeral.blocks if b.get("type") == "actions" for e in b["elements"]
                     if e["action_id"] == action_id)
        payload = {"type": "block_actions", "team": {"id": TEAM}, "api_app_id": "AKBBOT", "trigger_id": "1.2.3",
                   "user": {"id": user, "name": user[2:].lower(), "team_id": TEAM},
                   "container": {"type": "message", "message_ts": ephemeral.ts, "channel_id": CHANNEL,
                                 "is_ephemeral": True, "thread_ts": ephemeral.thread_ts},
                   "channel": {"id": CHANNEL}, "actions": [{"type": "button", "action_id": action_id,
                                                             "value": value, "action_ts": str(time.time())}]}
        assert self._post(urlencode({"payload": json.dumps(payload)}),
                          "application/x-www-form-urlencoded").status_code == 200


def settle(fake: FakeSlack, quiet_s: float = 1.5, timeout_s: float = 120) -> None:
    """Until the fake Slack saw no call for ``quiet_s``."""
    deadline, seen, since = time.time() + timeout_s, -1, time.time()
    while time.time() < deadline:
        if len(fake.calls) != seen:
            seen, since = len(fake.calls), time.time()
        elif time.time() - since >= quiet_s:
            return
        time.sleep(0.1)


def show(who: str, text: str) -> None:
    lines = text.strip().splitlines() or [""]
    print(f"{who:>8} | {lines[0]}")
    for line in lines[1:]:
        print(f"{'':>8} | {line}")


def show_thread(fake: FakeSlack, ts: str, since: int = 0) -> int:
    messages = fake.thread(CHANNEL, ts)
    for message in messages[since:]:
        sources = " ".join(e["text"] for b in message.blocks_of("context") for e in b["elements"])
        show("kbbot", message.body + (f"\n{sources}" if sources else ""))
    return len(messages)


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="kbbot-loop-"))
    docs = root / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text, encoding="utf-8")
    config = root / "kbbot.yaml"
    config.write_text(CONFIG.format(repo=REPO, docs=docs, alice=ALICE, rita=RITA), encoding="utf-8")
    port = free_port()
    with FakeSlack(team_id=TEAM, bot_user_id=BOT).run_in_thread() as fake:
        env = {**os.environ, "KBBOT_CONFIG": str(config), "KBBOT_DATA_DIR": str(root / "data"),
               "KBBOT_PORT": str(port), "SLACK_BOT_TOKEN": fake.token, "SLACK_SIGNING_SECRET": SECRET,
               "SLACK_API_URL": fake.base_url}
        for name in ("WEAVIATE_URL", "REDIS_URL", "ANTHROPIC_API_KEY"):  # embedded defaults: nothing to clean up
            env.pop(name, None)
        kbbot_bin = Path(sys.executable).with_name("kbbot")
        subprocess.run([str(kbbot_bin), "refresh"], env=env, check=True, capture_output=True)
        serve_log = open(root / "serve.log", "w")  # noqa: SIM115 - the server's, closed after it
        server = subprocess.Popen([str(kbbot_bin), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=serve_log)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                if server.poll() is not None:
                    raise SystemExit(f"kbbot serve stopped: {(root / 'serve.log').read_text()[-2000:]}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code < 500:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            bot = Kbbot(url, fake)
            print(f"$ kbbot serve   (fake Slack at {fake.base_url}; knowledge base {docs})\n")
            print("# Alice asks; the knowledge base does not have it")
            asked = bot.event({"type": "app_mention", "user": ALICE, "text": f"<@{BOT}> {QUESTION}"})
            show("alice", QUESTION)
            settle(fake)
            seen = show_thread(fake, asked["ts"])

            print("\n# Bob, who knows, replies in the thread; the reviewer Rita sees it with two buttons")
            bot.event({"type": "message", "user": BOB, "text": REPLY, "thread_ts": asked["ts"],
                       "channel_type": "channel"})
            show("bob", REPLY)
            settle(fake)
            [note] = [e for e in fake.ephemerals if e.user == RITA]
            buttons = [e["text"]["text"] for b in note.blocks if b.get("type") == "actions" for e in b["elements"]]
            show("(rita)", note.blocks[0]["text"]["text"] + "\n" + "  ".join(f"[{b}]" for b in buttons))

            print("\n# Someone adds the seal kit document; an admin refreshes")
            (docs / "seal-kit.md").write_text(SEAL, encoding="utf-8")
            show("(alice)", f"/kbbot refresh docs\n{bot.command('refresh docs', ALICE)}")
            settle(fake)
            seen = show_thread(fake, asked["ts"], seen)

            print("\n# The next refresh changes the document again: no second follow-up")
            (docs / "seal-kit.md").write_text(SEAL + "\nThe kit includes two O-rings.\n", encoding="utf-8")
            show("(alice)", f"/kbbot refresh docs\n{bot.command('refresh docs', ALICE)}")
            settle(fake)
            print(f"{'':>8}   (the thread still has {len(fake.thread(CHANNEL, asked['ts']))} messages of kbbot)")

            print("\n# Rita adds Bob's reply to the knowledge base; it is indexed on the next refresh")
            bot.click(note, "kbbot_expert_capture", RITA)
            settle(fake)
            show("(rita)", fake.ephemerals[-1].text)
            show("(alice)", f"/kbbot refresh docs\n{bot.command('refresh docs', ALICE)}")
            settle(fake)
            again = bot.event({"type": "app_mention", "user": "U0CAROL",
                               "text": f"<@{BOT}> How long does the HL-M200 seal kit take to arrive?"})
            show("carol", "How long does the HL-M200 seal kit take to arrive?")
            settle(fake)
            show_thread(fake, again["ts"])
        finally:
            server.terminate()
            server.wait(30)
            serve_log.close()
        print("\n$ kbbot report --since 1d   (the gaps closed)")
        report = subprocess.run([str(kbbot_bin), "report", "--since", "1d"], env=env, capture_output=True, text=True)
        out = report.stdout
        start = out.find("Gaps closed")
        print(out[start:out.find("\n\n", start)] if start >= 0 else out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
