"""Files to Haystack Documents, one failure reason per file.

Haystack's stock converters log a warning and skip a file that fails; an operator indexing a
folder needs to be told which file failed and why, while the rest is indexed. This component
converts Markdown and text (kept as Markdown: its headings and tables drive the splitter),
HTML (main content through trafilatura, as Markdown), PDF (pypdf, one Document per page; pages
without a text layer read by OCR, see ``pipelines.components.ocr``), CSV, and the formats of
``pipelines.components.office`` (Word, Excel, PowerPoint, e-mail, EPUB), and returns the failures
next to the documents.

A file may become several Documents of the one document version (``meta.doc_id``): its pages,
sheets, slides, chapters or attachments. Each carries where it sits in the file (``page``,
``slide``, ``sheet``), which the splitter passes to every chunk and a citation shows.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ByteStream

from pipelines.components import office
from pipelines.components.office import ConversionError, Part
from pipelines.text import detect_language

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {".md", ".markdown", ".txt"}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}
CSV_SUFFIXES = {".csv"}
OFFICE_SUFFIXES = {".docx", ".xlsx", ".pptx", ".eml", ".msg", ".epub"}
#: Zip containers (checked for what they inflate to before their parser opens them), by their reasons' name.
ZIP_KINDS = {".docx": "Word (.docx)", ".xlsx": "Excel (.xlsx)", ".pptx": "PowerPoint (.pptx)", ".epub": "EPUB"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES | CSV_SUFFIXES | OFFICE_SUFFIXES
#: A PDF page with fewer characters in its text layer than this is taken for a scan.
MIN_PAGE_CHARS = 20

__all__ = ["ConversionError", "Converted", "Failure", "FileToDocument", "FileLimits", "OcrOptions", "SUPPORTED_SUFFIXES",
           "convert_bytes"]


@dataclass
class Failure:
    source: str
    reason: str


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without BOM), else GB18030, which Chinese Windows tools still write."""
    if b"\x00" in data[:8192]:
        raise ConversionError("binary file, not text")
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    raise ConversionError("not valid UTF-8 (or GB18030) text")


def _first_line_title(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:200]
    return ""


def _markdown_title(text: str) -> str:
    match = re.search(r"^#\s+(.+?)\s*#*\s*$", text, flags=re.MULTILINE)
    return match.group(1).strip() if match else _first_line_title(text)


def convert_html(data: bytes) -> tuple[str, str]:
    import trafilatura  # heavy (lxml and its language data): loaded by the first HTML file only

    html = decode_text(data)
    text = trafilatura.extract(
        html, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
    )
    if not text or not text.strip():
        raise ConversionError("no readable text in the HTML page")
    meta = trafilatura.extract_metadata(html)
    title = (meta.title if meta and meta.title else "") or _markdown_title(text)
    return text, title


@dataclass(frozen=True)
class OcrOptions:
    """OCR of PDF pages without a text layer: off, or on at ``dpi`` for at most ``max_pages`` per file."""

    enabled: bool = True
    dpi: int = 200
    max_pages: int = 300


@dataclass(frozen=True)
class FileLimits:
    """What one file may cost: a zip container's inflated size (``max_inflated_mb``) and ratio to its own
    size (``max_zip_ratio``), checked before parsing; the characters its text may have (``max_chars``) and
    the chunks it may make (``max_chunks``, checked by the splitter)."""

    max_inflated_mb: float = 100
    max_zip_ratio: float = 100
    max_chars: int = 10_000_000
    max_chunks: int = 20_000


def convert_pdf(data: bytes, ocr: OcrOptions) -> Converted:
    """One part per page with its ``page`` number (1-based); scanned pages read by OCR (``ocr: True``)."""
    from pypdf import PdfReader  # loaded by the first PDF only, as each format's parser is
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
        info_title = (reader.metadata.title if reader.metadata else None) or ""
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise ConversionError(f"not a readable PDF ({type(exc).__name__}: {exc})") from exc
    scanned = [i for i, text in enumerate(pages) if len(text.strip()) < MIN_PAGE_CHARS]
    read_by_ocr: set[int] = set()
    seconds = 0.0
    if scanned and ocr.enabled:
        if len(scanned) > ocr.max_pages:
            raise ConversionError(f"{len(scanned)} pages without a text layer; OCR reads at most {ocr.max_pages} "
                                  "per file (indexing.ocr.max_pages)")
        from pipelines.components.ocr import ocr_pdf_pages  # onnxruntime behind it: scanned pages only

        try:
            texts, stats = ocr_pdf_pages(data, scanned, dpi=ocr.dpi)
        except Exception as exc:  # noqa: BLE001 - PDFium and the OCR engine raise their own types
            raise ConversionError(f"OCR of the scanned pages failed ({type(exc).__name__}: {exc})") from exc
        seconds = stats.seconds
        for i, text in texts.items():
            if len(text.strip()) > len(pages[i].strip()):
                pages[i] = text
                read_by_ocr.add(i)
    parts = [Part(text.strip(), {"page": i + 1, **({"ocr": True} if i in read_by_ocr else {})})
             for i, text in enumerate(pages) if text.strip()]
    if not parts:
        if scanned and not ocr.enabled:
            raise ConversionError("the PDF has no text layer (scanned pages) and OCR is off (indexing.ocr.enabled)")
        raise ConversionError("the PDF has no extractable text")
    return Converted(parts, str(info_title).strip() or _first_line_title(parts[0].text), "pdf",
                     pages=len(pages), ocr_seconds=seconds)


def convert_csv(data: bytes) -> str:
    """A CSV file (comma, semicolon or tab separated) as one Markdown table: the splitter keeps its
    rows whole with the header, and the table's rows become facts."""
    text = decode_text(data)
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = [[cell.strip().replace("|", "/").replace("\n", " ") for cell in row]
            for row in csv.reader(io.StringIO(text), dialect) if any(c.strip() for c in row)]
    if len(rows) < 2:
        raise ConversionError("the CSV file has no rows under its header")
    width = len(rows[0])
    if width < 2 or any(len(r) != width for r in rows):
        raise ConversionError(f"not a table: rows must all have the header's {width} columns (at least 2)")
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


@dataclass
class Converted:
    """A file as text: its parts (one Document each), title (may be empty) and format name."""

    parts: list[Part]
    title: str
    format: str
    #: Attachments (of an e-mail) that could not be read: (name, reason); the rest is indexed.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: A PDF's page count, and the seconds OCR took for its scanned pages.
    pages: int = 0
    ocr_seconds: float = 0.0

    @property
    def ocr_pages(self) -> int:
        return sum(1 for p in self.parts if p.meta.get("ocr"))


def _mail(data: bytes, suffix: str, ocr: OcrOptions, limits: FileLimits, depth: int) -> Converted:
    if suffix == ".eml":
        text, subject, attachments = office.read_eml(data, convert_html)
    else:
        text, subject, attachments = office.read_msg(data)
    converted = Converted([Part(text)], subject, suffix.lstrip("."))
    for attachment in attachments:
        att_suffix = PurePath(attachment.name).suffix.lower()
        if att_suffix not in SUPPORTED_SUFFIXES:
            continue  # pictures, signatures, calendar invites: nothing to answer from
        try:
            inner = convert_bytes(attachment.data, att_suffix, ocr=ocr, limits=limits, depth=depth + 1)
        except ConversionError as exc:
            converted.skipped.append((attachment.name, str(exc)))
            continue
        # An attachment is cited as itself (``attachment``, which citations show), not as the mail that carried it.
        for part in inner.parts:
            part.meta = {"format": inner.format, **part.meta, "title": attachment.name, "attachment": attachment.name}
        converted.parts += inner.parts
        converted.skipped += [(f"{attachment.name} > {name}", why) for name, why in inner.skipped]
    return converted


def convert_bytes(data: bytes, suffix: str, *, ocr: OcrOptions = OcrOptions(), limits: FileLimits = FileLimits(),
                  depth: int = 0) -> Converted:
    """A file's bytes as text; raises ``ConversionError`` with the reason."""
    suffix = suffix.lower()
    if not data.strip():
        raise ConversionError("the file is empty")
    if suffix in ZIP_KINDS:
        office.check_zip(data, ZIP_KINDS[suffix], max_inflated=int(limits.max_inflated_mb * 1024 * 1024),
                         max_ratio=limits.max_zip_ratio)
    converted = _convert(data, suffix, ocr, limits, depth)
    chars = sum(len(part.text) for part in converted.parts)
    if chars > limits.max_chars:
        raise ConversionError(f"refused: its text has {chars:,} characters, over the {limits.max_chars:,} limit "
                              "(indexing.max_document_chars)")
    return converted


def _convert(data: bytes, suffix: str, ocr: OcrOptions, limits: FileLimits, depth: int) -> Converted:
    if suffix in TEXT_SUFFIXES:
        text = decode_text(data)
        if not text.strip():
            raise ConversionError("the file is empty")
        title = _markdown_title(text) if suffix != ".txt" else _first_line_title(text)
        return Converted([Part(text)], title, "markdown" if suffix != ".txt" else "text")
    if suffix in HTML_SUFFIXES:
        text, title = convert_html(data)
        return Converted([Part(text)], title, "html")
    if suffix in PDF_SUFFIXES:
        return convert_pdf(data, ocr)
    if suffix in CSV_SUFFIXES:
        return Converted([Part(convert_csv(data))], "", "csv")  # titled by the file name
    if suffix == ".docx":
        return Converted(*office.convert_docx(data), "docx")
    if suffix == ".xlsx":
        return Converted(*office.convert_xlsx(data), "xlsx")
    if suffix == ".pptx":
        return Converted(*office.convert_pptx(data), "pptx")
    if suffix == ".epub":
        return Converted(*office.convert_epub(data, convert_html), "epub")
    if suffix in (".eml", ".msg"):
        if depth > 2:
            raise ConversionError("e-mails nested more than 2 deep")
        return _mail(data, suffix, ocr, limits, depth)
    raise ConversionError(f"unsupported file type {suffix or '(none)'}")


#: Formats whose text is Markdown: the splitter cuts them at their headings.
MARKDOWN_FORMATS = ("markdown", "html", "docx", "xlsx", "pptx", "epub", "eml", "msg")


@component
class FileToDocument:
    """Converts files to Documents (several per file: pages, sheets, slides, attachments); failures
    come back with reasons."""

    def __init__(self, max_file_mb: float = 20, ocr: OcrOptions | None = None, limits: FileLimits | None = None):
        self.max_bytes = int(max_file_mb * 1024 * 1024)
        self.ocr = ocr or OcrOptions()
        self.limits = limits or FileLimits()

    @component.output_types(documents=list[Document], failures=list[Failure])
    def run(self, sources: list[str | Path | ByteStream], meta: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """:param sources: file paths, or ``ByteStream`` s already read (a fetched page), whose
        ``meta["suffix"]`` (else ``meta["file_path"]``) names the format and ``meta["source"]`` the
        name failures are reported under. :param meta: per-source metadata merged into each document."""
        documents: list[Document] = []
        failures: list[Failure] = []
        for i, source in enumerate(sources):
            data: bytes | None = None
            if isinstance(source, ByteStream):
                path = Path(str(source.meta.get("file_path") or "document"))
                suffix = str(source.meta.get("suffix") or path.suffix)
                data = source.data
                source = str(source.meta.get("source") or path)  # noqa: PLW2901 - the name failures carry
            else:
                path = Path(source)
                suffix = path.suffix
            try:
                size = len(data) if data is not None else path.stat().st_size
                if size > self.max_bytes:
                    raise ConversionError(f"file too large ({size / 1e6:.1f} MB > {self.max_bytes / 1e6:.0f} MB limit)")
                converted = convert_bytes(data if data is not None else path.read_bytes(), suffix, ocr=self.ocr,
                                          limits=self.limits)
            except ConversionError as exc:
                failures.append(Failure(str(source), str(exc)))
                continue
            except OSError as exc:
                failures.append(Failure(str(source), f"cannot read the file ({exc.strerror or exc})"))
                continue
            for name, reason in converted.skipped:
                log.warning("%s: attachment %s not indexed: %s", source, name, reason)
            if converted.ocr_pages:
                log.info("OCR %s: %d of %d pages read in %.1f s (%.2f s per page)", source, converted.ocr_pages,
                         converted.pages, converted.ocr_seconds, converted.ocr_seconds / converted.ocr_pages)
            extra = meta[i] if meta else {}
            title = converted.title or path.stem
            for part in converted.parts:
                documents.append(Document(content=part.text, meta={
                    "title": title, "format": converted.format, "language": detect_language(part.text),
                    **extra, **part.meta}))
        return {"documents": documents, "failures": failures}
