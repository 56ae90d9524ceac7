"""Logging: one JSON object per line (or readable text), the turn id on every line of a turn, and
secrets masked in whatever is written.

- ``turn_id``: a context variable the ``Answerer`` sets for the duration of a turn. Tasks created
  inside the turn (stream writers, background learning) and threads it hands work to
  (``asyncio.to_thread``) copy the context, so their lines carry the same id.
- ``TurnIdFilter`` (on the handler, so it sees records of every logger) adds ``record.turn_id``.
- ``JsonFormatter``: ``{"ts", "level", "logger", "message", "turn_id"?, "exc"?, ...extra}``; fields
  passed with ``extra=`` (e.g. the refresh record) appear as keys of their own.
- ``SecretMasker`` masks the values of the secret environment variables (tokens, API keys, the
  password in ``REDIS_URL``) and anything shaped like a Slack/Telegram/Anthropic/OpenAI credential or a
  URL password, after formatting: messages, arguments, extras and tracebacks alike.

``setup_logging(format, level)`` installs one stderr handler on the root logger; the format comes
from ``--log-format`` or ``KBBOT_LOG_FORMAT`` (``json`` | ``text``), JSON being the default of
``kbbot serve`` and text of the interactive commands.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any
from urllib.parse import unquote, urlsplit

turn_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("kbbot_turn_id", default=None)

#: Environment variables whose values never appear in logs.
SECRET_ENV = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN", "SLACK_CLIENT_SECRET",
              "TELEGRAM_BOT_TOKEN", "TELEGRAM_WEBHOOK_SECRET", "ANTHROPIC_API_KEY", "OPENAI_API_KEY",
              "WEAVIATE_API_KEY", "REDIS_PASSWORD")
#: Environment variables holding URLs whose password (``scheme://user:password@host``) is secret.
SECRET_URL_ENV = ("REDIS_URL", "WEAVIATE_URL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "SLACK_API_URL",
                  "TELEGRAM_API_URL")

_SHAPES = re.compile(
    r"xox[abposr]-[A-Za-z0-9-]{8,}"          # Slack bot/user/app tokens
    r"|xapp-[A-Za-z0-9-]{8,}"
    r"|(?<!\d)\d{6,12}:[A-Za-z0-9_-]{30,}"      # Telegram bot tokens (also inside /bot<token>/ URLs)
    r"|sk-ant-[A-Za-z0-9_-]{8,}"              # Anthropic keys
    r"|sk-[A-Za-z0-9_-]{20,}"                 # OpenAI-style keys
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@")
MASK = "***"

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "turn_id"}


def _url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


class SecretMasker:
    """Masks known secret values and credential-shaped strings in text."""

    def __init__(self, env: Mapping[str, str] | None = None, extra: Iterable[str] = ()):
        env = os.environ if env is None else env
        values: set[str] = {v for v in extra if v}
        for name in SECRET_ENV:
            if env.get(name):
                values.add(env[name])
        for name in SECRET_URL_ENV:
            password = _url_password(env.get(name) or "")
            if password:
                values.add(password)
        # Longest first, so a secret containing another is masked whole; very short values would
        # mask ordinary words, and no real credential is that short.
        self.values = sorted((v for v in values if len(v) >= 6), key=len, reverse=True)

    def mask(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
        return _SHAPES.sub(MASK, text)


class TurnIdFilter(logging.Filter):
    """Adds ``record.turn_id`` (None outside a turn)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "turn_id"):
            record.turn_id = turn_id.get()
        return True


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, secrets masked."""

    def __init__(self, masker: SecretMasker | None = None):
        super().__init__()
        self.masker = masker or SecretMasker()
        #: Which of ``serve --workers`` wrote the line (``adapters.workers``), when there are several.
        self.worker = os.environ.get("KBBOT_WORKER")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.worker is not None:
            entry["worker"] = int(self.worker)
        if getattr(record, "turn_id", None):
            entry["turn_id"] = record.turn_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = _jsonable(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return self.masker.mask(json.dumps(entry, ensure_ascii=False, default=repr))


class TextFormatter(logging.Formatter):
    """``time level logger [turn]: message``, secrets masked."""

    def __init__(self, masker: SecretMasker | None = None):
        worker = os.environ.get("KBBOT_WORKER")
        super().__init__("%(asctime)s %(levelname)s " + (f"w{worker} " if worker else "") + "%(name)s%(turn)s: %(message)s")
        self.masker = masker or SecretMasker()

    def format(self, record: logging.LogRecord) -> str:
        tid = getattr(record, "turn_id", None)
        record.turn = f" [{tid[:12]}]" if tid else ""
        return self.masker.mask(super().format(record))


FORMATS = ("json", "text")


def log_format(requested: str | None, *, default: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    chosen = (requested or env.get("KBBOT_LOG_FORMAT") or default).strip().lower()
    if chosen not in FORMATS:
        raise ValueError(f"log format must be json or text, got {chosen!r} (--log-format / KBBOT_LOG_FORMAT)")
    return chosen


def make_handler(fmt: str = "json", stream: IO[str] | None = None,
                 masker: SecretMasker | None = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(masker) if fmt == "json" else TextFormatter(masker))
    handler.addFilter(TurnIdFilter())
    handler.set_name("kbbot")
    return handler


def setup_logging(fmt: str = "text", level: int = logging.WARNING, stream: IO[str] | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one kbbot handler."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler = make_handler(fmt, stream)
    root.addHandler(handler)
    root.setLevel(level)
    # Each request of the HTTP clients (httpx2/httpcore2: the Anthropic SDK's) and each component run of a
    # Haystack pipeline logs at INFO: 20 lines a turn that say nothing the turn's own line does not, and
    # formatting them cost the event loop more than the rest of the turn's logging (bench.workers).
    for noisy in ("pypdf", "httpx", "httpcore", "httpx2", "httpcore2", "urllib3", "haystack.core.pipeline"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING) if noisy != "pypdf" else logging.ERROR)
    return handler
