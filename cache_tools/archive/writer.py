"""The archive writer: an archive is written under a temporary name beside its output, with
room for the manifest first, then the payload, then the manifest written into the room, then
one rename.

The room is needed because the manifest comes first but is only known once the payload has
been read and hashed; its length, though, is known before (see ``pack``).  A zstd archive is a
series of frames: the manifest's, written last but first in the file; the payload's, spooled to
temporary files and appended in order (pack writes them with ``ZstdFrames``, in frames cut by
the entries' sizes; ``write_archive`` in one frame, compressed by zstd's worker threads, whose
output does not depend on their number); the end of the archive's.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence

from cache_tools.archive import tarfmt
from cache_tools.errors import CacheError
from cache_tools.locations import PACK_PREFIX
from cache_tools.archive.manifest import MANIFEST_NAME, EntryRecord, FileRecord, Manifest
from cache_tools.progress import Progress
from cache_tools.archive.reader import CHUNK, zstandard_module
from cache_tools.archive.staging import _ACTIVE, clean_stale, own_name


class ArchiveWriter:
    """One archive being written under a temporary name beside ``out``: room for a manifest of
    ``manifest_len`` bytes, then payload members, then ``finish`` fills the room and renames."""

    def __init__(self, out: Path, manifest_len: int, zstd: bool, level: int,
                 threads: int) -> None:
        self.out = out
        self.manifest_len = manifest_len
        self.room = len(tarfmt.header(MANIFEST_NAME, manifest_len, 0o644)) + manifest_len + \
            len(tarfmt.padding(manifest_len))
        self.offset = self.room          # of the (uncompressed) tar stream
        self.tmp = out.parent / own_name(PACK_PREFIX, ".tmp")
        self.spool: Path | None = None
        #: every file ``frame_paths`` named (removed by ``close``), and those ``framed`` holds
        #: the payload, in order (appended by ``finish``)
        self.frames: list[Path] = []
        self._framed: list[Path] = []
        self._zstd = None
        _ACTIVE.add(self.tmp)
        self._raw = open(self.tmp, "xb", buffering=0)
        if zstd:
            z = zstandard_module("write a zstd-compressed archive")
            self._zstd = z
            self.level = level
            self.spool = out.parent / own_name(PACK_PREFIX, ".tmp")
            _ACTIVE.add(self.spool)
            self._spool = open(self.spool, "xb", buffering=0)
            # threads >= 1: zstd's multithreaded format, identical for any number of workers.
            self._compressor = z.ZstdCompressor(level=level, write_checksum=True,
                                                threads=max(1, threads))
            self._sink = self._compressor.stream_writer(self._spool, closefd=False,
                                                        write_size=1 << 20)
            self._write = self._sink.write
        else:
            self._raw.seek(self.room)
            self._buffered = open(self._raw.fileno(), "wb", buffering=1 << 20, closefd=False)
            self._write = self._buffered.write

    def write(self, data: bytes | memoryview) -> None:
        """The next bytes of the (uncompressed) tar stream."""
        self._write(data)
        self.offset += len(data)

    def fileno(self) -> int:
        """The uncompressed archive's descriptor, for ``PlacedWriter``s of forked workers."""
        if self._zstd is not None:
            raise AssertionError("a compressed stream is written in order, in this process")
        return self._raw.fileno()

    def placed(self, end: int) -> None:
        """The payload up to byte ``end`` was written in place by ``PlacedWriter``s: go on
        from there."""
        self._buffered.seek(end)
        self.offset = end

    def frame_paths(self, n: int) -> list[Path]:
        """Files for the payload of a zstd archive written in ``n`` frames (``ZstdFrames``, in
        this process or in forked workers): a run of frames from frame ``i`` goes to the
        ``i``-th.  Those that exist are removed with the other temporaries."""
        if self._zstd is None:
            raise AssertionError("frames are for a zstd archive")
        paths = [self.out.parent / own_name(PACK_PREFIX, ".tmp") for _ in range(n)]
        _ACTIVE.update(paths)
        self.frames.extend(paths)
        return paths

    def framed(self, files: list[Path], end: int) -> None:
        """The payload up to byte ``end`` of the tar stream is in ``files``, in that order
        (``finish`` appends them after the manifest's frame): go on from there."""
        self._framed = files
        self.offset = end

    def finish(self, manifest_json: bytes) -> int:
        """Write the manifest into its room and the end of the archive; rename into place.
        Returns the archive's size."""
        if len(manifest_json) != self.manifest_len:
            raise AssertionError("the manifest's length differs from the room left for it")
        self.write(tarfmt.end(self.offset))
        head = tarfmt.header(MANIFEST_NAME, len(manifest_json), 0o644) + manifest_json + \
            tarfmt.padding(len(manifest_json))
        if self._zstd is None:
            self._buffered.flush()
            os.pwrite(self._raw.fileno(), head, 0)
        else:
            self._sink.flush(self._zstd.FLUSH_FRAME)
            self._sink.close()
            self._spool.close()
            frame = self._zstd.ZstdCompressor(level=self.level, write_checksum=True
                                              ).compress(head)
            self._raw.write(frame)
            assert self.spool is not None
            for path in [*self._framed, self.spool]:
                with open(path, "rb", buffering=0) as src:
                    _copy(src, self._raw)
        self._raw.close()
        os.replace(self.tmp, self.out)
        return os.stat(self.out).st_size

    def close(self) -> None:
        """Remove the temporaries (after ``finish``, or when writing failed)."""
        for f in (getattr(self, "_buffered", None), getattr(self, "_spool", None), self._raw):
            try:
                if f is not None:
                    f.close()
            except (OSError, ValueError):
                pass
        for p in (self.tmp, self.spool, *self.frames):
            if p is not None:
                _ACTIVE.discard(p)
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass


#: a zstd archive's payload is cut into frames at the first entry boundary after every this
#: many bytes: runs of whole frames are compressed at once by pack's workers (and read at
#: once by verify's and restore's), and the cuts depend on the entries alone, so the archive is
#: the same for any number of them
FRAME_BYTES = 16 << 20


def frame_cuts(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Runs ``(first, end)`` of entries of ``sizes`` bytes, cut after the entry that reaches
    each next multiple of FRAME_BYTES."""
    cuts: list[tuple[int, int]] = []
    first = done = 0
    for i, size in enumerate(sizes):
        done += size
        if done >= FRAME_BYTES * (len(cuts) + 1):
            cuts.append((first, i + 1))
            first = i + 1
    if first < len(sizes):
        cuts.append((first, len(sizes)))
    return cuts


class ZstdFrames:
    """Payload entries compressed into a file of zstd frames (one of
    ``ArchiveWriter.frame_paths``), a new frame at every ``cut``, by zstd's single-threaded
    compressor: frames cut at the same places are the same bytes in any process, however their
    data was split into writes (tested).  ``background``: the compression runs on a thread of
    its own (zstd releases the interpreter lock) while the caller reads and hashes the next
    files: one process then uses two CPUs, as pack's workers use one each."""

    def __init__(self, path: Path, level: int, background: bool = False) -> None:
        z = zstandard_module("write a zstd-compressed archive")
        self._compressor = z.ZstdCompressor(level=level, write_checksum=True)
        self._end = z.FLUSH_FRAME
        self._file = open(path, "wb", buffering=0)  # ours alone (own_name); again after a retry
        self._sink = self._compressor.stream_writer(self._file, closefd=False,
                                                    write_size=1 << 20)
        self._queue: "queue.Queue[object] | None" = None
        self._failed: list[BaseException] = []
        self._parts: list[bytes] = []
        self._held = 0
        if background:
            self._queue = queue.Queue(maxsize=4)             # 4 MiB in flight at most
            self._thread = threading.Thread(target=self._drain, name="sglang-warmup-zstd",
                                            daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        q = self._queue
        assert q is not None
        while True:
            piece = q.get()
            if piece is None:
                return
            if self._failed:
                continue                        # keep taking pieces: the caller never blocks
            try:
                if piece is _CUT:
                    self._sink.flush(self._end)
                else:
                    self._sink.write(piece)
            except BaseException as exc:      # noqa: BLE001 - raised again in the caller
                self._failed.append(exc)

    def _feed(self, piece: object) -> None:
        if self._queue is None:
            if piece is _CUT:
                self._sink.flush(self._end)
            return
        if self._failed:
            raise self._failed[0]
        self._queue.put(piece)

    def write(self, data: bytes | memoryview) -> None:
        if self._queue is None:
            self._sink.write(data)
            return
        # To the thread a MiB at a time (zstd's output does not depend on how its input is
        # split into writes: its blocks are cut from its own buffer), held until then: a copy
        # of anything that could change meanwhile.
        self._parts.append(data if isinstance(data, bytes) else bytes(data))
        self._held += len(data)
        if self._held >= CHUNK:
            self._flush_parts()

    def _flush_parts(self) -> None:
        """What is held, to the thread in pieces of at most a MiB: with at most 4 of them
        queued, the caller is at most a few MiB ahead of the compressor."""
        if not self._parts:
            return
        whole = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts.clear()
        self._held = 0
        view = memoryview(whole)
        for start in range(0, len(view), CHUNK):
            self._feed(view[start:start + CHUNK])

    def cut(self) -> None:
        """End the current frame; what follows starts the next."""
        self._flush_parts()
        self._feed(_CUT)

    def close(self) -> None:
        """End the last frame (closing the compressor's writer does) and close the file.  The
        thread is stopped whatever happens; an error it met is raised here."""
        try:
            try:
                self._flush_parts()
            finally:
                if self._queue is not None:
                    self._parts.clear()
                    self._queue.put(None)           # the thread takes every piece, then this
                    self._thread.join()
            if self._failed:
                raise self._failed[0]
            self._sink.close()
        finally:
            if self._queue is None or not self._thread.is_alive():
                self._file.close()          # (never under a thread still writing to it)


#: the piece that ends a frame in ``ZstdFrames``' queue (not a bytes object: an empty piece is
#: data)
_CUT = object()


class PlacedWriter:
    """A run of the payload written in place, from byte ``offset`` of an uncompressed archive
    being written (``ArchiveWriter.fileno``), in pieces of about a MiB: a forked worker's share,
    at the offset the layout gives it."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd = fd
        self.offset = offset
        self._at = offset
        self._parts: list[bytes | memoryview] = []
        self._held = 0

    def write(self, data: bytes | memoryview) -> None:
        self.write_parts((data,))

    def write_parts(self, parts: Sequence[bytes | memoryview]) -> None:
        """``parts`` in a row (headers, data, paddings): gathered by the kernel (``pwritev``),
        not joined here first."""
        self._parts.extend(parts)
        n = sum(map(len, parts))
        self._held += n
        self.offset += n
        if self._held >= CHUNK:
            self.flush()

    def flush(self) -> None:
        parts = self._parts
        while parts:
            batch = parts[:_IOV_MAX]
            n = os.pwritev(self.fd, batch, self._at)
            self._at += n
            done = 0
            for part in batch:                   # drop what was written, cut a part begun
                if n < len(part):
                    break
                n -= len(part)
                done += 1
            del parts[:done]
            if n:
                parts[0] = memoryview(parts[0])[n:]
        self._held = 0


#: buffers one pwritev takes at most (Linux's IOV_MAX)
_IOV_MAX = 1024


def _copy(src: IO[bytes], dst: IO[bytes]) -> None:
    """The rest of ``src`` appended to ``dst`` (in the kernel where it can)."""
    try:
        while os.copy_file_range(src.fileno(), dst.fileno(), 1 << 30):
            pass
        return
    except (AttributeError, OSError):
        pass
    shutil.copyfileobj(src, dst, CHUNK)


@dataclass(frozen=True)
class Source:
    """Where the bytes of one archived file come from."""

    entry: EntryRecord
    file: FileRecord
    #: returns a binary file object positioned at the start of exactly ``file.size`` bytes
    open: Callable[[], IO[bytes]]


def write_archive(out: str | os.PathLike[str], manifest: Manifest, sources: Sequence[Source], *,
                  zstd: bool = False, level: int = 3, progress: Progress | None = None,
                  threads: int | None = None) -> int:
    """Write ``manifest`` then every source in manifest order; atomic (temp file + rename).
    Returns the archive's size in bytes."""
    progress = progress or Progress.null()
    out = Path(out)
    order = [(e.key, f.path) for e in manifest.entries for f in e.files]
    if order != [(s.entry.key, s.file.path) for s in sources]:
        raise AssertionError("sources must follow the manifest order")
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out.parent)
    data = manifest.to_json()
    writer = ArchiveWriter(out, len(data), zstd, level, threads or os.cpu_count() or 1)
    try:
        progress.start("pack", manifest.size)
        for s in sources:
            writer.write(tarfmt.header(s.entry.member(s.file), s.file.size, s.file.mode))
            with s.open() as f:
                left = s.file.size
                while left:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        raise CacheError(f"{s.entry.member(s.file)}: source ended early",
                                         hint="the source changed while writing")
                    writer.write(chunk)
                    left -= len(chunk)
                    progress.advance(len(chunk))
            writer.write(tarfmt.padding(s.file.size))
        size = writer.finish(data)
    finally:
        writer.close()
    progress.finish()
    return size
