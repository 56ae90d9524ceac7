"""The answer-quality metrics of ``kbbot eval --answers`` on turns whose right figures are known,
and the command itself on a small dataset (extractive, so it runs in the fast suite)."""

import json
import os
from pathlib import Path

import numpy as np
from haystack import Document

from adapters.cli import main
from pipelines.answer_eval import AnswerCase, EvalTurn, load_cases, overlap, score_answer, summarize, supported


def _sources() -> list[Document]:
    return [Document(content="Regrease HL-M200 bearings every 4,000 operating hours with 15 g of grease.",
                     meta={"doc_id": "maint"}),
            Document(content="电机额定环境温度最高为 40 °C，超过时需降容使用或增加通风。", meta={"doc_id": "heat"})]


def _scored(text: str, question: str = "How often are the bearings greased?", gold=("maint",),
            answers=("every 4,000 operating hours",)) -> EvalTurn:
    case = AnswerCase("q1", question, list(gold), list(answers), "answerable")
    record = EvalTurn("q1", "answerable", question, "answered", text=text)
    score_answer(record, case, _sources(), embed=None)
    return record


def test_a_grounded_cited_answer_scores_fully():
    record = _scored("Regrease the HL-M200 bearings every 4,000 operating hours with 15 g of grease [1].")
    assert record.invalid_markers == 0 and record.cited == [1] and record.cited_gold is True
    assert (record.sentences, record.supported) == (1, 1)
    assert record.language_match is True and record.reference_recall == 1.0


def test_invalid_markers_uncited_and_unsupported_sentences_are_counted():
    record = _scored("The bearings need grease every 4,000 hours [3]. Paris is the capital of France [1].\n"
                     "Use a torque wrench.")
    assert record.invalid_markers == 1 and record.cited == [3, 1]
    # [3] was never shown, Paris is not in [1], the last sentence cites nothing: none is supported.
    assert (record.sentences, record.supported) == (3, 0)
    summary = summarize([record, _scored("Every 4,000 operating hours [1]."),
                         EvalTurn("u1", "unanswerable", "q", "not_found", seconds=2.0)])
    assert summary["citation_validity"] == round(2 / 3, 4) and summary["answered"] == round(2 / 3, 4)
    assert summary["abstained"] == round(1 / 3, 4) and summary["uncited"] == 0.0


def test_language_and_chinese_reference_overlap_by_characters():
    record = _scored("电机额定环境温度最高为 40 °C [2]。", question="电机最高环境温度是多少？", gold=("heat",),
                     answers=("40 °C",))
    assert record.language_match is True and record.cited_gold is True and record.supported == 1
    assert _scored("最高 40 °C [1]。").language_match is False  # an English question answered in Chinese
    assert overlap("环境温度最高为四十度", "最高温度")[1] == 1.0  # every reference character is there


def test_semantic_support_needs_a_close_sentence():
    def embed(texts):  # one direction per subject: grease, fuse, anything else
        return np.array([[1.0, 0, 0] if "grease" in t.lower() else [0, 1.0, 0] if "fuse" in t else [0, 0, 1.0]
                         for t in texts])

    chunk = ["Apply lithium grease every quarter. Keep the fan clean."]
    assert supported("Grease it each quarter year", chunk, embed)
    assert not supported("Replace the fuse", chunk, embed)


def test_the_eval_command_scores_extractive_answers_on_a_small_dataset(tmp_path: Path, capsys):
    data = tmp_path / "tiny"
    data.mkdir()
    passages = [{"id": "p1", "title": "Bearings", "text": "Regrease the bearings every 4,000 operating hours."},
                {"id": "p2", "title": "Warranty", "text": "The warranty lasts 24 months from delivery."}]
    questions = [{"id": "q1", "text": "How often should bearings be regreased?", "gold_ids": ["p1"],
                  "answers": ["every 4,000 operating hours"]},
                 {"id": "q2", "text": "How long is the warranty?", "gold_ids": ["p2"], "answers": ["24 months"]}]
    (data / "corpus.jsonl").write_text("\n".join(json.dumps(p) for p in passages), encoding="utf-8")
    (data / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in questions), encoding="utf-8")
    (data / "queries_unanswerable.jsonl").write_text(json.dumps(
        {"id": "u1", "text": "Who won the 1998 football world cup?", "gold_ids": [], "answers": []}), encoding="utf-8")
    config = Path(__file__).resolve().parent.parent / "config" / "kbbot.yaml"
    turns = tmp_path / "turns.jsonl"
    os.environ["KBBOT_DATA_DIR"] = str(tmp_path / "data")
    try:
        code = main(["--config", str(config), "eval", str(data), "--answers", "--json", "--turns", str(turns)])
    finally:
        del os.environ["KBBOT_DATA_DIR"]
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    answerable, unanswerable = result["sets"]["answerable"], result["sets"]["unanswerable"]
    assert result["generator"] == "extractive" and answerable["n"] == 2 and unanswerable["n"] == 1
    assert answerable["answered"] == 1.0 and answerable["cited_gold"] == 1.0
    assert answerable["citation_validity"] == 1.0 and answerable["groundedness"] == 1.0
    assert unanswerable["abstained"] == 1.0
    assert len(turns.read_text(encoding="utf-8").splitlines()) == 3


def test_a_folder_corpus_names_its_gold_files_as_the_store_does(tmp_path):
    """``examples/kb-eval`` points at ``examples/kb`` (``corpus.folder``) instead of a corpus.jsonl: its
    gold files are compared by the document id a folder source gives them, the absolute path."""
    from pipelines.evaluation import corpus_folder, load_queries

    root = Path(__file__).resolve().parent.parent
    dataset = root / "examples" / "kb-eval"
    assert corpus_folder(dataset) == root / "examples" / "kb"
    answerable = load_queries(dataset)
    unanswerable = load_queries(dataset, "queries_unanswerable.jsonl")
    assert len(answerable) == len(unanswerable) == 15
    assert all(Path(g).is_file() for q in answerable for g in q.gold_ids)
    assert all(not q.gold_ids for q in unanswerable)
    cases = load_cases(dataset)
    assert {c.set for c in cases} == {"answerable", "unanswerable"}
    assert all(Path(g).is_file() for c in cases for g in c.gold_ids)
