"""Files to Haystack Documents, one failure reason per file.

Haystack's stock converters log a warning and skip a file that fails; an operator indexing a
folder needs to be told which file failed and why, while the rest is indexed. This component
converts Markdown and text (kept as Markdown: its headings and tables drive the splitter),
HTML (main content through trafilatura, as Markdown) and PDF (pypdf), and returns the failures
next to the documents.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ByteStream

from pipelines.text import detect_language

TEXT_SUFFIXES = {".md", ".markdown", ".txt"}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}
CSV_SUFFIXES = {".csv"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES | CSV_SUFFIXES


class ConversionError(Exception):
    """A file that cannot become text; the message is shown to the operator as the reason."""


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
    import trafilatura

    html = decode_text(data)
    text = trafilatura.extract(
        html, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
    )
    if not text or not text.strip():
        raise ConversionError("no readable text in the HTML page")
    meta = trafilatura.extract_metadata(html)
    title = (meta.title if meta and meta.title else "") or _markdown_title(text)
    return text, title


def convert_pdf(data: bytes) -> tuple[str, str]:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
        info_title = (reader.metadata.title if reader.metadata else None) or ""
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise ConversionError(f"not a readable PDF ({type(exc).__name__}: {exc})") from exc
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise ConversionError("the PDF has no extractable text (scanned pages need OCR)")
    return text, str(info_title).strip() or _first_line_title(text)


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


def convert_bytes(data: bytes, suffix: str) -> tuple[str, str, str]:
    """(text, title, format) of a file's bytes; raises ``ConversionError`` with the reason."""
    suffix = suffix.lower()
    if not data.strip():
        raise ConversionError("the file is empty")
    if suffix in TEXT_SUFFIXES:
        text = decode_text(data)
        if not text.strip():
            raise ConversionError("the file is empty")
        title = _markdown_title(text) if suffix != ".txt" else _first_line_title(text)
        return text, title, "markdown" if suffix != ".txt" else "text"
    if suffix in HTML_SUFFIXES:
        text, title = convert_html(data)
        return text, title, "html"
    if suffix in PDF_SUFFIXES:
        text, title = convert_pdf(data)
        return text, title, "pdf"
    if suffix in CSV_SUFFIXES:
        return convert_csv(data), "", "csv"  # titled by the file name
    raise ConversionError(f"unsupported file type {suffix or '(none)'}")


@component
class FileToDocument:
    """Converts files (md, txt, html, pdf, csv) to one Document each; failures come back with reasons."""

    def __init__(self, max_file_mb: float = 20):
        self.max_bytes = int(max_file_mb * 1024 * 1024)

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
                text, title, fmt = convert_bytes(data if data is not None else path.read_bytes(), suffix)
            except ConversionError as exc:
                failures.append(Failure(str(source), str(exc)))
                continue
            except OSError as exc:
                failures.append(Failure(str(source), f"cannot read the file ({exc.strerror or exc})"))
                continue
            extra = meta[i] if meta else {}
            documents.append(
                Document(
                    content=text,
                    meta={"title": title or path.stem, "format": fmt, "language": detect_language(text), **extra},
                )
            )
        return {"documents": documents, "failures": failures}
