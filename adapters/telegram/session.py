"""Telegram's HTTP edges: its webhook's secret checked as bytes, the Bot API session's middlewares (5xx
retried, calls counted in ``bot.metrics``), and long polling's batches taken at once (``BatchConfirmed``).

aiogram compares ``X-Telegram-Bot-Api-Secret-Token`` with ``secrets.compare_digest`` on text, which raises
on anything but ASCII: a stranger's request ended in a 500 with a traceback. Here it is a 401 and one log line.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.exceptions import TelegramNetworkError, TelegramRetryAfter, TelegramServerError
from aiogram.methods import GetUpdates
from aiogram.types import Update
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from bot.metrics import METRICS, Metrics

log = logging.getLogger("kbbot.telegram")


class TelegramServerErrorRetry:
    """An aiogram request middleware: a Bot API call answered 5xx (or lost on the network) is tried
    again, up to ``retries`` times after ``backoff_s``, 2 x ``backoff_s``, ...; Slack's client does the
    same with its ``AsyncServerErrorRetryHandler``. A 5xx means Telegram did not finish the call, so
    the final answer is sent again rather than lost; 429s are left to the stream writer's Retry-After."""

    def __init__(self, retries: int = 2, backoff_s: float = 0.5):
        self.retries = retries
        self.backoff_s = backoff_s

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        name = getattr(method, "__api_method__", type(method).__name__)
        attempt = 0
        while True:
            try:
                return await make_request(bot, method)
            except (TelegramServerError, TelegramNetworkError) as exc:
                if attempt >= self.retries or name == "getUpdates":
                    raise
                attempt += 1
                log.warning("Telegram %s failed (%s); retry %d of %d", name, type(exc).__name__, attempt,
                            self.retries)
                await asyncio.sleep(self.backoff_s * attempt)


class TelegramApiMetrics:
    """An aiogram request middleware (``bot.session.middleware(TelegramApiMetrics())``): every Bot API
    call by method, with flood control (429) and server errors."""

    def __init__(self, metrics: Metrics | None = None):
        self.metrics = metrics

    async def __call__(self, make_request: Any, bot: Any, method: Any) -> Any:
        metrics = self.metrics or METRICS
        name = getattr(method, "__api_method__", type(method).__name__)
        if name == "getUpdates":  # long polls are the connection, not calls answering anyone
            return await make_request(bot, method)
        try:
            result = await make_request(bot, method)
        except TelegramRetryAfter:
            metrics.observe_api_call("telegram", name, 429)
            raise
        except TelegramServerError:
            metrics.observe_api_call("telegram", name, 500)
            raise
        except TelegramNetworkError:
            metrics.observe_api_call("telegram", name, "network")
            raise
        except Exception:
            metrics.observe_api_call("telegram", name, 400)  # refused (bad request, forbidden): still a call
            raise
        metrics.observe_api_call("telegram", name, 200)
        return result


class TelegramWebhook(SimpleRequestHandler):
    """aiogram's webhook handler, comparing the secret token as bytes and logging a refusal."""

    def verify_secret(self, telegram_secret_token: str, bot: Bot) -> bool:
        if not self.secret_token:
            return True
        # aiohttp keeps undecodable header bytes as surrogates: they encode back to what was sent.
        presented = telegram_secret_token.encode("utf-8", "surrogateescape")
        return hmac.compare_digest(presented, self.secret_token.encode())

    async def handle(self, request: web.Request) -> web.Response:
        bot = await self.resolve_bot(request)
        if not self.verify_secret(request.headers.get("X-Telegram-Bot-Api-Secret-Token", ""), bot):
            log.warning("Telegram webhook: refused %s %s from %s: wrong or missing secret token", request.method,
                        request.path, request.remote)
            return web.Response(body="Unauthorized", status=401)
        return await super().handle(request)

    __call__: Any = handle


def instrument(bot: Bot) -> None:
    """Retry the Bot API's 5xx and count every call (the retry outermost: each attempt is counted)."""
    bot.session.middleware(TelegramServerErrorRetry())
    bot.session.middleware(TelegramApiMetrics())


def chat_of(update: Update) -> int | None:
    """The chat an update comes from: a message's, or a button's message's (None for other updates)."""
    event = update.event
    chat = getattr(event, "chat", None) or getattr(getattr(event, "message", None), "chat", None)
    return getattr(chat, "id", None)


class BatchConfirmed:
    """Long polling that takes a batch of updates at once and confirms it as a whole.

    A question's handler returns once the question is accepted (recorded and claimed), and Telegram
    forgets an update only when a ``getUpdates`` moves the offset past it. Handled one after the other
    (aiogram's ``handle_as_tasks=False``), 50 questions polled together were accepted one by one, each
    behind the Redis round trips of those before it: the last was accepted, and its "typing" put in line,
    3.7 s after it arrived (``bench.workers``). Here the updates of a batch are handled at once
    (``handle_as_tasks=True``), one chat's in the order they came (a lock per chat, taken in the order the
    tasks start, which is the updates' order), and a ``getUpdates`` that would confirm updates waits, in
    a request middleware, until each of their handlers returned: an update is still confirmed only once
    it is accepted.
    """

    def __init__(self) -> None:
        self._taken: dict[int, asyncio.Future[None]] = {}  # polled update id -> its handler returned
        self._chats: dict[int, tuple[asyncio.Lock, int]] = {}  # the lock, and how many hold or wait for it

    def install(self, bot: Bot, dispatcher: Dispatcher | None = None) -> None:
        """Hold the polls of ``bot`` for the batch; ``dispatcher``: handle its updates (see ``HandOn``).
        The dispatcher's outer middlewares before this one must call on (``handle`` marks an update
        taken)."""
        if dispatcher is not None:
            dispatcher.update.outer_middleware(self.handle)
        bot.session.middleware(self._before_poll)

    async def handle(self, handler: Any, update: Update, data: dict[str, Any]) -> Any:
        chat = chat_of(update)
        try:
            if chat is None:
                return await handler(update, data)
            lock, users = self._chats.get(chat) or (asyncio.Lock(), 0)
            self._chats[chat] = (lock, users + 1)
            try:
                async with lock:
                    return await handler(update, data)
            finally:
                lock, users = self._chats[chat]
                if users > 1:
                    self._chats[chat] = (lock, users - 1)
                else:
                    del self._chats[chat]
        finally:
            taken = self._taken.get(update.update_id)
            if taken is not None and not taken.done():
                taken.set_result(None)

    async def _before_poll(self, make_request: Any, bot: Any, method: Any) -> Any:
        if not isinstance(method, GetUpdates):
            return await make_request(bot, method)
        confirms = [i for i in self._taken if i < (method.offset or 0)]
        if confirms:
            await asyncio.wait([self._taken[i] for i in confirms])
            for i in confirms:
                del self._taken[i]
        updates = await make_request(bot, method)
        loop = asyncio.get_running_loop()
        for update in updates:
            self._taken.setdefault(update.update_id, loop.create_future())
        return updates


class HandOn:
    """Worker 0's polling under ``serve --workers`` (``adapters.workers``): each update polled goes to one of
    the workers through the port they share, a new connection each so that the kernel picks the worker,
    and the polling offset moves on once that worker's webhook handler returned, as for Telegram's own
    webhook. An update no worker takes (the port refuses while workers restart) is handled here."""

    def __init__(self, port: int, path: str, secret: str, here: Callable[[Update], Awaitable[Any]],
                 batch: BatchConfirmed | None = None):
        self.url = f"http://127.0.0.1:{port}{path}"
        self.secret = secret
        self.here = here
        self.dispatcher = Dispatcher()
        if batch is not None:  # outside the hand-on, which never calls on
            self.dispatcher.update.outer_middleware(batch.handle)
        self.dispatcher.update.outer_middleware(self._hand_on)
        self._session: ClientSession | None = None

    async def _hand_on(self, _handler: Any, update: Update, _data: dict[str, Any]) -> Any:
        if self._session is None:
            self._session = ClientSession(connector=TCPConnector(force_close=True),
                                          timeout=ClientTimeout(total=60))
        body = update.model_dump_json(exclude_unset=True, by_alias=True)
        try:
            async with self._session.post(self.url, data=body, headers={
                    "Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": self.secret}) as resp:
                if resp.status == 200:
                    return None
                log.warning("Telegram: a worker answered %d to update %d; handling it here", resp.status,
                            update.update_id)
        except (ClientError, TimeoutError) as exc:
            log.warning("Telegram: no worker took update %d (%s); handling it here", update.update_id,
                        type(exc).__name__)
        return await self.here(update)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
