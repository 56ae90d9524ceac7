"""Word, Excel, PowerPoint, e-mail, EPUB and scanned PDFs: real files written with their writer libraries,
indexed with `kbbot index`, and questions answered only in them cited with document and page, slide,
sheet or section. Broken files are reported by name with their reason, and the report counts per format."""

from __future__ import annotations

import contextlib
import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.cli import SilentReply, main
from adapters.console.platform import console_inquiry, render_sources
from adapters.slack.text import sources_block
from adapters.telegram.text import sources_rendered
from bot.runtime import build_runtime
from bot.types import Answer, Citation, Outcome
from pipelines.components.converter import ConversionError, OcrOptions, convert_bytes
from tests.conftest import make_settings
from tests.office_files import (
    SCANNED_MANUAL_PAGES,
    scanned_pdf,
    write_docx,
    write_eml,
    write_epub,
    write_pptx,
    write_xlsx,
)


def attachment_docx() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("Winch brake card", level=1)
    document.add_paragraph("The HL-W5 winch brake air gap must be set to 0.4 mm.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(data dir, what `kbbot index` printed) for a folder of every format and some broken files."""
    root = tmp_path_factory.mktemp("formats")
    folder = root / "kb"
    folder.mkdir()
    write_docx(folder / "gearbox.docx")
    write_xlsx(folder / "params.xlsx")
    write_pptx(folder / "training.pptx")
    write_eml(folder / "bulletin.eml", ("winch-brake.docx", attachment_docx()))
    write_epub(folder / "field-guide.epub")
    (folder / "pump-manual.pdf").write_bytes(scanned_pdf(SCANNED_MANUAL_PAGES))
    (folder / "broken.docx").write_text("not a Word file", encoding="utf-8")
    (folder / "broken.xlsx").write_bytes(b"PK\x03\x04 truncated zip")
    (folder / "mail.msg").write_bytes(b"\xd0\xcf\x11\xe0 not really an Outlook file")
    data_dir = root / "data"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KBBOT_DATA_DIR", str(data_dir))
        for name in ("WEAVIATE_URL", "REDIS_URL", "ANTHROPIC_API_KEY", "KBBOT_CONFIG"):
            patch.delenv(name, raising=False)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["index", str(folder)])
    assert code == 0, err.getvalue()
    yield data_dir, out.getvalue() + err.getvalue()


@pytest.fixture
async def runtime(indexed, tmp_path: Path):
    data_dir, _ = indexed
    runtime = build_runtime(make_settings(data_dir))
    runtime.settings.data_dir = tmp_path  # this test's own history; the store is already open
    await runtime.start()
    yield runtime
    await runtime.close()


async def ask(runtime, question: str) -> Answer:
    return await runtime.answerer.answer(console_inquiry(question, f"formats-{uuid.uuid4().hex[:8]}"), SilentReply())


def test_index_reports_each_format_and_each_unreadable_file_by_name(indexed):
    _, printed = indexed
    assert "by format: docx: 1 indexed, 1 failed; eml: 1 indexed; epub: 1 indexed; msg: 0 indexed, 1 failed; " \
           "pdf: 1 indexed (3 pages OCR'd); pptx: 1 indexed; xlsx: 1 indexed, 1 failed" in printed
    assert "failed: " in printed and "broken.docx: not a readable Word (.docx) file" in printed
    assert "broken.xlsx: not a readable Excel (.xlsx) file" in printed
    assert "mail.msg: not a readable Outlook (.msg) file" in printed


# question, file cited first, where in it, words of the answer
CASES = [
    ("How often should the HL-X900 gear oil be changed?", "gearbox.docx", "Lubrication", "6,500"),
    ("What torque does the M16 foot bolt of the HL-X900 gearbox need?", "gearbox.docx", "Bolt torques", "210 Nm"),
    ("What is the default of parameter P7-31, the brake chopper threshold?", "params.xlsx", "sheet Parameters", "764"),
    ("What does the SP-88214 RV-40 valve actuator cost?", "params.xlsx", "sheet Spare parts", "412 EUR"),
    ("What must be re-learned after an HL-Q7 motor swap?", "training.pptx", "slide 2", "encoder offset"),
    ("Which RV-40 valves must be replaced free of charge?", "bulletin.eml", "", "RV-5120"),
    ("When does an HL-D50 motor cable need an output reactor?", "field-guide.epub", "", "85 metres"),
    ("How often should the HL-K3 pump shaft seal be replaced?", "pump-manual.pdf", "p. 2", "9,000 hours"),
    ("HL-K3 泵出现 K3-17 报警时怎么办？", "pump-manual.pdf", "p. 3", "进口滤网"),
]


@pytest.mark.parametrize("question, file, where, words", CASES, ids=[c[1] + ":" + (c[2] or "body") for c in CASES])
async def test_a_question_answered_only_in_one_file_cites_it_and_where(runtime, question, file, where, words):
    answer = await ask(runtime, question)
    assert answer.outcome == Outcome.ANSWERED, answer.text
    top = answer.citations[0]
    assert Path(top.doc_id).name == file, [(c.label, c.doc_id) for c in answer.citations]
    assert where in top.locator, top
    assert words.replace(" ", "") in answer.text.replace(" ", "")


async def test_an_e_mail_attachment_is_cited_as_a_document_of_its_own(runtime):
    answer = await ask(runtime, "What air gap does the HL-W5 winch brake need?")
    top = answer.citations[0]
    assert top.title == "winch-brake.docx" and Path(top.doc_id).name == "bulletin.eml", top
    assert top.locator == "Winch brake card" and "0.4 mm" in answer.text


async def test_scanned_pages_carry_their_page_into_the_sources_block_of_every_platform(runtime):
    answer = await ask(runtime, "How often should the HL-K3 pump shaft seal be replaced?")
    top = answer.citations[0]
    assert top.page == 2 and top.label == "HL-K3 Pump Manual, p. 2"
    assert "HL-K3 Pump Manual, p. 2" in render_sources(answer)
    # The same citation from a URL source links to its page.
    web = Citation(1, "https://kb.example.com/pump.pdf", 1, 0, "HL-K3 Pump Manual", "https://kb.example.com/pump.pdf",
                   locator="p. 2", page=2)
    assert sources_block([web])["elements"][0]["text"] == \
        "*Sources*  [1] <https://kb.example.com/pump.pdf#page=2|HL-K3 Pump Manual, p. 2>"
    rendered = sources_rendered([web])
    assert rendered is not None and rendered.text.endswith("[1] HL-K3 Pump Manual, p. 2")
    assert rendered.entities[-1]["url"] == "https://kb.example.com/pump.pdf#page=2"


def test_citations_read_their_place_from_chunk_meta():
    meta = {"doc_id": "d", "version": 3, "position": 1, "title": "Deck", "source": "deck.pptx"}
    assert Citation.of_chunk(1, {**meta, "slide": 4}).label == "Deck, slide 4"
    assert Citation.of_chunk(1, {**meta, "sheet": "Parts"}).label == "Deck, sheet Parts"
    assert Citation.of_chunk(1, {**meta, "page": 14.0}).page == 14  # Weaviate's auto-schema: a float
    assert Citation.of_chunk(1, {**meta, "header": "Install > Wiring"}).label == "Deck, Install > Wiring"
    assert Citation.of_chunk(1, {**meta, "page": 2}).url is None  # a file, not a URL: nothing to link


def test_with_ocr_off_a_scanned_pdf_fails_with_the_reason_and_text_pdfs_keep_their_pages():
    with pytest.raises(ConversionError, match="no text layer .* OCR is off"):
        convert_bytes(scanned_pdf(SCANNED_MANUAL_PAGES[:1]), ".pdf", ocr=OcrOptions(enabled=False))
    from fpdf import FPDF

    pdf = FPDF()
    for text in ("First page of the HL-R2 relay manual.", "The HL-R2 relay coil draws 35 mA at 24 V."):
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.multi_cell(0, 8, text)
    converted = convert_bytes(bytes(pdf.output()), ".pdf", ocr=OcrOptions(enabled=False))
    assert [p.meta for p in converted.parts] == [{"page": 1}, {"page": 2}] and converted.ocr_pages == 0
    assert "35 mA" in converted.parts[1].text


@pytest.mark.parametrize("suffix, data, reason", [
    (".docx", b"PK\x03\x04", "not a readable Word"),
    (".pptx", b"plain text", "not a readable PowerPoint"),
    (".epub", b"plain text", "not a readable EPUB"),
    (".eml", b"just some words\n", "not an e-mail message"),
])
def test_unreadable_files_say_why(suffix: str, data: bytes, reason: str):
    with pytest.raises(ConversionError, match=reason):
        convert_bytes(data, suffix)


def test_an_attachment_that_cannot_be_read_leaves_the_mail_indexed(tmp_path: Path, caplog):
    mail = write_eml(tmp_path / "m.eml", ("broken.xlsx", b"not a workbook"))
    converted = convert_bytes(mail.read_bytes(), ".eml")
    assert len(converted.parts) == 1 and "RV-5120" in converted.parts[0].text
    assert converted.skipped and converted.skipped[0][0] == "broken.xlsx"
