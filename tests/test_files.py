"""Atomic writes: a failed write leaves the old file and nothing partial; a link keeps being a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stragglar.errors import InputError
from stragglar.files import write_text


def test_write_text_replaces_the_file_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keep.json"
    write_text(path, "good\n")
    path.chmod(0o640)
    write_text(path, "better\n")
    assert path.read_text() == "better\n" and path.stat().st_mode & 0o777 == 0o640

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "lost\n")
    with pytest.raises(OSError, match="No space left"):
        write_text(tmp_path / "new.xml", "lost\n")
    assert path.read_text() == "better\n"  # the old file is untouched ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]  # ... and nothing partial is left


def test_write_text_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    target, link = tmp_path / "v3.json", tmp_path / "latest.json"
    target.write_text("old\n")
    link.symlink_to(target.name)
    write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == target.name  # the link is still a link ...
    assert target.read_text() == "new\n"  # ... and its target has the new text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "v3.json"]
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "missing" / "x.json")
    with pytest.raises(InputError, match="symbolic link to a missing file"):
        write_text(dangling, "lost\n")
    assert dangling.is_symlink() and not (tmp_path / "missing").exists()
