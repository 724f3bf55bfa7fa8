"""Staged, atomic installation of entries into cache directories (used by restore and pull).

Every entry is first written into a staging directory *inside the destination* (so the final
move is a same-filesystem ``rename``), checked, and only then moved into place, one entry per
rename; a kind whose directory does not exist yet is staged whole beside it and moved in with a
single rename.  A reader (Triton, SGLang, a concurrent restore) therefore sees an entry complete
or not at all; a process killed mid-way leaves only a ``.sgw-staging-<host>-<pid>-<id>``
directory, which scan ignores and the next run removes.  A complete entry is never overwritten.

Files are written through a descriptor of their entry's staging directory (``dir_fd``), with one
``open``/``write``/``close`` each: restore's cost per file is what ``tar -x`` pays.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Mapping

from cache_tools.errors import CacheError
from cache_tools.locations import (MERGE_PREFIX, PACK_PREFIX, STAGING_PREFIX, TRASH_PREFIX,
                                   kind)
from cache_tools.archive.manifest import EntryRecord, FileRecord, is_built_by_ninja, is_triton
from cache_tools.scan import GROUP_PREFIX, entry_at, read_group, triton_hits

#: a leftover of another host (shared filesystem) is removed after this long
STALE_AFTER_S = 24 * 3600.0
#: the names own_name() makes; nothing else is ever removed as a leftover
_OWN_NAME = re.compile("(%s)(.+)-([0-9]+)-[0-9a-f]{12}(?:\\.tmp)?" % "|".join(
    re.escape(p) for p in (STAGING_PREFIX, TRASH_PREFIX, PACK_PREFIX, MERGE_PREFIX)))
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Outcome:
    """What happened to one entry on commit."""

    entry: EntryRecord
    target: Path
    #: added | completed (an incomplete Triton entry was filled in) | present | blocked
    status: str
    detail: str = ""
    #: a FlashInfer op whose ninja records could not be written (``detail`` says why): its
    #: first load builds it again
    rebuilt_by_ninja: bool = False


def target_of(root: Path, entry: EntryRecord) -> Path:
    return root.joinpath(*entry.name.split("/")) if entry.name else root


def complete_at(root: Path, entry: EntryRecord) -> bool:
    """Whether the destination already holds this entry complete (never overwritten then)."""
    target = target_of(root, entry)
    if not os.path.lexists(target):
        return False
    if is_triton(entry):
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


#: our own temporaries in use by this process (never cleaned as leftovers)
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
    """Remove leftovers of dead processes in ``directory``: staging and trash directories,
    pack and merge temporaries.  Only names ``own_name()`` makes are touched; one of this host
    goes when its pid is not alive, one of another host after ``STALE_AFTER_S``."""
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = _host()
    for name in names:
        m = _OWN_NAME.fullmatch(name)
        if m is None:
            continue
        path = directory / name
        if path in _ACTIVE:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        mine = m.group(2) == host
        if (mine and not _pid_alive(int(m.group(3)))) or \
                (not mine and time.time() - st.st_mtime > STALE_AFTER_S):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    continue
            removed.append(path)
    return removed


def own_name(prefix: str, suffix: str = "") -> str:
    """A name for one of our temporaries: ``<prefix><host>-<pid>-<12 hex digits><suffix>``."""
    return f"{prefix}{_host()}-{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}"


class StagedEntry:
    """One entry being written into the staging area: ``write`` a small file whole, ``open``
    a large one; files of a directory entry go through the directory's descriptor."""

    def __init__(self, path: str, is_dir: bool) -> None:
        self.path = path
        self.is_dir = is_dir
        self._fd: int | None = None
        self._dirs: set[str] = set()

    def _where(self, f: FileRecord) -> tuple[str, int | None]:
        if not self.is_dir:
            return self.path, None
        if self._fd is None:            # created on first use: possibly on a writer thread
            os.mkdir(self.path)
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        head, _, _ = f.path.rpartition("/")
        if head and head not in self._dirs:
            parts = head.split("/")
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                if sub not in self._dirs:
                    try:
                        os.mkdir(sub, dir_fd=self._fd)
                    except FileExistsError:
                        pass
                    self._dirs.add(sub)
        return f.path, self._fd

    def write(self, f: FileRecord, data: bytes | memoryview) -> None:
        path = f.path
        if self._fd is None or "/" in path:     # the first file, a file entry, a subdirectory
            path, dir_fd = self._where(f)
        else:
            dir_fd = self._fd
        fd = os.open(path, _WRITE, f.mode, dir_fd=dir_fd)
        try:
            done = os.write(fd, data)
            if done < len(data):
                view = memoryview(data)[done:]
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def open(self, f: FileRecord) -> BinaryIO:
        name, dir_fd = self._where(f)
        return os.fdopen(os.open(name, _WRITE, f.mode, dir_fd=dir_fd), "wb")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif self.is_dir and not os.path.isdir(self.path):
            os.mkdir(self.path)         # an entry of no file is impossible; be safe anyway


class Installer:
    """Stages entries for a set of kind roots, then commits them: one rename per entry, or one
    rename of the whole directory for a kind whose directory did not exist when staging began
    (every entry of it is new; if the directory appeared meanwhile, entry by entry after all)."""

    def __init__(self, roots: Mapping[str, Path]) -> None:
        self.roots = dict(roots)
        self._stages: dict[Path, Path] = {}   # directory that holds a stage -> the stage
        self._created: list[Path] = []        # directories made for stages, deepest first
        self._made: set[str] = set()          # directories inside stages, and commit parents
        self._paths: dict[str, str] = {}      # entry key -> its staged path
        self._whole: dict[str, str] = {}      # kind -> its staged directory ('' per entry)
        self.staged: list[EntryRecord] = []

    def clean_stale(self) -> list[Path]:
        """Remove leftovers of killed restores/pulls in every root (and beside it, where a
        whole directory stages)."""
        return clean_roots(self.roots.values())

    # -- staging ------------------------------------------------------------------------------

    def _stage_dir(self, home: Path) -> Path:
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
            stage = home / own_name(STAGING_PREFIX)
            stage.mkdir()
            _ACTIVE.add(stage)
            self._stages[home] = stage
        return stage

    def _beside(self, kind_name: str) -> str:
        """Where the whole directory of a kind stages: beside it, so that one rename moves it."""
        return f"{self._stage_dir(self.roots[kind_name].parent)}/{kind_name}"

    def _staged_str(self, entry: EntryRecord) -> str:
        path = self._paths.get(entry.key)
        if path is None:
            if not entry.name:                 # the entry is the whole directory
                path = self._beside(entry.kind)
            else:
                whole = self._whole.get(entry.kind)
                if whole is None:
                    root = self.roots[entry.kind]
                    whole = "" if os.path.lexists(root) else self._beside(entry.kind)
                    self._whole[entry.kind] = whole
                stage = whole or str(self._stage_dir(self.roots[entry.kind]))
                path = f"{stage}/{entry.name}"
            self._paths[entry.key] = path
        return path

    def stage(self, entry: EntryRecord) -> StagedEntry:
        """Start staging ``entry`` (its directory, or its file's parent, is created); the
        caller writes its files and closes it, then the entry is committed with the others."""
        path = self._staged_str(entry)
        parent = path.rpartition("/")[0]
        if parent not in self._made:
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)
        self.staged.append(entry)
        return StagedEntry(path, entry.is_dir)

    # -- commit -------------------------------------------------------------------------------

    def commit_all(self, on_entry: "Callable[[Outcome], None] | None" = None) -> list[Outcome]:
        """Move every staged entry into place (called once everything staged has been
        verified, so a bad archive leaves the destination untouched)."""
        outcomes = []
        moved: dict[str, bool] = {}
        for entry in self.staged:
            if entry.name and self._whole.get(entry.kind):
                if entry.kind not in moved:
                    moved[entry.kind] = self._move_whole(entry.kind)
                if moved[entry.kind]:
                    outcome = Outcome(entry, Path(f"{self.roots[entry.kind]}/{entry.name}"),
                                      "added")
                else:
                    outcome = self.commit(entry)
            else:
                outcome = self.commit(entry)
            outcomes.append(outcome)
            if on_entry is not None:
                on_entry(outcome)
        return _with_ninja_records(outcomes)

    def _move_whole(self, kind_name: str) -> bool:
        """The staged directory of a kind moved into place: whether it was (False when the
        directory appeared meanwhile with content: its entries then go in one by one)."""
        try:
            os.rename(self._whole[kind_name], self.roots[kind_name])  # onto absent or empty
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            return False

    def commit(self, entry: EntryRecord) -> Outcome:
        root = self.roots[entry.kind]
        staged = self._staged_str(entry)
        if not entry.name:
            return self._commit_whole(entry, staged, root)
        target_str = f"{root}/{entry.name}"
        target = Path(target_str)
        parent = target_str.rpartition("/")[0]
        if parent not in self._made:
            os.makedirs(parent, exist_ok=True)
            self._made.add(parent)
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
        if not os.path.lexists(target_str):
            try:
                os.rename(staged, target_str)
                return Outcome(entry, target, "added")
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
        # The target exists (or appeared while we were working).
        if complete_at(root, entry):
            return Outcome(entry, target, "present", "already complete")
        if is_triton(entry) and target.is_dir() and not target.is_symlink():
            self._fill_triton(entry, Path(staged), target)
            return Outcome(entry, target, "completed", "filled in an incomplete entry")
        return Outcome(entry, target, "blocked",
                       "an incomplete entry is there (being written by another process, or "
                       "abandoned); left alone")

    def _commit_whole(self, entry: EntryRecord, staged: str, target: Path) -> Outcome:
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


def _with_ninja_records(outcomes: list[Outcome]) -> list[Outcome]:
    """Entries just added whose library runs ninja on them at each load (FlashInfer's ops), with
    ninja's records written beside them so that ninja does not build them again
    (:mod:`cache_tools.ninja_log`); each such outcome says what was done, or why ninja will
    build the op again at its first load."""
    ops = [i for i, o in enumerate(outcomes) if o.status == "added" and o.entry.is_dir
           and is_built_by_ninja(o.entry)]
    if not ops:
        return outcomes
    from cache_tools import ninja_log
    from cache_tools.ninja_build import Unsupported

    for i in ops:
        o = outcomes[i]
        try:
            formats = ninja_log.probe()
            if formats is None:
                raise Unsupported("no ninja here whose records this tool writes")
            outcomes[i] = replace(o, detail=ninja_log.record_op(o.target, formats))
        except (Unsupported, OSError) as exc:  # the op stays as installed
            outcomes[i] = replace(o, detail=str(exc), rebuilt_by_ninja=True)
        except Exception as exc:  # noqa: BLE001 - after the commit: the entries are installed, a records bug must not fail the restore
            outcomes[i] = replace(o, detail=f"ninja's records not written: {exc!r}",
                                  rebuilt_by_ninja=True)
    return outcomes


def triton_hits_group(group_file: Path) -> bool:
    children = read_group(group_file)
    return children is not None and all(os.path.exists(p) for p in children.values())


def refuse_links(roots: Mapping[str, Path], entries: Iterable[EntryRecord],
                 dest: str | os.PathLike[str] | None) -> None:
    """Refuse a symbolic link where restore or pull would create or enter a directory (a
    CacheError naming it, before anything is written): below ``dest`` down to each kind's
    directory, that directory itself, and the directories of each entry's name under it.
    ``dest`` itself, the user's choice, may be a link."""
    base = Path(os.path.abspath(dest)) if dest is not None else None
    dirs: set[Path] = set()
    for root in roots.values():
        dirs.add(root)
        if base is not None:
            dirs.update(p for p in root.parents if p.is_relative_to(base) and p != base)
    # The directories of each entry's name: ROOT/a and ROOT/a/b for a/b/c (none for a name of
    # one component, most of them); spelled as text, deduplicated, then made paths (a path
    # per entry cost 30 us: 0.3 s of a 10,000-entry restore's plan).
    inner: set[tuple[str, str]] = set()
    for entry in entries:
        name = entry.name
        if "/" in name and roots.get(entry.kind) is not None:
            head = name.rpartition("/")[0]
            while head and (entry.kind, head) not in inner:
                inner.add((entry.kind, head))
                head = head.rpartition("/")[0]
    dirs.update(roots[k].joinpath(*head.split("/")) for k, head in inner)
    for path in sorted(dirs, key=lambda p: len(p.parts)):
        if os.path.islink(path):
            raise CacheError(f"{path}: a symbolic link (to {os.readlink(path)}); nothing was "
                             "written",
                             hint="restore and pull write into real directories only: replace "
                                  "the link with a directory, or give --dest where the files "
                                  "should go")


def clean_roots(roots: Iterable[Path]) -> list[Path]:
    """``clean_stale`` in each root and beside it (where whole-directory entries stage)."""
    removed: list[Path] = []
    for root in roots:
        removed += clean_stale(root)
        removed += clean_stale(root.parent)
    return removed
