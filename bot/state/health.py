"""Whether the services a process needs answer: one check of Redis and Weaviate, in one wording, for
``/healthz``, ``kbbot status`` and the admins' ``status`` command.

Each check says ``up``, ``down`` or ``off`` (not configured: the embedded default is used) with a
``detail`` or an ``error``. ``public`` checks (``/healthz`` answers anyone) say what failed, never where
a service is or how it is reached; the others name the service's URL with its password replaced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bot.settings import Settings
from pipelines.errors import one_line
from pipelines.redact import redact_url, scrub

OFF_WEAVIATE = "embedded in-memory store (set WEAVIATE_URL)"
OFF_REDIS = "state kept in this process and the data dir (set REDIS_URL)"


def _no_answer(timeout_s: float) -> str:
    return f"no answer within {timeout_s:g} s"


def error_text(exc: BaseException, settings: Settings, *, public: bool) -> str:
    """What a check says of a failure: the exception's type (public) or its message, secrets scrubbed."""
    if public:
        return type(exc).__name__
    return scrub_secrets(one_line(exc), settings)


def scrub_secrets(text: str, settings: Settings) -> str:
    """``text`` with the passwords of the service URLs replaced."""
    for url in (settings.store.weaviate_url, settings.redis_url):
        if url:
            text = scrub(text, url)
    return text


async def check_store(settings: Settings, store: Any, read: Callable[[Any], Any], *, timeout_s: float,
                      public: bool = False, error: str | None = None) -> tuple[dict[str, Any], Any]:
    """(the check of the document store, what ``read(store)`` returned): ``read`` runs in a worker
    thread, so a store that hangs is reported after ``timeout_s``, not waited for. ``error`` is a
    failure already known (the store could not be opened)."""
    value = None
    if store is not None and error is None:
        try:
            value = await asyncio.wait_for(asyncio.to_thread(read, store), timeout_s)
        except TimeoutError:
            error = _no_answer(timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported as the service being down
            error = error_text(exc, settings, public=public)
    elif error is not None:
        error = scrub_secrets(error, settings)
    if settings.store_kind != "weaviate":
        if error:
            return {"status": "down", "detail": "embedded in-memory store", "error": error}, value
        return {"status": "off", "detail": OFF_WEAVIATE}, value
    body: dict[str, Any] = {"status": "down" if error or store is None else "up"}
    if not public:
        body["url"] = redact_url(settings.store.weaviate_url or "")
    if error:
        body["error"] = error
    return body, value


async def check_redis(settings: Settings, redis: Any, *, timeout_s: float, public: bool = False,
                      error: str | None = None) -> dict[str, Any]:
    """The check of Redis: a PING on ``redis`` (None: not connected; ``error`` says why when known)."""
    if not settings.redis_url:
        return {"status": "off", "detail": OFF_REDIS}
    if redis is not None and error is None:
        try:
            await asyncio.wait_for(redis.ping(), timeout_s)
        except TimeoutError:
            error = _no_answer(timeout_s)
        except Exception as exc:  # noqa: BLE001 - reported as the service being down
            error = error_text(exc, settings, public=public)
    elif redis is None and error is None:
        error = "not connected"
    elif error is not None:
        error = scrub_secrets(error, settings)
    body: dict[str, Any] = {"status": "down" if error else "up"}
    if not public:
        body["url"] = redact_url(settings.redis_url)
    if error:
        body["error"] = error
    return body
