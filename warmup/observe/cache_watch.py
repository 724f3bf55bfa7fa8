"""JIT builds of the libraries that offer no hook, seen as new entries in their cache directories.

DeepGEMM builds its kernels inside its C++ extension (nvcc, one kernel per GEMM shape and
M range), TileLang, FlashInfer, CuTe and Inductor write their own caches: none calls anything
of ours.  What each build leaves is a new entry in that library's cache directory (the layouts
of :mod:`cache_tools.locations`), so one thread of the server's main process lists the
directories every ``WARMUP_CACHE_WATCH_S`` seconds (one ``stat`` per directory; a directory is
listed again only when its mtime moved) and records every new entry as a ``jit_build`` of that
library, stamped with the phase of the moment it was seen, in the compile log and Prometheus.
A new directory with everything below it is one build (DeepGEMM's ``cache/<kernel>.<hash>/``,
an Inductor FX graph's key directory), a new file in a directory already there is one build,
a new directory above the layout's entries (``cache/`` made by the first kernel) holds builds
each of its own, and a file outside every entry (a log or a lock beside them) is none;
new files inside one build directory of the kind's layout (a FlashInfer op's
``<ver>/<archs>/cached_ops/<op>/``) are one build of that directory, recorded once its marker
(``<op>.so``) is newer than the build's first new file or the directory went quiet for a poll,
whatever polls the build spans: ninja rebuilding an op that is
already there (after a restore, its ``.ninja_log`` gone or naming another directory) leaves
only new depfiles (``*.o.d``) beside the objects it rewrites.  A held build is stamped with
the phase of the poll that first saw it (a build begun in ``warmup`` and finished after the
phase turned ``serving`` is no compile after ready); one whose marker never comes is recorded
as failed once its directory is gone, or nothing new came in for ``HELD_FAILED_AFTER_S``, or
the watch stops.
Its duration is the span of the entry's file times (DeepGEMM writes the kernel's source first
and its cubin last), a lower bound.  Triton, SGLang's own nvcc JIT and tvm-ffi have hooks
of their own and are not watched.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

from cache_tools import compile_log, locations
from warmup.observe import phase

logger = logging.getLogger("sglang_warmup.events")

#: Kinds whose builds are seen here (the others have hooks: warmup.observe.triton_hooks and
#: jit_hooks).
WATCHED = compile_log.LIBRARY_COMPILERS
#: Directories one watch follows at most (a cache that large is listed, never walked whole
#: again): above it new entries in the directories past the limit are not seen.
MAX_DIRS = 20_000
#: a build directory without its marker, with nothing new in it for this long, is a build that
#: failed (the longest single nvcc step of a FlashInfer op takes minutes, not ten)
HELD_FAILED_AFTER_S = 600.0

Record = Callable[..., None]


class Build(NamedTuple):
    """One build seen: its path below the kind's root, the span of its files' mtimes (s),
    what the caller passed to the poll that first saw it, and whether it ended without its
    marker (failed)."""

    entry: str
    span: float
    seen: Any = None
    failed: bool = False


@dataclass
class _Held:
    """A build directory with new files whose build may go on."""

    glob: str                   # its marker
    seen: Any                   # what the first poll that saw it was given
    times: list[float] = field(default_factory=list)
    last_new: float = field(default_factory=time.monotonic)


@dataclass
class _Dir:
    mtime_ns: int
    children: set[str] = field(default_factory=set)


class KindWatch:
    """The directories of one cache kind, and the entries already there."""

    def __init__(self, kind: locations.CacheKind, root: Path) -> None:
        self.kind, self.root = kind, root
        self.dirs: dict[Path, _Dir] = {}
        self.baseline = True
        #: build directories with new files whose build may go on
        self.held: dict[tuple[str, ...], _Held] = {}

    def poll(self, seen: Any = None) -> list[Build]:
        """New entries since the last poll (the first poll only learns what is there), each
        a :class:`Build` carrying ``seen`` of the poll that first saw it."""
        found: dict[tuple[str, ...], list[float]] = {}
        self._visit(self.root, (), found)
        self.baseline = False
        builds: list[Build] = []
        for parts, times in found.items():
            held = self._build_dir_of(parts)
            if held is None:
                builds.append(Build("/".join(parts), _span(times), seen))
            else:
                h = self.held.setdefault(held[0], _Held(held[1], seen))
                h.times.extend(times)
                h.last_new = time.monotonic()
        return builds + self._finished(set(found))

    def release(self) -> list[Build]:
        """The held builds, as failed (cut short: the watch stops)."""
        out = [Build("/".join(entry), _span(h.times), h.seen, failed=True)
               for entry, h in self.held.items()]
        self.held.clear()
        return out

    def _build_dir_of(self, parts: tuple[str, ...]) -> tuple[tuple[str, ...], str] | None:
        """The build directory of the layout that holds ``parts`` (an entry complete once its
        marker file exists: one module's build, FlashInfer's op) and its marker glob; None
        for other entries (Inductor's hash prefix holds many builds, each its own)."""
        for n in range(1, len(parts) + 1):
            verdict, rule = self.kind.layout.match(parts[:n], True)
            glob = rule.marker(parts[n - 1]) if verdict == "entry" and rule is not None else None
            if glob is not None:
                return parts[:n], glob
        return None

    def _finished(self, new: set[tuple[str, ...]]) -> list[Build]:
        """Held build directories whose build is over: the marker is at least as new as the
        build's first new file (a module built, or rebuilt over its restored files), or the
        marker was there already and nothing new came in since the last poll (a rebuild in
        place: ninja rewrites what exists).  A directory still without its marker stays held
        (a first build can run long between new files) until it is gone or quiet for
        ``HELD_FAILED_AFTER_S``: a failed build.  One build each, whatever polls it spans."""
        done = []
        for entry, h in list(self.held.items()):
            quiet = not any(parts[:len(entry)] == entry for parts in new)
            directory = self.root.joinpath(*entry)
            marker = _marker_mtime(directory, h.glob)
            built = marker >= min(h.times, default=0.0)
            if built or (quiet and marker >= 0):
                done.append(Build("/".join(entry), _span(h.times + [marker] if built
                                                         else h.times), h.seen))
            elif quiet and (not directory.is_dir()
                            or time.monotonic() - h.last_new > HELD_FAILED_AFTER_S):
                done.append(Build("/".join(entry), _span(h.times), h.seen, failed=True))
            else:
                continue
            del self.held[entry]
        return done

    def _visit(self, path: Path, parts: tuple[str, ...],
               found: dict[tuple[str, ...], list[float]]) -> None:
        try:
            st = os.stat(path)
        except OSError:
            self.dirs.pop(path, None)
            return
        known = self.dirs.get(path)
        if known is not None and known.mtime_ns == st.st_mtime_ns:
            children = known.children
            fresh: set[str] = set()
        else:
            children = self._list(path)
            fresh = children - (known.children if known else set()) \
                if known is not None or not self.baseline else set()
            if known is None and len(self.dirs) >= MAX_DIRS:
                return
            self.dirs[path] = _Dir(st.st_mtime_ns, children)
        for name in sorted(children):
            if self.kind.layout.may_skip(name):    # temporary or ignored
                continue
            child, child_parts = path / name, parts + (name,)
            if name in fresh:
                if not self._new(child, child_parts, found):
                    # an empty directory being filled now: look again at the next pass
                    self.dirs[path].mtime_ns = -1
                    self.dirs[path].children.discard(name)
            elif child in self.dirs or (known is None and self._is_dir(child)):
                self._visit(child, child_parts, found)

    def _new(self, path: Path, parts: tuple[str, ...],
             found: dict[tuple[str, ...], list[float]]) -> bool:
        """A path that appeared: a new file is one entry, a new directory with everything
        below it is one entry, a new directory above the layout's entries (a cache directory
        made now, FlashInfer's version directory) holds entries each of its own.  A file
        outside every entry (ninja's log in the JIT directory of a FlashInfer before 0.6) is
        no build.  False for a directory that holds no file yet, and for a path gone again
        (looked at again at the next pass, like a directory being filled)."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            if not self._outside_entries(parts):
                found.setdefault(parts, []).append(st.st_mtime)
            return True
        if self.kind.layout.match(parts, True)[0] == "descend":
            held = self._new_container(path, parts, found)
        else:
            self._visit_new_tree(path, parts, found, parts)
            held = bool(found.get(parts))
            if not held:
                found.pop(parts, None)
        if not held:
            for known in [d for d in self.dirs if d == path or path in d.parents]:
                del self.dirs[known]
        return held

    def _outside_entries(self, parts: tuple[str, ...]) -> bool:
        """True when no part of the file's path is an entry of the layout, nor the file."""
        return all(self.kind.layout.match(parts[:n], n < len(parts))[0] != "entry"
                   for n in range(1, len(parts) + 1))

    def _new_container(self, path: Path, parts: tuple[str, ...],
                       found: dict[tuple[str, ...], list[float]]) -> bool:
        """A new directory above the entry level: everything in it is new, entry by entry; a
        directory in it still empty is looked at again at the next pass.  False when it holds
        nothing yet."""
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            return False
        children = self._list(path)
        known: set[str] = set()
        for name in sorted(children):
            if self.kind.layout.may_skip(name) or self._new(path / name, parts + (name,), found):
                known.add(name)
        if len(self.dirs) < MAX_DIRS:
            self.dirs[path] = _Dir(mtime_ns if known == children else -1, known)
        return bool(known)

    def _visit_new_tree(self, path: Path, parts: tuple[str, ...],
                        found: dict[tuple[str, ...], list[float]],
                        entry: tuple[str, ...]) -> None:
        times = found.setdefault(entry, [])
        try:
            st = os.stat(path)
            children = self._list(path)
        except OSError:
            return
        if len(self.dirs) < MAX_DIRS:
            self.dirs[path] = _Dir(st.st_mtime_ns, children)
        for name in sorted(children):
            if self.kind.layout.may_skip(name):    # temporary or ignored
                continue
            child = path / name
            try:
                cst = os.lstat(child)
            except OSError:
                continue  # gone again
            if stat.S_ISDIR(cst.st_mode):
                self._visit_new_tree(child, parts + (name,), found, entry)
            else:
                times.append(cst.st_mtime)

    @staticmethod
    def _list(path: Path) -> set[str]:
        try:
            return set(os.listdir(path))
        except OSError:
            return set()

    @staticmethod
    def _is_dir(path: Path) -> bool:
        try:
            return path.is_dir() and not path.is_symlink()
        except OSError:
            return False


def _span(times: list[float]) -> float:
    return max(times) - min(times) if times else 0.0


def _marker_mtime(directory: Path, glob: str) -> float:
    """The newest mtime of the files in ``directory`` matching ``glob``, else -1 (a marker
    gone between the listing and its stat is no marker)."""
    try:
        names = [n for n in os.listdir(directory) if fnmatch.fnmatchcase(n, glob)]
    except OSError:
        return -1.0
    times = []
    for n in names:
        try:
            times.append(os.stat(directory / n).st_mtime)
        except OSError:
            continue
    return max(times, default=-1.0)


def watches(env: dict[str, str] | None = None) -> list[KindWatch]:
    """One watch per watched kind whose directory this environment resolves."""
    out = []
    kinds = [locations.kind(name) for name in WATCHED]
    for loc in locations.resolve(kinds, env=env):
        if loc.path is not None:
            out.append(KindWatch(loc.kind, Path(loc.path)))
    return out


class CacheWatch:
    """The watching thread: every ``interval_s``, each kind's new entries become builds
    recorded by ``record(outcome, entry, duration_s, compiler=kind, path=..., state=...)``,
    ``state`` the phase of the poll that first saw the build."""

    def __init__(self, record: Record, interval_s: float,
                 kinds: list[KindWatch] | None = None) -> None:
        self.record, self.interval_s = record, interval_s
        self.kinds = watches() if kinds is None else kinds
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """One pass over every kind; returns how many builds were recorded."""
        seen = phase.current()
        return sum(self._record(watch, watch.poll(seen)) for watch in self.kinds)

    def _record(self, watch: KindWatch, builds: list[Build]) -> int:
        for b in builds:
            self.record(compile_log.FAILED if b.failed else compile_log.BUILT, b.entry,
                        round(b.span, 3), compiler=watch.kind.name,
                        path=str(watch.root / b.entry), state=b.seen)
        return len(builds)

    def start(self) -> None:
        self.poll_once()  # what is there now is the baseline, not builds
        self.thread = threading.Thread(target=self._run, name="sglang-warmup-cache-watch",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            try:
                self.poll_once()
            except Exception as exc:  # a guest's thread never takes its host down
                logger.debug("sglang-warmup: cache watch pass failed: %r", exc)

    def stop(self) -> None:
        """Stop the thread; first builds still without their marker are recorded as failed
        (cut short), unless the thread is still in a pass."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
            if self.thread.is_alive():
                return
        for watch in self.kinds:
            self._record(watch, watch.release())
