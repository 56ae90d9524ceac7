"""On-premise options: an OpenAI-compatible chat endpoint and a /rerank endpoint, through the real
openai client (Haystack's OpenAIChatGenerator) and httpx."""

from pathlib import Path

import pytest
from haystack import Document

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from pipelines.components.ranker import HttpReranker
from tests.conftest import make_settings
from tests.fakes.openai_server import FakeOpenAI
from tests.replies import RecordingReply


async def test_openai_compatible_generator_streams_a_cited_answer(kb_data_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch):
    async with FakeOpenAI(reply=lambda req: "Grease every 4,000 operating hours [1].") as fake:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
        settings = make_settings(kb_data_dir)
        settings.generator.kind = "openai"
        settings.generator.base_url = f"{fake.base_url}/v1"
        settings.generator.model = "qwen2.5:7b"
        settings.generator.max_retries = 0
        runtime = build_runtime(settings)
        runtime.settings.data_dir = tmp_path
        await runtime.start()
        reply = RecordingReply()
        answer = await runtime.answerer.answer(
            Inquiry("test", "t", "c", "test:oa", "u", "How often should the bearings be greased?"), reply)
    assert answer.outcome is Outcome.ANSWERED
    assert answer.text == "Grease every 4,000 operating hours [1]." == reply.streamed
    assert answer.citations and answer.citations[0].index == 1
    request = fake.requests[-1]
    assert request["model"] == "qwen2.5:7b" and request["stream"] is True
    assert request["messages"][0]["role"] == "system"
    assert "<sources>" in request["messages"][1]["content"]


async def test_http_reranker_reorders_and_keeps_similarity():
    docs = [Document(id=str(i), content=text, meta={"doc_id": f"d{i}"}) for i, text in
            enumerate(["short", "a much longer passage", "medium one"])]
    dense = [Document(id="1", content="", score=0.91)]
    async with FakeOpenAI(rerank=lambda q, texts: [float(len(t)) for t in texts]) as fake:
        ranker = HttpReranker(fake.base_url, top_k=2)
        out = (await ranker.run_async(query="q", documents=docs, dense_documents=dense))["documents"]
    assert [d.content for d in out] == ["a much longer passage", "medium one"]
    assert out[0].meta["similarity"] == 0.91
    assert fake.requests[-1] == {"query": "q", "texts": ["short", "a much longer passage", "medium one"],
                                 "truncate": True}
