"""The archive reader: ``manifest.json`` first, then every member checked against it, within the
reader's limits.  ``verify``, ``restore`` and ``merge`` read archives only through it, so they
accept and refuse exactly the same archives.

What is checked, in stream order (a member up to ``WHOLE`` bytes is checked completely before
its consumer sees a byte of it; a larger one streams in chunks and its sha256 is checked after
the last one, so restore stages it and moves nothing into place before the end):

* the file: a tar or a complete zstd stream (frames walked first; see
  ``zstd_structure_problem``); decompressed volume and ratio bounded as it is read;
* every header: bounded before it is read (``Limits.max_header_bytes``), a plain relative UTF-8
  name, a regular file (links, devices, FIFOs, directories, sparse files are refused);
* the manifest: first, at most ``max_manifest_bytes``, valid (``Manifest.parse``: layout,
  completeness, no overlapping entries), within the entry, file and total limits;
* every payload member: the one the manifest lists next, with its size and sha256; Triton group
  files name only files of their own entry (``groups.check``);
* the end: nothing unlisted after the last member, only zeros after the end-of-archive block.

Our own members are recognized by comparing their header bytes with what the writer produces
for the listed name, size and mode (one comparison); anything else goes through the careful
parse in ``tarfmt.TarStream.next_header``.  ``range_members`` runs the same checks on a byte
range, ``frame_members`` on a frame of a zstd archive in pack's frames, for the read workers
(``read_workers``: verify and restore), and both accept only our own layout there.

Longer than 500 lines: every check an archive passes lives here, so that verify, restore (in one
process or in workers) and merge accept and refuse exactly the same archives.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Callable, Generator, Iterator, Sequence

from cache_tools import inputfile
from cache_tools.archive import groups
from cache_tools.archive import tarfmt
from cache_tools.errors import ArchiveError, CacheError
from cache_tools.archive.manifest import (MANIFEST_NAME, EntryRecord, FileRecord, Manifest, is_triton,
                                  member_prefix)

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: members up to this size are read whole (one buffer, hashed at once); larger ones in chunks
WHOLE = 4 << 20
CHUNK = 1 << 20
HINT_CORRUPT = "the archive is corrupt, truncated or hostile; nothing was written"
_HINT_OURS = "give an archive written by `sglang-warmup cache pack`"
#: Compressed formats a file may be in instead, by their first bytes.
_OTHER_FORMATS = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"),
                  (b"PK\x03\x04", "zip"))


class NotOurs(Exception):
    """A range of the archive is not laid out byte for byte as our writer lays it out: a
    parallel reader stops, and the sequential one (which says exactly what is wrong, or
    accepts a member another tar wrote) reads the archive instead."""


@dataclass(frozen=True)
class Limits:
    """What a reader accepts.  The defaults leave room for large real caches; pass tighter
    limits when the archive comes from an untrusted place.  docs/cache.md lists them."""

    max_file_bytes: int = 8 << 30
    max_total_bytes: int = 256 << 30
    #: decompressed/compressed bytes (zstd archives only)
    max_ratio: float = 1000.0
    #: the ratio is only checked once this much has been decompressed
    ratio_floor_bytes: int = 16 << 20
    max_manifest_bytes: int = 64 << 20
    max_entries: int = 2_000_000
    max_files: int = 4_000_000
    #: one PAX extended header (our writer's are a name of at most 4 KiB)
    max_header_bytes: int = 64 << 10


def zstandard_module(why: str) -> ModuleType:
    """The zstandard package, or a CacheError saying how to install it."""
    try:
        import zstandard
    except ImportError:
        raise CacheError(f"the zstandard package is needed to {why}",
                         hint="pip install 'sglang-warmup[zstd]' (or zstandard)") from None
    return zstandard


class _Counted:
    """The compressed file as the decompressor reads it from byte ``start``: ``count`` is the
    offset reached (the compressed bytes the ratio check weighs, those before ``start``
    included), and it ends at byte ``end`` when given (one frame's end)."""

    def __init__(self, raw: IO[bytes], start: int = 0, end: int | None = None) -> None:
        self.raw = raw
        self.count = start
        self.end = end

    def read(self, n: int = -1) -> bytes:
        if self.end is not None:
            left = self.end - self.count
            n = left if n < 0 else min(n, left)
            if n <= 0:
                return b""
        data = self.raw.read(n)
        self.count += len(data)
        return data


class Member:
    """One payload member.  ``data`` holds the whole verified content of a member up to
    ``WHOLE`` bytes; a larger one is read with ``chunks()`` (verified after the last chunk; the
    reader drains and verifies what the consumer leaves).  ``children`` lists a Triton group
    file's children (checked against its entry)."""

    __slots__ = ("reader", "name", "entry", "file", "data", "children", "consumed")

    def __init__(self, reader: "ArchiveReader", name: str, entry: EntryRecord, file: FileRecord,
                 data: memoryview | None, children: list[str] | None) -> None:
        self.reader = reader
        self.name = name
        self.entry = entry
        self.file = file
        self.data = data
        self.children = children
        self.consumed = data is not None

    def chunks(self) -> Iterator[memoryview]:
        if self.data is not None:
            yield self.data
            return
        self.consumed = True
        yield from self.reader._chunks(self.name, self.file)

    def drain(self) -> None:
        for _ in self.chunks():
            pass


class ArchiveReader:
    """Streams an archive once: the manifest, then every member checked against it."""

    def __init__(self, path: str | os.PathLike[str], limits: Limits | None = None, *,
                 walked: list[int] | None = None) -> None:
        """``walked``: the frame offsets of this very file, already walked and found complete
        (``reopen``): not walked again."""
        self.path = Path(path)
        self.limits = limits or Limits()
        self.current = MANIFEST_NAME
        self.manifest: Manifest | None = None
        #: sha256 of the manifest's bytes (a plan compares it before executing)
        self.manifest_sha256 = ""
        try:
            self._file = inputfile.open_regular(self.path, buffering=0)
        except FileNotFoundError:
            raise CacheError(f"{self.path}: no such archive",
                             hint="check the path (`sglang-warmup cache pack OUT` writes one)"
                             ) from None
        except inputfile.NotRead as exc:
            raise CacheError(f"{self.path}: cannot open: {exc.strerror}",
                             hint="pass the archive file itself; a pipe or a device cannot be "
                                  "read by offsets") from None
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot open: {exc.strerror}",
                             hint="check the path and its permissions") from None
        try:
            self._open_stream(walked)
        except BaseException:  # the file is closed on any way out, then raised as it was
            self._file.close()
            raise
        # Decompressed bytes allowed: payload + manifest + tar framing; tightened to what the
        # manifest declares once it is read (see _framing).
        lim = self.limits
        self._budget = lim.max_total_bytes + lim.max_manifest_bytes + \
            (lim.max_files + 16) * (3 * tarfmt.BLOCK + lim.max_header_bytes)
        self._produced = 0
        self._tar = tarfmt.TarStream(self._read, max_header_bytes=lim.max_header_bytes,
                                     chunk=CHUNK)

    def _open_stream(self, walked: list[int] | None) -> None:
        head = self._file.read(4)
        self._file.seek(0)
        self.compressed = head == ZSTD_MAGIC
        self._zstd_error: type[BaseException] = _NoError
        self._counted = _Counted(self._file)
        #: byte offsets of a zstd archive's frames (pack cuts its payload into frames)
        self.zstd_frames: list[int] = []
        if not self.compressed:
            self._source: Callable[[int], bytes] = self._file.read
            return
        zstd = zstandard_module("read a zstd-compressed archive")
        if walked is not None:
            self.zstd_frames = list(walked)
            problem = ""
        else:
            problem = zstd_structure_problem(self._file, self.zstd_frames)
        if problem:
            raise ArchiveError(f"archive is truncated or damaged: {problem}", hint=HINT_CORRUPT)
        self._decompress()
        self._zstd_error = zstd.ZstdError

    def _decompress(self, frame: int = 0, alone: bool = False) -> None:
        """Decompress from the frame at byte ``frame``: it and every frame after it, or
        (``alone``) that frame only (its compressed bytes end where the next frame starts)."""
        zstd = zstandard_module("read a zstd-compressed archive")
        end = None
        if alone:
            i = bisect.bisect_right(self.zstd_frames, frame)
            end = self.zstd_frames[i] if i < len(self.zstd_frames) else \
                os.fstat(self._file.fileno()).st_size
        self._file.seek(frame)
        # Counted from the file's start: at a frame deep in the archive the ratio weighs what
        # one reader from the start would have read by then (at most that: stricter, never
        # laxer, than the one-process read).
        self._counted = _Counted(self._file, frame, end)
        self._source = zstd.ZstdDecompressor(max_window_size=1 << 27).stream_reader(
            self._counted, read_across_frames=True).read

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def fileno(self) -> int:
        return self._file.fileno()

    def reopen(self, walk: bool = True) -> "ArchiveReader":
        """A new reader of the very file this one has open, from its start (through its
        ``/proc/self/fd`` entry where there is one: not whatever the path names by now); its
        messages name the same path.  ``walk=False``: a zstd archive's frames are taken from
        this reader, not walked again (the read workers)."""
        fd = Path(f"/proc/self/fd/{self.fileno()}")
        if fd.exists():
            again = ArchiveReader(fd, self.limits, walked=None if walk else self.zstd_frames)
        else:                           # by its path: what the path names now, walked again
            again = ArchiveReader(self.path, self.limits)
        again.path = self.path
        return again

    def restart(self) -> "ArchiveReader":
        """This reader closed and the very file read again from its start (``reopen``): the
        one-process read after the workers gave up."""
        try:
            return self.reopen()
        finally:
            self.close()

    @property
    def archive_bytes(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    # -- the byte stream ------------------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        try:
            data = self._source(n)
        except self._zstd_error as exc:
            raise ArchiveError(f"archive is truncated or damaged at member {self.current!r} "
                               f"({exc})", hint=HINT_CORRUPT) from None
        self._produced += len(data)
        produced, lim = self._produced, self.limits
        if produced > self._budget:
            raise ArchiveError(f"archive member {self.current!r}: decompressed data exceeds what "
                               f"the manifest declares ({produced} bytes); refusing a possible "
                               "decompression bomb", hint=HINT_CORRUPT)
        if self.compressed and produced > lim.ratio_floor_bytes and \
                produced > lim.max_ratio * max(self._counted.count, 1):
            raise ArchiveError(f"archive member {self.current!r}: decompression ratio exceeds "
                               f"{lim.max_ratio:g}:1 ({produced} bytes from "
                               f"{self._counted.count}); refusing a possible decompression "
                               "bomb", hint=HINT_CORRUPT)
        return data

    def _where(self, previous: str | None, offset: int) -> str:
        if previous is None:
            return "the first archive member (byte 0)"
        return f"the archive member after {previous!r} (byte {offset})"

    def _header(self, previous: str | None) -> tarfmt.Header | None:
        """The next header, parsed carefully; format errors become ArchiveErrors."""
        try:
            return self._tar.next_header()
        except tarfmt.TarFormatError as exc:
            if previous is None and exc.offset == 0:
                raise self._not_an_archive(exc) from None
            if exc.truncated:
                raise ArchiveError(f"archive is truncated at byte {exc.offset} (after member "
                                   f"{previous!r})", hint=HINT_CORRUPT) from None
            raise ArchiveError(f"{self._where(previous, exc.offset)}: {exc.reason}",
                               hint=HINT_CORRUPT) from None

    def _not_an_archive(self, exc: tarfmt.TarFormatError) -> ArchiveError:
        """What a file whose first header cannot be read is: another compressed format, not a
        tar at all, a tar cut short in its first header, or a tar of a kind pack never writes."""
        head = os.pread(self._file.fileno(), 8, 0)
        other = next((name for magic, name in _OTHER_FORMATS if head.startswith(magic)), None)
        if other is not None:
            return ArchiveError(f"{self.path}: a {other} file, not a tar or tar.zst archive",
                                hint="cache archives are tar or tar.zst (`cache pack --zstd`); "
                                     "decompress it first if it holds one")
        if exc.no_header:
            return ArchiveError(f"{self.path}: not a tar or tar.zst archive (no tar header at "
                                "its start)", hint=_HINT_OURS)
        if exc.truncated:
            return ArchiveError(f"{self.path}: it ends inside its first tar header: an archive "
                                "cut short, or not one", hint=HINT_CORRUPT)
        return ArchiveError(f"{self.path}: a tar archive of a kind `sglang-warmup cache pack` "
                            f"never writes: {exc.reason}", hint=_HINT_OURS + "; GNU tar, "
                            "`git archive` and Python's tarfile write other tars")

    def _check(self, h: tarfmt.Header, previous: str | None) -> str:
        """A member that could write outside the destination or is not a plain file is refused;
        returns its name."""
        if h.name is None:
            raise ArchiveError(f"{self._where(previous, h.offset)}: member name is not valid "
                               f"UTF-8 ({h.raw_name[:120]!r})", hint=HINT_CORRUPT)
        name = h.name
        if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
            raise ArchiveError(f"archive member {name!r}: absolute path; members must be "
                               "relative", hint=HINT_CORRUPT)
        parts = name.split("/")
        if ".." in parts:
            raise ArchiveError(f"archive member {name!r}: path leaves the destination ('..')",
                               hint=HINT_CORRUPT)
        if any(p in ("", ".") for p in parts) or "\\" in name or "\x00" in name:
            raise ArchiveError(f"archive member {name!r}: not a plain relative path",
                               hint=HINT_CORRUPT)
        what = _TYPES.get(h.typeflag)
        if h.sparse:
            what = "sparse file"
        elif what is not None and h.typeflag in (b"1", b"2"):
            what += f" {h.linkname!r}"
        if what is not None:
            raise ArchiveError(f"archive member {name!r}: {what}; only regular files are "
                               "allowed", hint=HINT_CORRUPT)
        if h.typeflag not in (b"0", b"\0"):
            raise ArchiveError(f"archive member {name!r}: unsupported member type "
                               f"{h.typeflag!r}; only regular files are allowed",
                               hint=HINT_CORRUPT)
        if h.size > self.limits.max_file_bytes and name != MANIFEST_NAME:
            raise ArchiveError(f"archive member {name!r}: {h.size} bytes exceeds the per-file "
                               f"limit of {self.limits.max_file_bytes} bytes", hint=HINT_CORRUPT)
        return name

    def _data(self, name: str, size: int) -> memoryview:
        try:
            return self._tar.data(size)
        except tarfmt.TarFormatError as exc:
            raise ArchiveError(f"archive is truncated: member {name!r} ends after "
                               f"{exc.reason}", hint=HINT_CORRUPT) from None

    # -- the manifest ---------------------------------------------------------------------------

    def read_manifest(self, parsed: Manifest | None = None, parsed_sha256: str = ""
                      ) -> Manifest:
        """Read and validate the first member, which must be ``manifest.json``.  ``parsed`` is
        a manifest already parsed from bytes with sha256 ``parsed_sha256`` (a plan's): when the
        bytes match it is used as is, otherwise they are parsed."""
        h = self._header(None)
        if h is None:
            raise ArchiveError(f"{self.path}: empty archive (no manifest.json)",
                               hint=HINT_CORRUPT)
        if h.name is not None and h.name != MANIFEST_NAME:  # a tar of another tool, likely
            raise ArchiveError(f"archive member {h.name!r} comes first; {MANIFEST_NAME} must "
                               "be the first member", hint="only archives written by "
                               "`sglang-warmup cache pack` or `cache merge` are accepted")
        self._check(h, None)
        lim = self.limits
        if h.size > lim.max_manifest_bytes:
            raise ArchiveError(f"archive member {MANIFEST_NAME!r}: {h.size} bytes exceeds the "
                               f"limit of {lim.max_manifest_bytes} bytes", hint=HINT_CORRUPT)
        data = bytes(self._data(MANIFEST_NAME, h.size))
        self.manifest_sha256 = hashlib.sha256(data).hexdigest()
        if parsed is not None and parsed_sha256 == self.manifest_sha256:
            self.manifest = parsed
            self._budget = parsed.size + lim.max_manifest_bytes + _framing(parsed)
            return parsed
        manifest = Manifest.parse(data)
        if len(manifest.entries) > lim.max_entries:
            raise ArchiveError(f"{MANIFEST_NAME}: {len(manifest.entries)} entries exceed the "
                               f"limit of {lim.max_entries}", hint=HINT_CORRUPT)
        if manifest.nb_files > lim.max_files:
            raise ArchiveError(f"{MANIFEST_NAME}: {manifest.nb_files} files exceed the limit "
                               f"of {lim.max_files}", hint=HINT_CORRUPT)
        for e in manifest.entries:
            if max(f.size for f in e.files) > lim.max_file_bytes:
                f = next(f for f in e.files if f.size > lim.max_file_bytes)
                raise ArchiveError(f"archive member {e.member(f)!r}: {f.size} bytes exceeds "
                                   f"the per-file limit of {lim.max_file_bytes} bytes",
                                   hint=HINT_CORRUPT)
        if manifest.size > lim.max_total_bytes:
            raise ArchiveError(f"{MANIFEST_NAME}: the archive declares {manifest.size} bytes, "
                               f"more than the limit of {lim.max_total_bytes} bytes",
                               hint=HINT_CORRUPT)
        self.manifest = manifest
        self._budget = manifest.size + lim.max_manifest_bytes + _framing(manifest)
        return manifest

    # -- the payload ----------------------------------------------------------------------------

    def members(self) -> Iterator[Member]:
        """Every payload member, in manifest order (see the module docstring)."""
        manifest = self.manifest or self.read_manifest()
        previous = yield from self._payload(manifest, manifest.entries, MANIFEST_NAME, True)
        self._check_tail(previous)

    def payload_start(self) -> int:
        """Right after ``read_manifest``: the manifest's padding checked (only zeros, else
        :class:`NotOurs`), and the byte of the first payload member's header."""
        try:
            self._tar.skip_padding(MANIFEST_NAME)
        except tarfmt.TarFormatError as exc:
            raise NotOurs(exc.reason) from None
        return self._tar.offset

    def frame_members(self, manifest: Manifest, frame: int, offset: int,
                      entries: Sequence[EntryRecord]) -> Iterator[Member]:
        """The members of ``entries`` read from the zstd frame at byte ``frame`` of a
        compressed archive written by our pack, whose content starts at byte ``offset`` of the
        tar stream: checked as ``range_members`` checks them, and the frame must end right
        after them (else :class:`NotOurs`)."""
        if not self.compressed:
            raise NotOurs("an uncompressed archive has no frames")
        self._seek_frame(manifest, frame, offset, alone=True)
        yield from self._range(manifest, entries)
        if not self._tar.exhausted():
            raise NotOurs(f"the frame at byte {frame} holds more than its entries")

    def frame_length(self, frame: int, limit: int) -> int:
        """How many bytes the zstd frame at byte ``frame`` decompresses to, counted up to
        ``limit`` + 1."""
        self._decompress(frame, alone=True)
        total = 0
        while total <= limit:
            data = self._source(min(CHUNK, limit + 1 - total))
            if not data:
                break
            total += len(data)
        return total

    def check_tail_from_frame(self, manifest: Manifest, frame: int, offset: int,
                              previous: str) -> None:
        """``check_tail_at`` for a compressed archive: from the frame at byte ``frame``, whose
        content starts at byte ``offset`` of the tar stream, to the end of the file."""
        self._seek_frame(manifest, frame, offset, alone=False)
        self._check_tail(previous)

    def _seek_frame(self, manifest: Manifest, frame: int, offset: int, alone: bool) -> None:
        self._seek(manifest, offset)
        self._decompress(frame, alone)

    def range_members(self, manifest: Manifest, offset: int, entries: Sequence[EntryRecord]
                      ) -> Iterator[Member]:
        """The members of ``entries`` read from byte ``offset`` of an uncompressed archive
        written by our writer: what one worker of a parallel verify or restore checks.  Every
        header must be byte for byte what the writer produces (else :class:`NotOurs`); sizes,
        hashes, Triton groups and paddings, the last member's included, are checked as in
        ``members``.  The tail is the caller's (``check_tail_at``)."""
        if self.compressed:
            raise NotOurs("a compressed archive is read from its start")
        self._seek(manifest, offset)
        yield from self._range(manifest, entries)

    def _range(self, manifest: Manifest, entries: Sequence[EntryRecord]) -> Iterator[Member]:
        """The members of ``entries`` from where the reader stands, our layout only, and the
        last one's padding (no other range reads it)."""
        last = yield from self._payload(manifest, entries, MANIFEST_NAME, False)
        try:
            self._tar.skip_padding(repr(last))
        except tarfmt.TarFormatError as exc:
            raise NotOurs(exc.reason) from None

    def check_tail_at(self, manifest: Manifest, offset: int, previous: str) -> None:
        """What ``members`` checks after the last member, from byte ``offset`` (the end of the
        member ``previous``): no unlisted member, an end-of-archive block, only zeros after."""
        self._seek(manifest, offset)
        self._check_tail(previous)

    def _seek(self, manifest: Manifest, offset: int) -> None:
        self.manifest = manifest
        self._budget = manifest.size + self.limits.max_manifest_bytes + _framing(manifest)
        self._produced = offset     # what a reader from the start would have produced by here
        self._file.seek(offset)
        self._tar = tarfmt.TarStream(self._read, max_header_bytes=self.limits.max_header_bytes,
                                     chunk=CHUNK)
        self._tar.offset = offset

    def _payload(self, manifest: Manifest, entries: Sequence[EntryRecord], previous: str,
                 careful: bool) -> Generator[Member, None, str]:
        """The members of ``entries``, in order; returns the last one's name.  A header that is
        not byte for byte ours goes through the careful parse when ``careful``, else raises
        NotOurs."""
        tar = self._tar
        match, whole, data_of, header = tar.match, tar.whole, self._data, tarfmt.header
        sha256 = hashlib.sha256
        for entry in entries:
            triton = is_triton(entry)
            paths = {f.path for f in entry.files} if triton else ()
            prefix = member_prefix(entry.kind, entry.name)
            for f in entry.files:
                name = f"{prefix}/{f.path}" if f.path else prefix
                self.current = name
                expected = header(name, f.size, f.mode)
                if len(expected) > tarfmt.BLOCK and \
                        int(expected[124:135], 8) > self.limits.max_header_bytes:
                    expected = b""          # a PAX header over the limit: the careful path
                data = whole(expected, f.size) if expected and f.size <= WHOLE else None
                if data is None:
                    try:
                        fast = match(expected) if expected else False
                    except tarfmt.TarFormatError as exc:
                        if not careful:
                            raise NotOurs(f"{exc.reason} before {name!r}") from None
                        if not exc.truncated:
                            raise ArchiveError(f"{self._where(previous, exc.offset)}: "
                                               f"{exc.reason}", hint=HINT_CORRUPT) from None
                        raise ArchiveError(f"archive is truncated after member {previous!r}",
                                           hint=HINT_CORRUPT) from None
                    if not fast:
                        if not careful:
                            raise NotOurs(f"member {name!r} is not byte for byte ours")
                        self._listed_header(name, f, previous, manifest)
                if f.size > WHOLE:
                    member = Member(self, name, entry, f, None, None)
                    yield member
                    if not member.consumed:
                        member.drain()
                    previous = name
                    continue
                if data is None:
                    data = data_of(name, f.size)
                group = triton and f.path.startswith("__grp__") and groups.is_group(f.path)
                got = sha256(data).hexdigest()
                if got != f.sha256:
                    raise _mismatch(name, f, got)
                children = groups.check(data, f.path, paths, entry.key) if group else None
                yield Member(self, name, entry, f, data, children)
                previous = name
        return previous

    def _check_tail(self, previous: str) -> None:
        tar = self._tar
        self.current = previous
        h = self._header(previous)
        if h is not None:
            raise ArchiveError(f"archive member {self._check(h, previous)!r} is not listed in "
                               "the manifest", hint=HINT_CORRUPT)
        if not tar.end_block:
            raise ArchiveError(f"archive is truncated after member {previous!r} (no "
                               "end-of-archive block)", hint=HINT_CORRUPT)
        junk = tar.rest_is_zero()
        if junk is not None:
            raise ArchiveError(f"archive holds data after its end-of-archive block (byte "
                               f"{junk})", hint=HINT_CORRUPT)

    def _listed_header(self, name: str, f: FileRecord, previous: str, manifest: Manifest
                       ) -> None:
        """The careful path: a header that is not byte for byte ours must still be a regular
        file with the listed name and size."""
        h = self._header(previous)
        if h is None:
            raise ArchiveError(f"archive is truncated: the manifest lists {name!r} but the "
                               "archive ends before it", hint=HINT_CORRUPT)
        got = self._check(h, previous)
        if got != name:
            if any(got == n for n, _, _ in manifest.members()):
                raise ArchiveError(f"archive member {got!r} is out of order (expected "
                                   f"{name!r})", hint=HINT_CORRUPT)
            raise ArchiveError(f"archive member {got!r} is not listed in the manifest",
                               hint=HINT_CORRUPT)
        if h.size != f.size:
            raise ArchiveError(f"archive member {name!r}: {h.size} bytes, the manifest lists "
                               f"{f.size}", hint=HINT_CORRUPT)

    def _chunks(self, name: str, f: FileRecord) -> Iterator[memoryview]:
        h = hashlib.sha256()
        try:
            for chunk in self._tar.chunks(f.size):
                h.update(chunk)
                yield chunk
        except tarfmt.TarFormatError as exc:
            raise ArchiveError(f"archive is truncated: member {name!r} ends after "
                               f"{exc.reason}", hint=HINT_CORRUPT) from None
        got = h.hexdigest()
        if got != f.sha256:
            raise _mismatch(name, f, got)


def _mismatch(name: str, f: FileRecord, got: str) -> ArchiveError:
    return ArchiveError(f"archive member {name!r}: sha256 mismatch (manifest "
                        f"{f.sha256[:16]}, content {got[:16]})", hint=HINT_CORRUPT)


_TYPES = {b"2": "symbolic link to", b"1": "hard link to", b"3": "character device",
          b"4": "block device", b"6": "FIFO", b"5": "directory", b"S": "sparse file"}


#: frame offsets a reader keeps at most (pack writes one frame per 16 MiB of payload and three
#: more); an archive of more frames is read in one process
MAX_FRAMES = 1 << 16


def zstd_structure_problem(f: IO[bytes], starts: list[int] | None = None) -> str:
    """Walk the zstd frame and block headers (RFC 8878) without decompressing; '' when every
    frame is complete.  The decompressor itself reports a stream cut at a block boundary as a
    clean end, so truncation is caught here, before anything is read.  ``starts`` gets the byte
    offset of every (not skippable) frame."""
    size = os.fstat(f.fileno()).st_size
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        f.seek(pos)
        data = f.read(n)
        if len(data) != n:
            raise EOFError
        pos += n
        return data

    try:
        frames = 0
        while pos < size:
            magic = int.from_bytes(read(4), "little")
            if magic & 0xFFFFFFF0 == 0x184D2A50:
                return f"skippable zstd frame at byte {pos - 4} (an archive of ours has none)"
            if magic != 0xFD2FB528:
                return f"no zstd frame at byte {pos - 4}"
            if starts is not None and len(starts) < MAX_FRAMES:
                starts.append(pos - 4)
            fhd = read(1)[0]
            single = fhd >> 5 & 1
            header = (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + \
                ((1 if single else 0), 2, 4, 8)[fhd >> 6]
            read(header)
            while True:
                bh = int.from_bytes(read(3), "little")
                btype, bsize = bh >> 1 & 3, bh >> 3
                if btype == 3:
                    return f"reserved block type at byte {pos - 3}"
                pos += 1 if btype == 1 else bsize
                if pos > size:
                    raise EOFError
                if bh & 1:
                    break
            if fhd >> 2 & 1:
                read(4)
            frames += 1
        return "" if frames else "no zstd frame"
    except EOFError:
        return f"the zstd stream ends inside a frame (file is {size} bytes)"
    finally:
        f.seek(0)


def _framing(manifest: Manifest) -> int:
    """An upper bound of the tar framing around the payload: per member a header, a PAX
    header and its records (about the name's length, at most 4 bytes a character, twice),
    data padding; then the end blocks."""
    return 2560 * manifest.nb_files + 8 * manifest.name_chars + 2560 + 2 * len(MANIFEST_NAME) + \
        64 * 1024


class _NoError(Exception):
    """Placeholder for zstandard.ZstdError when reading an uncompressed archive."""
