"""Issue 39, finding 9: Office and EPUB files are zips, and their parsers hold what they inflate (and a
tree of it) in memory: a 0.4 MB .docx inflating to 300 MB of XML held ``kbbot refresh`` at 3.2 GB. A zip
container is now refused before parsing when its members' declared sizes add up past
``indexing.max_inflated_mb`` or past ``indexing.max_zip_ratio`` times its size; a document is refused
whole past ``indexing.max_document_chars`` characters or ``indexing.max_document_chunks`` chunks; the
refresh reports the file and goes on."""

from __future__ import annotations

import io
import re
import struct
import zipfile
from pathlib import Path

import docx
import pytest
from haystack.dataclasses import ByteStream

from bot.runtime import build_runtime
from pipelines.components.converter import FileToDocument
from tests.conftest import make_settings
from tests.security.peak import allocation_peak

MB = 1024 * 1024
INFLATED = r"refused: it inflates to 300\.\d MB, over the 100 MB limit \(indexing.max_inflated_mb\)"
RATIO = r"refused: it inflates \d{3} times its size \(to 30\.\d MB\), over the limit of 100 \(indexing.max_zip_ratio\)"


def word_file(text: str = "Regrease the bearings every 3,000 hours.") -> bytes:
    out = io.BytesIO()
    document = docx.Document()
    document.add_paragraph(text)
    document.save(out)
    return out.getvalue()


def docx_bomb(inflated_mb: int, *, zip64: bool = True) -> bytes:
    """A real Word file whose body is ``inflated_mb`` MB of one long run of text, written in pieces (the
    test never holds it): deflate packs it about 800 times."""
    template = zipfile.ZipFile(io.BytesIO(word_file()))
    body = template.read("word/document.xml")
    head, tail = body.split(b"<w:body>")
    paragraph = b"<w:p><w:r><w:t>" + b"A" * 100_000 + b"</w:t></w:r></w:p>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as bomb:
        for info in template.infolist():
            if info.filename != "word/document.xml":
                bomb.writestr(info, template.read(info))
        with bomb.open("word/document.xml", "w", force_zip64=zip64) as member:
            member.write(head + b"<w:body>")
            for _ in range(inflated_mb * MB // len(paragraph)):
                member.write(paragraph)
            member.write(tail)
    return out.getvalue()


def lying(data: bytes, member: str, size: int) -> bytes:
    """``data`` with ``member``'s uncompressed size in its local and central headers set to ``size``."""
    name = member.encode()
    out = bytearray(data)
    # (signature, where the size is, where the name's length is, where the name is): APPNOTE 4.3.7, 4.3.12
    for signature, size_at, length_at, name_at in ((b"PK\x03\x04", 22, 26, 30), (b"PK\x01\x02", 24, 28, 46)):
        at = out.find(signature)
        while at >= 0:
            length = struct.unpack_from("<H", out, at + length_at)[0]
            if out[at + name_at:at + name_at + length] == name:
                struct.pack_into("<I", out, at + size_at, size)
            at = out.find(signature, at + 4)
    return bytes(out)


def convert(name: str, data: bytes, converter: FileToDocument | None = None) -> dict:
    result = (converter or FileToDocument()).run([ByteStream(data, meta={"file_path": name, "source": name})])
    return {"documents": result["documents"], "failures": {f.source: f.reason for f in result["failures"]}}


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = docx_bomb(300)
    assert len(data) < 500_000, "0.4 MB inflating to 300 MB, as the audit's"
    return data


@pytest.mark.parametrize("suffix", [".docx", ".xlsx", ".pptx", ".epub"])
def test_a_zip_bomb_is_refused_before_its_parser_opens_it(bomb: bytes, suffix: str):
    with allocation_peak() as peak:
        got = convert(f"bomb{suffix}", bomb)
    [(name, reason)] = got["failures"].items()
    assert name == f"bomb{suffix}" and re.fullmatch(INFLATED, reason), reason
    assert got["documents"] == []
    assert peak[0] < 50, f"{peak[0]:.0f} MB allocated"


def test_a_file_inflating_more_than_the_ratio_is_refused_under_the_size_limit():
    data = docx_bomb(30)  # 30 MB, under max_inflated_mb, in ~40 KB
    with allocation_peak() as peak:
        got = convert("dense.docx", data)
    [reason] = got["failures"].values()
    assert re.fullmatch(RATIO, reason), reason
    assert peak[0] < 50, f"{peak[0]:.0f} MB allocated"
    # An ordinary Word file, however repetitive (13 MB of text inflated from 21 KB), is read: a ratio says
    # nothing below 10 MB; at 100 MB (max_inflated_mb) no file is small enough to pass the ratio either.
    ordinary = convert("manual.docx", word_file("Regrease the bearings every 3,000 hours. " * 2000))
    assert ordinary["failures"] == {} and "3,000 hours" in ordinary["documents"][0].content


def test_a_member_inflating_past_its_declared_size_is_refused_in_bounded_memory():
    """Headers that declare 5 KB for 300 MB of XML pass the size check. Python's zipfile, which every reader
    reads through, refuses the member on its CRC, but only after inflating all of it at once."""
    data = lying(docx_bomb(300, zip64=False), "word/document.xml", 5000)
    assert sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(data)).infolist()) < MB
    with allocation_peak() as peak:
        got = convert("liar.docx", data)
    [reason] = got["failures"].values()
    assert reason == "not a readable Word (.docx) file (BadZipFile: Bad CRC-32 for file 'word/document.xml')", reason
    assert peak[0] < 50, f"{peak[0]:.0f} MB allocated"


def test_the_refresh_reports_each_refused_file_and_indexes_the_rest(tmp_path: Path, bomb: bytes):
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "bomb.docx").write_bytes(bomb)
    (folder / "dense.xlsx").write_bytes(docx_bomb(30))
    (folder / "long.md").write_text("# Long\n\n" + "Check the fan every month. " * 2000, encoding="utf-8")
    (folder / "many.md").write_text("# Many\n\n" + "".join(f"## Step {i}\n\nTighten bolt {i}.\n\n" for i in range(40)),
                                    encoding="utf-8")
    (folder / "manual.docx").write_bytes(word_file())
    (folder / "faq.md").write_text("# FAQ\n\nThe drive trips on E-004 when the heatsink overheats.\n", encoding="utf-8")
    settings = make_settings(tmp_path / "data")
    settings.indexing.max_document_chars = 50_000
    settings.indexing.max_document_chunks = 30
    runtime = build_runtime(settings)
    with allocation_peak() as peak:
        report = runtime.indexer.index([folder])
    reasons = {Path(f.source).name: f.reason for f in report.failed}
    assert set(reasons) == {"bomb.docx", "dense.xlsx", "long.md", "many.md"}, reasons
    assert re.fullmatch(INFLATED, reasons["bomb.docx"]) and re.fullmatch(RATIO, reasons["dense.xlsx"])
    assert re.fullmatch(r"refused: its text has 54,0\d\d characters, over the 50,000 limit "
                        r"\(indexing.max_document_chars\)", reasons["long.md"])
    assert reasons["many.md"] == "refused: it makes 40 chunks, over the 30 limit (indexing.max_document_chunks)"
    assert sorted(Path(s).name for s in report.added) == ["faq.md", "manual.docx"]
    assert report.formats["docx"].failed == 1 and report.formats["md"].failed == 2
    assert peak[0] < 100, f"{peak[0]:.0f} MB allocated"
