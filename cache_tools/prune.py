"""Pruning: choose entries to delete (least recently used first) into a PruneStrategy that states
what it frees, then ``execute()`` it.

Criteria combine as a union: entries last used longer ago than ``older_than``; the least recently
used entries until the caches fit in ``max_size``; entries built by another toolchain
(``other_toolchain``) where the cache records its producer (Triton's ``triton_version``,
FlashInfer's ``<version>/`` directory, tvm-ffi's ``__tvmffi_<version>`` suffix).  Entries whose
producer is not recorded are never pruned by that last criterion.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cache_tools.errors import CacheError
from cache_tools.fingerprint import Fingerprint
from cache_tools.locations import TRASH_PREFIX, Location
from cache_tools.scan import GROUP_PREFIX, CacheEntry, CacheInfo, read_noatime, scan, size_str
from cache_tools.archive.staging import clean_roots, own_name

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str, option: str = "--max-size") -> int:
    """``10G`` / ``500M`` / ``1.5GiB`` / ``123`` -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise CacheError(f"{option} {text!r}: not a size",
                         hint="write a number with an optional unit: 500M, 10G, 1.5T (binary)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_duration(text: str, option: str = "--older-than") -> float:
    """``7d`` / ``12h`` / ``30m`` / ``45s`` / ``2w`` -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", text)
    if not m:
        raise CacheError(f"{option} {text!r}: not a duration",
                         hint="write a number and a unit: 45s, 30m, 12h, 7d, 2w")
    return float(m.group(1)) * _SECONDS[m.group(2)]


@dataclass(frozen=True)
class PruneCandidate:
    """An entry the strategy deletes, and why."""

    entry: CacheEntry
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class PruneResult:
    removed: int
    freed: int
    #: (path, error) for entries that could not be removed
    failed: tuple[tuple[Path, str], ...]


@dataclass(frozen=True)
class PruneStrategy:
    """What a prune deletes; nothing is deleted until ``execute()``."""

    candidates: tuple[PruneCandidate, ...]
    #: bytes of every scanned entry before and after the prune
    size_before: int
    #: entries whose producing toolchain is not recorded (kept by ``other_toolchain``)
    unknown_toolchain: int = 0

    @property
    def expected_freed_size(self) -> int:
        return sum(c.entry.size_on_disk for c in self.candidates)

    @property
    def expected_freed_size_str(self) -> str:
        return size_str(self.expected_freed_size)

    @property
    def size_after(self) -> int:
        return self.size_before - self.expected_freed_size

    def execute(self) -> PruneResult:
        """Delete the candidates, least recently used first.  Each directory entry is first
        renamed into a trash directory, so no reader ever sees half an entry."""
        freed = removed = 0
        failed: list[tuple[Path, str]] = []
        trash: dict[Path, Path] = {}
        try:
            for c in self.candidates:
                e = c.entry
                try:
                    if not e.is_dir:
                        os.unlink(e.path)
                    else:
                        home = e.path.parent if e.name == "" else _root_of(e)
                        bin_ = trash.get(home)
                        if bin_ is None:
                            bin_ = home / own_name(TRASH_PREFIX)
                            bin_.mkdir()
                            trash[home] = bin_
                        os.rename(e.path, bin_ / str(removed))
                except FileNotFoundError:
                    continue  # already gone: nothing to free
                except OSError as exc:
                    failed.append((e.path, exc.strerror or str(exc)))
                    continue
                removed += 1
                freed += e.size_on_disk
        finally:
            for bin_ in trash.values():
                shutil.rmtree(bin_, ignore_errors=True)
        return PruneResult(removed, freed, tuple(failed))


def _root_of(e: CacheEntry) -> Path:
    depth = len(e.name.split("/"))
    root = e.path
    for _ in range(depth):
        root = root.parent
    return root


def plan_prune(locations: Iterable[Location], *, older_than: float | None = None,
               max_size: int | None = None, other_toolchain: bool = False,
               local: Fingerprint | None = None, now: float | None = None,
               info: CacheInfo | None = None) -> PruneStrategy:
    """Choose what to delete.  At least one criterion is required.  Leftovers of killed
    prunes, restores and pulls (trash and staging directories of dead processes) are removed
    first, so a dry run or an empty prune does not leave them behind either."""
    if older_than is None and max_size is None and not other_toolchain:
        raise CacheError("nothing to prune by",
                         hint="give --older-than 7d, --max-size 10G and/or --fingerprint other")
    now = time.time() if now is None else now
    locations = list(locations)
    clean_roots(loc.path for loc in locations if loc.path is not None)
    info = info or scan(locations)
    entries = sorted(info.entries, key=lambda e: (e.last_used, e.kind, e.name))
    reasons: dict[int, list[str]] = {}
    unknown = 0
    if other_toolchain:
        from cache_tools import fingerprint

        local = local or fingerprint.current(probe_gpu=False)
        for i, e in enumerate(entries):
            verdict = _other_toolchain(e, local)
            if verdict is None:
                unknown += 1
            elif verdict:
                reasons.setdefault(i, []).append(verdict)
    if older_than is not None:
        for i, e in enumerate(entries):
            if now - e.last_used > older_than:
                reasons.setdefault(i, []).append(f"last used {_days(now - e.last_used)} ago")
    if max_size is not None:
        total = sum(e.size_on_disk for e in entries)
        remaining = total - sum(entries[i].size_on_disk for i in reasons)
        for i, e in enumerate(entries):
            if remaining <= max_size:
                break
            if i in reasons:
                continue
            reasons[i] = [f"least recently used beyond {size_str(max_size)}"]
            remaining -= e.size_on_disk
    candidates = tuple(PruneCandidate(entries[i], tuple(r)) for i, r in sorted(reasons.items()))
    return PruneStrategy(candidates, info.size_on_disk, unknown)


def _days(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    return f"{seconds / 3600:.1f}h"


def _other_toolchain(e: CacheEntry, local: Fingerprint) -> str | None:
    """A reason when the entry records a producer other than this toolchain, '' when it
    records this one, None when it records nothing."""
    soft = local.software_map
    if any(f.startswith(GROUP_PREFIX) for f in e.files) or e.kind == "triton":
        made_by = _triton_version(e)
        if made_by is None or "triton" not in soft:
            return None
        return "" if made_by == soft["triton"] else f"built by Triton {made_by}"
    if e.kind == "flashinfer" and e.name and not e.name.startswith("cubins/"):
        made_by = e.name.split("/")[0]
        here = soft.get("flashinfer")
        if here is None:
            return None
        return "" if made_by == here else f"built by FlashInfer {made_by}"
    if e.kind == "tvm_ffi":
        m = re.search(r"__tvmffi_([0-9][^/_]*)$", e.name)
        here = _dist_version("apache-tvm-ffi")
        if not m or here is None:
            return None
        return "" if m.group(1) == here else f"built by tvm-ffi {m.group(1)}"
    return None


def _triton_version(e: CacheEntry) -> str | None:
    for f in e.files:
        if f.endswith(".json") and not f.startswith(GROUP_PREFIX) and \
                not f.endswith(".autotune.json"):
            try:
                meta = json.loads(read_noatime(e.path / f).decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            version = meta.get("triton_version") if isinstance(meta, dict) else None
            if isinstance(version, str):
                return version
    return None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
