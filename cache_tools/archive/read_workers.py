"""Read workers: a large archive of our own read by forked processes at once,
each taking run after run of entries (``forks.map_runs``): ``check`` runs every check of the
reader on it (verify), ``stage`` also writes what a restore installs.

Reading many small files is Python work per file (the header comparison, the hash, for a
restore the write) that holds the interpreter lock: threads do not help, processes do.  The
parent lays out the entries from the manifest alone (our writer's layout is a function of it),
for a restore stages every entry to write (``Installer.stage``: the stage directories exist
before the fork), forks, and collects the workers' progress; for each run it takes, a worker
reopens the archive, seeks to the run's first header and runs the reader's own checks on it
(``ArchiveReader.range_members``: header bytes, sizes, sha256, Triton groups, paddings up to
the run's end), writing the members of its entries where the parent staged them.  The parent
checks the manifest's padding before the fork and the archive's tail after it
(``ArchiveReader.payload_start``, ``check_tail_at``).

Anything unexpected (a worker that fails for any reason, a header that is not byte for byte
ours, a tail that is not clean) makes :func:`check` and :func:`stage` return False: the caller
discards what was staged and reads the archive sequentially, which accepts and refuses exactly
what it always did, with its own messages.  The workers can make a verify or a restore faster,
never different.

They are used only where they are safe and pay: where ``forks.usable`` says so (a platform that
forks, no other thread in the process), enough of it (``forks.worth``), and an uncompressed
archive or a zstd archive in the frames pack cuts (``writer.frame_cuts``: a frame starts at an
entry's first header, so a worker decompresses its frames from their own starts; a zstd
stream of other frames has no place to start from but its beginning).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping

from cache_tools import forks
from cache_tools.archive import groups
from cache_tools.archive import tarfmt
from cache_tools.archive.manifest import EntryRecord, Manifest, member_prefix
from cache_tools.archive.reader import MAX_FRAMES, ArchiveReader, Member, NotOurs
from cache_tools.archive.staging import Installer, StagedEntry
from cache_tools.archive.writer import frame_cuts


def usable(reader: ArchiveReader, manifest: Manifest, jobs: int) -> bool:
    """Whether workers may read this archive (see the module docstring)."""
    return (forks.worth(manifest.nb_files, manifest.size) and forks.usable(jobs)
            and (not reader.compressed or _frames(reader, manifest) is not None))


def _frames(reader: ArchiveReader, manifest: Manifest
            ) -> tuple[list[tuple[int, int]], list[int], int] | None:
    """For a zstd archive in the frames pack writes: the runs of entries of its payload
    frames (``writer.frame_cuts``), where each of those frames starts, and where the frames
    after the payload start; None for any other framing (an older pack's, a merge's)."""
    frames = reader.zstd_frames
    if len(frames) >= MAX_FRAMES:
        return None
    cuts = frame_cuts([e.size for e in manifest.entries])
    if len(cuts) < 2 or len(frames) < len(cuts) + 2:
        return None
    return cuts, frames[1:len(cuts) + 1], frames[len(cuts) + 1]


def stage_members(members: Iterable[Member], stage: Callable[[EntryRecord], StagedEntry],
                  targets: Mapping[str, Path | None], advance: Callable[[int], None]) -> None:
    """Every member through the reader's checks; those of entries to write into staging."""
    staged: StagedEntry | None = None
    entry: EntryRecord | None = None
    target: Path | None = None
    try:
        for m in members:
            if m.entry is not entry:            # the reader yields an entry's members in a row
                if staged is not None:
                    staged.close()
                    staged = None
                entry = m.entry
                target = targets.get(entry.key)
                if target is not None:
                    staged = stage(entry)
            if staged is None or target is None:    # staged only where there is a target
                m.drain()
            elif m.children is not None:
                staged.write(m.file, groups.relocate(m.children, target))
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


def layout(manifest: Manifest, start: int) -> tuple[list[int], int]:
    """The byte offset of each entry's first header in an archive laid out by our writer from
    ``start`` (the first payload header), and the offset after the last member."""
    return tarfmt.layout(start, ((member_prefix(e.kind, e.name),
                                  ((f.path, f.size, f.mode) for f in e.files))
                                 for e in manifest.entries))


def check(reader: ArchiveReader, manifest: Manifest, jobs: int,
          advance: Callable[[int], None]) -> bool:
    """Check the whole archive with ``jobs`` forked workers; True when every member and the
    tail passed, False when the caller must read it sequentially.  ``reader`` has just read
    the manifest."""
    return _read_runs(reader, manifest, jobs, advance, drain_members)


def drain_members(members: Iterable[Member], advance: Callable[[int], None]) -> None:
    """Every member through the reader's checks, nothing kept (verify)."""
    for m in members:
        if m.data is None:
            m.drain()
        advance(m.file.size)


def stage(reader: ArchiveReader, manifest: Manifest, installer: Installer,
          targets: Mapping[str, Path | None], jobs: int, advance: Callable[[int], None]) -> bool:
    """Stage the archive with ``jobs`` forked workers; True when everything is staged and the
    whole archive checked, False when the caller must read it sequentially (after discarding
    what was staged).  ``reader`` has just read the manifest."""
    stage_of = {e.key: installer.stage(e) for e in manifest.entries
                if targets.get(e.key) is not None}
    return _read_runs(reader, manifest, jobs, advance,
                      lambda members, progress: stage_members(
                          members, lambda entry: stage_of[entry.key], targets, progress))


def _read_runs(reader: ArchiveReader, manifest: Manifest, jobs: int,
               advance: Callable[[int], None],
               handle: Callable[[Iterable[Member], Callable[[int], None]], None]) -> bool:
    """Every run of entries read by a worker, its members handed to ``handle``; then the tail
    checked here.  False on anything unexpected (see the module docstring)."""
    entries = manifest.entries
    if not entries:
        return False
    try:
        start = reader.payload_start()          # the manifest's padding checked here
    except NotOurs:
        return False
    offsets, end = layout(manifest, start)
    last = entries[-1].member(entries[-1].files[-1])
    if reader.compressed:
        return _read_frames(reader, manifest, jobs, advance, handle, offsets, start, end, last)

    def work(first: int, stop: int, progress: Callable[[int], None]) -> bytes:
        # the very file the parent opened and checked (a new open file of it, with its own
        # offset), not whatever the path names by then
        with reader.reopen(walk=False) as mine:
            handle(mine.range_members(manifest, offsets[first], entries[first:stop]), progress)
        return b""

    weights = [forks.weight(e.size, len(e.files)) for e in entries]
    if forks.map_runs(weights, jobs, work, advance) is None:
        return False
    try:
        reader.check_tail_at(manifest, end, last)
    except Exception:                                       # the sequential read says what
        return False
    return True


def _read_frames(reader: ArchiveReader, manifest: Manifest, jobs: int,
                 advance: Callable[[int], None],
                 handle: Callable[[Iterable[Member], Callable[[int], None]], None],
                 offsets: list[int], start: int, end: int, last: str) -> bool:
    """``_read_runs`` for a zstd archive of pack's frames: workers take runs of payload frames,
    each decompressed from its own start; the manifest's frame must hold the manifest alone,
    and the frames after the payload the tail alone."""
    framed = _frames(reader, manifest)
    if framed is None:
        return False
    cuts, starts, tail = framed
    entries = manifest.entries
    try:
        if reader.frame_length(reader.zstd_frames[0], start) != start:
            return False                        # the manifest's frame holds more, or less

        def work(first: int, stop: int, progress: Callable[[int], None]) -> bytes:
            with reader.reopen(walk=False) as mine:
                for c in range(first, stop):
                    a, b = cuts[c]
                    handle(mine.frame_members(manifest, starts[c], offsets[a], entries[a:b]),
                           progress)
            return b""

        weights = [forks.weight(sum(e.size for e in entries[a:b]),
                                sum(len(e.files) for e in entries[a:b])) for a, b in cuts]
        if forks.map_runs(weights, jobs, work, advance) is None:
            return False
        reader.check_tail_from_frame(manifest, tail, end, last)
    except Exception:                                       # the sequential read says what
        return False
    return True
