"""The one bounded read of a file someone else wrote (a plan, facts, traffic, a report, a compile
log, an archive): at most a byte limit, and a FIFO or a device, which no size bounds, within a
time limit; a reader that seeks takes regular files only.  Nothing here ever waits on a FIFO
that nobody writes to."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import stat
import time
from typing import BinaryIO

#: Seconds a FIFO or a device (``<(zcat log.gz)``, a terminal) has to deliver a whole file.
SPECIAL_TIMEOUT_S = 30.0
#: Bytes asked of a FIFO or a device at a time.
_CHUNK = 1 << 20


class TooLarge(ValueError):
    """A file above its byte limit: ``str()`` is ``N bytes (limit L)``, with ``at least`` where
    the size is not known (a FIFO or a device is read to one byte past the limit, no further)."""

    def __init__(self, size: int, limit: int, exact: bool = True) -> None:
        super().__init__(f"{'' if exact else 'at least '}{size:,} bytes (limit {limit:,})")
        self.size, self.limit, self.exact = size, limit, exact


class NotRead(OSError):
    """A file that was not read: not a regular file where one is needed, or a FIFO or a device
    that did not end in time.  An ``OSError`` with ``strerror`` (one line) and ``filename`` set,
    so that every reader's handler of unreadable files reports it."""


def _kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, for an error line (``a FIFO``)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a special file"


def read(path: str | os.PathLike[str], max_bytes: int, *, follow_links: bool = True) -> bytes:
    """The bytes of ``path``: a regular file larger than ``max_bytes`` is refused before it is
    read (:class:`TooLarge` with its size), a FIFO or a device is read to one byte past the limit
    and within :data:`SPECIAL_TIMEOUT_S`.  ``OSError`` (:class:`NotRead` included) when it
    cannot be read; with ``follow_links=False``, also when ``path`` itself is a symbolic link
    (refused in the same call that opens it, so a link put in its place after a check is never
    followed)."""
    fd = _open(path, follow_links)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(st.st_mode):
            return _read_special(fd, max_bytes, path, _kind(st.st_mode))
        if st.st_size > max_bytes:
            raise TooLarge(st.st_size, max_bytes)
        _blocking(fd)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)  # the file may have grown since fstat
        if len(data) > max_bytes:
            raise TooLarge(max(len(data), os.fstat(fd).st_size), max_bytes)
        return data
    finally:
        os.close(fd)


def open_regular(path: str | os.PathLike[str], buffering: int = -1) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (archives, compile logs: readers that
    seek or read by offsets); :class:`NotRead` for anything else, without waiting on a FIFO."""
    fd = _open(path)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRead(errno.EINVAL, f"not a regular file ({_kind(mode)})", os.fspath(path))
        _blocking(fd)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:  # the descriptor is closed on any way out, then raised as it was
        os.close(fd)
        raise


def _open(path: str | os.PathLike[str], follow_links: bool = True) -> int:
    """A read-only descriptor; ``O_NONBLOCK`` so that opening a FIFO with no writer returns."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        return os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a device without its driver)
            raise NotRead(errno.ENXIO, f"not a regular file ({_kind_of(path)})",
                          os.fspath(path)) from None
        raise


def _kind_of(path: str | os.PathLike[str]) -> str:
    try:
        return _kind(os.stat(path).st_mode)
    except OSError:
        return "a special file"


def _blocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)


def _read_special(fd: int, max_bytes: int, path: str | os.PathLike[str], what: str) -> bytes:
    """A FIFO or a device, read as it delivers, to one byte past ``max_bytes`` at most and
    within :data:`SPECIAL_TIMEOUT_S` (a FIFO nobody opens for writing delivers nothing)."""
    limit_s = SPECIAL_TIMEOUT_S
    deadline = time.monotonic() + limit_s
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise NotRead(errno.ETIMEDOUT, f"{what} that did not end within {limit_s:g} s "
                                           f"({size:,} bytes read)", os.fspath(path))
        try:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
        except BlockingIOError:
            continue
        if not chunk:  # every writer has closed it
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise TooLarge(size, max_bytes, exact=False)
