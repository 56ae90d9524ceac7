"""Attacks on folder sources (issue 15, finding 3): a symbolic link out of the knowledge folder, and a
huge file that used to be read whole before its size was checked."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.sources.folder import FolderSource
from pipelines.store import DocRecord
from tests.security.peak import allocation_peak


def items(source: FolderSource) -> dict[str, object]:
    return {Path(item.source).name: item for item in source.scan({}, "default")}


def test_a_symlink_out_of_the_folder_is_not_followed_and_is_reported(tmp_path: Path):
    secrets = tmp_path / "home"
    secrets.mkdir()
    (secrets / "passwords.md").write_text("# Passwords\n\nroot: hunter2\n")
    (secrets / "notes").mkdir()
    (secrets / "notes" / "plan.md").write_text("# Plan\n\nconfidential\n")
    docs = tmp_path / "kb"
    docs.mkdir()
    (docs / "manual.md").write_text("# Manual\n\nRegrease every 3,000 hours.\n")
    (docs / "shared.md").symlink_to(secrets / "passwords.md")
    (docs / "linked-folder").symlink_to(secrets / "notes", target_is_directory=True)
    (docs / "inside.md").symlink_to(docs / "manual.md")  # inside the folder: harmless

    got = items(FolderSource([docs]))
    assert got["manual.md"].data is not None
    assert "shared.md" in got and got["shared.md"].data is None
    assert "outside the source's folder: not followed" in got["shared.md"].error
    assert str(secrets / "passwords.md") in got["shared.md"].error
    assert not any(item.data and b"hunter2" in item.data for item in got.values())
    assert not any(item.data and b"confidential" in item.data for item in got.values())
    assert got["shared.md"].root == docs.resolve().as_posix(), "reported under the folder's root"


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path):
    docs = tmp_path / "kb"
    docs.mkdir()
    with (docs / "huge.md").open("wb") as out:  # sparse: 400 MB on paper, nothing on disk
        out.truncate(400 * 1024 * 1024)
    (docs / "small.md").write_text("# Small\n\nfits\n")
    with allocation_peak() as peak:
        got = items(FolderSource([docs], max_file_mb=20))
    grown_mb = peak[0]
    assert got["huge.md"].data is None and got["huge.md"].error == "file too large (419.4 MB > 21 MB limit)"
    assert got["small.md"].data == b"# Small\n\nfits\n"
    assert grown_mb < 50, f"{grown_mb:.0f} MB allocated reading a file it refuses"
    assert os.path.getsize(docs / "huge.md") == 400 * 1024 * 1024


def test_a_file_published_through_an_outside_link_earlier_is_revoked(tmp_path: Path):
    secrets = tmp_path / "home"
    secrets.mkdir()
    (secrets / "passwords.md").write_text("# Passwords\n\nroot: hunter2\n")
    docs = tmp_path / "kb"
    docs.mkdir()
    (docs / "manual.md").write_text("# Manual\n\nRegrease every 3,000 hours.\n")
    (docs / "shared.md").symlink_to(secrets / "passwords.md")
    target = (secrets / "passwords.md").resolve().as_posix()
    # What main published for the link: the target's path as doc id, and no root.
    current = {target: DocRecord(doc_id=target, version=1, content_hash="x", title="Passwords", source=target)}
    got = list(FolderSource([docs]).scan(current, "default"))
    revoke = [item for item in got if item.doc_id == target]
    assert len(revoke) == 1 and revoke[0].gone and "revoked" in revoke[0].error


def test_a_symlink_to_a_hidden_or_excluded_file_inside_the_folder_is_not_followed(tmp_path: Path):
    """Issue 39, item 10: hidden files and folders and what the globs leave out stay out when a link
    inside the folder points at them (the link's own name is visible and included)."""
    docs = tmp_path / "kb"
    (docs / ".secret").mkdir(parents=True)
    (docs / ".secret" / "keys.md").write_text("# Keys\n\nroot: hunter2\n")
    (docs / ".draft.md").write_text("# Draft\n\nunreleased price list\n")
    (docs / "private").mkdir()
    (docs / "private" / "pay.md").write_text("# Pay\n\nTechnicians are paid on scale T9.\n")
    (docs / "manuals").mkdir()
    (docs / "manuals" / "manual.md").write_text("# Manual\n\nRegrease every 3,000 hours.\n")
    (docs / "notes").mkdir()
    (docs / "notes" / "internal.md").write_text("# Internal\n\nnot for the bot\n")
    (docs / "manuals" / "keys.md").symlink_to(docs / ".secret" / "keys.md")
    (docs / "manuals" / "draft.md").symlink_to(docs / ".draft.md")
    (docs / "manuals" / "pay.md").symlink_to(docs / "private" / "pay.md")
    (docs / "manuals" / "internal.md").symlink_to(docs / "notes" / "internal.md")  # not included
    (docs / "manuals" / "private").symlink_to(docs / "private", target_is_directory=True)
    (docs / "manuals" / "same.md").symlink_to(docs / "manuals" / "manual.md")  # allowed either way

    found = list(FolderSource([docs], include=["manuals/**"], exclude=["private/"]).scan({}, "default"))
    published = b" ".join(item.data or b"" for item in found)
    for secret in (b"hunter2", b"unreleased", b"scale T9", b"not for the bot"):
        assert secret not in published, secret
    assert {Path(item.doc_id).relative_to(docs.resolve()).as_posix() for item in found if item.data} == {
        "manuals/manual.md"}
