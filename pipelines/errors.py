"""kbbot's errors, and which dependency an exception came from, so a user reads what happened in words.

Our own errors form one small hierarchy (``KbbotError``), each of a ``kind``. The exceptions of the
libraries we call (the model SDKs, httpx, the Weaviate and Redis clients) are filed by their types,
never by their names. The model SDKs speak HTTP through ``httpx2`` (a stream cut mid-answer raises
its errors unwrapped), other clients through ``httpx``. A ``Diagnosis`` keeps what the user may read
(``reason``: "timed out", "HTTP 503") apart from what the log gets (``detail``: the exception itself).

The Weaviate client is not imported here (it takes seconds and hundreds of modules, and the embedded
store never needs it): its exceptions are looked up in ``sys.modules``, since none of them can have
been raised in a process that never imported it.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

import anthropic
import httpx
import httpx2
import openai
import redis.exceptions
from haystack.core.errors import PipelineRuntimeError


class ErrorKind(str, enum.Enum):
    MODEL = "model"  # the language model (its API, or the local server) did not answer
    MODEL_EMPTY = "model_empty"  # it answered nothing
    STORE = "store"  # the document store (Weaviate)
    STATE = "state"  # history, locks, idempotency (Redis)
    INTERNAL = "internal"  # a bug of ours


class KbbotError(RuntimeError):
    """An error of kbbot's own; ``reason`` is short and safe to show a user."""

    kind = ErrorKind.INTERNAL
    reason = "internal error"


class ServiceUnavailable(KbbotError):
    """A store the process needs cannot be reached at start; the message names its URL and the error."""

    reason = "unavailable"


class StoreUnavailable(ServiceUnavailable):
    kind = ErrorKind.STORE


class StateUnavailable(ServiceUnavailable):
    kind = ErrorKind.STATE


class EmptyModelReply(KbbotError):
    """The model finished without any text: an error, never an empty message."""

    kind = ErrorKind.MODEL_EMPTY
    reason = "empty reply"


@dataclass(frozen=True)
class Diagnosis:
    kind: ErrorKind
    reason: str  # for the user: short, no URL, no secret
    detail: str  # for the log


_Types = tuple[type[BaseException], ...]


def _weaviate(name: str) -> _Types:
    """The Weaviate client's exception ``name``, if the client was imported (else none can exist)."""
    module = sys.modules.get("weaviate.exceptions")
    return (getattr(module, name),) if module is not None else ()


def _kinds() -> tuple[tuple[ErrorKind, _Types], ...]:
    """Library errors by the dependency they mean, checked in this order."""
    return (
        (ErrorKind.MODEL, (anthropic.APIError, openai.APIError, httpx.TransportError, httpx2.TransportError,
                           TimeoutError)),
        (ErrorKind.STORE, _weaviate("WeaviateBaseError")),
        (ErrorKind.STATE, (redis.exceptions.RedisError,)),
    )


_TIMEOUTS = (TimeoutError, httpx.TimeoutException, httpx2.TimeoutException, anthropic.APITimeoutError, openai.APITimeoutError,
             redis.exceptions.TimeoutError)
_RATE_LIMITS = (anthropic.RateLimitError, openai.RateLimitError)
_CONNECTIONS = (ConnectionError, httpx.TransportError, httpx2.TransportError, anthropic.APIConnectionError, openai.APIConnectionError,
                redis.exceptions.ConnectionError)


def root_cause(exc: BaseException) -> BaseException:
    """Unwraps Haystack's ``PipelineRuntimeError`` (and plain chaining) to the original error."""
    seen = set()
    while isinstance(exc, PipelineRuntimeError) and exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The exception's message on one line (its type when it has none), cut at ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if isinstance(exc, _RATE_LIMITS) or status == 429:
        return "rate limited"
    if isinstance(exc, anthropic.OverloadedError) or status == 529:
        return "overloaded"
    if isinstance(exc, _TIMEOUTS + _weaviate("WeaviateTimeoutError")):
        return "timed out"
    if isinstance(status, int):
        return f"HTTP {status}"
    if isinstance(exc, _CONNECTIONS + _weaviate("WeaviateConnectionError")):
        return "connection lost"
    return type(exc).__name__


def diagnose(exc: BaseException) -> Diagnosis:
    cause = root_cause(exc)
    detail = f"{type(cause).__name__}: {cause}"
    if isinstance(cause, KbbotError):
        return Diagnosis(cause.kind, cause.reason, detail)
    for kind, types in _kinds():
        if isinstance(cause, types):
            return Diagnosis(kind, _reason(cause), detail)
    return Diagnosis(ErrorKind.INTERNAL, type(cause).__name__, detail)
