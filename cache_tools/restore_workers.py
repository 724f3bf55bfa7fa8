"""Restore workers: a large uncompressed archive of our own checked and staged by forked
processes, each from its own byte range, at once.

Restoring many small files is Python work per file (the header comparison, the hash, the
write) that holds the interpreter lock: threads do not help, processes do.  The parent plans
the ranges from the manifest alone (our writer's layout is a function of it), stages every
entry to write (``Installer.stage``: the stage directories exist before the fork), forks, and
collects the workers' progress; each worker reopens the archive, seeks to its range and runs the
reader's own checks on it (``ArchiveReader.range_members``: header bytes, sizes, sha256, Triton
groups), writing the members of its entries where the parent staged them.  The parent then
checks the archive's tail (``ArchiveReader.check_tail_at``).

Anything unexpected (a worker that fails for any reason, a header that is not byte for byte
ours, a tail that is not clean) makes :func:`stage` return False: the caller discards what was
staged and reads the archive sequentially, which accepts and refuses exactly what it always did,
with its own messages.  The workers can make a restore faster, never different.

They are used only where they are safe and pay: a fork start method (Linux), no other thread in
the process (a fork copies no thread and no lock they hold), an uncompressed archive (a zstd
stream has no byte offsets to start from), at least :data:`MIN_FILES` payload files or
:data:`MIN_BYTES` of payload.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import struct
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from cache_tools import groups, tarfmt
from cache_tools.manifest import MANIFEST_NAME, EntryRecord, Manifest
from cache_tools.reader import ArchiveReader, Limits, Member
from cache_tools.staging import Installer, StagedEntry

#: below this many payload files and bytes a restore stays in one process (a fork costs more
#: than it saves)
MIN_FILES = 2048
MIN_BYTES = 256 << 20
#: at most this many workers (more gain nothing on the file systems measured)
MAX_JOBS = 8
#: a worker reports its progress every this many bytes
_REPORT_BYTES = 8 << 20
_COUNT = struct.Struct("<Q")
_FALLBACK = 3            # a worker's exit status: read the archive sequentially


def default_jobs() -> int:
    """The CPUs this process may run on, at most MAX_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_JOBS))


def usable(reader: ArchiveReader, manifest: Manifest, jobs: int) -> bool:
    """Whether workers may stage this archive (see the module docstring)."""
    return (jobs > 1 and hasattr(os, "fork") and not reader.compressed
            and (manifest.nb_files >= MIN_FILES or manifest.size >= MIN_BYTES)
            and single_threaded())


def single_threaded() -> bool:
    """No other thread runs in this process (a forked child would miss it and any lock it
    holds)."""
    return threading.active_count() == 1


def stage_members(members: Iterable[Member], stage: Callable[[EntryRecord], StagedEntry],
                  targets: Mapping[str, Path | None], advance: Callable[[int], None]) -> None:
    """Every member through the reader's checks; those of entries to write into staging."""
    staged: StagedEntry | None = None
    key = ""
    target: Path | None = None
    try:
        for m in members:
            if m.entry.key != key:
                if staged is not None:
                    staged.close()
                    staged = None
                key = m.entry.key
                target = targets.get(key)
                if target is not None:
                    staged = stage(m.entry)
            if staged is None:
                m.drain()
            elif m.children is not None:
                staged.write(m.file, groups.relocate(m.children, target))  # type: ignore[arg-type]
            elif m.data is not None:
                staged.write(m.file, m.data)
            else:
                with staged.open(m.file) as out:
                    for chunk in m.chunks():
                        out.write(chunk)
            advance(m.file.size)
    finally:
        if staged is not None:
            staged.close()


def ranges(manifest: Manifest, start: int, jobs: int) -> tuple[list[tuple[int, int, int]], int]:
    """Up to ``jobs`` contiguous runs of entries of about equal work, as (first entry, end
    entry, byte offset of the first entry's first header), and the byte offset after the last
    member, for an archive laid out by our writer from ``start`` (the first payload header)."""
    entries = manifest.entries
    offsets, weights = [], []
    offset = start
    for entry in entries:
        offsets.append(offset)
        prefix = "/".join(p for p in (entry.kind, entry.name) if p)
        weight = 0
        for f in entry.files:
            name = f"{prefix}/{f.path}" if f.path else prefix
            if len(name) <= 100 and f.size < 8 << 30 and name.isascii():
                head = tarfmt.BLOCK
            else:
                head = len(tarfmt.header(name, f.size, f.mode))
            offset += head + f.size + (-f.size % tarfmt.BLOCK)
            weight += f.size + (16 << 10)       # a file costs about what 16 KiB of data does
        weights.append(weight)
    total = sum(weights)
    runs: list[tuple[int, int, int]] = []
    first, done = 0, 0
    for i, w in enumerate(weights):
        done += w
        if len(runs) < jobs - 1 and done >= total * (len(runs) + 1) / jobs and i + 1 < len(entries):
            runs.append((first, i + 1, offsets[first]))
            first = i + 1
    runs.append((first, len(entries), offsets[first] if entries else start))
    return runs, offset


def stage(reader: ArchiveReader, manifest: Manifest, installer: Installer,
          targets: Mapping[str, Path | None], jobs: int, advance: Callable[[int], None]) -> bool:
    """Stage the archive with ``jobs`` forked workers; True when everything is staged and the
    whole archive checked, False when the caller must read it sequentially (after discarding
    what was staged).  ``reader`` has just read the manifest."""
    runs, end = ranges(manifest, reader.payload_offset, jobs)
    stage_of = {e.key: installer.stage(e) for e in manifest.entries if targets.get(e.key) is not None}
    pids: list[int] = []
    pipes: list[int] = []
    try:
        for first, last, offset in runs:
            try:
                r, w = os.pipe()
            except OSError:                                 # no descriptor to spare: one will do
                return False
            pipes.append(r)
            try:
                pid = os.fork()
            except OSError:                                 # no process to spare: one will do
                os.close(w)
                return False
            if pid == 0:                                    # the worker
                os.close(r)
                os._exit(_work(reader.path, reader.limits, manifest, offset,
                               manifest.entries[first:last], stage_of, targets, w))
            os.close(w)
            pids.append(pid)
        _progress(pipes, advance)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        pids = []
    finally:
        for fd in pipes:
            os.close(fd)
        for pid in pids:                                    # interrupted: stop and reap them
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    if any(codes):
        return False
    last = manifest.entries[-1] if manifest.entries else None
    previous = last.member(last.files[-1]) if last is not None else MANIFEST_NAME
    try:
        reader.check_tail_at(manifest, end, previous)
    except Exception:                                       # the sequential read says what
        return False
    return True


def _work(path: Path, limits: Limits, manifest: Manifest, offset: int,
          entries: Sequence[EntryRecord], stage_of: Mapping[str, StagedEntry],
          targets: Mapping[str, Path | None], report_fd: int) -> int:
    """One worker: its range checked and staged; 0, or _FALLBACK on anything at all."""
    try:
        gc.disable()                                        # a short life: no cycles to find
        pending = [0]

        def advance(n: int) -> None:
            pending[0] += n
            if pending[0] >= _REPORT_BYTES:
                os.write(report_fd, _COUNT.pack(pending[0]))
                pending[0] = 0

        with ArchiveReader(path, limits) as reader:
            stage_members(reader.range_members(manifest, offset, entries),
                          lambda entry: stage_of[entry.key], targets, advance)
        if pending[0]:
            os.write(report_fd, _COUNT.pack(pending[0]))
        return 0
    except BaseException:                                   # noqa: BLE001 - the parent decides
        return _FALLBACK
    finally:
        os.close(report_fd)


def _progress(pipes: list[int], advance: Callable[[int], None]) -> None:
    """The workers' byte counts, as they come, until every worker has closed its pipe."""
    open_fds = list(pipes)
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        for fd in ready:
            data = os.read(fd, _COUNT.size * 512)
            if not data:
                open_fds.remove(fd)
                continue
            for (n,) in _COUNT.iter_unpack(data[:len(data) - len(data) % _COUNT.size]):
                advance(n)
