"""``/admin`` on ``kbbot serve``: what the knowledge base is missing, for the people who run it.

Server-rendered pages (Jinja2; charts are inline SVG), usable without JavaScript:

- ``/admin/`` overview: turns per day by outcome, answer rate and feedback per day, latency;
- ``/admin/gaps``: not-found and off-topic questions grouped by meaning, and the gaps refreshes closed;
- ``/admin/disliked``: 👎 answers with their sources, each linking to its trace;
- ``/admin/turns``: every kept turn, searchable; ``/admin/turns/{id}`` its trace (query, ranked
  chunks and scores, the grader's verdict, stage timings) and approve / withdraw;
- ``/admin/approvals``: answers a reviewer may approve, and those approved;
- ``/admin/sources``: each source's last and next run, with "refresh now".

Access: ``KBBOT_ADMIN_TOKEN`` is exchanged at ``/admin/login`` for a session cookie (signed with a
key derived from the token, HttpOnly, SameSite=Strict, Secure over https, also behind a proxy in
``server.trusted_proxies`` that says so; valid ``insights.session_hours``); every other path under
``/admin`` redirects to the login without it (POSTs are refused with 403), and every action carries
the session's CSRF token. Logging out revokes the session (its id is kept in the turn store until
it would have expired); changing the token ends every session.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web
from itsdangerous import BadSignature, URLSafeTimedSerializer

from adapters.admin_charts import OUTCOME_COLOURS, legend, rate_line, stacked_days
from bot.knowledge.insights.report import build_report, embedder_function, gaps_closed, source_health
from bot.knowledge.refresh import parse_iso, schedule_zone
from bot.state.turn_log.records import GAP_OUTCOMES, TurnRecord

log = logging.getLogger("kbbot.admin")

COOKIE = "kbbot_admin"
SESSION = web.RequestKey("admin_session", dict)
PERIODS = (1, 7, 30, 90)
PAGE_SIZE = 50
REVIEWER = "admin-page"
NOTES = {
    "approved": "Approved: the same question now gets this answer at once.",
    "withdrawn": "Approval withdrawn.",
    "not_approvable": "This answer cannot be approved (it expired, or was never offered: only a thread's "
                      "first, freshly generated answer can be).",
    "not_approved": "There was no approval to withdraw.",
    "refreshing": "Refresh started; its result appears here when it is done.",
    "busy": "A refresh of this source is already running.",
}
_TEMPLATES = Path(__file__).resolve().parent / "templates" / "admin"
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _when(at: float | None) -> str:
    return "–" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _matches(record: TurnRecord, words: list[str]) -> bool:
    haystack = " ".join([record.question, record.answer, record.query or "", record.channel, record.user,
                         record.turn_id]).casefold()
    return all(w in haystack for w in words)


class AdminSite:
    """The pages on a started runtime; ``knowledge`` is ``bot.knowledge.scheduler.KnowledgeAdmin``."""

    def __init__(self, runtime: Any, knowledge: Any, *, token: str, clock: Any = time.time):
        if runtime.turns is None:
            raise ValueError("the admin page needs turn records (insights.enabled)")
        self.runtime = runtime
        self.turns = runtime.turns.log
        self.knowledge = knowledge
        self.settings = runtime.settings
        self.clock = clock
        self._token = token
        key = hmac.new(token.encode(), b"kbbot admin session", hashlib.sha256).hexdigest()
        self._sessions = URLSafeTimedSerializer(key, salt="kbbot-admin")
        self._max_age = int(self.settings.insights.session_hours * 3600)
        self._refreshing: dict[str, asyncio.Task[Any]] = {}
        self._env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                                       undefined=jinja2.StrictUndefined)
        self._env.globals["periods"] = PERIODS
        self._env.filters["when"] = _when
        self._env.filters["iso"] = lambda text: _when(parse_iso(text).timestamp()) if text else "–"
        self._env.filters["pct"] = lambda v: "–" if v is None else f"{v * 100:.0f}%"
        self._env.filters["ms"] = lambda v: "–" if v is None else f"{v:,.0f} ms"

    # --- wiring ----------------------------------------------------------------------------------
    def mount(self, app: web.Application) -> None:
        admin = web.Application(middlewares=[self._guard])
        admin.add_routes([
            web.get("/login", self.login_form), web.post("/login", self.login), web.post("/logout", self.logout),
            web.get("/", self.overview), web.get("/gaps", self.gaps), web.get("/disliked", self.disliked),
            web.get("/turns", self.turn_list), web.get("/turns/{turn_id}", self.turn),
            web.post("/turns/{turn_id}/approve", self.approve), web.post("/turns/{turn_id}/withdraw", self.withdraw),
            web.get("/approvals", self.approvals), web.get("/sources", self.sources),
            web.post("/sources/{name}/refresh", self.refresh),
        ])
        async def to_index(request: web.Request) -> web.Response:
            raise web.HTTPFound("/admin/")

        app.router.add_get("/admin", to_index)
        app.add_subapp("/admin", admin)

    async def _session(self, request: web.Request) -> dict[str, Any] | None:
        raw = request.cookies.get(COOKIE)
        if not raw:
            return None
        try:
            session = self._sessions.loads(raw, max_age=self._max_age)
        except BadSignature:  # also expired (SignatureExpired is a BadSignature)
            return None
        if not isinstance(session, dict) or not isinstance(session.get("csrf"), str) \
                or not isinstance(session.get("sid"), str):
            return None
        # Logged out: the cookie is still signed and in date, so the turn store remembers it is over.
        return None if await self.turns.session_revoked(session["sid"]) else session

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        open_paths = {"/admin/login"}
        session = await self._session(request)
        if request.path not in open_paths:
            if session is None:
                if request.method in ("GET", "HEAD"):
                    raise web.HTTPSeeOther(f"/admin/login?next={quote(request.path_qs)}")
                raise web.HTTPForbidden(text="Log in first.")
            if request.method == "POST":
                form = await request.post()
                if not hmac.compare_digest(str(form.get("csrf", "")), session["csrf"]):
                    log.warning("admin: %s %s refused: missing or wrong CSRF token", request.method, request.path)
                    raise web.HTTPForbidden(text="The form expired; reload the page and try again.")
        request[SESSION] = session
        response = await handler(request)
        response.headers.update(_SECURITY_HEADERS)
        return response

    def _render(self, request: web.Request, template: str, http_status: int = 200, **values: Any) -> web.Response:
        session = request.get(SESSION)
        note = NOTES.get(request.query.get("note", ""))
        html = self._env.get_template(template).render(
            csrf=session["csrf"] if session else "", note=note, path=request.path, **values)
        return web.Response(text=html, content_type="text/html", status=http_status)

    # --- login -----------------------------------------------------------------------------------
    @staticmethod
    def _next(value: Any) -> str:
        target = str(value or "/admin/")
        # Only a path of this site: "//host" or a scheme would make the login an open redirect.
        return target if target.startswith("/admin") and not target.startswith("//") else "/admin/"

    async def login_form(self, request: web.Request) -> web.Response:
        return self._render(request, "login.html", next=self._next(request.query.get("next")), error=None)

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        target = self._next(form.get("next"))
        if not hmac.compare_digest(str(form.get("token", "")).strip().encode(), self._token.encode()):
            log.warning("admin: failed login from %s", request.remote)
            await asyncio.sleep(0.5)  # makes guessing slow
            return self._render(request, "login.html", http_status=401, next=target,
                                error="That is not the admin token.")
        response = web.HTTPSeeOther(target)
        session = {"csrf": secrets.token_urlsafe(24), "sid": secrets.token_urlsafe(18)}
        # request.secure: https to kbbot, or to a proxy in server.trusted_proxies that says so.
        response.set_cookie(COOKIE, self._sessions.dumps(session), path="/admin", httponly=True, samesite="Strict",
                            secure=request.secure, max_age=self._max_age)
        log.info("admin: login from %s", request.remote)
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        session = request[SESSION]
        await self.turns.revoke_session(session["sid"], self._max_age)
        log.info("admin: logout from %s", request.remote)
        response = web.HTTPSeeOther("/admin/login")
        response.del_cookie(COOKIE, path="/admin", secure=request.secure, httponly=True, samesite="Strict")
        raise response

    # --- data ------------------------------------------------------------------------------------
    def _days(self, request: web.Request) -> int:
        try:
            days = int(request.query.get("days", 7))
        except ValueError:
            raise web.HTTPBadRequest(text="days must be a whole number of days") from None
        if days not in PERIODS:
            raise web.HTTPBadRequest(text=f"days must be one of {', '.join(map(str, PERIODS))}")
        return days

    async def _window(self, days: int) -> tuple[list[TurnRecord], float, float]:
        until = self.clock()
        since = until - days * 86400
        return await self.turns.window(since, until), since, until

    # --- pages -----------------------------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.Response:
        days = self._days(request)
        records, since, until = await self._window(days)
        report = build_report(records, since=since, until=until)
        feedback = {"up": ("👍", "#2f855a"), "down": ("👎", "#c53030")}
        charts = {
            "outcomes": stacked_days(report["per_day"], OUTCOME_COLOURS, "Turns per day by outcome"),
            "outcomes_legend": legend(OUTCOME_COLOURS),
            "answer_rate": rate_line(report["per_day"], ("answered", "cached"), None, "Answer rate per day"),
            "feedback": stacked_days(report["feedback_per_day"], feedback, "Feedback per day"),
            "feedback_legend": legend(feedback),
        }
        return self._render(request, "overview.html", days=days, report=report, charts=charts)

    async def gaps(self, request: web.Request) -> web.Response:
        days = self._days(request)
        records, since, until = await self._window(days)
        gaps = [r for r in records if r.outcome in GAP_OUTCOMES and not r.gap_closed]
        report = await asyncio.to_thread(build_report, gaps, since=since, until=until,
                                         embed=embedder_function(self.runtime.text_embedder),
                                         threshold=self.settings.insights.group_similarity)
        return self._render(request, "gaps.html", days=days, gaps=report["gaps"], total=len(gaps),
                            closed=gaps_closed(records))

    async def disliked(self, request: web.Request) -> web.Response:
        days = self._days(request)
        records, _, _ = await self._window(days)
        items = sorted((r for r in records if r.downs), key=lambda r: (-r.downs, -r.at))
        return self._render(request, "disliked.html", days=days, items=items)

    async def turn_list(self, request: web.Request) -> web.Response:
        days = self._days(request)
        query = request.query.get("q", "").strip()[:200]
        outcome = request.query.get("outcome", "")
        try:
            page = max(1, int(request.query.get("page", 1)))
        except ValueError:
            raise web.HTTPBadRequest(text="page must be a number") from None
        records, _, _ = await self._window(days)
        words = query.casefold().split()
        found = [r for r in records if (not outcome or r.outcome == outcome) and _matches(r, words)]
        pages = max(1, math.ceil(len(found) / PAGE_SIZE))
        shown = found[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        link = lambda p: "?" + urlencode({"days": days, "q": query, "outcome": outcome, "page": p})  # noqa: E731
        return self._render(request, "turns.html", days=days, q=query, outcome=outcome, turns=shown,
                            found=len(found), page=page, pages=pages, link=link, outcomes=OUTCOME_COLOURS)

    async def turn(self, request: web.Request) -> web.Response:
        record = await self.turns.get(request.match_info["turn_id"])
        if record is None:
            raise web.HTTPNotFound(text="No record of that turn (it may have expired or been forgotten).")
        total = max(record.stages.get("total", 0.0), 1.0)
        stages = [(name, ms, ms / total) for name, ms in record.stages.items() if name != "total"]
        return self._render(request, "turn.html", t=record, stages=stages,
                            approvals=self.runtime.approved is not None)

    async def approvals(self, request: web.Request) -> web.Response:
        days = self._days(request)
        records, _, _ = await self._window(days)
        approved = [r for r in records if r.approval]
        waiting = [r for r in records if r.approvable and not r.approval]
        return self._render(request, "approvals.html", days=days, approved=approved, waiting=waiting,
                            enabled=self.runtime.approved is not None)

    async def sources(self, request: web.Request) -> web.Response:
        status = await self.knowledge.status()
        sources = source_health(self.settings, status, schedule_zone(self.settings))
        running = {name for name, task in self._refreshing.items() if not task.done()}
        return self._render(request, "sources.html", knowledge=status, sources=sources, running=running)

    # --- actions ---------------------------------------------------------------------------------
    @staticmethod
    def _back(note: str, to: str) -> web.HTTPSeeOther:
        return web.HTTPSeeOther(f"{to}?note={note}")

    async def approve(self, request: web.Request) -> web.Response:
        turn_id = request.match_info["turn_id"]
        if self.runtime.approved is None:
            raise web.HTTPConflict(text="Approved answers are off (approvals.enabled).")
        approved = await self.runtime.approved.approve(turn_id, REVIEWER, "admin page")
        log.info("admin: turn %s %s", turn_id, "approved" if approved else "could not be approved")
        raise self._back("approved" if approved else "not_approvable", f"/admin/turns/{turn_id}")

    async def withdraw(self, request: web.Request) -> web.Response:
        turn_id = request.match_info["turn_id"]
        if self.runtime.approved is None:
            raise web.HTTPConflict(text="Approved answers are off (approvals.enabled).")
        withdrawn = await self.runtime.approved.withdraw(turn_id)
        log.info("admin: turn %s approval %s", turn_id, "withdrawn" if withdrawn else "not found")
        raise self._back("withdrawn" if withdrawn else "not_approved", f"/admin/turns/{turn_id}")

    async def refresh(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        problem = self.knowledge.check(name)
        if problem:
            raise web.HTTPNotFound(text=problem)
        running = self._refreshing.get(name)
        if running is not None and not running.done():
            raise self._back("busy", "/admin/sources")

        async def run() -> None:
            try:
                log.info("admin: refresh %s: %s", name, await self.knowledge.refresh_text(name, trigger="admin"))
            except Exception:  # noqa: BLE001 - the run record shows the failure on the page
                log.exception("admin: refresh of %s failed", name)

        self._refreshing[name] = asyncio.create_task(run(), name=f"admin refresh {name}")
        raise self._back("refreshing", "/admin/sources")

    async def close(self, timeout_s: float = 30.0) -> None:
        tasks = [t for t in self._refreshing.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
