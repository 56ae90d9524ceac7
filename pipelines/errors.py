"""Names the dependency behind an exception, so the chat can say what happened in words."""

from __future__ import annotations

from dataclasses import dataclass

from haystack.core.errors import PipelineRuntimeError


class ServiceUnavailable(RuntimeError):
    """A store the process needs cannot be reached at start; the message names its URL and the error."""


class EmptyModelReply(RuntimeError):
    """The model finished without any text: an error, never an empty message."""


@dataclass(frozen=True)
class Diagnosis:
    kind: str  # "model" | "model_empty" | "store" (documents) | "state" (history, locks) | "internal"
    reason: str


def root_cause(exc: BaseException) -> BaseException:
    """Unwraps Haystack's ``PipelineRuntimeError`` (and plain chaining) to the original error."""
    seen = set()
    while isinstance(exc, PipelineRuntimeError) and exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def _model_errors() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [TimeoutError]
    for module, names in (
        ("anthropic", ("APIError", "APIConnectionError", "APITimeoutError")),
        ("openai", ("APIError", "APIConnectionError", "APITimeoutError")),
        ("httpx", ("TransportError",)),
        ("httpx2", ("TransportError",)),
    ):
        try:
            mod = __import__(module)
        except ImportError:
            continue
        kinds.extend(getattr(mod, n) for n in names if hasattr(mod, n))
    return tuple(kinds)


def _store_errors() -> tuple[type[BaseException], ...]:
    try:
        from weaviate.exceptions import WeaviateBaseError
    except ImportError:
        return ()
    return (WeaviateBaseError,)


def _state_errors() -> tuple[type[BaseException], ...]:
    try:
        from redis.exceptions import RedisError
    except ImportError:
        return ()
    return (RedisError,)


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if status == 429 or "RateLimit" in name:
        return "rate limited"
    if status == 529 or "Overloaded" in name:
        return "overloaded"
    if isinstance(exc, TimeoutError) or "Timeout" in name:
        return "timed out"
    if status:
        return f"HTTP {status}"
    if "Connection" in name or "Protocol" in name or "Transport" in name or "Unavailable" in name:
        return "connection lost"
    return name


def diagnose(exc: BaseException) -> Diagnosis:
    cause = root_cause(exc)
    if isinstance(cause, EmptyModelReply):
        return Diagnosis("model_empty", "empty reply")
    if isinstance(cause, _model_errors()):
        return Diagnosis("model", _describe(cause))
    if isinstance(cause, _store_errors()):
        return Diagnosis("store", _describe(cause))
    if isinstance(cause, _state_errors()):
        return Diagnosis("state", _describe(cause))
    return Diagnosis("internal", type(cause).__name__)
