"""Reading scanned PDF pages (no text layer) with OCR, offline, Chinese and English.

RapidOCR (``rapidocr-onnxruntime``) runs PaddleOCR's PP-OCRv4 detection and recognition models on
ONNX Runtime; the models ship inside the wheel, so nothing is downloaded at run time, and the one
recognition model reads Chinese and English alike. Pages are rendered with PDFium (``pypdfium2``),
which also draws pages whose text is vector outlines, where pulling embedded images would miss it.

The engine is loaded once per process on first use (about a second); pages are read one at a time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_engine: Any = None
_engine_lock = threading.Lock()


def _ocr_engine() -> Any:
    global _engine
    with _engine_lock:
        if _engine is None:
            from rapidocr_onnxruntime import RapidOCR  # onnxruntime: heavy, and only for scanned pages

            started = time.perf_counter()
            _engine = RapidOCR()
            log.info("OCR engine loaded in %.1f s", time.perf_counter() - started)
        return _engine


@dataclass
class OcrStats:
    """What OCR did for one file: for the log line and the per-format report."""

    pages: int = 0
    seconds: float = 0.0

    @property
    def seconds_per_page(self) -> float:
        return self.seconds / self.pages if self.pages else 0.0


def _lines(result: list[Any]) -> list[str]:
    """RapidOCR's boxes in reading order: top to bottom, boxes whose middles share a line left to right."""
    boxes = []
    for box, text, _score in result:
        ys = [p[1] for p in box]
        xs = [p[0] for p in box]
        boxes.append((min(ys), max(ys), min(xs), text.strip()))
    boxes.sort()
    lines: list[list[tuple[float, float, float, str]]] = []
    for box in boxes:
        if lines:
            top, bottom = lines[-1][0][0], lines[-1][0][1]
            middle = (box[0] + box[1]) / 2
            if top <= middle <= bottom:
                lines[-1].append(box)
                continue
        lines.append([box])
    return [" ".join(b[3] for b in sorted(line, key=lambda b: b[2]) if b[3]) for line in lines]


def ocr_pdf_pages(data: bytes, page_numbers: list[int], *, dpi: int = 200) -> tuple[dict[int, str], OcrStats]:
    """The text OCR reads on ``page_numbers`` (0-based) of the PDF in ``data``, and the time it took."""
    import pypdfium2 as pdfium  # rendering pages for OCR only

    engine = _ocr_engine()
    stats = OcrStats()
    texts: dict[int, str] = {}
    pdf = pdfium.PdfDocument(data)
    try:
        for number in page_numbers:
            started = time.perf_counter()
            page = pdf[number]
            try:
                image = page.render(scale=dpi / 72).to_numpy()
            finally:
                page.close()
            result, _ = engine(image)
            texts[number] = "\n".join(_lines(result or []))
            stats.pages += 1
            stats.seconds += time.perf_counter() - started
    finally:
        pdf.close()
    return texts, stats
