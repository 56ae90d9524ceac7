"""What the Google Drive tests share: Office files made in memory (what Drive exports Google Docs,
Sheets and Slides to) and a Drive source entry pointed at the fake (``tests/fakes/gdrive.py``)."""

from __future__ import annotations

import io

import pytest

from bot.settings import SourceSettings
from pipelines.sources.gdrive import DriveSettings
from tests.fakes.gdrive import FakeDrive, service_account_json

KEY_ENV = "KBBOT_TEST_GDRIVE_KEY"


def docx(title: str, *paragraphs: str) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    document.add_heading(title, level=0)
    for text in paragraphs:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx(rows: list[list[object]]) -> bytes:
    import openpyxl

    book = openpyxl.Workbook()
    for row in rows:
        book.active.append(row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def pptx(*slides: tuple[str, str]) -> bytes:
    from pptx import Presentation

    deck = Presentation()
    for title, body in slides:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def drive_source(server: FakeDrive, folder: str, monkeypatch: pytest.MonkeyPatch, *, name: str = "drive",
                 **options: object) -> SourceSettings:
    monkeypatch.setenv(KEY_ENV, service_account_json(server))
    options.setdefault("max_retry_wait_s", 5)
    settings = DriveSettings(folder=folder, api_url=server.base_url, service_account_env=KEY_ENV, **options)
    return SourceSettings(name=name, gdrive=settings, interval="1h")
