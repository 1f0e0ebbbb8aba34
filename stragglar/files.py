"""Writing files so that nothing is lost: a temporary file in the same folder, then a rename.

A write that fails half way (a full disk, a signal) leaves the old file as it was and no partial
file behind, because the new content only replaces the old by ``os.replace``, which is atomic on
one file system.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_text(folder / "a.txt", "one\\n")
>>> (folder / "a.txt").read_text(), sorted(p.name for p in folder.iterdir())
('one\\n', ['a.txt'])
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_bytes", "write_text"]


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file ``path`` with ``text`` (UTF-8), atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file ``path`` with ``data``, atomically; on failure the old file is untouched."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
