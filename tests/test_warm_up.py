"""``Runtime.warm_up``: a process's first turn's one-time costs paid before anyone waits on them, with no
model asked and nothing shown; a store that is down or slow leaves the process to start cold, never
unstarted. ``kbbot serve`` warms up before it listens."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bot.permissions import Audience
from tests.replies import RecordingReply
from tests.test_anthropic_generator import inquiry


def recording_probe(runtime: Any) -> list[tuple[str, dict[str, Any], list[Any]]]:
    """What the answerer's retrieval probe is asked from now on (question, filters, chunks found)."""
    seen: list[tuple[str, dict[str, Any], list[Any]]] = []
    probe = runtime.answerer.permissions.probe

    async def recording(question: str, filters: dict[str, Any]) -> list[Any]:
        found = await probe(question, filters)
        seen.append((question, filters, found))
        return found

    runtime.answerer.permissions.probe = recording
    return seen


async def test_warm_up_makes_the_model_clients_and_retrieves_public_documents_without_asking_the_model(claude):
    fake, runtime = claude
    seen = recording_probe(runtime)
    searched: list[str] = []
    keyword_search = runtime.store.keyword_search
    runtime.store.keyword_search = lambda query, **kw: searched.append(query) or keyword_search(query, **kw)
    assert runtime._generators and all(g.async_client is None for g in runtime._generators)

    assert await runtime.warm_up() is True

    # The answer's and the helper's clients (the helper is no component of the pipeline: warmed apart).
    assert len(runtime._generators) == 2 and all(g.async_client is not None for g in runtime._generators)
    assert all(g.client is None for g in runtime._generators)  # no sync client that no async turn uses
    known = await runtime.answerer.permissions.known_principals()
    assert [(question, filters) for question, filters, _ in seen] == [
        ("warm-up", Audience.public().filter(known))]
    assert searched == ["warm-up"]  # the store's first query (the keyword index built), whatever it found
    assert fake.fake.requests == []  # no model call at all, helper calls included

    # The turn after it uses the clients made, and answers.
    clients = [g.async_client for g in runtime._generators]
    answer = await runtime.answerer.answer(inquiry("How often should the bearings be greased?"), RecordingReply())
    assert answer.outcome.value == "answered"
    assert [g.async_client for g in runtime._generators] == clients


async def test_a_store_that_does_not_answer_leaves_the_process_to_start_cold(claude, caplog):
    fake, runtime = claude
    runtime.answerer  # noqa: B018 - built first, so the probe below is the one it holds

    async def hangs(question: str, filters: dict[str, Any]) -> list[Any]:
        await asyncio.sleep(3600)
        return []

    runtime.answerer.permissions.probe = hangs
    with caplog.at_level(logging.WARNING, logger="kbbot.runtime"):
        assert await asyncio.wait_for(runtime.warm_up(timeout_s=0.2), 5) is False
    assert "warm-up skipped (TimeoutError" in caplog.text

    async def down(question: str, filters: dict[str, Any]) -> list[Any]:
        raise ConnectionRefusedError("weaviate:8080")

    runtime.answerer.permissions.probe = down
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kbbot.runtime"):
        assert await runtime.warm_up() is False
    assert "warm-up skipped (ConnectionRefusedError: weaviate:8080)" in caplog.text


async def test_serve_warms_up_before_it_listens(kb_data_dir, tmp_path, monkeypatch):
    from adapters.server import serve
    from bot.runtime import build_runtime
    from tests.conftest import make_settings

    for name in ("SLACK_BOT_TOKEN", "TELEGRAM_BOT_TOKEN", "KBBOT_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    runtime = build_runtime(make_settings(kb_data_dir))
    runtime.settings.data_dir = tmp_path
    order: list[str] = []
    warm_up = runtime.warm_up

    async def recorded_warm_up(*args: Any, **kwargs: Any) -> bool:
        order.append("warm-up")
        return await warm_up(*args, **kwargs)

    runtime.warm_up = recorded_warm_up  # type: ignore[method-assign]
    stop = asyncio.Event()

    def listening(port: int) -> None:
        order.append("listening")
        stop.set()

    await asyncio.wait_for(serve(runtime, env={}, host="127.0.0.1", port=0, stop=stop, schedule=False,
                                 on_listening=listening), 60)
    assert order == ["warm-up", "listening"]
