"""Restore: plan what an archive would add to the destination, then execute the plan — stream
the archive once through the checking reader into staging, and move each entry into place with
one rename once the whole archive has been read and found good.

Execution always reads and checks every member, also when every entry is already in place, so
a damaged archive never passes as restored.  Triton group files are written already rewritten
for their final, absolute place (``groups.relocate``); a relative ``--dest`` is made absolute
first, because a server in another working directory reads those paths.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from cache_tools import fingerprint as fp_mod
from cache_tools import forks
from cache_tools.archive import read_workers
from cache_tools.errors import ArchiveError, os_errors
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.locations import kind, resolve
from cache_tools.archive.manifest import EntryRecord, Manifest, is_triton, paused_gc
from cache_tools.progress import Progress
from cache_tools.archive.reader import ArchiveReader, Limits
from cache_tools.archive.staging import (Installer, Outcome, clean_roots, complete_at, refuse_links,
                                 target_of)


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

    @functools.cached_property
    def to_write(self) -> tuple[PlannedEntry, ...]:
        """(Computed once: the rendering and the execution ask for it several times.)"""
        return tuple(i for i in self.items if i.action in ("add", "fill"))

    @functools.cached_property
    def bytes_to_write(self) -> int:
        return sum(i.entry.size for i in self.to_write)

    @property
    def nothing_to_do(self) -> bool:
        return not self.to_write


@dataclass(frozen=True)
class RestorePlan(EntryPlanView):
    """What a restore would do; nothing has been written yet.  ``execute()`` does it (and
    reads and checks the whole archive even when ``nothing_to_do``)."""

    archive: Path
    manifest: Manifest
    compatibility: Compatibility
    roots: Mapping[str, Path]
    items: tuple[PlannedEntry, ...]
    limits: Limits = field(default_factory=Limits)
    #: sha256 of the manifest's bytes: execute() refuses an archive changed since planning
    manifest_sha256: str = ""

    def execute(self, *, progress: Progress | None = None,
                on_entry: Callable[[Outcome], None] | None = None,
                jobs: int | None = None) -> RestoreResult:
        """Stage every entry to write while checking the whole archive, then move entries into
        place one rename each.  ``on_entry`` is called after each entry is committed.  ``jobs``:
        worker processes for a large archive of ours (default: the usable CPUs, at most
        8; 1 reads in this process; see ``read_workers``)."""
        with os_errors("restore", "check free space and permissions of the destination; "
                                  "no partial entry is visible, rerun to finish"), paused_gc():
            return _execute(self, progress or Progress.null(), on_entry, jobs)


def restore_roots(kinds: Iterable[str], dest: str | os.PathLike[str] | None,
                  env: Mapping[str, str] | None = None) -> dict[str, Path | None]:
    """Where each kind goes: under ``dest`` (the ``--root`` layout) or where SGLang looks;
    always absolute (restored Triton group files record these paths)."""
    chosen = [kind(k) for k in sorted(set(kinds))]
    locs = resolve(chosen, root=dest) if dest is not None else resolve(chosen, env=env)
    return {loc.kind.name: Path(os.path.abspath(loc.path)) if loc.path is not None else None
            for loc in locs}


def plan_restore(archive: str | os.PathLike[str], *, dest: str | os.PathLike[str] | None = None,
                 kinds: Iterable[str] | None = None, force: bool = False,
                 env: Mapping[str, str] | None = None, limits: Limits | None = None,
                 local: Fingerprint | None = None) -> RestorePlan:
    """Read the manifest, apply the compatibility rule and compare with the destination.
    Leftovers of killed restores and pulls in the destination are removed first."""
    with paused_gc():      # a collection would walk the manifest's records: 50-100 ms
        return _plan(archive, dest, kinds, force, env, limits or Limits(), local)


def _plan(archive: str | os.PathLike[str], dest: str | os.PathLike[str] | None,
          kinds: Iterable[str] | None, force: bool, env: Mapping[str, str] | None,
          limits: Limits, local: Fingerprint | None) -> RestorePlan:
    with ArchiveReader(archive, limits) as reader:
        manifest = reader.read_manifest()
        digest = reader.manifest_sha256
    compat = fp_mod.require_compatible(manifest.fingerprint, local or fp_mod.current(),
                                       force=force, what=f"archive {archive}")
    wanted = set(kinds) if kinds is not None else None
    entries = [e for e in manifest.entries if wanted is None or e.kind in wanted]
    roots = restore_roots((e.kind for e in entries), dest, env)
    present = {k: v for k, v in roots.items() if v is not None}
    refuse_links(present, entries, dest)
    clean_roots(present.values())
    # Under a kind directory that does not exist yet every entry is new: no lookup each.
    absent = {k for k, root in present.items() if not os.path.lexists(root)}
    items = tuple(PlannedEntry(e, target_of(present[e.kind], e), "add")
                  if e.kind in absent else plan_entry(e, roots.get(e.kind)) for e in entries)
    return RestorePlan(Path(archive), manifest, compat, present, items, limits, digest)


def plan_entry(entry: EntryRecord, root: Path | None) -> PlannedEntry:
    if root is None:
        return PlannedEntry(entry, None, "nowhere")
    target = target_of(root, entry)
    if not os.path.lexists(target):
        return PlannedEntry(entry, target, "add")
    if complete_at(root, entry):
        return PlannedEntry(entry, target, "skip")
    if is_triton(entry) and target.is_dir() and not target.is_symlink():
        return PlannedEntry(entry, target, "fill")
    if not entry.name and target.is_dir() and not os.listdir(target):
        return PlannedEntry(entry, target, "add")
    return PlannedEntry(entry, target, "blocked")


def _execute(plan: RestorePlan, progress: Progress,
             on_entry: Callable[[Outcome], None] | None, jobs: int | None) -> RestoreResult:
    started = time.monotonic()
    installer = Installer(plan.roots)
    installer.clean_stale()
    outcomes: list[Outcome] = []
    try:
        installer, bytes_read = stage(plan, installer, progress, forks.jobs_for(jobs))
        progress.finish()
        outcomes.extend(installer.commit_all(on_entry))
    finally:
        installer.cleanup()
    return RestoreResult(tuple(outcomes), time.monotonic() - started, bytes_read)


def stage(plan: RestorePlan, installer: Installer, progress: Progress, jobs: int
          ) -> tuple[Installer, int]:
    """Stage every entry ``plan`` writes into ``installer`` while the whole archive is read and
    checked (by forked workers when they can); nothing is committed.  Returns the installer that
    holds the staged entries (a new one when the workers gave up and the archive was read again
    here: the caller commits and cleans that one; a failure cleans it here) and the archive's
    size.  Also the OCI pull's step, one archive (layer) at a time."""
    targets = {i.entry.key: i.target for i in plan.to_write}
    fresh: Installer | None = None
    try:
        reader = ArchiveReader(plan.archive, plan.limits)
        try:
            manifest = _read_manifest(reader, plan)
            progress.start("restore", manifest.size)
            tried = read_workers.usable(reader, manifest, jobs)
            staged = tried and read_workers.stage(reader, manifest, installer, targets, jobs,
                                                  progress.advance)
            if tried and not staged:                # the workers' fallback: start over
                installer.cleanup()
                installer = fresh = Installer(plan.roots)
                reader = reader.restart()
                _read_manifest(reader, plan)
                progress.start("restore", manifest.size)
            if not staged:
                read_workers.stage_members(reader.members(), installer.stage, targets,
                                           progress.advance)
            return installer, reader.archive_bytes
        finally:
            reader.close()
    except BaseException:  # cleanup on any way out (Ctrl-C too), then raised as it was
        if fresh is not None:
            fresh.cleanup()
        raise


def _read_manifest(reader: ArchiveReader, plan: RestorePlan) -> Manifest:
    manifest = reader.read_manifest(plan.manifest, plan.manifest_sha256)
    if manifest is not plan.manifest and manifest != plan.manifest:
        raise ArchiveError(f"{plan.archive} changed since the restore was planned",
                           hint="plan and restore again")
    return manifest
