"""Read-only inventory of the JIT caches: frozen CacheInfo / KindInfo / CacheEntry objects.

Scanning never raises on what it finds: incomplete entries, in-flight temp files, leftovers of
interrupted restores and names outside a kind's known layout become CacheWarnings.  Only
complete entries are ever packed, pushed or counted as present by a restore.

Longer than 500 lines: the walk, the entry reader (one process or forked workers) and the Triton
group check share the layout rules, the warnings and the per-file stats pack relies on; apart
they would hand all of them back and forth.
"""

from __future__ import annotations

import fnmatch
import json
import marshal
import operator
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple

from cache_tools import forks
from cache_tools.locations import (STAGING_PREFIX, TRASH_PREFIX, CacheKind, EntryRule, Layout,
                                   Location)

GROUP_PREFIX = "__grp__"
# Triton writes these without a group file (runtime/build.py, runtime/autotuner.py).
_TRITON_LONE_FILES = ("*.so", "*.autotune.json")
_TRITON_RULE = EntryRule(("*",), "triton")
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_NOATIME_READ = _READ | getattr(os, "O_NOATIME", 0)


def noatime_fd(path: Path | str) -> int:
    """A read-only descriptor opened without updating the access time where the OS allows it
    (Linux, O_NOATIME, file owner), so packing or scanning does not make every entry look
    recently used to ``prune``."""
    try:
        return os.open(path, _NOATIME_READ)
    except PermissionError:
        if _NOATIME_READ == _READ:
            raise
        return os.open(path, _READ)


def open_noatime(path: Path | str) -> BinaryIO:
    """``noatime_fd`` as a binary file object."""
    return os.fdopen(noatime_fd(path), "rb")


def read_noatime(path: Path | str) -> bytes:
    fd = noatime_fd(path)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def size_str(n: int) -> str:
    """Human size with binary units: 0 B, 1.5 KiB, 20.0 MiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def age_str(when: float, now: float | None = None) -> str:
    """``3s ago``, ``5m ago``, ``2h ago``, ``4d ago`` (``never`` for 0)."""
    if not when:
        return "never"
    delta = max(0.0, (time.time() if now is None else now) - when)
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= seconds:
            return f"{int(delta // seconds)}{unit} ago"
    return f"{int(delta)}s ago"


@dataclass(frozen=True)
class CacheWarning:
    """A problem found while scanning; never fatal."""

    kind: str
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.message}"


@dataclass(frozen=True)
class CacheEntry:
    """One entry of one cache kind (see locations.Layout for what an entry is per kind)."""

    kind: str
    #: path relative to the kind's root, '/'-separated ('' when the whole directory is the entry)
    name: str
    path: Path
    is_dir: bool
    #: files of the entry, relative to ``path`` ('' for a file entry), sorted
    files: tuple[str, ...]
    size_on_disk: int
    #: most recent access or modification of any file (seconds since the epoch)
    last_used: float
    last_modified: float
    complete: bool
    #: why the entry is incomplete ('' when complete)
    problem: str = ""
    #: per file (aligned with ``files``): (size, mode, inode, mtime_ns) as scanned; pack
    #: checks a file against them after reading it (a change means it was rewritten meanwhile)
    stats: tuple[tuple[int, int, int, int], ...] = field(default=(), compare=False, repr=False)
    #: per Triton group file: its name and the children it lists, in its order (each checked
    #: to be a file of this entry); what pack writes instead of reading the group again
    groups: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False,
                                                             repr=False)

    @property
    def size_on_disk_str(self) -> str:
        return size_str(self.size_on_disk)


@dataclass(frozen=True)
class KindInfo:
    """One kind's directory and what it holds."""

    location: Location
    exists: bool
    entries: tuple[CacheEntry, ...]
    warnings: tuple[CacheWarning, ...]

    @property
    def kind(self) -> CacheKind:
        return self.location.kind

    @property
    def complete_entries(self) -> tuple[CacheEntry, ...]:
        return tuple(e for e in self.entries if e.complete)

    @property
    def size_on_disk(self) -> int:
        return sum(e.size_on_disk for e in self.entries)

    @property
    def size_on_disk_str(self) -> str:
        return size_str(self.size_on_disk)

    @property
    def last_used(self) -> float:
        return max((e.last_used for e in self.entries), default=0.0)


@dataclass(frozen=True)
class CacheInfo:
    """Every scanned kind."""

    kinds: tuple[KindInfo, ...]

    @property
    def warnings(self) -> tuple[CacheWarning, ...]:
        return tuple(w for k in self.kinds for w in k.warnings)

    @property
    def entries(self) -> tuple[CacheEntry, ...]:
        return tuple(e for k in self.kinds for e in k.entries)

    @property
    def size_on_disk(self) -> int:
        return sum(k.size_on_disk for k in self.kinds)

    @property
    def size_on_disk_str(self) -> str:
        return size_str(self.size_on_disk)

    @property
    def is_empty(self) -> bool:
        return not any(k.entries for k in self.kinds)


def scan(locations: Iterable[Location], jobs: int = 1) -> CacheInfo:
    """Inventory every location (missing directories are empty, not errors).  ``jobs`` above 1
    reads the entries of a large cache in that many forked workers (``forks``); the inventory
    is the same."""
    return CacheInfo(tuple(scan_kind(loc, jobs) for loc in locations))


def scan_kind(loc: Location, jobs: int = 1) -> KindInfo:
    if loc.path is None:
        return KindInfo(loc, False, (), ())
    root = loc.path
    warnings = _staged_beside(loc.kind.name, root)
    try:
        st = os.lstat(root)
    except OSError:
        return KindInfo(loc, False, (), tuple(warnings))
    if not stat.S_ISDIR(st.st_mode):
        warnings.append(CacheWarning(loc.kind.name, root, "not a directory; left alone"))
        return KindInfo(loc, False, (), tuple(warnings))
    found: list[CacheWarning | _Spot] = []
    _walk(loc.kind, root, (), found)
    spots = [s for s in found if isinstance(s, _Spot)]
    read = iter(_read_forked(loc.kind, root, spots, jobs) or
                [_read_spot(loc.kind, root, s) for s in spots])
    entries = []
    for item in found:
        if isinstance(item, _Spot):
            entry, more = next(read)
            warnings += more
            if entry is not None:
                entries.append(entry)
        else:
            warnings.append(item)
    for e in entries:
        if not e.complete:
            warnings.append(CacheWarning(loc.kind.name, e.path, "incomplete: " + e.problem))
    return KindInfo(loc, True, tuple(entries), tuple(warnings))


class _Spot(NamedTuple):
    """Where the walk found an entry, and whether a directory; ``_entry`` reads it."""

    parts: tuple[str, ...]
    rule: EntryRule
    path: Path
    is_dir: bool


def _read_spot(k: CacheKind, root: Path, spot: _Spot
               ) -> tuple[CacheEntry | None, list[CacheWarning]]:
    warnings: list[CacheWarning] = []
    try:
        st = os.lstat(spot.path)
    except OSError:
        return None, warnings     # vanished since the walk (pruned or replaced): nothing to say
    if stat.S_ISDIR(st.st_mode) != spot.is_dir or stat.S_ISLNK(st.st_mode):
        return None, warnings     # replaced by another type since the walk: as vanished
    return _entry(k, root, spot.parts, spot.rule, warnings, spot.path, st), warnings


def _read_forked(k: CacheKind, root: Path, spots: list[_Spot], jobs: int
                 ) -> list[tuple[CacheEntry | None, list[CacheWarning]]] | None:
    """The spots read by forked workers, run after run (None: read them here)."""
    if len(spots) < forks.MIN_ENTRIES or not forks.usable(jobs):
        return None

    def work(first: int, end: int, advance: Callable[[int], None]) -> bytes:
        out = []
        for spot in spots[first:end]:
            e, ws = _read_spot(k, root, spot)
            out.append((None if e is None else (
                e.is_dir, e.files, e.size_on_disk, e.last_used, e.last_modified, e.complete,
                e.problem, e.stats, e.groups), [(str(w.path), w.message) for w in ws]))
        return marshal.dumps(out)

    results = forks.map_runs([1] * len(spots), jobs, work, lambda n: None)
    if results is None:
        return None
    read = []
    for spot, (e, ws) in zip(spots, (r for blob in results for r in marshal.loads(blob))):
        entry = None if e is None else CacheEntry(k.name, "/".join(spot.parts), spot.path, *e)
        read.append((entry, [CacheWarning(k.name, Path(p), m) for p, m in ws]))
    return read


def entry_at(k: CacheKind, root: Path, name: str) -> CacheEntry | None:
    """The entry called ``name`` under ``root`` as a scan would see it (None when absent or
    when ``name`` is not an entry position of the kind)."""
    parts = tuple(name.split("/")) if name else ()
    path = root.joinpath(*parts)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return None
    verdict, rule = k.layout.match(parts, stat.S_ISDIR(st.st_mode))
    if verdict != "entry" or rule is None:
        return None
    return _entry(k, root, parts, rule, [])


def _walk(k: CacheKind, root: Path, parts: tuple[str, ...],
          found: list[CacheWarning | _Spot], path: Path | None = None,
          mode: int | None = None) -> None:
    """Append to ``found``, in walk order, the warnings and the spots of the entries.  ``mode``:
    the type bits of ``path`` as its directory's listing gave them (else it is lstat'ed); the
    workers that read an entry stat it then."""
    path = path if path is not None else root.joinpath(*parts)
    if mode is None:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return  # vanished while scanning (pruned or replaced): nothing to report
    if stat.S_ISLNK(mode):
        found.append(CacheWarning(k.name, path, "symbolic link; never packed"))
        return
    is_dir = stat.S_ISDIR(mode)
    verdict, rule = k.layout.match(parts, is_dir)
    if verdict == "entry":
        assert rule is not None
        found.append(_Spot(parts, rule, path, is_dir))
        return
    if verdict == "descend" and is_dir:
        for d in _scandir(path):
            name = d.name
            if _own(name):
                found.append(CacheWarning(k.name, path / name, _own_message(name)))
                continue
            if k.layout.is_ignored(name):
                continue
            if k.layout.is_temp(name):
                found.append(CacheWarning(k.name, path / name,
                                          "in-flight or abandoned temporary file; skipped"))
                continue
            _walk(k, root, parts + (name,), found, path / name, _type_bits(d))
        return
    found.append(CacheWarning(k.name, path, f"not part of the known {k.name} layout; "
                                            "left alone"))


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    """A directory's entries sorted by name (none when it cannot be listed)."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=_by_name)
    except OSError:
        return []


_by_name = operator.attrgetter("name")


def _type_bits(d: os.DirEntry[str]) -> int | None:
    """The type of a listed name from the listing itself (no system call where the file system
    reports types): a symbolic link, a directory, a regular file; None for anything else or
    when it cannot be told (the walk then lstat's it)."""
    try:
        if d.is_symlink():
            return stat.S_IFLNK
        if d.is_dir(follow_symlinks=False):
            return stat.S_IFDIR
        if d.is_file(follow_symlinks=False):
            return stat.S_IFREG
    except OSError:
        pass
    return None


def _staged_beside(kind_name: str, root: Path) -> list[CacheWarning]:
    """The copies of this kind that killed restores left staged beside its directory (a kind
    whose directory does not exist is staged whole there, then moved in with one rename)."""
    parent = root.parent
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(STAGING_PREFIX))
    except OSError:
        return []
    return [CacheWarning(kind_name, parent / n / kind_name, _own_message(n))
            for n in names if os.path.lexists(parent / n / kind_name)]


def _own(name: str) -> bool:
    return name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX)


def _own_message(name: str) -> str:
    if name.startswith(STAGING_PREFIX):
        return "restore staging directory (a restore is running or was interrupted; the next " \
               "restore removes it)"
    return "prune trash directory (a prune is running or was interrupted)"


def _entry(k: CacheKind, root: Path, parts: tuple[str, ...], rule: EntryRule,
           warnings: list[CacheWarning], path: Path | None = None,
           st: os.stat_result | None = None) -> CacheEntry | None:
    path = path or root.joinpath(*parts)
    name = "/".join(parts)
    found: list[tuple[str, tuple[int, int, int, int]]] = []
    size = 0
    used = modified = 0.0
    temp_seen: list[str] = []
    for rel, fst in _files(path, k.layout, temp_seen, warnings, k.name, st):
        found.append((rel, (fst.st_size, fst.st_mode, fst.st_ino, fst.st_mtime_ns)))
        size += fst.st_size
        if fst.st_mtime > modified:
            modified = fst.st_mtime
        if fst.st_atime > used:
            used = fst.st_atime
    used = max(used, modified)
    found.sort()
    files = [rel for rel, _ in found]
    try:
        is_dir = stat.S_ISDIR((st or os.lstat(path)).st_mode)
    except OSError:
        return None
    problem = layout_problem(rule, parts, files, is_dir)
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    if problem == "" and rule.complete == "triton":
        problem, stale, groups = _triton_groups(path, files)
        if stale and problem == "":
            warnings.append(CacheWarning(
                k.name, path, "Triton group file records another directory (a copied "
                "cache); Triton misses it until `cache restore` places it"))
    if problem == "" and temp_seen and rule.complete != "triton":
        problem = "being written (temporary file " + temp_seen[0] + " present)"
    elif problem == "" and temp_seen:
        # Triton publishes each file by os.replace and the group last: the entry is usable.
        warnings.append(CacheWarning(k.name, path / temp_seen[0],
                                     "in-flight or abandoned temporary file; skipped"))
    return CacheEntry(k.name, name, path, is_dir, tuple(files), size, used, modified,
                      problem == "", problem, tuple(st for _, st in found),
                      groups if problem == "" else ())


def _files(path: Path, layout: Layout, temp_seen: list[str], warnings: list[CacheWarning],
           kind_name: str, st: os.stat_result | None = None
           ) -> Iterator[tuple[str, os.stat_result]]:
    """Regular files below ``path`` (or ``path`` itself), skipping temp and ignored names."""
    try:
        st = st or os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        yield "", st
        return
    ignored, temp, either = layout.is_ignored, layout.is_temp, layout.may_skip
    stack = [("", str(path))]
    while stack:
        rel, current = stack.pop()
        try:
            with os.scandir(current) as it:
                children = sorted(it, key=_by_name)
        except OSError:
            continue
        for d in children:
            name = d.name
            child_rel = f"{rel}/{name}" if rel else name
            if either(name):
                if ignored(name):
                    continue
                if temp(name):
                    temp_seen.append(child_rel)
                    continue
            try:
                cst = d.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(cst.st_mode):
                stack.append((child_rel, d.path))
            elif stat.S_ISREG(cst.st_mode):
                yield child_rel, cst
            else:
                warnings.append(CacheWarning(kind_name, Path(d.path),
                                             "not a regular file (link or device); never packed"))


def layout_problem(rule: EntryRule, parts: tuple[str, ...], files: Iterable[str],
                   is_dir: bool) -> str:
    """Why an entry with these files is incomplete by its kind's rule ('' when complete), from
    the file names alone: the one completeness rule of scan, archives and the shared store.
    For Triton it leaves the group files' content to ``triton_problem`` / ``groups.check``."""
    names = list(files)
    if not is_dir:
        return ""
    if not names:
        return "empty directory (being written or interrupted)"
    if rule.complete == "any":
        return ""
    glob = rule.marker(parts[-1] if parts else "")
    if glob is not None:
        if any("/" not in f and fnmatch.fnmatchcase(f, glob) for f in names):
            return ""
        return f"no {glob} yet (being built or interrupted)"
    if rule.complete == "triton":
        if any("/" in f for f in names):
            return "unexpected subdirectory in a Triton entry"
        if not any(f.startswith(GROUP_PREFIX) and f.endswith(".json") for f in names) and \
                not all(any(fnmatch.fnmatchcase(f, g) for g in _TRITON_LONE_FILES)
                        for f in names):
            return "no __grp__*.json group file (compile in flight or interrupted)"
        return ""
    raise AssertionError(rule.complete)


def read_group(path: Path | str) -> dict[str, str] | None:
    """A Triton group file's ``child_paths`` (name -> path); None when unreadable."""
    try:
        data = json.loads(read_noatime(path).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    children = data.get("child_paths") if isinstance(data, dict) else None
    if not isinstance(children, dict) or not all(
            isinstance(a, str) and isinstance(b, str) for a, b in children.items()):
        return None
    return children


def triton_problem(path: Path, files: Iterable[str]) -> str:
    """Why a Triton hash directory is not a complete entry ('' when it is).

    Complete means: at least one ``__grp__*.json`` and every child it names is a file of this
    directory (Triton writes the group last), or no group and only the lone artifacts Triton
    writes without one (launcher ``.so``, ``.autotune.json``).
    """
    names = list(files)
    return layout_problem(_TRITON_RULE, (), names, True) or _triton_groups(path, names)[0]


def _triton_groups(path: Path, names: list[str]
                   ) -> tuple[str, bool, tuple[tuple[str, tuple[str, ...]], ...]]:
    """The group-file half of ``triton_problem`` (each group read once), whether a group
    records another directory than ``path`` (a copied cache), and each group's children."""
    present = set(names)
    stale = False
    found = []
    here = str(path)
    for g in names:
        if not (g.startswith(GROUP_PREFIX) and g.endswith(".json")):
            continue
        children = read_group(f"{here}/{g}")
        if children is None:
            return f"unreadable group file {g}", stale, ()
        for child, recorded in children.items():
            where, _, base = recorded.rpartition("/")
            if "/" in child or child in ("", ".", "..") or base != child:
                return f"group file {g} names {child!r} outside its entry", stale, ()
            if child not in present:
                return f"group file {g} references missing file {child}", stale, ()
            stale = stale or where != here
        found.append((g, tuple(children)))
    return "", stale, tuple(found)


def triton_hits(path: Path) -> bool:
    """Whether Triton itself would hit this directory: every group present and every path it
    records exists (FileCacheManager.get_group), or a lone-artifact entry."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    groups = [n for n in names if n.startswith(GROUP_PREFIX) and n.endswith(".json")]
    if not groups:
        return bool(names) and all(
            any(fnmatch.fnmatchcase(n, g) for g in _TRITON_LONE_FILES) for n in names)
    for g in groups:
        children = read_group(path / g)
        if children is None or not all(os.path.exists(p) for p in children.values()):
            return False
    return True


def stale_group_paths(entry: CacheEntry) -> bool:
    """Whether a complete Triton entry's group records paths of another location (a copied
    cache): Triton misses it until ``cache restore`` rewrites the group."""
    for f in entry.files:
        if f.startswith(GROUP_PREFIX) and f.endswith(".json"):
            children = read_group(entry.path / f) or {}
            if any(os.path.dirname(p) != str(entry.path) for p in children.values()):
                return True
    return False
