"""Verify and merge archives (the checks that read a whole archive without installing it)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence

from cache_tools import fingerprint as fp_mod
from cache_tools import forks
from cache_tools.archive import read_workers
from cache_tools.errors import ArchiveError, CacheError, IncompatibleError, os_errors
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.locations import MERGE_PREFIX
from cache_tools.archive.manifest import EntryRecord, Manifest, check_overlaps, paused_gc
from cache_tools.archive.packer import producer
from cache_tools.progress import Progress
from cache_tools.archive.reader import (ArchiveReader, Limits)
from cache_tools.archive.staging import _ACTIVE, clean_stale, own_name
from cache_tools.archive.writer import Source, write_archive



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
           local: Fingerprint | None = None, progress: Progress | None = None,
           jobs: int | None = None) -> VerifyReport:
    """Check every member against the manifest with the reader restore uses (the same
    refusals); an ArchiveError names the first bad member.  ``jobs``: worker processes for a
    large archive of ours (default: the usable CPUs, at most 8; see ``read_workers``); when
    they give up, the archive is read here, which says what is wrong."""
    progress = progress or Progress.null()
    jobs = forks.jobs_for(jobs)
    with paused_gc():
        reader = ArchiveReader(archive, limits)
        try:
            manifest = reader.read_manifest()
            progress.start("verify", manifest.size)
            workers = read_workers.usable(reader, manifest, jobs)
            if not (workers and read_workers.check(reader, manifest, jobs, progress.advance)):
                if workers:                         # the workers' fallback: read it all here
                    digest = reader.manifest_sha256
                    reader = reader.restart()
                    if reader.read_manifest(manifest, digest) is not manifest:
                        raise ArchiveError(f"{archive} changed while it was verified",
                                           hint="verify it again once nothing writes it")
                    progress.start("verify", manifest.size)
                read_workers.drain_members(reader.members(), progress.advance)
            compressed, archive_bytes = reader.compressed, reader.archive_bytes
        finally:
            reader.close()
    progress.finish()
    here = local or fp_mod.current()
    return VerifyReport(Path(archive), compressed, archive_bytes, manifest, here,
                        fp_mod.compare(manifest.fingerprint, here))


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
    records = tuple(sorted((e for e, _ in chosen.values()), key=lambda e: (e.kind, e.name)))
    check_overlaps(records, "merged manifest")     # entries of different inputs may overlap
    manifest = Manifest(first, records, producer())
    with os_errors("merge"):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        clean_stale(Path(out).parent)
        work = Path(out).parent / own_name(MERGE_PREFIX)
        _ACTIVE.add(work)
        work.mkdir()
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
        sources = [Source(e, f, _opener(work / e.member(f))) for e in records for f in e.files]
        with os_errors("merge"):
            size = write_archive(out, manifest, sources, zstd=zstd, progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _ACTIVE.discard(work)
    return MergeResult(Path(out), manifest, size, duplicates, tuple(dict.fromkeys(notes)))


def _opener(path: Path) -> Callable[[], IO[bytes]]:
    """A ``Source.open`` for a file of the merge's work directory."""
    return lambda: open(path, "rb")
