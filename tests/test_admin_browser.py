"""The admin page in a real browser: Debian's headless Chromium driven by Playwright for Python.

Questions arrive through the Slack fake; an admin logs in, finds a not-found question grouped with
its paraphrase, opens a 👎 answer's trace, approves an answer (the next asker gets it from the
cache), and a visitor without the token sees only the login. Screenshots of every page are saved
under ``tests/artifacts/admin/`` (gitignored).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from bot.types import Outcome
from tests.admin_site import TOKEN, admin_site
from tests.fakes.slack_server import FakeSlack
from tests.test_slack import BOT, TEAM

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parent / "artifacts" / "admin"
CHROMIUM = os.environ.get("KBBOT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

PASSWORD = "How do I reset the password of the web portal?"
PASSWORD_AGAIN = "I forgot the web portal password, how can I reset it?"
FIRMWARE = "How do I update the firmware over Wi-Fi?"
GREASE = "How often should the bearings be greased?"
FAULT = "What does fault E-004 mean?"


@pytest.fixture
async def fake_slack():
    async with FakeSlack(team_id=TEAM, bot_user_id=BOT) as fake:
        yield fake


@pytest.fixture
async def browser():
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: run the tests with `make test` (scripts/browser.sh installs it)")
    from playwright.async_api import async_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as p:
        # --no-sandbox: the tests run as root in a container, where Chromium's sandbox cannot start.
        chromium = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            await chromium.close()


async def shot(page, name: str) -> None:
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def test_an_admin_finds_the_gaps_a_disliked_answers_trace_and_approves_an_answer(kb_runtime, fake_slack,
                                                                                       browser):
    async with admin_site(kb_runtime, fake_slack) as site:
        assert (await site.ask(PASSWORD)).answer.outcome is Outcome.NOT_FOUND
        assert (await site.ask(PASSWORD_AGAIN, channel="C0HELP", user="U0CAROL")).answer.outcome is Outcome.NOT_FOUND
        assert (await site.ask(FIRMWARE)).answer.outcome is Outcome.NOT_FOUND
        greased = await site.ask(GREASE)
        await site.thumbs_down(greased)
        fault = await site.ask(FAULT, channel="C0HELP")
        assert fault.answer.approvable

        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(f"{site.url}/admin/")
        assert page.url.startswith(f"{site.url}/admin/login")
        await page.fill("input[name=token]", "a wrong token, certainly")
        await page.click("button[type=submit]")
        assert "That is not the admin token." in await page.inner_text("[role=alert]")
        await shot(page, "01-login-refused")
        await page.fill("input[name=token]", TOKEN)
        await page.click("button[type=submit]")
        assert page.url == f"{site.url}/admin/"
        assert await page.locator("svg.chart rect").count() >= 1, "the turns-per-day chart has bars"
        kpis = await page.inner_text(".kpis")
        assert "5\nturns" in kpis and "40%" in kpis, kpis  # 2 of 5 answered
        await shot(page, "02-overview")

        await page.click("nav >> text=Gaps")
        rows = page.locator("tr.gap")
        assert await rows.count() == 2, "the password paraphrases are one gap, the firmware question another"
        first = await rows.nth(0).inner_text()
        assert PASSWORD in first and PASSWORD_AGAIN in first and "slack:C0HELP" in first and "slack:C0SUPPORT" in first
        assert FIRMWARE in await rows.nth(1).inner_text()
        await shot(page, "03-gaps")

        await page.click("nav >> text=👎 Answers")
        card = page.locator(".card.disliked")
        assert await card.count() == 1 and GREASE in await card.inner_text()
        assert greased.answer.citations[0].title in await card.inner_text(), "its sources are listed"
        await shot(page, "04-disliked")
        await card.locator("text=Open trace").click()
        trace = await page.inner_text(".trace")
        record = await kb_runtime.turns.log.get(greased.answer.trace.turn_id)
        assert "Ranked chunks" in trace and f"{record.ranked[0]['score']:.3f}" in trace
        assert record.verdict in trace and "retrieve" in trace
        await shot(page, "05-trace")

        await page.click("nav >> text=Turns")
        await page.fill("input[name=q]", "portal password")
        await page.click("form.card button[type=submit]")
        listed = await page.inner_text("table")
        assert PASSWORD_AGAIN in listed and GREASE not in listed
        await shot(page, "06-turns-search")

        await page.click("nav >> text=Approvals")
        waiting = page.locator("tr", has_text=FAULT)
        await waiting.locator("button", has_text="Approve").click()
        assert "Approved" in await page.inner_text("[role=status]")
        await shot(page, "07-approved")
        assert (await kb_runtime.turns.log.get(fault.answer.trace.turn_id)).approval["by"] == "admin page"
        again = await site.ask(FAULT, channel="C0OTHER", user="U0DAVE")
        assert again.answer.outcome is Outcome.CACHED, "the next asker gets the approved answer"

        await page.click("nav >> text=Sources")
        assert "examples" in await page.inner_text("table") and "never run" in await page.inner_text(".pill")
        await shot(page, "08-sources")
        await page.click("button:has-text('Refresh now')")
        assert "Refresh started" in await page.inner_text("[role=status]")
        for _ in range(120):  # the refresh runs in the background; its run record shows when done
            await page.goto(f"{site.url}/admin/sources")
            if (await page.inner_text(".pill")).strip() == "ok":
                break
            await asyncio.sleep(0.5)
        row = await page.inner_text("table")
        assert "(admin," in row and " unchanged" in row and "never" not in row, row
        await shot(page, "09-sources-refreshed")

        stranger = await browser.new_page()
        await stranger.goto(f"{site.url}/admin/gaps")
        assert stranger.url.startswith(f"{site.url}/admin/login")
        assert PASSWORD not in await stranger.content(), "nothing of the page without the token"
        await stranger.close()
        await page.close()
