"""Pack: every complete entry of a set of cache locations into one archive, each file read
once (``archive`` re-exports ``pack``, ``PackResult`` and ``read_entry``).

The manifest must come first but lists every file's sha256, which is only known once the file
is read; its length, however, is known from the scan alone (sizes, names and modes; every hash
has 64 digits: ``manifest.json_size``), so the writer leaves exactly that much room, the payload
streams after it while it is hashed, and the manifest fills the room at the end.  A large cache
is read, hashed and written by forked workers (``forks.map_runs``): in place for a tar, in
frames of their own for a zstd archive (``writer.frame_cuts``).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

from cache_tools import fingerprint as fp_mod
from cache_tools import forks
from cache_tools.archive import groups
from cache_tools.archive import tarfmt
from cache_tools.errors import CacheError, os_errors
from cache_tools.fingerprint import Fingerprint
from cache_tools.locations import Location
from cache_tools.archive.manifest import (EntryRecord, FileRecord, Manifest, content_digest_of,
                                  entry_json, file_record, files_json, json_size, member_prefix,
                                  paused_gc)
from cache_tools.progress import Progress
from cache_tools.archive.reader import CHUNK, WHOLE, zstandard_module
from cache_tools.scan import CacheEntry, CacheWarning, noatime_fd, scan, size_str
from cache_tools.archive.staging import clean_stale
from cache_tools.versions import dist_version
from cache_tools.archive.writer import ArchiveWriter, PlacedWriter, ZstdFrames, frame_cuts


def producer() -> str:
    """What wrote an archive: this package and its version."""
    version = dist_version("sglang-warmup")
    return f"sglang-warmup {version}" if version else "sglang-warmup"


# --- reading files ------------------------------------------------------------------------------


def _changed(path: str) -> CacheError:
    return CacheError(f"{path} changed while packing",
                      hint="a process is rewriting the cache in place; pack again when it is "
                           "done (entries are only packed whole)")


class _File(NamedTuple):
    """One file to pack: what the scan saw, or a group file's archive form."""

    rel: str
    path: str
    size: int
    mode: int
    #: (inode, mtime_ns) as scanned; the file must still match after it is read
    ident: tuple[int, int]
    data: bytes | None = None


class _Vanished(Exception):
    """An entry disappeared while packing (pruned, replaced)."""

    def __init__(self, entry: CacheEntry) -> None:
        super().__init__(entry.path)
        self.entry = entry


def _plan_entry(entry: CacheEntry) -> list[_File]:
    """The files of one entry as they will be packed (group files in archive form, from the
    children the scan read)."""
    base = str(entry.path)
    listed = dict(entry.groups)
    files = []
    for rel, (size, mode, ino, mtime_ns) in zip(entry.files, entry.stats):
        mode = 0o755 if mode & 0o111 else 0o644
        path = f"{base}/{rel}" if rel else base
        children = listed.get(rel) if listed else None
        if children is None:
            files.append(_File(rel, path, size, mode, (ino, mtime_ns)))
        else:
            data = groups.archive_form(children)
            files.append(_File(rel, path, len(data), mode, (ino, mtime_ns), data))
    return files


#: an entry's files as the archive holds them: (path, size, mode), a group file's size its
#: archive form's
_Measured = tuple[tuple[str, int, int], ...]


def _measure(entry: CacheEntry) -> _Measured:
    """What the layout and the manifest's room need of an entry, from the scan alone: each
    file's path, size and mode as ``_plan_entry`` will pack it (the parent measures every
    entry; the workers plan, read and hash their own)."""
    listed = dict(entry.groups) if entry.groups else None
    out = []
    for rel, (size, mode, _, _) in zip(entry.files, entry.stats):
        if listed is not None and rel in listed:
            size = groups.archive_size(listed[rel])
        out.append((rel, size, 0o755 if mode & 0o111 else 0o644))
    return tuple(out)


class _Packed(NamedTuple):
    """One entry as written: its files' sha256s, its digest and its record as the manifest
    spells it (``manifest.entry_json``), made where it was hashed."""

    hashes: list[str]
    digest: str
    text: str


def _packed(entry: CacheEntry, files: Sequence[_File], hashes: list[str]) -> _Packed:
    listed = files_json([(f.rel, f.size, h, f.mode) for f, h in zip(files, hashes)])
    digest = content_digest_of(listed, entry.is_dir)
    return _Packed(hashes, digest, entry_json(entry.kind, entry.name, entry.is_dir, listed,
                                              digest))


#: a ``_Packed`` as a worker sends it back: marshal takes a plain tuple, not a NamedTuple
_Marshaled = tuple[list[str], str, str]


def _marshaled(p: _Packed) -> _Marshaled:
    return (p.hashes, p.digest, p.text)


def _read_exact(fd: int, size: int, path: str) -> bytes:
    data = os.read(fd, size) if size else b""
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            raise _changed(path)
        data += more
    return data


def _read_file(f: _File) -> bytes:
    """A whole file as planned (FileNotFoundError when it vanished; CacheError when it no
    longer is the file the scan saw)."""
    if f.data is not None:
        return f.data
    fd = noatime_fd(f.path)
    try:
        data = _read_exact(fd, f.size, f.path)
        _check_same(fd, f)
    finally:
        os.close(fd)
    return data


def _check_same(fd: int, f: _File) -> None:
    st = os.fstat(fd)
    if (st.st_ino, st.st_mtime_ns, st.st_size) != (*f.ident, f.size):
        raise _changed(f.path)


def _entry_record(entry: CacheEntry, files: _Measured, packed: _Packed) -> EntryRecord:
    """The manifest's record of an entry packed as measured, its digest the one computed where
    it was hashed."""
    rels, sizes, modes = zip(*files) if files else ((), (), ())
    record = EntryRecord(entry.kind, entry.name, entry.is_dir,
                         tuple(map(file_record, zip(rels, sizes, packed.hashes, modes))))
    record.__dict__["digest"] = packed.digest
    return record


def _record(entry: CacheEntry, files: list[_File], hashes: Sequence[str]) -> EntryRecord:
    return EntryRecord(entry.kind, entry.name, entry.is_dir,
                       tuple(FileRecord(f.rel, f.size, h, f.mode) for f, h in zip(files, hashes)))


def read_entry(entry: CacheEntry) -> tuple[EntryRecord, list[bytes]]:
    """One complete entry read whole: its record and each file's bytes (archive form), for
    the shared store.  FileNotFoundError when it vanished; CacheError when it changed."""
    files = _plan_entry(entry)
    datas = [_read_file(f) for f in files]
    hashes = [hashlib.sha256(d).hexdigest() for d in datas]
    return _record(entry, files, hashes), datas


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


def pack(out: str | os.PathLike[str], locations: Iterable[Location], *, zstd: bool = False,
         level: int = 3, fingerprint: Fingerprint | None = None,
         progress: Progress | None = None, jobs: int | None = None) -> PackResult:
    """Pack every complete entry of ``locations`` into ``out``, reading each file once.
    ``jobs``: forked workers that scan, read and compress a large cache (default: the usable
    CPUs, at most ``forks.MAX_JOBS``; the archive is the same for any number)."""
    if zstd:  # before the scan and the fingerprint, not after them
        zstandard_module("write a zstd-compressed archive")
    with paused_gc():
        return _pack_all(Path(out), list(locations), zstd, level, fingerprint,
                         progress or Progress.null(), forks.jobs_for(jobs))


def _pack_all(out: Path, locations: list[Location], zstd: bool, level: int,
              fingerprint: Fingerprint | None, progress: Progress, jobs: int) -> PackResult:
    started = time.monotonic()
    progress.step("scanning " + ", ".join(loc.kind.name for loc in locations if loc.path))
    info = scan(locations, jobs)
    warnings = list(info.warnings)
    complete = sorted((e for e in info.entries if e.complete), key=lambda e: (e.kind, e.name))
    fp = fingerprint or fp_mod.current()
    with os_errors("pack", "check that the cache files are readable and the output directory "
                           "is writable with free space"):
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out.parent)
        planned = [(e, _measure(e)) for e in complete]
        for _ in range(4):
            total = sum(size for _, files in planned for _, size, _ in files)
            progress.step(f"packing {len(planned)} entries ({size_str(total)}) into {out}")
            try:
                manifest, size = _pack(out, planned, fp, zstd, level, progress, jobs)
                break
            except _Vanished as gone:
                warnings.append(_vanished(gone.entry))
                planned = [(e, f) for e, f in planned if e is not gone.entry]
        else:
            raise CacheError("entries keep vanishing while packing",
                             hint="pack when nothing prunes or rewrites the cache")
    return PackResult(out, manifest, size, tuple(warnings), time.monotonic() - started)


def _vanished(e: CacheEntry) -> CacheWarning:
    return CacheWarning(e.kind, e.path, "vanished while packing (pruned or replaced); skipped")


def _pack(out: Path, planned: list[tuple[CacheEntry, _Measured]], fp: Fingerprint,
          zstd: bool, level: int, progress: Progress, jobs: int) -> tuple[Manifest, int]:
    made_by = producer()
    room = json_size(fp, made_by, ((e.kind, e.name, e.is_dir, files) for e, files in planned))
    writer = ArchiveWriter(out, room, zstd, level, jobs)
    try:
        total = sum(size for _, files in planned for _, size, _ in files)
        progress.start("pack", total)
        packed = _compress_frames(writer, planned, level, jobs, progress) if zstd else \
            _encode_forked(writer, planned, jobs, progress.advance)
        if packed is None:
            if progress.done:           # workers counted some of it, then one failed: anew
                progress.start("pack", total)
            packed = [_encode_entry(writer, e, _plan_entry(e), progress.advance)
                      for e, _ in planned]
        manifest = Manifest(fp, tuple(_entry_record(e, files, p)
                                      for (e, files), p in zip(planned, packed)), made_by)
        size = writer.finish(manifest.to_json([p.text for p in packed]))
    finally:
        writer.close()
    progress.finish()
    return manifest, size


def _layout(start: int, planned: list[tuple[CacheEntry, _Measured]]) -> tuple[list[int], int]:
    """Each entry's first header offset and the end of the payload, members laid out from
    ``start`` by the names and sizes alone."""
    return tarfmt.layout(start, ((member_prefix(e.kind, e.name), files) for e, files in planned))


def _encode_forked(writer: ArchiveWriter, planned: list[tuple[CacheEntry, _Measured]],
                   jobs: int, advance: Callable[[int], None]) -> list[_Packed] | None:
    """The payload planned, read, hashed and written in place by forked workers, run of
    entries after run of entries (``forks.map_runs``), each at the offset the layout gives it
    (it follows from the names and sizes); each entry as packed.  None when the payload is to
    be written here (a small cache, no fork, a worker that failed: that path then says what is
    wrong)."""
    sizes = [sum(size for _, size, _ in files) for _, files in planned]
    nfiles = sum(len(files) for _, files in planned)
    if not forks.worth(nfiles, sum(sizes)) or not forks.usable(jobs):
        return None
    offsets, offset = _layout(writer.offset, planned)
    fd = writer.fileno()

    def work(first: int, end: int, progress: Callable[[int], None]) -> bytes:
        """One run of entries read, hashed and written in place; (the index of an entry that
        vanished or -1, the entries packed before it)."""
        sink = PlacedWriter(fd, offsets[first])
        packed: list[_Marshaled] = []
        for i in range(first, end):
            entry = planned[i][0]
            try:
                packed.append(_marshaled(_encode_entry(sink, entry, _plan_entry(entry), progress)))
            except _Vanished:
                return marshal.dumps((i, packed))
        sink.flush()
        return marshal.dumps((-1, packed))

    results = forks.map_runs([forks.weight(size, len(files))
                              for size, (_, files) in zip(sizes, planned)], jobs, work, advance)
    if results is None:
        return None
    packed: list[_Packed] = []
    for vanished, some in map(marshal.loads, results):
        if vanished >= 0:
            raise _Vanished(planned[vanished][0])
        packed += map(_Packed._make, some)
    writer.placed(offset)
    return packed


def _compress_frames(writer: ArchiveWriter, planned: list[tuple[CacheEntry, _Measured]],
                     level: int, jobs: int, progress: Progress) -> list[_Packed]:
    """A zstd archive's payload, planned, read, hashed and compressed in frames
    (``frame_cuts``): runs of frames by forked workers where they pay, else all of them here
    (compressed on a thread of their own); each entry as packed."""
    sizes = [sum(size for _, size, _ in files) for _, files in planned]
    cuts = frame_cuts(sizes)
    paths = writer.frame_paths(max(len(cuts), 1))

    def compress(first: int, end: int, background: bool, advance: Callable[[int], None]
                 ) -> bytes:
        """Frames ``first`` to ``end`` into ``paths[first]``: (first, the index of an entry
        that vanished or -1, the entries packed before it)."""
        packed: list[_Marshaled] = []
        frames = ZstdFrames(paths[first], level, background)
        try:
            for c in range(first, end):
                if c > first:
                    frames.cut()
                for i in range(*cuts[c]):
                    entry = planned[i][0]
                    try:
                        packed.append(_marshaled(_encode_entry(frames, entry,
                                                               _plan_entry(entry), advance)))
                    except _Vanished:
                        return marshal.dumps((first, i, packed))
        finally:
            frames.close()
        return marshal.dumps((first, -1, packed))

    nfiles = sum(len(files) for _, files in planned)
    results = None
    if len(cuts) > 1 and forks.worth(nfiles, sum(sizes)) and forks.usable(jobs):
        weights = [forks.weight(sum(sizes[a:b]), sum(len(planned[i][1]) for i in range(a, b)))
                   for a, b in cuts]
        results = forks.map_runs(weights, jobs,
                                 lambda a, b, advance: compress(a, b, False, advance),
                                 progress.advance)
    if results is None:
        if progress.done:               # workers counted some of it, then one failed: anew
            progress.start("pack", sum(sizes))
        results = [compress(0, len(cuts), True, progress.advance)] if cuts else []
    files: list[Path] = []
    packed: list[_Packed] = []
    for first, vanished, some in map(marshal.loads, results):
        if vanished >= 0:
            raise _Vanished(planned[vanished][0])
        files.append(paths[first])
        packed += map(_Packed._make, some)
    writer.framed(files, _layout(writer.offset, planned)[1])
    return packed


_Sink = ArchiveWriter | PlacedWriter | ZstdFrames


def _encode_entry(sink: _Sink, entry: CacheEntry, files: list[_File],
                  advance: Callable[[int], None]) -> _Packed:
    """One entry's members written to ``sink``; the entry as packed."""
    encoded = _encode(entry, files)
    if encoded is None:            # a file too large to hold: streamed
        return _packed(entry, files, _write_entry(sink, entry, files, advance))
    parts, hashes = encoded
    if isinstance(sink, PlacedWriter):
        sink.write_parts(parts)    # gathered by pwritev: no copy of the data here
    else:
        sink.write(b"".join(parts))
    advance(sum(f.size for f in files))
    return _packed(entry, files, hashes)


def _encode(entry: CacheEntry, files: list[_File]) -> tuple[list[bytes], list[str]] | None:
    """An entry's members (header, data, padding each, in a row) and sha256s, read from disk;
    None when a file is too large to hold in memory (the caller streams the entry)."""
    if any(f.size > WHOLE for f in files):
        return None
    prefix = member_prefix(entry.kind, entry.name)
    parts: list[bytes] = []
    hashes = []
    for f in files:
        hashes.append(_encode_one(entry, f, f"{prefix}/{f.rel}" if f.rel else prefix, parts))
    return parts, hashes


def _encode_one(entry: CacheEntry, f: _File, name: str, parts: list[bytes]) -> str:
    """One member (header, data, padding) added to ``parts``; its sha256."""
    try:
        data = _read_file(f)
    except FileNotFoundError:
        raise _Vanished(entry) from None
    parts.append(tarfmt.header(name, f.size, f.mode))
    parts.append(data)
    pad = -f.size % tarfmt.BLOCK
    if pad:
        parts.append(tarfmt.ZERO_BLOCK[:pad])
    return hashlib.sha256(data).hexdigest()


def _write_entry(sink: _Sink, entry: CacheEntry, files: list[_File],
                 advance: Callable[[int], None]) -> list[str]:
    """An entry holding a file too large to read whole: each member written as it is read."""
    hashes = []
    prefix = member_prefix(entry.kind, entry.name)
    for f in files:
        name = f"{prefix}/{f.rel}" if f.rel else prefix
        if f.size <= WHOLE:
            member: list[bytes] = []
            hashes.append(_encode_one(entry, f, name, member))
            sink.write(b"".join(member))
            advance(f.size)
            continue
        try:
            fd = noatime_fd(f.path)
        except FileNotFoundError:
            raise _Vanished(entry) from None
        try:
            hashes.append(_write_large(sink, fd, name, f, advance))
        finally:
            os.close(fd)
    return hashes


def _write_large(sink: _Sink, fd: int, name: str, f: _File,
                 advance: Callable[[int], None]) -> str:
    sink.write(tarfmt.header(name, f.size, f.mode))
    h = hashlib.sha256()
    left = f.size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            raise _changed(f.path)
        h.update(chunk)
        sink.write(chunk)
        left -= len(chunk)
        advance(len(chunk))
    _check_same(fd, f)
    sink.write(tarfmt.padding(f.size))
    return h.hexdigest()
