"""BM25 analysis (stemming, stop words, CJK bigrams, codes), the in-memory keyword index and
relative score fusion: the parts that made retrieval win on device manuals."""

from __future__ import annotations

from pathlib import Path

import pytest
from haystack import Document

from pipelines.analysis import analyze, chunk_search_text, search_text, unigrams
from pipelines.evaluation import EvalQuery, miss_cause
from pipelines.fusion import adaptive_alpha, check_alpha, fuse, relative_score_fusion
from pipelines.store import DocRecord, InMemoryKnowledgeStore


def test_english_is_stemmed_and_stop_words_dropped():
    assert unigrams("How can I charge my phone while charging?") == ["charg", "phone", "charg"]
    assert unigrams("Configuring the Wi-Fi settings") == ["configur", "wi-fi", "set"]


def test_neighbouring_words_also_count_as_a_pair():
    assert analyze("Change the picture size") == ["chang", "pictur", "size", "chang_pictur", "pictur_size"]


def test_codes_and_numbers_stay_whole():
    assert unigrams("Error E-004 on the HL-M200 at 95 °C") == ["error", "e-004", "hl-m200", "95", "c"]


def test_chinese_becomes_overlapping_bigrams_and_a_lone_character_a_unigram():
    assert analyze("电机过热") == ["电机", "机过", "过热"]
    assert analyze("热 motor") == ["热", "motor"]


def test_the_heading_path_weighs_twice_the_body():
    assert search_text("Pump > Seals", "Replace the seal.") == "pump seal pump_seal pump seal pump_seal replac seal replac_seal"


def test_a_chunk_search_text_reads_its_breadcrumb_as_heading():
    chunk = Document(content="Manual > Bluetooth\nPair a headset.", meta={"title": "Manual", "header": "Bluetooth"})
    assert chunk_search_text(chunk).split()[:3] == ["manual", "bluetooth", "manual_bluetooth"]
    assert chunk_search_text(chunk).split().count("bluetooth") == 2


def _publish(store: InMemoryKnowledgeStore, doc_id: str, text: str, space: str = "default") -> None:
    record = DocRecord(doc_id=doc_id, version=0, content_hash=doc_id, title=doc_id, source=doc_id, space=space)
    store.publish(record, [Document(content=text, meta={"header": ""})])
    store.commit()


def test_keyword_index_matches_word_forms_and_follows_publish_and_revoke(tmp_path: Path):
    store = InMemoryKnowledgeStore(tmp_path)
    _publish(store, "charging", "Charging the battery wirelessly takes three hours.")
    _publish(store, "display", "The display turns off after a minute.")
    found = store.keyword_search("how do I charge it?")
    assert [d.meta["doc_id"] for d in found] == ["charging"]
    assert found[0].score > 0
    _publish(store, "charging", "Charging the battery takes two hours.")  # a new version replaces the old
    assert [d.meta["version"] for d in store.keyword_search("charge")] == [2]
    store.revoke("charging")
    store.commit()
    assert store.keyword_search("charge") == []
    assert store.keyword_search("how do I?") == []  # stop words only: nothing to match


def test_keyword_index_applies_filters_and_is_rebuilt_from_disk(tmp_path: Path):
    store = InMemoryKnowledgeStore(tmp_path)
    _publish(store, "a", "Reset the drive to factory settings.", space="sales")
    _publish(store, "b", "Reset the motor protection relay.", space="service")
    only = {"field": "meta.space", "operator": "in", "value": ["service"]}
    assert [d.meta["doc_id"] for d in store.keyword_search("reset", filters=only)] == ["b"]
    reopened = InMemoryKnowledgeStore(tmp_path)
    assert {d.meta["doc_id"] for d in reopened.keyword_search("resetting")} == {"a", "b"}


def _doc(doc_id: str, score: float) -> Document:
    return Document(id=doc_id, content=doc_id, score=score)


def test_relative_score_fusion_weighs_scaled_scores_by_alpha():
    keyword = [_doc("a", 10.0), _doc("b", 5.0), _doc("c", 0.0)]
    dense = [_doc("b", 0.9), _doc("c", 0.8), _doc("a", 0.7)]
    fused = relative_score_fusion(keyword, dense, alpha=0.4)
    scores = {d.id: round(d.score, 3) for d in fused}
    assert scores == {"a": 0.6, "b": 0.7, "c": 0.2}
    assert [d.id for d in fused] == ["b", "a", "c"]
    assert [d.id for d in relative_score_fusion(keyword, dense, alpha=0.0)] == ["a", "b", "c"]
    assert fuse(keyword, [], "relative_score") == keyword  # one side empty: the other as it is


def test_adaptive_alpha_trusts_vectors_as_far_as_they_separate_their_best_candidates():
    assert adaptive_alpha([0.88, 0.879, 0.878, 0.877, 0.876, 0.5]) == 0.2  # gap 0.004: keywords lead
    assert adaptive_alpha([0.90, 0.89, 0.88, 0.87, 0.87]) == pytest.approx(0.54)  # 18 x 0.03
    assert adaptive_alpha([0.95, 0.80, 0.79, 0.78, 0.77, 0.76]) == 0.8  # a clear vector hit: capped
    assert adaptive_alpha(iter([0.9, 0.7, 0.89, 0.6, 0.88, 0.1])) == 0.8  # the best five, in any order
    assert adaptive_alpha([0.9]) == adaptive_alpha([]) == 0.5  # nothing to compare


def test_auto_alpha_lets_the_list_that_separates_its_candidates_decide():
    keyword = [_doc("a", 12.0), _doc("b", 6.0), _doc("c", 5.0), _doc("d", 1.0)]
    # Vectors nearly tied (sibling sections): the keyword winner stays first.
    tied = [_doc("b", 0.881), _doc("c", 0.880), _doc("a", 0.879), _doc("d", 0.878), _doc("e", 0.877)]
    assert fuse(keyword, tied, "relative_score", "auto")[0].id == "a"
    assert fuse(keyword, tied, "relative_score", 0.55)[0].id == "b"  # a fixed weight lets the tie win
    # Vectors sure of one passage: it wins.
    sure = [_doc("b", 0.95), _doc("c", 0.80), _doc("a", 0.79), _doc("d", 0.78), _doc("e", 0.77)]
    assert fuse(keyword, sure, "relative_score", "auto")[0].id == "b"


def test_alpha_is_auto_or_a_weight_from_0_to_1():
    assert check_alpha("auto") == "auto" and check_alpha("0.3") == 0.3 and check_alpha(1) == 1.0
    for bad in ("1.5", "keywords", None, -0.1):
        with pytest.raises(ValueError, match="expected \"auto\" or a number from 0"):
            check_alpha(bad)


def test_miss_causes_read_the_section_paths():
    titles = {"p": "M > Settings", "c": "M > Settings > Sound", "s": "M > Settings > Display",
              "d1": "M > Sound", "d2": "M > Sound", "x": "M > Apps"}

    def cause(gold: str, ranked: list[str]) -> str | None:
        return miss_cause(EvalQuery("q", "?", [gold]), ranked[0], ranked, ranked, titles)

    assert cause("c", ["c", "p"]) == "hit"
    assert cause("c", ["p", "c"]) == "parent_first"
    assert cause("p", ["c", "p"]) == "child_first"
    assert cause("c", ["s", "c"]) == "sibling_first"
    assert cause("d2", ["d1", "d2"]) == "duplicate"
    assert cause("c", ["x", "c"]) == "other_section"
    assert miss_cause(EvalQuery("q", "?", ["c"]), "x", ["x"], ["x"], titles) == "not_retrieved"
    assert miss_cause(EvalQuery("q", "?", ["c"]), "x", ["x", "c", "s"], ["x", "s"], titles) == "cut_by_ranker"
    assert miss_cause(EvalQuery("q", "?", ["c"]), "x", ["x", "s", "c"], ["x", "s"], titles) == "other_section"
