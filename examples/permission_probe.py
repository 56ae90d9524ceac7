"""The permission probe: who is shown a restricted document, asked as a new user would.

    .venv/bin/python -m examples.permission_probe               # embedded defaults (in-memory store)
    .venv/bin/python -m examples.permission_probe --services    # Redis and Weaviate (REDIS_URL, WEAVIATE_URL)

Writes a small knowledge base and a config, starts the fake Slack and a fake Confluence Data Center
(``tests/fakes/``), runs ``kbbot refresh`` and ``kbbot serve`` (extractive answers, no model), and asks
the same restricted questions everywhere a user can:

- a folder source with ``acl: {finance/: [group:finance]}``: the HL-K8 claim limit is for the finance
  group only;
- a Confluence space whose read permissions the API user cannot see (as Data Center answers): its page
  is held back (readable by nobody) until the operator names its readers
  (``confluence.hidden_space_readers``), then read by whoever holds that principal;
- two HTTP API callers, one granted ``group:finance``, one not; the console (``kbbot ask``, unmapped);
- Slack: a public and a private channel whose members are both in finance. A public channel is readable
  by the whole workspace, so it reads public documents only; the private channel reads what all its
  members may.

It prints one row per question asked and whether the restricted text was shown, then checks each row
against the rule and exits 1 if any row breaks it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from slack_sdk.signature import SignatureVerifier

from examples.knowledge_loop import free_port, settle
from tests.fakes.confluence_server import FakeConfluence
from tests.fakes.slack_server import FakeSlack

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM, BOT = "T0PROBE", "UKBBOT"
ALICE, BOB = "U0ALICE", "U0BOB"
PUBLIC_CHANNEL, PRIVATE_CHANNEL = "C0PUBLIC", "G0PRIVATE"
CLAIMS = ("# HL-K8 warranty claims\n\nWarranty claims for the HL-K8 compressor are approved up to 4,800 euros "
          "by the service manager without further review.\n")
SEALS = "# HL-K8 seals\n\nThe HL-K8 compressor seal must be replaced every 7,200 operating hours.\n"
ESCALATION = ("<p>Field escalations of the HL-K8 compressor go to the on-call engineer Marta Ruiz, "
              "who decides on a site visit within four hours.</p>")
QUESTIONS = {  # question -> the words only its restricted source holds
    "claims": ("Up to which amount are HL-K8 warranty claims approved without further review?", "4,800"),
    "escalation": ("Who handles field escalations of the HL-K8 compressor?", "Marta Ruiz"),
    "seals": ("How often must the HL-K8 compressor seal be replaced?", "7,200"),
}
REPO = Path(__file__).resolve().parent.parent
CONFIG = """
prompt:
  system_template: {repo}/config/prompts/system.md
  user_template: {repo}/config/prompts/user.md
answering:
  topics: {repo}/config/topics.yaml
{store}
refresh:
  allow_hosts: [127.0.0.1]
sources:
  - name: docs
    path: {docs}
    interval: 24h
    acl:
      finance/: [group:finance]
  - name: wiki
    interval: 24h
    confluence:
      url: {wiki}
      spaces: [OPS]
      token_env: PROBE_CONFLUENCE_TOKEN
{hidden}
api:
  tokens:
    - {{name: finance-desk, token_env: PROBE_FINANCE_TOKEN}}
    - {{name: helpdesk, token_env: PROBE_HELPDESK_TOKEN}}
permissions:
  cache_s: 0
  principals:
    api:finance-desk: [group:finance{space}]
    slack:{alice}: [group:finance]
    slack:{bob}: [group:finance]
slack:
  stream_mode: edit
insights:
  digest:
    cron: null
"""
TOKENS = {"finance-desk": "probe-finance-token", "helpdesk": "probe-helpdesk-token"}
_ts = itertools.count(1)


class Probe:
    """One knowledge base, the fakes, and ``kbbot serve`` (restarted when the config changes)."""

    def __init__(self, root: Path, slack: FakeSlack, wiki: FakeConfluence, services: bool):
        self.root, self.slack, self.wiki, self.services = root, slack, wiki, services
        self.tag = uuid.uuid4().hex[:10]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kbbot = str(Path(sys.executable).with_name("kbbot"))
        self.server: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(timeout=60)
        self.events = itertools.count(1)
        self.rows: list[tuple[str, str, str, bool, bool]] = []

    # --- set-up -------------------------------------------------------------------------------------
    def configure(self, *, hidden_space_mapped: bool) -> None:
        store = (f"store:\n  collection: Probe{self.tag}\nredis_prefix: 'kbbot-probe-{self.tag}:'"
                 if self.services else "")
        hidden = "      hidden_space_readers: {OPS: [space:ops]}" if hidden_space_mapped else ""
        (self.root / "kbbot.yaml").write_text(CONFIG.format(
            repo=REPO, docs=self.root / "docs", wiki=self.wiki.base_url, store=store, hidden=hidden,
            space=", space:ops" if hidden_space_mapped else "", alice=ALICE, bob=BOB), encoding="utf-8")

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "KBBOT_CONFIG": str(self.root / "kbbot.yaml"), "KBBOT_DATA_DIR": str(self.root / "data"),
               "KBBOT_PORT": str(self.port), "SLACK_BOT_TOKEN": self.slack.token, "SLACK_SIGNING_SECRET": SECRET,
               "SLACK_API_URL": self.slack.base_url, "PROBE_CONFLUENCE_TOKEN": self.wiki.token,
               "PROBE_FINANCE_TOKEN": TOKENS["finance-desk"], "PROBE_HELPDESK_TOKEN": TOKENS["helpdesk"]}
        env.pop("ANTHROPIC_API_KEY", None)  # extractive answers: what is shown is the sources' own sentences
        if not self.services:
            for name in ("WEAVIATE_URL", "REDIS_URL"):
                env.pop(name, None)
        return env

    def run(self, *args: str) -> str:
        done = subprocess.run([self.kbbot, *args], env=self.env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"kbbot {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self) -> None:
        log = open(self.root / "serve.log", "a")  # noqa: SIM115 - the server's, closed when it stops
        self.server = subprocess.Popen([self.kbbot, "serve"], env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        for _ in range(900):
            if self.server.poll() is not None:
                raise SystemExit(f"kbbot serve stopped: {(self.root / 'serve.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("kbbot serve did not start within 3 minutes")

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            try:
                self.server.wait(30)
            except subprocess.TimeoutExpired:
                self.server.kill()
            self.server = None

    def clean_up(self) -> None:
        if not self.services:
            return
        import redis

        with httpx.Client(timeout=30) as client:
            client.delete(f"{os.environ['WEAVIATE_URL'].rstrip('/')}/v1/schema/Probe{self.tag}")
        r = redis.Redis.from_url(os.environ["REDIS_URL"])
        keys = list(r.scan_iter(f"kbbot-probe-{self.tag}:*", count=1000))
        if keys:
            r.delete(*keys)

    # --- asking -------------------------------------------------------------------------------------
    def record(self, where: str, who: str, question: str, text: str, allowed: bool) -> None:
        _, secret = QUESTIONS[question]
        self.rows.append((where, who, question, secret in text, allowed))

    def api(self, caller: str, question: str, *, allowed: bool) -> None:
        body = {"question": QUESTIONS[question][0], "conversation": uuid.uuid4().hex}
        with self.http.stream("POST", f"{self.url}/v1/ask", json=body,
                              headers={"Authorization": f"Bearer {TOKENS[caller]}"}) as response:
            seen = "".join(response.iter_text())  # every delta and the final event: all the caller is sent
        self.record("HTTP API", caller, question, seen, allowed)

    def console(self, question: str, *, allowed: bool) -> None:
        self.record("console", "kbbot ask", question, self.run("ask", QUESTIONS[question][0]), allowed)

    def _post(self, body: str) -> None:
        ts = str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
                   "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)}
        assert self.http.post(f"{self.url}/slack/events", content=body.encode(), headers=headers).status_code == 200

    def slack_ask(self, channel: str, label: str, question: str, *, allowed: bool) -> None:
        ts = f"{1_800_000_000 + next(_ts)}.000200"
        before = len(self.slack.calls)
        event = {"type": "app_mention", "user": ALICE, "text": f"<@{BOT}> {QUESTIONS[question][0]}", "team": TEAM,
                 "channel": channel, "ts": ts}
        self._post(json.dumps({"token": "legacy", "team_id": TEAM, "api_app_id": "AKBBOT", "type": "event_callback",
                               "event_id": f"Ev{next(self.events):08d}", "event_time": int(time.time()),
                               "authorizations": [{"team_id": TEAM, "user_id": BOT, "is_bot": True}],
                               "event": event}))
        settle(self.slack)
        # Everything kbbot sent to the channel since (posts, every edit and stream append) and what stays.
        sent = " ".join(c.text_sent for c in self.slack.calls[before:] if c.args.get("channel") == channel)
        shown = " ".join(m.body for m in self.slack.thread(channel, ts))
        self.record(f"Slack {label}", "alice (finance)", question, f"{sent} {shown}", allowed)


def held_back(status: str) -> str:
    """``kbbot status``'s count of documents held back and its reasons (none: nothing is)."""
    lines = status.splitlines()
    at = next((i for i, line in enumerate(lines) if "documents held back" in line), None)
    if at is None:
        return "no document held back"
    return "\n".join(line.strip() for line in lines[at:at + 2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.permission_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--services", action="store_true", help="Redis and Weaviate from REDIS_URL / WEAVIATE_URL")
    args = parser.parse_args(argv)
    if args.services and not (os.environ.get("REDIS_URL") and os.environ.get("WEAVIATE_URL")):
        parser.error("--services needs REDIS_URL and WEAVIATE_URL (scripts/services.sh env)")
    root = Path(tempfile.mkdtemp(prefix="kbbot-probe-"))
    for name, text in {"manuals/seals.md": SEALS, "finance/claims.md": CLAIMS}.items():
        (root / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "docs" / name).write_text(text, encoding="utf-8")
    with FakeSlack(team_id=TEAM, bot_user_id=BOT).run_in_thread() as slack, \
            FakeConfluence(cloud=False).run_in_thread() as wiki:
        for user in (ALICE, BOB):
            slack.add_user(user, f"{user[2:].lower()}@example.com")
        slack.add_channel(PUBLIC_CHANNEL, [ALICE, BOB])
        slack.add_channel(PRIVATE_CHANNEL, [ALICE, BOB], private=True)
        wiki.add_page("OPS", "HL-K8 field escalations", ESCALATION)
        wiki.hidden_permissions = {"OPS"}  # Data Center: the space's permissions are not shown
        probe = Probe(root, slack, wiki, args.services)
        store = "Redis and Weaviate" if args.services else "embedded defaults (in-memory store, local state)"
        print(f"# {store}; knowledge base {root / 'docs'}; fake Confluence Data Center at {wiki.base_url}\n")
        try:
            probe.configure(hidden_space_mapped=False)
            print("$ kbbot refresh")
            print(probe.run("refresh").strip())
            print(f"$ kbbot status\n{held_back(probe.run('status'))}\n")
            probe.start()
            probe.api("finance-desk", "claims", allowed=True)
            probe.api("helpdesk", "claims", allowed=False)
            probe.api("finance-desk", "seals", allowed=True)
            probe.api("finance-desk", "escalation", allowed=False)  # held back: readers unknown
            probe.console("claims", allowed=False)
            probe.slack_ask(PUBLIC_CHANNEL, "public channel", "claims", allowed=False)
            probe.slack_ask(PRIVATE_CHANNEL, "private channel", "claims", allowed=True)
            probe.stop()

            print("# The operator names the hidden space's readers and grants them to finance-desk")
            probe.configure(hidden_space_mapped=True)
            print("$ kbbot refresh --permissions-only wiki")
            print(probe.run("refresh", "--permissions-only", "wiki").strip())
            print(f"$ kbbot status\n{held_back(probe.run('status'))}\n")
            probe.start()
            probe.api("finance-desk", "escalation", allowed=True)
            probe.api("helpdesk", "escalation", allowed=False)
        finally:
            probe.stop()
            probe.clean_up()
    print("| where | who | question | restricted text shown | allowed by the rule |\n| --- | --- | --- | --- | --- |")
    for where, who, question, shown, allowed in probe.rows:
        print(f"| {where} | {who} | {question} | {'yes' if shown else 'no'} | {'yes' if allowed else 'no'} |")
    wrong = [row for row in probe.rows if row[3] != row[4]]
    print(f"\n{len(probe.rows) - len(wrong)} of {len(probe.rows)} as the rule says" +
          ("" if not wrong else f"; WRONG: {wrong}"))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
