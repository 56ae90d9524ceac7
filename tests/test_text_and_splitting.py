from haystack import Document

from pipelines.components.splitter import SectionSplitter
from pipelines.text import detect_language, split_sentences


def test_sentences_split_on_chinese_and_english_boundaries():
    text = "电机过热怎么办？先检查风扇。温度超过 90 °C 时停机！Check the fan. Version 1.5 stays whole."
    assert split_sentences(text) == [
        "电机过热怎么办？", "先检查风扇。", "温度超过 90 °C 时停机！", "Check the fan.", "Version 1.5 stays whole.",
    ]


def test_table_rows_are_never_cut_inside():
    row = "| E-004 | Drive overheat | Heatsink above 95 °C. Fan failed. | Clean it. |"
    assert split_sentences(row) == [row]


def test_language_detection():
    assert detect_language("HL-M300 的轴承型号是什么？") == "zh"
    assert detect_language("What bearing does the HL-M300 use?") == "en"


def _chunks(text: str, chunk_chars: int = 200, fmt: str = "markdown") -> list[Document]:
    return SectionSplitter(chunk_chars=chunk_chars).run([Document(content=text, meta={"format": fmt})])["documents"]


def test_markdown_sections_start_new_chunks_with_their_breadcrumb():
    text = "# Motor\nIntro.\n\n## Causes\nThe fan is blocked.\n\n## Remedy\nClean the fins every 3 months."
    chunks = _chunks(text)
    assert [c.meta["header"] for c in chunks] == ["Motor", "Motor > Causes", "Motor > Remedy"]
    assert chunks[2].content == "Motor > Remedy\nClean the fins every 3 months."


def test_chunks_of_plain_text_carry_the_document_title_once():
    splitter = SectionSplitter(chunk_chars=200)
    passage, own_title = splitter.run([
        Document(content="Built in 1889 for the World's Fair.", meta={"format": "text", "title": "Eiffel Tower"}),
        Document(content="Warranty\nThe warranty lasts 24 months.", meta={"format": "text", "title": "Warranty"}),
    ])["documents"]
    assert passage.content == "Eiffel Tower\nBuilt in 1889 for the World's Fair."
    assert own_title.content == "Warranty\nThe warranty lasts 24 months."


def test_long_chinese_paragraph_splits_at_sentence_ends_within_limit():
    sentence = "电机运行时必须检查冷却风扇是否正常工作并清理散热片上的灰尘。"
    text = "# 维护\n" + sentence * 12
    chunks = _chunks(text, chunk_chars=120)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk.content) <= 120
        body = chunk.content.split("\n", 1)[1]
        assert body.endswith("。"), body  # never cut mid-sentence
        assert chunk.meta["language"] == "zh"


def test_long_english_paragraph_splits_at_sentence_ends():
    text = " ".join(f"Step {i} tightens bolt number {i} to 190 N·m." for i in range(1, 30))
    chunks = _chunks(text, chunk_chars=150, fmt="text")
    assert len(chunks) > 1
    assert all(c.content.rstrip().endswith(".") and len(c.content) <= 150 for c in chunks)
    assert all(c.meta["language"] == "en" for c in chunks)


def test_big_table_repeats_its_header_in_every_chunk():
    header = "| Code | Name | Remedy |\n|---|---|---|\n"
    rows = "".join(f"| E-{i:03d} | Fault number {i} | Check wiring and reset the drive |\n" for i in range(1, 20))
    chunks = _chunks("# Codes\n" + header + rows, chunk_chars=300)
    assert len(chunks) > 1
    for chunk in chunks:
        assert "| Code | Name | Remedy |" in chunk.content
    joined = "\n".join(c.content for c in chunks)
    assert all(f"E-{i:03d}" in joined for i in range(1, 20))


def test_headings_inside_code_fences_are_not_sections():
    text = "# Guide\n```\n# not a heading\n```\nText."
    assert [c.meta["header"] for c in _chunks(text)] == ["Guide"]
