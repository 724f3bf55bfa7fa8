"""Archives of JIT caches: pack, verify, restore (plan, then staged execute) and merge.

An archive is a tar (optionally zstd-compressed) whose first member is ``manifest.json``; the
payload members follow in manifest order, one per file, named ``<kind>/<entry>/<file>``, with
normalized metadata (mtime 0, uid/gid 0, mode 0644/0755) so the same cache packs to the same
bytes.  Triton group files are stored with child paths relative to their entry and rewritten to
absolute paths on restore, so a relocated cache still hits.

Reading is hostile-input safe: absolute paths, ``..``, links, devices, FIFOs, oversize members,
decompression bombs, truncation, manifest/payload mismatch and a manifest that is not first are
all rejected with an ArchiveError naming the member, before anything is moved into place.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Mapping, Sequence

from cache_tools import fingerprint as fp_mod
from cache_tools.errors import ArchiveError, CacheError, os_errors
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.locations import Location, kind, resolve
from cache_tools.manifest import MANIFEST_NAME, EntryRecord, FileRecord, Manifest
from cache_tools.progress import Progress
from cache_tools.scan import (GROUP_PREFIX, CacheEntry, CacheWarning, open_noatime,
                              read_noatime, scan, size_str)
from cache_tools.staging import Installer, Outcome, complete_at, is_triton_entry, \
    normalize_group, target_of

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20
_HINT_CORRUPT = "the archive is corrupt, truncated or hostile; nothing was written"


def _producer() -> str:
    try:
        import importlib.metadata

        return "sglang-warmup " + importlib.metadata.version("sglang-warmup")
    except Exception:
        return "sglang-warmup"


@dataclass(frozen=True)
class Limits:
    """What a reader accepts.  The defaults leave room for large real caches; pass tighter
    limits when the archive comes from an untrusted place."""

    max_file_bytes: int = 8 << 30
    max_total_bytes: int = 256 << 30
    #: decompressed/compressed bytes (zstd archives only)
    max_ratio: float = 1000.0
    #: the ratio is only checked once this much has been decompressed
    ratio_floor_bytes: int = 16 << 20
    max_manifest_bytes: int = 64 << 20
    max_entries: int = 2_000_000


# --- reading ----------------------------------------------------------------------------------


class _Counting(io.RawIOBase):
    """Counts bytes read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.raw.read(len(b))
        n = len(data)
        b[:n] = data
        self.count += n
        return n


class _Guard(io.RawIOBase):
    """The decompressed stream tarfile reads: enforces the total and ratio limits."""

    def __init__(self, inner, raw: _Counting, reader: "ArchiveReader") -> None:
        self.inner = inner
        self.raw = raw
        self.reader = reader
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.count += n
        self.reader._check_volume(self.count, self.raw.count)
        return n


class Member:
    """One payload member being read; ``chunks()`` yields its data and verifies it at the end."""

    def __init__(self, reader: "ArchiveReader", fileobj: IO[bytes], name: str,
                 entry: EntryRecord, file: FileRecord) -> None:
        self.reader = reader
        self.fileobj = fileobj
        self.name = name
        self.entry = entry
        self.file = file
        self.consumed = False

    def chunks(self) -> Iterator[bytes]:
        self.consumed = True
        h = hashlib.sha256()
        n = 0
        while True:
            chunk = self.reader._guarded(lambda: self.fileobj.read(CHUNK), self.name)
            if not chunk:
                break
            n += len(chunk)
            if n > self.file.size:
                raise ArchiveError(f"archive member {self.name!r}: more data than the "
                                   f"{self.file.size} bytes the manifest lists",
                                   hint=_HINT_CORRUPT)
            h.update(chunk)
            yield chunk
        if n != self.file.size:
            raise ArchiveError(f"archive is truncated: member {self.name!r} ends after {n} of "
                               f"{self.file.size} bytes", hint=_HINT_CORRUPT)
        got = h.hexdigest()
        if got != self.file.sha256:
            raise ArchiveError(f"archive member {self.name!r}: sha256 mismatch (manifest "
                               f"{self.file.sha256[:16]}, content {got[:16]})",
                               hint=_HINT_CORRUPT)

    def drain(self) -> None:
        for _ in self.chunks():
            pass


class ArchiveReader:
    """Streams an archive once: the manifest, then every member checked against it."""

    def __init__(self, path: str | os.PathLike[str], limits: Limits | None = None) -> None:
        self.path = Path(path)
        self.limits = limits or Limits()
        self.current = MANIFEST_NAME
        self.manifest: Manifest | None = None
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise CacheError(f"{self.path}: no such archive",
                             hint="check the path (`sglang-warmup cache pack OUT` writes one)"
                             ) from None
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot open ({exc.strerror})",
                             hint="check the path and its permissions") from None
        head = self._file.read(4)
        self._file.seek(0)
        self.compressed = head == ZSTD_MAGIC
        self._raw = _Counting(self._file)
        if self.compressed:
            zstd = _zstandard("read a zstd-compressed archive")
            problem = zstd_structure_problem(self._file)
            if problem:
                self._file.close()
                raise ArchiveError(f"archive is truncated or damaged: {problem}",
                                   hint=_HINT_CORRUPT)
            inner = zstd.ZstdDecompressor(max_window_size=1 << 27).stream_reader(
                self._raw, read_across_frames=True)
            self._zstd_error: type[BaseException] = zstd.ZstdError
        else:
            inner = self._raw
            self._zstd_error = _NoError
        self._guard = _Guard(inner, self._raw, self)
        # Decompressed bytes allowed: payload + manifest + tar framing; tightened to what the
        # manifest declares once it is read (see _framing).
        self._budget = self.limits.max_total_bytes + self.limits.max_manifest_bytes + \
            (self.limits.max_entries + 16) * 8192
        self._tar: tarfile.TarFile | None = None

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    @property
    def archive_bytes(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    def _check_volume(self, produced: int, consumed: int) -> None:
        lim = self.limits
        if produced > self._budget:
            raise ArchiveError(f"archive member {self.current!r}: decompressed data exceeds what "
                               f"the manifest declares ({produced} bytes); refusing a possible "
                               "decompression bomb", hint=_HINT_CORRUPT)
        if self.compressed and produced > lim.ratio_floor_bytes and \
                produced > lim.max_ratio * max(consumed, 1):
            raise ArchiveError(f"archive member {self.current!r}: decompression ratio exceeds "
                               f"{lim.max_ratio:g}:1 ({produced} bytes from {consumed}); "
                               "refusing a possible decompression bomb", hint=_HINT_CORRUPT)

    def _guarded(self, fn: Callable[[], object], where: str):
        try:
            return fn()
        except ArchiveError:
            raise
        except (tarfile.TarError, EOFError, self._zstd_error) as exc:
            raise ArchiveError(f"archive is truncated or damaged at member {where!r} ({exc})",
                               hint=_HINT_CORRUPT) from None

    def _next(self, after: str) -> tarfile.TarInfo | None:
        assert self._tar is not None
        return self._guarded(self._tar.next, after)  # type: ignore[return-value]

    def read_manifest(self) -> Manifest:
        """Read and validate the first member, which must be ``manifest.json``."""
        try:
            self._tar = tarfile.open(fileobj=self._guard, mode="r|", format=tarfile.PAX_FORMAT)
        except tarfile.ReadError as exc:
            text = str(exc)
            if "empty" in text:
                raise ArchiveError(f"{self.path}: empty archive (no manifest.json)",
                                   hint=_HINT_CORRUPT) from None
            raise ArchiveError(f"{self.path}: not a tar or tar.zst archive ({exc})",
                               hint="give an archive written by `sglang-warmup cache pack`"
                               ) from None
        except self._zstd_error as exc:
            raise ArchiveError(f"{self.path}: damaged zstd stream ({exc})",
                               hint=_HINT_CORRUPT) from None
        ti = self._next(MANIFEST_NAME)
        if ti is None:
            raise ArchiveError(f"{self.path}: empty archive (no manifest.json)",
                               hint=_HINT_CORRUPT)
        check_member(ti, self.limits)
        if ti.name != MANIFEST_NAME:
            raise ArchiveError(f"archive member {ti.name!r} comes first; {MANIFEST_NAME} must "
                               "be the first member", hint="only archives written by "
                               "`sglang-warmup cache pack` or `cache merge` are accepted")
        if ti.size > self.limits.max_manifest_bytes:
            raise ArchiveError(f"archive member {MANIFEST_NAME!r}: {ti.size} bytes exceeds the "
                               f"limit of {self.limits.max_manifest_bytes} bytes",
                               hint=_HINT_CORRUPT)
        f = self._tar.extractfile(ti)
        assert f is not None
        data = self._guarded(lambda: f.read(ti.size + 1), MANIFEST_NAME)
        if len(data) != ti.size:  # type: ignore[arg-type]
            raise ArchiveError(f"archive is truncated: member {MANIFEST_NAME!r} ends early",
                               hint=_HINT_CORRUPT)
        manifest = Manifest.parse(data)  # type: ignore[arg-type]
        lim = self.limits
        if len(manifest.entries) > lim.max_entries:
            raise ArchiveError(f"{MANIFEST_NAME}: {len(manifest.entries)} entries exceed the "
                               f"limit of {lim.max_entries}", hint=_HINT_CORRUPT)
        for name, _, frec in manifest.members():
            if frec.size > lim.max_file_bytes:
                raise ArchiveError(f"archive member {name!r}: {frec.size} bytes exceeds the "
                                   f"per-file limit of {lim.max_file_bytes} bytes",
                                   hint=_HINT_CORRUPT)
        if manifest.size > lim.max_total_bytes:
            raise ArchiveError(f"{MANIFEST_NAME}: the archive declares {manifest.size} bytes, "
                               f"more than the limit of {lim.max_total_bytes} bytes",
                               hint=_HINT_CORRUPT)
        self.manifest = manifest
        self._budget = manifest.size + lim.max_manifest_bytes + _framing(manifest)
        return manifest

    def members(self) -> Iterator[Member]:
        """Every payload member, in manifest order, each verified once it has been read (the
        consumer may read ``chunks()``; otherwise the reader drains and verifies it)."""
        manifest = self.manifest or self.read_manifest()
        assert self._tar is not None
        listed = {name for name, _, _ in manifest.members()}
        previous = MANIFEST_NAME
        for name, entry, frec in manifest.members():
            ti = self._next(previous)
            if ti is None:
                raise ArchiveError(f"archive is truncated: the manifest lists {name!r} but the "
                                   "archive ends before it", hint=_HINT_CORRUPT)
            check_member(ti, self.limits)
            if ti.name != name:
                if ti.name in listed:
                    raise ArchiveError(f"archive member {ti.name!r} is out of order (expected "
                                       f"{name!r})", hint=_HINT_CORRUPT)
                raise ArchiveError(f"archive member {ti.name!r} is not listed in the manifest",
                                   hint=_HINT_CORRUPT)
            if ti.size != frec.size:
                raise ArchiveError(f"archive member {name!r}: {ti.size} bytes, the manifest "
                                   f"lists {frec.size}", hint=_HINT_CORRUPT)
            self.current = name
            fobj = self._tar.extractfile(ti)
            assert fobj is not None
            member = Member(self, fobj, name, entry, frec)
            yield member
            if not member.consumed:
                member.drain()
            previous = name
        ti = self._next(previous)
        if ti is not None:
            check_member(ti, self.limits)
            raise ArchiveError(f"archive member {ti.name!r} is not listed in the manifest",
                               hint=_HINT_CORRUPT)


def zstd_structure_problem(f: IO[bytes]) -> str:
    """Walk the zstd frame and block headers (RFC 8878) without decompressing; '' when every
    frame is complete.  The decompressor itself reports a stream cut at a block boundary as a
    clean end, so truncation is caught here, before anything is read."""
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
            if magic & 0xFFFFFFF0 == 0x184D2A50:          # skippable frame
                pos += int.from_bytes(read(4), "little")
                if pos > size:
                    raise EOFError
                continue
            if magic != 0xFD2FB528:
                return f"no zstd frame at byte {pos - 4}"
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
    header and its records (about the name's length), data padding; then the end blocks."""
    per_member = sum(2560 + 2 * len(name.encode()) for name, _, _ in manifest.members())
    return per_member + 2560 + 2 * len(MANIFEST_NAME) + 64 * 1024


class _NoError(Exception):
    """Placeholder for zstandard.ZstdError when reading an uncompressed archive."""


def check_member(ti: tarfile.TarInfo, limits: Limits) -> None:
    """Reject a member that could write outside the destination or is not a plain file."""
    name = ti.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"archive member {name!r}: absolute path; members must be relative",
                           hint=_HINT_CORRUPT)
    parts = name.split("/")
    if ".." in parts:
        raise ArchiveError(f"archive member {name!r}: path leaves the destination ('..')",
                           hint=_HINT_CORRUPT)
    if any(p in ("", ".") for p in parts) or "\\" in name or "\x00" in name:
        raise ArchiveError(f"archive member {name!r}: not a plain relative path",
                           hint=_HINT_CORRUPT)
    kinds = (
        (ti.issym(), f"symbolic link to {ti.linkname!r}"),
        (ti.islnk(), f"hard link to {ti.linkname!r}"),
        (ti.ischr(), "character device"),
        (ti.isblk(), "block device"),
        (ti.isfifo(), "FIFO"),
        (ti.isdir(), "directory"),
        (ti.issparse(), "sparse file"),
    )
    for hit, what in kinds:
        if hit:
            raise ArchiveError(f"archive member {name!r}: {what}; only regular files are "
                               "allowed", hint=_HINT_CORRUPT)
    if not ti.isreg():
        raise ArchiveError(f"archive member {name!r}: unsupported member type {ti.type!r}; only "
                           "regular files are allowed", hint=_HINT_CORRUPT)
    if ti.size > limits.max_file_bytes and name != MANIFEST_NAME:
        raise ArchiveError(f"archive member {name!r}: {ti.size} bytes exceeds the per-file "
                           f"limit of {limits.max_file_bytes} bytes", hint=_HINT_CORRUPT)


def _zstandard(why: str):
    try:
        import zstandard
    except ImportError:
        raise CacheError(f"the zstandard package is needed to {why}",
                         hint="pip install 'sglang-warmup[zstd]' (or zstandard)") from None
    return zstandard


# --- writing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where the bytes of one archived file come from."""

    entry: EntryRecord
    file: FileRecord
    #: returns a binary file object positioned at the start of exactly ``file.size`` bytes
    open: Callable[[], IO[bytes]]


def write_archive(out: str | os.PathLike[str], manifest: Manifest, sources: Sequence[Source], *,
                  zstd: bool = False, level: int = 3, progress: Progress | None = None) -> int:
    """Write ``manifest`` then every source in manifest order; atomic (temp file + rename).
    Returns the archive's size in bytes."""
    progress = progress or Progress.null()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    order = [(e.key, f.path) for e in manifest.entries for f in e.files]
    if order != [(s.entry.key, s.file.path) for s in sources]:
        raise AssertionError("sources must follow the manifest order")
    try:
        with open(tmp, "wb") as raw:
            sink: IO[bytes] = raw
            compressor = None
            if zstd:
                z = _zstandard("write a zstd-compressed archive")
                compressor = z.ZstdCompressor(level=level, write_checksum=True, threads=0
                                              ).stream_writer(raw, closefd=False)
                sink = compressor  # type: ignore[assignment]
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                data = manifest.to_json()
                tar.addfile(_tarinfo(MANIFEST_NAME, len(data), 0o644), io.BytesIO(data))
                progress.start("pack", manifest.size)
                for s in sources:
                    ti = _tarinfo(s.entry.member(s.file), s.file.size, s.file.mode)
                    with s.open() as fobj:
                        tar.addfile(ti, _Metered(fobj, progress))
            if compressor is not None:
                compressor.flush(z.FLUSH_FRAME)
                compressor.close()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    progress.finish()
    return out.stat().st_size


def _tarinfo(name: str, size: int, mode: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mode = mode
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    return ti


class _Metered(io.RawIOBase):
    def __init__(self, inner: IO[bytes], progress: Progress) -> None:
        self.inner = inner
        self.progress = progress

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        data = self.inner.read(n)
        self.progress.advance(len(data))
        return data


# --- pack -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackResult:
    """What ``pack`` wrote."""

    path: Path
    manifest: Manifest
    archive_bytes: int
    #: entries left out (incomplete, in flight, vanished) and other scan findings
    warnings: tuple[CacheWarning, ...]
    seconds: float

    @property
    def is_empty(self) -> bool:
        return not self.manifest.entries


def collect(entries: Iterable[CacheEntry], progress: Progress | None = None,
            warnings: list[CacheWarning] | None = None
            ) -> tuple[list[EntryRecord], list[Source]]:
    """Hash complete entries into records and sources (Triton groups in archive form)."""
    progress = progress or Progress.null()
    warnings = warnings if warnings is not None else []
    records: list[EntryRecord] = []
    sources: list[Source] = []
    for entry in sorted((e for e in entries if e.complete), key=lambda e: (e.kind, e.name)):
        try:
            rec, srcs = _collect_entry(entry, progress)
        except FileNotFoundError:
            warnings.append(CacheWarning(entry.kind, entry.path,
                                         "vanished while packing (pruned or replaced); skipped"))
            continue
        records.append(rec)
        sources.extend(srcs)
    return records, sources


def _collect_entry(entry: CacheEntry, progress: Progress) -> tuple[EntryRecord, list[Source]]:
    triton = any(f.startswith(GROUP_PREFIX) for f in entry.files) and \
        _kind_rule_is_triton(entry)
    files: list[FileRecord] = []
    openers: list[Callable[[], IO[bytes]]] = []
    for rel in entry.files:
        path = entry.path / rel if rel else entry.path
        if triton and rel.startswith(GROUP_PREFIX) and rel.endswith(".json"):
            raw = read_noatime(path)
            data = normalize_group(raw, str(path))
            progress.advance(len(raw))
            files.append(FileRecord(rel, len(data), hashlib.sha256(data).hexdigest(), 0o644))
            openers.append(lambda data=data: io.BytesIO(data))
            continue
        with open_noatime(path) as f:
            st = os.fstat(f.fileno())
            h = hashlib.sha256()
            n = 0
            while chunk := f.read(CHUNK):
                h.update(chunk)
                n += len(chunk)
                progress.advance(len(chunk))
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        files.append(FileRecord(rel, n, h.hexdigest(), mode))
        ident = (st.st_ino, st.st_dev, n, st.st_mtime_ns)
        openers.append(lambda path=path, ident=ident: _open_same(path, ident))
    record = EntryRecord(entry.kind, entry.name, entry.is_dir, tuple(files))
    # ``entry.files`` is sorted, so ``files`` follows the record's order.
    return record, [Source(record, f, o) for f, o in zip(files, openers)]


def _kind_rule_is_triton(entry: CacheEntry) -> bool:
    parts = tuple(entry.name.split("/")) if entry.name else ()
    rule = kind(entry.kind).layout.entry_rule(parts, entry.is_dir)
    return rule is not None and rule.complete == "triton"


def _open_same(path: Path, ident: tuple[int, int, int, int]) -> IO[bytes]:
    f = open_noatime(path)
    st = os.fstat(f.fileno())
    if (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns) != ident:
        f.close()
        raise CacheError(f"{path} changed while packing",
                         hint="a process is rewriting the cache in place; pack again when it "
                              "is done (entries are only packed whole)")
    return f


def pack(out: str | os.PathLike[str], locations: Iterable[Location], *, zstd: bool = False,
         level: int = 3, fingerprint: Fingerprint | None = None,
         progress: Progress | None = None) -> PackResult:
    """Pack every complete entry of ``locations`` into ``out``."""
    progress = progress or Progress.null()
    started = time.monotonic()
    locations = list(locations)
    progress.step("scanning " + ", ".join(loc.kind.name for loc in locations if loc.path))
    info = scan(locations)
    warnings = list(info.warnings)
    complete = [e for e in info.entries if e.complete]
    total = sum(e.size_on_disk for e in complete)
    progress.step(f"hashing {len(complete)} entries ({size_str(total)})")
    progress.start("hash", total)
    with os_errors("pack", "check that the cache files are readable and the output directory "
                           "is writable with free space"):
        records, sources = collect(complete, progress, warnings)
        progress.finish()
        manifest = Manifest(fingerprint or fp_mod.current(), tuple(records), _producer())
        progress.step(f"writing {out}")
        size = write_archive(out, manifest, sources, zstd=zstd, level=level,
                             progress=progress)
    return PackResult(Path(out), manifest, size, tuple(warnings), time.monotonic() - started)


# --- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyReport:
    """An archive whose every member matched its manifest."""

    path: Path
    compressed: bool
    archive_bytes: int
    manifest: Manifest
    local: Fingerprint
    compatibility: Compatibility


def verify(archive: str | os.PathLike[str], *, limits: Limits | None = None,
           local: Fingerprint | None = None, progress: Progress | None = None) -> VerifyReport:
    """Hash every member against the manifest; an ArchiveError names the first bad member."""
    progress = progress or Progress.null()
    with ArchiveReader(archive, limits) as reader:
        manifest = reader.read_manifest()
        progress.start("verify", manifest.size)
        for member in reader.members():
            for chunk in member.chunks():
                progress.advance(len(chunk))
        progress.finish()
        here = local or fp_mod.current()
        return VerifyReport(Path(archive), reader.compressed, reader.archive_bytes, manifest,
                            here, fp_mod.compare(manifest.fingerprint, here))


# --- restore ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedEntry:
    """One entry of a restore plan."""

    entry: EntryRecord
    target: Path | None
    #: add | fill (complete an incomplete Triton entry) | skip (already complete) |
    #: blocked (an incomplete non-Triton entry is there) | nowhere (kind has no directory here)
    action: str


@dataclass(frozen=True)
class RestoreResult:
    """What ``RestorePlan.execute`` did, entry by entry."""

    outcomes: tuple[Outcome, ...]
    seconds: float
    bytes_read: int

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)


class EntryPlanView:
    """What every entry-by-entry install plan (restore, pull) says about itself.  Needs an
    ``items`` tuple of :class:`PlannedEntry`."""

    items: tuple[PlannedEntry, ...]

    def by_action(self, action: str) -> tuple[PlannedEntry, ...]:
        return tuple(i for i in self.items if i.action == action)

    @property
    def to_write(self) -> tuple[PlannedEntry, ...]:
        return tuple(i for i in self.items if i.action in ("add", "fill"))

    @property
    def bytes_to_write(self) -> int:
        return sum(i.entry.size for i in self.to_write)

    @property
    def nothing_to_do(self) -> bool:
        return not self.to_write


@dataclass(frozen=True)
class RestorePlan(EntryPlanView):
    """What a restore would do; nothing has been written yet.  ``execute()`` does it."""

    archive: Path
    manifest: Manifest
    compatibility: Compatibility
    roots: Mapping[str, Path]
    items: tuple[PlannedEntry, ...]
    limits: Limits = field(default_factory=Limits)

    def execute(self, *, progress: Progress | None = None,
                on_entry: Callable[[Outcome], None] | None = None) -> RestoreResult:
        """Stage every entry to write, verify the whole archive, then move entries into place
        one rename each.  ``on_entry`` is called after each entry is committed."""
        with os_errors("restore", "check free space and permissions of the destination; "
                                  "no partial entry is visible, rerun to finish"):
            return _execute(self, progress or Progress.null(), on_entry)


def restore_roots(kinds: Iterable[str], dest: str | os.PathLike[str] | None,
                  env: Mapping[str, str] | None = None) -> dict[str, Path | None]:
    """Where each kind goes: under ``dest`` (the ``--root`` layout) or where SGLang looks."""
    chosen = [kind(k) for k in sorted(set(kinds))]
    locs = resolve(chosen, root=dest) if dest is not None else resolve(chosen, env=env)
    return {loc.kind.name: loc.path for loc in locs}


def plan_restore(archive: str | os.PathLike[str], *, dest: str | os.PathLike[str] | None = None,
                 kinds: Iterable[str] | None = None, force: bool = False,
                 env: Mapping[str, str] | None = None, limits: Limits | None = None,
                 local: Fingerprint | None = None) -> RestorePlan:
    """Read the manifest, apply the compatibility rule and compare with the destination."""
    limits = limits or Limits()
    with ArchiveReader(archive, limits) as reader:
        manifest = reader.read_manifest()
    compat = fp_mod.require_compatible(manifest.fingerprint, local or fp_mod.current(),
                                       force=force, what=f"archive {archive}")
    wanted = set(kinds) if kinds is not None else None
    entries = [e for e in manifest.entries if wanted is None or e.kind in wanted]
    roots = restore_roots((e.kind for e in entries), dest, env)
    return RestorePlan(Path(archive), manifest, compat,
                       {k: v for k, v in roots.items() if v is not None},
                       tuple(plan_entry(e, roots.get(e.kind)) for e in entries), limits)


def plan_entry(entry: EntryRecord, root: Path | None) -> PlannedEntry:
    if root is None:
        return PlannedEntry(entry, None, "nowhere")
    target = target_of(root, entry)
    if not os.path.lexists(target):
        return PlannedEntry(entry, target, "add")
    if complete_at(root, entry):
        return PlannedEntry(entry, target, "skip")
    if is_triton_entry(entry) and target.is_dir() and not target.is_symlink():
        return PlannedEntry(entry, target, "fill")
    if not entry.name and target.is_dir() and not os.listdir(target):
        return PlannedEntry(entry, target, "add")
    return PlannedEntry(entry, target, "blocked")


def _execute(plan: RestorePlan, progress: Progress,
             on_entry: Callable[[Outcome], None] | None) -> RestoreResult:
    started = time.monotonic()
    wanted = {i.entry.key for i in plan.to_write}
    installer = Installer(plan.roots)
    installer.clean_stale()
    outcomes: list[Outcome] = []
    try:
        with ArchiveReader(plan.archive, plan.limits) as reader:
            manifest = reader.read_manifest()
            if manifest != plan.manifest:
                raise ArchiveError(f"{plan.archive} changed since the restore was planned",
                                   hint="plan and restore again")
            progress.start("restore", manifest.size)
            staged_keys: list[str] = []
            for member in reader.members():
                if member.entry.key in wanted:
                    with installer.open(member.entry, member.file) as out:
                        for chunk in member.chunks():
                            out.write(chunk)
                            progress.advance(len(chunk))
                    if not staged_keys or staged_keys[-1] != member.entry.key:
                        staged_keys.append(member.entry.key)
                        installer.mark_staged(member.entry)
                else:
                    for chunk in member.chunks():
                        progress.advance(len(chunk))
            bytes_read = reader.archive_bytes
        progress.finish()
        outcomes.extend(installer.commit_all(on_entry))
    finally:
        installer.cleanup()
    return RestoreResult(tuple(outcomes), time.monotonic() - started, bytes_read)


# --- merge ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    """What ``merge`` wrote."""

    path: Path
    manifest: Manifest
    archive_bytes: int
    #: entries found in more than one input with identical content (kept once)
    duplicates: int
    notes: tuple[str, ...]


def merge(out: str | os.PathLike[str], inputs: Sequence[str | os.PathLike[str]], *,
          zstd: bool = False, force: bool = False, limits: Limits | None = None,
          progress: Progress | None = None) -> MergeResult:
    """Merge archives (several ranks or nodes) into one: identical entries are kept once;
    the same entry with different content is an error naming it."""
    progress = progress or Progress.null()
    limits = limits or Limits()
    if not inputs:
        raise CacheError("nothing to merge", hint="give at least one archive")
    manifests = []
    for path in inputs:
        with ArchiveReader(path, limits) as reader:
            manifests.append(reader.read_manifest())
    first = manifests[0].fingerprint
    notes: list[str] = []
    for path, m in zip(inputs[1:], manifests[1:]):
        verdict = fp_mod.compare(m.fingerprint, first)
        if not verdict.ok and not force:
            from cache_tools.errors import IncompatibleError

            raise IncompatibleError(
                f"{path} was built by another toolchain than {inputs[0]}: "
                + verdict.describe().replace("(here)", f"({Path(inputs[0]).name})"),
                hint="merge only archives of one toolchain, or pass --force")
        notes.extend(verdict.notes)
    chosen: dict[str, tuple[EntryRecord, int]] = {}
    duplicates = 0
    for i, m in enumerate(manifests):
        for e in m.entries:
            seen = chosen.get(e.key)
            if seen is None:
                chosen[e.key] = (e, i)
            elif seen[0].digest == e.digest:
                duplicates += 1
            else:
                raise ArchiveError(
                    f"conflicting content for entry {e.key}: {inputs[seen[1]]} has sha256 "
                    f"{seen[0].digest[:16]}, {inputs[i]} has {e.digest[:16]}",
                    hint="the same entry was compiled differently; merge archives of one "
                         "toolchain, or drop one of them")
    work = Path(out).parent / f".sgw-merge-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with os_errors("merge"):
        work.mkdir(parents=True)
    try:
        progress.step(f"reading {len(inputs)} archives")
        for i, path in enumerate(inputs):
            mine = {k for k, (_, j) in chosen.items() if j == i}
            with ArchiveReader(path, limits) as reader:
                reader.read_manifest()
                for member in reader.members():
                    if member.entry.key not in mine:
                        member.drain()
                        continue
                    dst = work / member.name
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    with open(dst, "wb") as f:
                        for chunk in member.chunks():
                            f.write(chunk)
        records = tuple(sorted((e for e, _ in chosen.values()), key=lambda e: (e.kind, e.name)))
        manifest = Manifest(first, records, _producer())
        sources = [Source(e, f, lambda p=work / e.member(f): open(p, "rb"))
                   for e in records for f in e.files]
        with os_errors("merge"):
            size = write_archive(out, manifest, sources, zstd=zstd, progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return MergeResult(Path(out), manifest, size, duplicates, tuple(dict.fromkeys(notes)))

