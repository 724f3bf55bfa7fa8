"""What a prebake produced: the archive, what it holds by cache kind, how the server ran, and
the steps record beside it; as JSON and as the table ``prebake`` prints."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from cache_tools.locations import Location
from cache_tools.render import table
from cache_tools.scan import size_str


@dataclass(frozen=True)
class BakedKind:
    """One cache kind in the archive: complete entries, their files and bytes."""

    kind: str
    title: str
    path: str
    entries: int
    files: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title, "path": self.path,
                "entries": self.entries, "files": self.files, "bytes": self.bytes}


@dataclass(frozen=True)
class PrebakeResult:
    """What a prebake produced.  ``stopped_with``: how the server ended (``SIGTERM`` or
    ``SIGKILL``).  ``warmup``: the plan's run report as the server wrote it.  ``work_dir``: kept
    for inspection (None when it was a temporary directory and got removed)."""

    archive: Path
    archive_bytes: int
    kinds: tuple[BakedKind, ...]
    ready_s: float
    seconds: float
    stopped_with: str
    warmup: Mapping[str, Any]
    warnings: tuple[str, ...] = ()
    work_dir: Path | None = None
    #: the steps record beside the archive (None: not learned)
    steps: Path | None = None
    steps_line: str = ""

    @property
    def entries(self) -> int:
        return sum(k.entries for k in self.kinds)

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.kinds)

    def to_dict(self) -> dict[str, Any]:
        return {"archive": str(self.archive), "archive_bytes": self.archive_bytes,
                "entries": self.entries, "bytes": self.bytes,
                "kinds": [k.to_dict() for k in self.kinds], "ready_s": round(self.ready_s, 3),
                "seconds": round(self.seconds, 3), "stopped_with": self.stopped_with,
                "warmup": {k: self.warmup.get(k) for k in ("plan", "ok", "requests",
                                                           "duration_s", "flush")},
                "warnings": list(self.warnings),
                "work_dir": str(self.work_dir) if self.work_dir else None,
                "steps": str(self.steps) if self.steps else None}

    def render(self) -> str:
        rows = [[k.kind, k.entries, k.files, size_str(k.bytes)] for k in self.kinds]
        rows.append(["total", self.entries, sum(k.files for k in self.kinds), size_str(self.bytes)])
        w = self.warmup
        lines = [table(["kind", "entries", "files", "size"], rows, align="lrrr"),
                 f"archive: {self.archive} ({size_str(self.archive_bytes)}), "
                 f"{self.entries} entries",
                 f"server: ready in {self.ready_s:.1f} s, stopped with {self.stopped_with}; "
                 f"warm-up {w.get('plan')}: {w.get('requests')} requests in "
                 f"{float(w.get('duration_s') or 0):.1f} s; prebake took {self.seconds:.1f} s"]
        if self.steps_line:
            lines.append(self.steps_line)
        if self.work_dir:
            lines.append(f"kept: {self.work_dir} (server.log, state/, cache/)")
        lines.append(f"restore with: sglang-warmup cache restore {shlex.quote(str(self.archive))}")
        if self.steps:
            lines.append(f"then launch with the same plan and SGLang flags and: --steps "
                         f"{shlex.quote(str(self.steps))}")
        return "\n".join(lines)


def baked_kinds(locs: Sequence[Location], entries: Sequence[Any]) -> tuple[BakedKind, ...]:
    counts: dict[str, list[int]] = {}
    for e in entries:
        c = counts.setdefault(e.kind, [0, 0, 0])
        c[0] += 1
        c[1] += len(e.files)
        c[2] += e.size
    return tuple(BakedKind(loc.kind.name, loc.kind.title, str(loc.path),
                           *counts.get(loc.kind.name, [0, 0, 0])) for loc in locs)
