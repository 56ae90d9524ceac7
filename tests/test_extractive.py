from haystack import Document

from pipelines.components.extractive import HEADINGS, ExtractiveAnswerer, select_sentences


def _sources() -> list[Document]:
    return [
        Document(content="## Bearing lubrication\nHow often should the bearings be greased?\n"
                         "Regrease HL-M200 bearings every 4,000 operating hours with 15 g of grease. "
                         "Wipe old grease from the outlet.", meta={"header": "Maintenance > Bearing lubrication"}),
        Document(content="| Code | Name |\n|---|---|\n| E-004 | Drive overheat |", meta={}),
        Document(content="The warranty lasts 24 months.", meta={}),
    ]


def test_picks_sentences_sharing_the_question_terms_and_cites_them():
    picked = select_sentences("How often should the bearings be greased?", _sources())
    assert (1, "Regrease HL-M200 bearings every 4,000 operating hours with 15 g of grease.") in picked
    assert all(not s.endswith("?") for _, s in picked)  # the question itself is no answer
    assert all("| Code | Name |" not in s for _, s in picked)  # nor a table header


def test_answer_says_no_model_and_streams_the_same_text():
    chunks = []
    reply = ExtractiveAnswerer().run(question="How often should the bearings be greased?", sources=_sources(),
                                     streaming_callback=chunks.append)["replies"][0]
    assert reply.text.startswith(HEADINGS["en"])
    assert "4,000 operating hours" in reply.text and "[1]" in reply.text
    assert "".join(c.content for c in chunks) == reply.text


def test_chinese_question_gets_chinese_label():
    text = ExtractiveAnswerer().run(question="电机过热怎么办？", sources=_sources())["replies"][0].text
    assert text.startswith(HEADINGS["zh"])
    assert "[1]" in text  # with no shared terms the top source still leads
