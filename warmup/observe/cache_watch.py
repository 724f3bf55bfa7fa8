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
only new depfiles (``*.o.d``) beside the objects it rewrites.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cache_tools import compile_log, locations

logger = logging.getLogger("sglang_warmup.events")

#: Kinds whose builds are seen here (the others have hooks: warmup.observe.triton_hooks and
#: jit_hooks).
WATCHED = compile_log.LIBRARY_COMPILERS
#: Directories one watch follows at most (a cache that large is listed, never walked whole
#: again): above it new entries in the directories past the limit are not seen.
MAX_DIRS = 20_000

Record = Callable[..., None]


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
        #: build directories with new files whose build may go on: glob of the marker, times
        self.held: dict[tuple[str, ...], tuple[str, list[float]]] = {}

    def poll(self) -> list[tuple[str, float]]:
        """New entries since the last poll (the first poll only learns what is there), each
        as (its path below the root, the span of its files' mtimes in seconds)."""
        found: dict[tuple[str, ...], list[float]] = {}
        self._visit(self.root, (), found)
        self.baseline = False
        builds: dict[tuple[str, ...], list[float]] = {}
        for parts, times in found.items():
            held = self._build_dir_of(parts)
            if held is None:
                builds.setdefault(parts, []).extend(times)
            else:
                self.held.setdefault(held[0], (held[1], []))[1].extend(times)
        for entry, times in self._finished(set(found)):
            builds[entry] = times
        return [("/".join(parts), max(times) - min(times) if times else 0.0)
                for parts, times in builds.items()]

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

    def _finished(self, new: set[tuple[str, ...]]) -> list[tuple[tuple[str, ...], list[float]]]:
        """Held build directories whose build is over: the marker is at least as new as the
        build's first new file (a module built, or rebuilt over its restored files), or the
        marker was there already and nothing new came in since the last poll (a rebuild in
        place: ninja rewrites what exists).  A directory still without its marker stays held
        (a first build can run long between new files).  One build each, whatever polls it
        spans."""
        done = []
        for entry, (glob, times) in list(self.held.items()):
            quiet = not any(parts[:len(entry)] == entry for parts in new)
            marker = _marker_mtime(self.root.joinpath(*entry), glob)
            if marker >= min(times, default=0.0) or (quiet and marker >= 0):
                done.append((entry, times + [marker] if marker >= min(times, default=0.0)
                             else times))
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
            if self.kind.layout.is_temp(name) or self.kind.layout.is_ignored(name):
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
            layout = self.kind.layout
            if layout.is_temp(name) or layout.is_ignored(name) \
                    or self._new(path / name, parts + (name,), found):
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
            if self.kind.layout.is_temp(name) or self.kind.layout.is_ignored(name):
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
    recorded by ``record(outcome, entry, duration_s, compiler=kind, path=...)``."""

    def __init__(self, record: Record, interval_s: float,
                 kinds: list[KindWatch] | None = None) -> None:
        self.record, self.interval_s = record, interval_s
        self.kinds = watches() if kinds is None else kinds
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """One pass over every kind; returns how many builds were recorded."""
        n = 0
        for watch in self.kinds:
            for entry, span in watch.poll():
                self.record(compile_log.BUILT, entry, round(span, 3), compiler=watch.kind.name,
                            path=str(watch.root / entry))
                n += 1
        return n

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
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        for watch in self.kinds:  # first builds still without their marker (failed, or cut)
            for entry, (_, times) in watch.held.items():
                self.record(compile_log.BUILT, "/".join(entry),
                            round(max(times) - min(times), 3) if times else 0.0,
                            compiler=watch.kind.name, path=str(watch.root.joinpath(*entry)))
            watch.held.clear()
