"""The real default local model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, joined from its PyPI parts)
through a whole turn over the sample knowledge base. Slow (a turn takes about a minute on 2 cores):
``make test-local`` runs it; ``make test`` does not."""

from pathlib import Path

import pytest

from bot.runtime import build_runtime
from bot.types import Inquiry, Outcome
from tests.conftest import make_settings
from tests.replies import RecordingReply

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the sample KB is indexed first


async def test_the_local_model_answers_a_fault_code_question_with_valid_citations(kb_data_dir: Path,
                                                                                  tmp_path: Path):
    pytest.importorskip("xllamacpp", reason="needs the `local` extra: make test-local")
    settings = make_settings(kb_data_dir, KBBOT_GENERATOR="local")
    settings.generator.local.turn_timeout_s = 800  # a shared 2-core machine can be several times slower
    runtime = build_runtime(settings)
    runtime.settings.data_dir = tmp_path
    await runtime.start()
    try:
        reply = RecordingReply()
        answer = await runtime.answerer.answer(
            Inquiry("test", "t", "c", "test:local", "u", "What does error E-004 mean on the HL-D50?"), reply)
    finally:
        await runtime.close()
    assert answer.outcome is Outcome.ANSWERED, answer.text
    assert answer.citations and all(c.doc_id for c in answer.citations)
    assert "95" in answer.text or "overheat" in answer.text.lower()  # heatsink above 95 °C: drive overheat
    assert reply.streamed  # streamed through the OpenAI-compatible path
    assert answer.trace.model_calls >= 1
