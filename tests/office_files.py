"""Real files for the format tests, written with the formats' own writer libraries.

Each file holds facts found nowhere else in the sample knowledge base (the HL-X900 gearbox, the
RV-40 valve...), so a question about one can only be answered from that file.
"""

from __future__ import annotations

import io
from email.message import EmailMessage
from pathlib import Path

CJK_FONT = Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")


def write_docx(path: Path) -> Path:
    import docx

    document = docx.Document()
    document.core_properties.title = "HL-X900 Gearbox Service Manual"
    document.add_heading("HL-X900 Gearbox Service Manual", level=0)
    document.add_paragraph("This manual covers the HL-X900 helical gearbox.")
    document.add_heading("Lubrication", level=1)
    document.add_paragraph("Change the HL-X900 gear oil every 6,500 operating hours. Use ISO VG 320 synthetic oil.")
    document.add_heading("Bolt torques", level=2)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "Bolt"
    table.rows[0].cells[1].text = "Torque"
    for bolt, torque in (("M12 housing bolt", "86 Nm"), ("M16 foot bolt", "210 Nm")):
        row = table.add_row()
        row.cells[0].text, row.cells[1].text = bolt, torque
    document.add_heading("Storage", level=1)
    document.add_paragraph("Store the gearbox below 40 °C with the breather plug closed.")
    document.save(path)
    return path


def write_xlsx(path: Path) -> Path:
    import openpyxl

    book = openpyxl.Workbook()
    params = book.active
    params.title = "Parameters"
    params.append(["Parameter", "Name", "Default", "Unit"])
    params.append(["P7-31", "Brake chopper threshold", 764, "V"])
    params.append(["P7-32", "Fan start temperature", 47, "°C"])
    parts = book.create_sheet("Spare parts")
    parts.append(["Part number", "Description", "Price"])
    parts.append(["SP-88213", "RV-40 valve seal kit", "38 EUR"])
    parts.append(["SP-88214", "RV-40 valve actuator", "412 EUR"])
    book.save(path)
    return path


def write_pptx(path: Path) -> Path:
    from pptx import Presentation

    deck = Presentation()
    layout = deck.slide_layouts[1]  # title and content
    slides = [
        ("Commissioning training", "Day one: safety and wiring", ""),
        ("Encoder alignment", "Run the auto-tune with the motor uncoupled.",
         "Trainer note: the encoder offset must be re-learned after every HL-Q7 motor swap."),
        ("Questions", "Ask the trainer.", ""),
    ]
    for title, body, notes in slides:
        slide = deck.slides.add_slide(layout)
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        if notes:
            slide.notes_slide.notes_text_frame.text = notes
    deck.save(path)
    return path


def write_eml(path: Path, attachment: tuple[str, bytes] | None = None) -> Path:
    message = EmailMessage()
    message["Subject"] = "Service bulletin SB-2291: RV-40 valve recall"
    message["From"] = "Quality Team <quality@hengli-drives.example>"
    message["To"] = "service@hengli-drives.example"
    message["Date"] = "Mon, 02 Nov 2026 09:30:00 +0000"
    message.set_content("All RV-40 valves with serial numbers below RV-5120 must be replaced free of charge.\n"
                        "Order the replacement through the bulletin form.")
    if attachment is not None:
        name, data = attachment
        message.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    path.write_bytes(bytes(message))
    return path


def write_epub(path: Path) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("hl-field-guide")
    book.set_title("HL Field Guide")
    book.set_language("en")
    chapters = []
    for i, (title, text) in enumerate([
        ("Site survey", "Measure the mains impedance before installing an HL-D50 drive."),
        ("Cable lengths", "Motor cables longer than 85 metres on the HL-D50 need an output reactor."),
    ], start=1):
        chapter = epub.EpubHtml(title=title, file_name=f"chap_{i}.xhtml", lang="en")
        chapter.content = f"<html><body><h1>{title}</h1><p>{text}</p></body></html>"
        book.add_item(chapter)
        chapters.append(chapter)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(path), book)
    return path


def page_image(lines: list[str], *, size: tuple[int, int] = (1240, 1754), font_px: int = 40):
    """An A4 page at 150 dpi with ``lines`` drawn in black: what a scanner gives."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.truetype(str(CJK_FONT), font_px)
    y = 150
    for line in lines:
        draw.text((120, y), line, fill="black", font=font)
        y += int(font_px * 1.8)
    return image


def scanned_pdf(pages: list[list[str]]) -> bytes:
    """A PDF whose pages are images of text only: no text layer at all."""
    images = [page_image(lines) for lines in pages]
    out = io.BytesIO()
    images[0].save(out, format="PDF", save_all=True, append_images=images[1:], resolution=150)
    return out.getvalue()


SCANNED_MANUAL_PAGES = [
    ["HL-K3 Pump Manual", "Chapter 1: Safety", "Wear gloves when opening the pump housing."],
    ["HL-K3 Pump Manual", "Chapter 2: Seals", "Replace the HL-K3 shaft seal every 9,000 hours."],
    ["HL-K3 泵使用手册", "第三章 故障", "出现 K3-17 报警时，请检查进口滤网是否堵塞。"],
]
