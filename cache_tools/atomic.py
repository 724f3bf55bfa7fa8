"""Atomic file writes: the one way this project replaces a file that others may read.

The bytes go to a temporary file with a unique name in the same directory (pid and random: two
writers never share one), are flushed to disk, then ``os.replace`` puts them in place in one
step; a reader sees the old file or the new one, never a part.  A failure removes the temporary
file and leaves the old one.  Standard library only.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def temp_name(path: str | os.PathLike[str]) -> Path:
    """A unique temporary name beside ``path`` (hidden, ``.tmp``)."""
    p = Path(path)
    return p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644,
                fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (parents created).  ``fsync``: flush the file
    before the rename, so a crash leaves the old file or the whole new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(p)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except BaseException:  # the temporary file goes on any way out, then raised as it was
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    write_bytes(path, text.encode("utf-8"), fsync=fsync)
