"""Approved answers re-checked after a refresh (issue 39, item 5), on the fake Slack and Telegram servers,
with the embedded state and with Redis (skipped without REDIS_URL): an approval keeps the audience it was
written for; its re-check is answered for that audience and posted only where every reader may read what
both answers cite (the reviewers' channel, each Telegram reviewer's private chat), else to its approver
privately."""

from __future__ import annotations

import contextlib
from pathlib import Path

from adapters.platforms import Settings
from adapters.slack.text import APPROVE_ACTION
from bot.platform import ReviewerMessages
from bot.runtime import Runtime
from bot.types import Outcome
from tests.fakes.telegram_server import callback_update, message_update, user
from tests.refresh_helpers import folder_source
from tests.security.loop_world import folder_runtime, state  # noqa: F401 - fixture
from tests.test_approvals import ask, click
from tests.test_loop_rechecks import section_text
from tests.test_slack import fake_slack, slack_app  # noqa: F401 - fixture
from tests.test_telegram import fake_tg, telegram_bot  # noqa: F401 - fixture

FAULT = "# Fault code E-917\n\nFault E-917 means the cooling fan of the HL-D50 drive is blocked. Clean the fan grille.\n"
FAULT_NEW = ("# Fault code E-917\n\nFault E-917 means the cooling fan of the HL-D50 drive is blocked or has failed. "
             "Clean the fan grille.\n")
CLAIMS = ("# HL-K8 warranty claims\n\nWarranty claims for the HL-K8 compressor are approved up to 4,800 euros by the "
          "service manager without further review.\n")
CLAIMS_NEW = ("# HL-K8 warranty claims\n\nWarranty claims for the HL-K8 compressor are approved up to 5,200 euros by "
              "the service manager without further review.\n")
FAULT_QUESTION = "What does fault E-917 mean?"
CLAIMS_QUESTION = "Up to which amount are HL-K8 warranty claims approved without further review?"
SECRETS = ("4,800", "5,200")
REVIEWER, REVIEWERS_CHANNEL = "U0REVIEW", "C0REVIEW"
TG_RITA, TG_OTTO = 9101, 9102


def knowledge(state: str, tmp_path: Path, acl: dict[str, list[str]],
              ) -> contextlib.AbstractAsyncContextManager[tuple[Runtime, Path]]:
    """A started runtime on a folder source whose ``finance/`` is read as ``acl`` says; reviewers' messages
    go to REVIEWERS_CHANNEL; state in memory or Redis."""

    def configure(settings: Settings, docs: Path) -> None:
        settings.sources = [folder_source("docs", docs, acl=acl)]
        settings.approvals.reviewers_channel = REVIEWERS_CHANNEL
        settings.permissions.principals = {f"telegram:{TG_RITA}": ["user:rita@example.com"]}

    return folder_runtime(state, tmp_path, {"fault.md": FAULT, "finance/claims.md": CLAIMS}, configure)


def change_both(docs: Path) -> None:
    (docs / "fault.md").write_text(FAULT_NEW, encoding="utf-8")
    (docs / "finance" / "claims.md").write_text(CLAIMS_NEW, encoding="utf-8")


async def test_a_restricted_approvals_recheck_goes_to_its_approver_not_the_reviewers_channel(state, tmp_path,
                                                                                             fake_slack):
    async with knowledge(state, tmp_path, {"finance/": ["channel:C0FIN"]}) as (runtime, docs), \
            slack_app(runtime, fake_slack, reviewers=[REVIEWER]) as slack:
        refresher = runtime.refresher()
        refresher.after_change.append(
            runtime.knowledge_loop(ReviewerMessages([slack.adapter])).after_refresh)
        restricted, message = await ask(slack, CLAIMS_QUESTION, channel="C0FIN")
        assert restricted.answer.outcome is Outcome.ANSWERED and "4,800" in restricted.answer.text
        await click(slack, message, APPROVE_ACTION, REVIEWER)
        public, message = await ask(slack, FAULT_QUESTION)
        assert public.answer.outcome is Outcome.ANSWERED
        await click(slack, message, APPROVE_ACTION, REVIEWER)

        change_both(docs)
        record = await refresher.run("docs")
        assert record.ok and record.changed == 2

        in_channel = [m for m in fake_slack.messages.values() if m.channel == REVIEWERS_CHANNEL]
        shown = "\n".join(section_text(m) for m in in_channel)
        assert not any(secret in shown for secret in SECRETS), "the finance page's text in the reviewers' channel"
        assert len(in_channel) == 1 and "blocked or has failed" in shown, "the public one goes there as before"
        [private] = [m for m in fake_slack.messages.values() if m.channel == REVIEWER]
        text = section_text(private)
        assert "4,800" in text and "5,200" in text, "the approver gets both answers, re-run for the same audience"
        [entry] = [e for e in await runtime.approved.entries() if e.turn_id == restricted.answer.trace.turn_id]
        assert "channel:c0fin" in entry.audience["everyone"], "the approval keeps who it was written for"


async def test_a_telegram_recheck_goes_only_to_reviewers_who_may_read_it(state, tmp_path, fake_tg):
    async with knowledge(state, tmp_path, {"finance/": ["user:rita@example.com"]}) as (runtime, docs), \
            telegram_bot(runtime, fake_tg, reviewers=[str(TG_RITA), str(TG_OTTO)]) as tg:
        refresher = runtime.refresher()
        refresher.after_change.append(
            runtime.knowledge_loop(ReviewerMessages([tg.adapter])).after_refresh)
        rita = user(TG_RITA, first_name="Rita")
        await tg.send(message_update(CLAIMS_QUESTION, chat_id=TG_RITA, from_user=rita))
        assert tg.turns[-1].answer.outcome is Outcome.ANSWERED and "4,800" in tg.turns[-1].answer.text
        [answer] = fake_tg.chat(TG_RITA)
        await tg.send(callback_update(f"kbap:{tg.turns[-1].answer.trace.turn_id}", message=answer, from_user=rita))
        assert fake_tg.ok_calls("answerCallbackQuery")[-1].args["text"].startswith("✅ Approved")
        # Rita is no reviewer any more: a re-check would go to every reviewer, but Otto may not read the page.
        tg.adapter.settings.reviewers = [str(TG_OTTO)]

        change_both(docs)
        record = await refresher.run("docs")
        assert record.ok and record.changed >= 1
        assert not any(secret in m.text for m in fake_tg.chat(TG_OTTO) for secret in SECRETS)
        recheck = fake_tg.chat(TG_RITA)[-1]
        assert "4,800" in recheck.text and "5,200" in recheck.text
