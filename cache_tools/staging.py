"""Staged, atomic installation of entries into cache directories (used by restore and pull).

Every entry is first written into a staging directory *inside the destination* (so the final
move is a same-filesystem ``rename``), checked, and only then moved into place, one entry per
rename.  A reader (Triton, SGLang, a concurrent restore) therefore sees an entry complete or not
at all; a process killed mid-way leaves only a ``.sgw-staging-<host>-<pid>-<id>`` directory,
which scan ignores and the next run removes.  A complete entry is never overwritten.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from cache_tools.errors import ArchiveError, CacheError
from cache_tools.locations import STAGING_PREFIX, TRASH_PREFIX, kind
from cache_tools.manifest import EntryRecord, FileRecord
from cache_tools.scan import GROUP_PREFIX, entry_at, triton_hits, triton_problem

#: a staging directory of another host (shared filesystem) is removed after this long
STALE_AFTER_S = 24 * 3600.0


@dataclass(frozen=True)
class Outcome:
    """What happened to one entry on commit."""

    entry: EntryRecord
    target: Path
    #: added | completed (an incomplete Triton entry was filled in) | present | blocked
    status: str
    detail: str = ""


def target_of(root: Path, entry: EntryRecord) -> Path:
    return root.joinpath(*entry.name.split("/")) if entry.name else root


def is_triton_entry(entry: EntryRecord) -> bool:
    parts = tuple(entry.name.split("/")) if entry.name else ()
    rule = kind(entry.kind).layout.entry_rule(parts, entry.is_dir)
    return rule is not None and rule.complete == "triton"


def complete_at(root: Path, entry: EntryRecord) -> bool:
    """Whether the destination already holds this entry complete (never overwritten then)."""
    target = target_of(root, entry)
    if not os.path.lexists(target):
        return False
    if is_triton_entry(entry):
        groups = [f.path for f in entry.files if f.path.startswith(GROUP_PREFIX)]
        return triton_hits(target) and all((target / g).is_file() for g in groups)
    if not entry.is_dir:
        return target.is_file() and not target.is_symlink()
    if not entry.name:  # the whole directory: any content means "present, left alone"
        try:
            return bool(os.listdir(target))
        except OSError:
            return True
    found = entry_at(kind(entry.kind), root, entry.name)
    return found is not None and found.complete


#: staging directories of live installers in this process (never cleaned as leftovers)
_ACTIVE: set[Path] = set()


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "host"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our pid on a leftover from a previous container with the same pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(directory: Path) -> list[Path]:
    """Remove leftover staging/trash directories of dead processes in ``directory``."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _host()
    for name in names:
        for prefix in (STAGING_PREFIX, TRASH_PREFIX):
            if not name.startswith(prefix):
                continue
            path = directory / name
            if path in _ACTIVE:
                continue
            try:
                rest = name[len(prefix):]
                owner, pid_text, _ = rest.rsplit("-", 2)
                pid = int(pid_text)
            except ValueError:
                owner, pid = "", -1
            try:
                age = time.time() - os.lstat(path).st_mtime
            except OSError:
                continue
            if (owner == host and not _pid_alive(pid)) or age > STALE_AFTER_S:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def own_dir_name(prefix: str) -> str:
    return f"{prefix}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class Installer:
    """Stages entries for a set of kind roots, then commits them one rename at a time."""

    def __init__(self, roots: Mapping[str, Path]) -> None:
        self.roots = dict(roots)
        self._stages: dict[Path, Path] = {}   # directory that holds a stage -> the stage
        self._created: list[Path] = []        # directories made for stages, deepest first
        self.staged: list[EntryRecord] = []

    def clean_stale(self) -> list[Path]:
        """Remove leftovers of killed restores/pulls in every root (and beside it, where a
        whole-directory entry stages)."""
        removed: list[Path] = []
        for root in self.roots.values():
            removed += clean_stale(root)
            removed += clean_stale(root.parent)
        return removed

    # -- staging ------------------------------------------------------------------------------

    def _stage_dir(self, entry: EntryRecord) -> Path:
        root = self.roots[entry.kind]
        home = root if entry.name else root.parent   # a whole-directory entry stages beside
        stage = self._stages.get(home)
        if stage is None:
            missing = []
            probe = home
            while not os.path.lexists(probe) and probe != probe.parent:
                missing.append(probe)
                probe = probe.parent
            home.mkdir(parents=True, exist_ok=True)
            self._created.extend(missing)
            clean_stale(home)
            stage = home / own_dir_name(STAGING_PREFIX)
            stage.mkdir()
            _ACTIVE.add(stage)
            self._stages[home] = stage
        return stage

    def staged_path(self, entry: EntryRecord) -> Path:
        stage = self._stage_dir(entry)
        if entry.name:
            return stage.joinpath(*entry.name.split("/"))
        return stage / self.roots[entry.kind].name

    def open(self, entry: EntryRecord, f: FileRecord):
        """A binary file object for one file of ``entry`` in the staging area."""
        base = self.staged_path(entry)
        path = base.joinpath(*f.path.split("/")) if f.path else base
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, f.mode)
        return os.fdopen(fd, "wb")

    def mark_staged(self, entry: EntryRecord) -> None:
        self.staged.append(entry)

    def prepare(self) -> None:
        """Check and rewrite every staged Triton group file for its final location.  Runs
        before the first rename, so a bad group leaves the destination untouched."""
        for entry in self.staged:
            if not (entry.is_dir and is_triton_entry(entry)):
                continue
            staged = self.staged_path(entry)
            target = target_of(self.roots[entry.kind], entry)
            names = {f.path for f in entry.files}
            problem = triton_problem(staged, sorted(names))
            if problem:
                raise ArchiveError(f"entry {entry.kind}:{entry.name}: {problem}",
                                   hint="the archive holds an incomplete Triton entry; "
                                        "repack it from a complete cache")
            for f in entry.files:
                if f.path.startswith(GROUP_PREFIX) and f.path.endswith(".json"):
                    rewrite_group(staged / f.path, target, names,
                                  f"{entry.kind}/{entry.name}/{f.path}")

    # -- commit -------------------------------------------------------------------------------

    def commit_all(self, on_entry: "Callable[[Outcome], None] | None" = None) -> list[Outcome]:
        """``prepare()``, then move every staged entry into place, one rename each."""
        self.prepare()  # everything is verified: only now does anything move into place
        outcomes = []
        for entry in self.staged:
            outcome = self.commit(entry)
            outcomes.append(outcome)
            if on_entry is not None:
                on_entry(outcome)
        return outcomes

    def commit(self, entry: EntryRecord) -> Outcome:
        root = self.roots[entry.kind]
        target = target_of(root, entry)
        staged = self.staged_path(entry)
        if not entry.name:
            return self._commit_whole(entry, staged, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not entry.is_dir:
            try:
                os.link(staged, target)   # create-if-absent: never replaces a file
                return Outcome(entry, target, "added")
            except FileExistsError:
                return Outcome(entry, target, "present", "already there")
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
                    raise
                if os.path.lexists(target):
                    return Outcome(entry, target, "present", "already there")
                os.rename(staged, target)
                return Outcome(entry, target, "added")
        if not os.path.lexists(target):
            try:
                os.rename(staged, target)
                return Outcome(entry, target, "added")
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
        # The target exists (or appeared while we were working).
        if complete_at(root, entry):
            return Outcome(entry, target, "present", "already complete")
        if is_triton_entry(entry) and target.is_dir() and not target.is_symlink():
            self._fill_triton(entry, staged, target)
            return Outcome(entry, target, "completed", "filled in an incomplete entry")
        return Outcome(entry, target, "blocked",
                       "an incomplete entry is there (being written by another process, or "
                       "abandoned); left alone")

    def _commit_whole(self, entry: EntryRecord, staged: Path, target: Path) -> Outcome:
        try:
            os.rename(staged, target)  # succeeds onto an absent or empty directory only
            return Outcome(entry, target, "added")
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
        return Outcome(entry, target, "present",
                       "the directory is not empty; the driver's cache is left alone")

    def _fill_triton(self, entry: EntryRecord, staged: Path, target: Path) -> None:
        """Complete an incomplete Triton directory the way Triton does: children first (each
        an atomic create-if-absent), group files last (atomic replace)."""
        groups = []
        for f in entry.files:
            if f.path.startswith(GROUP_PREFIX) and f.path.endswith(".json"):
                groups.append(f.path)
                continue
            src, dst = staged / f.path, target / f.path
            if os.path.exists(dst):
                continue
            try:
                os.link(src, dst)
            except FileExistsError:
                pass
            except OSError:
                if not os.path.exists(dst):
                    tmp = target / f".{f.path}.{uuid.uuid4().hex}.sgw"
                    shutil.copyfile(src, tmp)
                    os.replace(tmp, dst)
        for g in groups:
            existing = target / g
            if existing.is_file() and triton_hits_group(existing):
                continue
            os.replace(staged / g, existing)

    def cleanup(self) -> None:
        """Remove the staging directories, and the directories made for them if nothing was
        committed into them (a failed restore leaves the destination as it was)."""
        for stage in self._stages.values():
            shutil.rmtree(stage, ignore_errors=True)
            _ACTIVE.discard(stage)
        self._stages.clear()
        for path in sorted(self._created, key=lambda p: len(p.parts), reverse=True):
            try:
                os.rmdir(path)
            except OSError:
                pass  # not empty: entries were committed below it
        self._created.clear()


def triton_hits_group(group_file: Path) -> bool:
    from cache_tools.scan import read_group

    children = read_group(group_file)
    return children is not None and all(os.path.exists(p) for p in children.values())


def normalize_group(data: bytes, where: str) -> bytes:
    """A Triton group file with its child paths made relative to the entry (archive form)."""
    try:
        doc = json.loads(data.decode("utf-8"))
        children = doc["child_paths"]
        assert isinstance(children, dict)
    except Exception:
        raise CacheError(f"{where}: unreadable Triton group file",
                         hint="the cache entry is damaged; delete it and let Triton recompile"
                         ) from None
    return json.dumps({"child_paths": {c: os.path.basename(p) for c, p in children.items()}}
                      ).encode()


def rewrite_group(path: Path, target: Path, names: Iterable[str], member: str) -> None:
    """Rewrite a staged (archive-form) group so every child path is absolute under ``target``,
    as Triton's FileCacheManager.get_group expects."""
    names = set(names)
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
        children = doc["child_paths"]
        assert isinstance(children, dict)
    except Exception:
        raise ArchiveError(f"archive member {member!r}: not a Triton group file",
                           hint="the archive is corrupt or was not written by "
                                "`sglang-warmup cache pack`") from None
    rewritten = {}
    for child, rel in children.items():
        if not (isinstance(child, str) and isinstance(rel, str)) or rel != child or \
                child not in names:
            raise ArchiveError(
                f"archive member {member!r}: group child {child!r} -> {rel!r} is not a file "
                "of the same entry",
                hint="the archive is corrupt or hostile; nothing was written")
        rewritten[child] = str(target / rel)
    path.write_bytes(json.dumps({"child_paths": rewritten}).encode())
