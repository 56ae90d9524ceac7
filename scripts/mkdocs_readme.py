"""The README is the documentation site's front page: `mkdocs build` takes it as `index.md`, its links to
`docs/*.md` made relative to the site, so strict mode checks its links and anchors as it checks every
page's (a README link to anything but a page, or to a heading that is not there, fails `make docs`)."""

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent.parent / "README.md"


def on_files(files: Files, config) -> Files:
    text = re.sub(r"\]\(docs/", "](", README.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
