"""Office files, e-mails and e-books as Markdown parts, read with their own well-kept libraries.

Each reader turns a file into ``Part`` s: Markdown text (so the splitter sees headings and tables, and
the writer reads table facts) plus the meta that tells a citation where in the file it points
(``sheet`` of a workbook, ``slide`` of a deck). A Word document keeps its heading levels and its
tables; a workbook is one part per sheet, its first non-empty row the table's header (repeated in
every chunk of rows by the splitter); a deck one part per slide (title, text, tables, speaker notes);
an e-mail its subject, sender, date and body, each attachment converted as a part of its own (titled
by the attachment's name); an EPUB one part per chapter.

Every reader raises ``ConversionError`` with the reason a person can act on.
"""

from __future__ import annotations

import io
import logging
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any

log = logging.getLogger(__name__)


class ConversionError(Exception):
    """A file that cannot become text; the message is shown to the operator as the reason."""


@dataclass
class Part:
    """A piece of one file, indexed as its own Haystack Document (the same document version)."""

    text: str
    #: Extra chunk meta: ``page``, ``slide``, ``sheet``, ``ocr``; an attachment's ``title`` and ``format``.
    meta: dict[str, Any] = field(default_factory=dict)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return " ".join(str(value).replace("|", "/").split())


def markdown_table(rows: Iterable[Iterable[Any]]) -> str:
    """Rows (the first is the header) as a Markdown table; empty rows and trailing empty columns dropped."""
    grid = [[_cell(v) for v in row] for row in rows]
    grid = [row for row in grid if any(row)]
    if not grid:
        return ""
    width = max(max((i + 1 for i, v in enumerate(row) if v), default=0) for row in grid)
    grid = [(row + [""] * width)[:width] for row in grid]
    lines = ["| " + " | ".join(grid[0]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(row) + " |" for row in grid[1:]]
    return "\n".join(lines)


def _open_zip_error(kind: str, exc: Exception) -> ConversionError:
    return ConversionError(f"not a readable {kind} file ({type(exc).__name__}: {exc})")


#: Below this inflated size no ratio matters: nothing that small costs memory (a short, repetitive table
#: compresses more than 100 times).
_RATIO_FLOOR = 10 * 1024 * 1024
_MB = 1024 * 1024
_PIECE = 1 << 16


def check_zip(data: bytes, kind: str, *, max_inflated: int, max_ratio: float) -> None:
    """Refuses a ``kind`` of zip container (Word, Excel, PowerPoint, EPUB) that would inflate past ``max_inflated``
    bytes, or more than ``max_ratio`` times its own size, before a parser opens it: their parsers hold the
    XML they inflate, and a tree of it, in memory (a 0.4 MB file inflating to 300 MB of XML took 3.2 GB).

    The sizes are those the central directory declares. A member may hold more than it declares: Python's
    ``zipfile`` (which every reader here reads through) cuts it to the declared size only after inflating
    all of its data at once (631 MB for 300 MB declared as 5 KB). So every member is read through here in
    small pieces first, which stops at its declared size and checks its CRC: one that lies is refused."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            inflated = sum(info.file_size for info in members)
            if inflated > max_inflated:
                raise ConversionError(f"refused: it inflates to {inflated / _MB:.1f} MB, over the "
                                      f"{max_inflated / _MB:g} MB limit (indexing.max_inflated_mb)")
            if inflated > _RATIO_FLOOR and inflated > max_ratio * len(data):
                raise ConversionError(f"refused: it inflates {inflated / len(data):.0f} times its size (to "
                                      f"{inflated / _MB:.1f} MB), over the limit of {max_ratio:g} "
                                      "(indexing.max_zip_ratio)")
            for info in members:
                with archive.open(info) as member:
                    while member.read(_PIECE):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError, RuntimeError,
            NotImplementedError) as exc:  # corrupt, truncated, encrypted, an unknown compression method
        raise _open_zip_error(kind, exc) from exc


# --- Word -------------------------------------------------------------------------------------------
def _heading_level(style_name: str) -> int | None:
    name = (style_name or "").strip().lower()
    if name == "title":
        return 1
    if name.startswith("heading"):
        digits = name.removeprefix("heading").strip()
        return min(int(digits), 6) if digits.isdigit() else 1
    return None


def convert_docx(data: bytes) -> tuple[list[Part], str]:
    """A .docx as one Markdown part: heading styles become ``#`` levels, tables Markdown tables."""
    import docx  # each office format's parser is loaded by the first file of that format only
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise _open_zip_error("Word (.docx)", exc) from exc
    lines: list[str] = []
    title = (document.core_properties.title or "").strip()
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = " ".join(block.text.split())
            if not text:
                continue
            level = _heading_level(block.style.name if block.style is not None else "")
            if level is not None:
                title = title or text
                lines += ["", "#" * level + " " + text, ""]
            else:
                lines += [text, ""]
        elif isinstance(block, Table):
            table = markdown_table([cell.text for cell in row.cells] for row in block.rows)
            if table:
                lines += ["", table, ""]
    text = "\n".join(lines).strip()
    if not text:
        raise ConversionError("the Word document has no text")
    return [Part(text + "\n")], title


# --- Excel ------------------------------------------------------------------------------------------
def convert_xlsx(data: bytes) -> tuple[list[Part], str]:
    """A workbook as one part per non-empty sheet: ``## <sheet>`` and its rows as a Markdown table."""
    import openpyxl  # loaded by the first file of its format, as every reader here is
    from openpyxl.utils.exceptions import InvalidFileException

    try:
        book = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise _open_zip_error("Excel (.xlsx)", exc) from exc
    parts: list[Part] = []
    try:
        for sheet in book.worksheets:
            table = markdown_table(sheet.iter_rows(values_only=True))
            if table:
                parts.append(Part(f"## {sheet.title}\n\n{table}\n", {"sheet": sheet.title}))
        title = (book.properties.title or "").strip()
    finally:
        book.close()
    if not parts:
        raise ConversionError("the workbook has no cells with values")
    return parts, title


# --- PowerPoint -------------------------------------------------------------------------------------
def convert_pptx(data: bytes) -> tuple[list[Part], str]:
    """A deck as one part per slide: ``## <title>`` (else ``Slide n``), its text and tables, its notes."""
    from pptx import Presentation  # loaded by the first file of its format
    from pptx.exc import PackageNotFoundError

    try:
        deck = Presentation(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise _open_zip_error("PowerPoint (.pptx)", exc) from exc
    parts: list[Part] = []
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        heading = " ".join(title_shape.text_frame.text.split()) if title_shape is not None else ""
        body: list[str] = []
        for shape in slide.shapes:
            if title_shape is not None and shape.shape_id == title_shape.shape_id:
                continue
            if shape.has_text_frame:
                body += [" ".join(p.text.split()) for p in shape.text_frame.paragraphs if p.text.strip()]
            elif getattr(shape, "has_table", False) and shape.has_table:
                body += ["", markdown_table([c.text for c in row.cells] for row in shape.table.rows), ""]
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame.text.strip() if slide.notes_slide.notes_text_frame else ""
            if notes:
                body += ["", "Notes: " + " ".join(notes.split())]
        if not heading and not any(line.strip() for line in body):
            continue
        text = f"## {heading or f'Slide {number}'}\n\n" + "\n".join(body).strip() + "\n"
        parts.append(Part(text, {"slide": number}))
    if not parts:
        raise ConversionError("the presentation has no text")
    title = (deck.core_properties.title or "").strip()
    return parts, title


# --- EPUB -------------------------------------------------------------------------------------------
def convert_epub(data: bytes, html_to_markdown: Callable[[bytes], tuple[str, str]]) -> tuple[list[Part], str]:
    """An e-book as one part per chapter (its XHTML documents in reading order)."""
    import ebooklib  # loaded by the first file of its format
    from ebooklib import epub

    try:
        book = epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
    except (epub.EpubException, zipfile.BadZipFile, KeyError, ValueError, AttributeError) as exc:
        raise _open_zip_error("EPUB", exc) from exc
    order = [book.get_item_with_id(idref) for idref, _ in book.spine]
    # The navigation page (a table of contents) repeats every chapter title: no content of its own.
    items = [i for i in order if i is not None and i.get_type() == ebooklib.ITEM_DOCUMENT
             and not isinstance(i, epub.EpubNav) and "nav" not in (getattr(i, "properties", None) or [])]
    parts: list[Part] = []
    for item in items:
        try:
            text, _ = html_to_markdown(item.get_content())
        except ConversionError:
            continue  # a cover or an empty navigation page
        parts.append(Part(text))
    if not parts:
        raise ConversionError("the EPUB has no readable chapters")
    titles = book.get_metadata("DC", "title")
    return parts, (titles[0][0] if titles else "").strip()


# --- e-mail -----------------------------------------------------------------------------------------
@dataclass
class Attachment:
    name: str
    data: bytes


def _mail_text(subject: str, sender: str, date: str, body: str) -> str:
    head = [f"# {subject or '(no subject)'}", ""]
    head += [f"From: {sender}"] if sender else []
    head += [f"Date: {date}"] if date else []
    return "\n".join(head) + "\n\n" + body.strip() + "\n"


def read_eml(data: bytes, html_to_markdown: Callable[[bytes], tuple[str, str]]) -> tuple[str, str, list[Attachment]]:
    """(Markdown text, subject, attachments) of an RFC 5322 message."""
    message = BytesParser(policy=policy.default).parsebytes(data)
    if not isinstance(message, EmailMessage) or not (message["subject"] or message["from"]):
        raise ConversionError("not an e-mail message (no Subject or From header)")
    body_part = message.get_body(preferencelist=("plain", "html"))
    body = ""
    if body_part is not None:
        content = body_part.get_content()
        if body_part.get_content_subtype() == "html":
            try:
                body, _ = html_to_markdown(content.encode("utf-8") if isinstance(content, str) else content)
            except ConversionError:
                body = ""
        else:
            body = content if isinstance(content, str) else content.decode("utf-8", "replace")
    attachments = []
    for part in message.iter_attachments():
        name = part.get_filename()
        payload = part.get_payload(decode=True)
        if name and payload:
            attachments.append(Attachment(name, payload))
    subject = str(message["subject"] or "").strip()
    return _mail_text(subject, str(message["from"] or ""), str(message["date"] or ""), body), subject, attachments


def read_msg(data: bytes) -> tuple[str, str, list[Attachment]]:
    """(Markdown text, subject, attachments) of an Outlook .msg file."""
    import extract_msg  # loaded by the first file of its format

    try:
        message = extract_msg.openMsg(data)
    except Exception as exc:  # noqa: BLE001 - extract-msg raises many types for a broken file
        raise ConversionError(f"not a readable Outlook (.msg) file ({type(exc).__name__}: {exc})") from exc
    try:
        attachments = []
        for att in getattr(message, "attachments", []):
            name = getattr(att, "longFilename", None) or getattr(att, "shortFilename", None)
            payload = getattr(att, "data", None)
            if name and isinstance(payload, bytes | bytearray):
                attachments.append(Attachment(name, bytes(payload)))
        subject = (message.subject or "").strip()
        text = _mail_text(subject, message.sender or "", str(message.date or ""), message.body or "")
    finally:
        message.close()
    return text, subject, attachments
