"""``kbbot eval DATASET --answers``: whole turns with the configured generator, scored
(``pipelines/answer_eval.py`` says what each figure means)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from haystack import Document

from bot.runtime import Runtime, make_generators
from bot.settings import Settings
from pipelines.answer_eval import EvalTurn, evaluate_answers, load_cases
from pipelines.components.turn import TurnLedger
from pipelines.topics import Topics


def embedder_of(runtime: Runtime) -> Any:
    """Sentence vectors from the configured document embedder (groundedness)."""
    def embed(texts: list[str]) -> np.ndarray:
        docs = runtime.document_embedder.run(documents=[Document(content=t) for t in texts])["documents"]
        vectors = np.array([d.embedding for d in docs], dtype=np.float32)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)

    return embed


def run_answer_eval(settings: Settings, runtime: Runtime, dataset: Path, *, limit: int | None,
                    turns_path: str | None) -> dict[str, Any]:
    """Temperature 0 (repeatable figures); no topic scope and no clarifying questions: the eval
    sets are not about the configured products."""
    cases = load_cases(dataset, limit)
    generators = make_generators(settings, temperature=0, similarity=runtime.sentence_similarity)
    pipeline = runtime.query_pipeline(generators, Topics(), clarify=False)
    a = settings.answering
    ledger = lambda: TurnLedger.start(max_model_calls=a.max_model_calls,  # noqa: E731
                                      timeout_s=generators.turn_timeout_s, max_retries=a.max_retries)
    out = open(turns_path, "a", encoding="utf-8") if turns_path else None  # noqa: SIM115 - closed below
    done = 0

    def on_turn(record: EvalTurn) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{len(cases)}] {record.set} {record.outcome} {record.seconds:.1f}s", file=sys.stderr)
        if out is not None:
            out.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            out.flush()

    try:
        result = evaluate_answers(pipeline, cases, ledger=ledger, embed=embedder_of(runtime), on_turn=on_turn)
    finally:
        if out is not None:
            out.close()
    return {"generator": settings.generator_kind, **result}
