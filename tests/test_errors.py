"""Which dependency an exception came from is read from its type, never from its name."""

from __future__ import annotations

import anthropic
import httpx
import httpx2
import redis.exceptions
from haystack.core.errors import PipelineRuntimeError

from bot.state.redis import RedisUnavailable
from pipelines.errors import EmptyModelReply, ErrorKind, KbbotError, diagnose
from pipelines.weaviate_store import WeaviateUnavailable


def test_our_errors_carry_their_kind_and_a_reason_a_user_may_read():
    assert (diagnose(EmptyModelReply("nothing")).kind, diagnose(EmptyModelReply("x")).reason) == (
        ErrorKind.MODEL_EMPTY, "empty reply")
    down = diagnose(WeaviateUnavailable("cannot reach Weaviate at http://admin:secret@weaviate:8080: refused"))
    assert (down.kind, down.reason) == (ErrorKind.STORE, "connection lost")
    assert "secret" not in down.reason and "WeaviateUnavailable" in down.detail
    assert diagnose(RedisUnavailable("cannot reach Redis")).kind is ErrorKind.STATE


def test_library_errors_are_filed_by_type_through_haystacks_wrapper():
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    limited = anthropic.RateLimitError("slow down", response=httpx.Response(429, request=request), body=None)
    wrapped = PipelineRuntimeError.from_exception("generate", object, limited)
    wrapped.__cause__ = limited  # as Haystack raises it: `raise ... from error`
    assert (diagnose(wrapped).kind, diagnose(wrapped).reason) == (ErrorKind.MODEL, "rate limited")
    assert diagnose(httpx2.RemoteProtocolError("peer closed")).reason == "connection lost"
    assert diagnose(httpx2.ReadTimeout("slow")).reason == "timed out"
    assert (diagnose(redis.exceptions.ConnectionError("x")).kind, diagnose(redis.exceptions.TimeoutError()).reason) == (
        ErrorKind.STATE, "timed out")


def test_a_name_that_only_sounds_like_a_dependency_is_ours():
    class ConnectionTimeoutUnavailableError(Exception):
        pass

    odd = diagnose(ConnectionTimeoutUnavailableError("?"))
    assert (odd.kind, odd.reason) == (ErrorKind.INTERNAL, "ConnectionTimeoutUnavailableError")
    assert issubclass(EmptyModelReply, KbbotError) and issubclass(WeaviateUnavailable, KbbotError)
