"""Saved documents: which of the three kinds a JSON file is (run report, audit report, coverage
record), read within a size limit, refused in one line when it is none of them or newer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cache_tools import jsonfile
from warmup.coverage import audit, classes
from warmup.errors import WarmupError
from warmup.serve import report

RUN, AUDIT, COVERAGE = "run report", "audit report", "coverage record"
#: format marker -> (kind, the newest version this sglang-warmup reads)
FORMATS = {report.FORMAT: (RUN, report.VERSION), audit.FORMAT: (AUDIT, audit.VERSION),
           classes.FORMAT: (COVERAGE, classes.VERSION)}
#: A saved report is a few hundred KiB; anything this large is not one.
MAX_BYTES = 64 * 1024 * 1024
_HINT = ("pass a run report (serve --report, <state dir>/report.json), an audit-*.json or a "
         "coverage.json")


@dataclass(frozen=True)
class Document:
    """One saved document: its kind (:data:`RUN`, :data:`AUDIT`, :data:`COVERAGE`), where it
    came from and its JSON."""

    kind: str
    path: str
    data: dict[str, Any]


def load(path: str | Path) -> Document:
    """Read and identify a saved document; errors name the file and what it is."""
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in ("report.json", "coverage.json") if (p / n).is_file()]
        found += sorted(p.glob("audit-*.json"))[-1:]
        if not found:
            raise WarmupError(f"{p}: no report.json, coverage.json or audit-*.json here",
                              hint=_HINT)
        p = found[0]
    try:
        data = jsonfile.load(p, MAX_BYTES)
    except jsonfile.JsonFileError as exc:
        raise WarmupError(f"{p}: {exc}", hint=_HINT) from None
    kind = _identify(p, data)
    return Document(kind, str(p), data)


def _identify(p: Path, data: Any) -> str:
    if not isinstance(data, dict):
        raise WarmupError(f"{p}: a JSON {type(data).__name__}, not a saved report", hint=_HINT)
    fmt = data.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        kind, newest = FORMATS[fmt]
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > newest:
            raise WarmupError(f"{p}: a {kind} of format version {version!r}, newer than this "
                              f"sglang-warmup reads ({newest})",
                              hint="upgrade sglang-warmup, or render it where it was written")
        _require(p, data, kind)
        return kind
    # Files written before the format marker: recognised by their fields.
    if {"plan", "expansion_digest", "classes"} <= set(data):
        _require(p, data, RUN)
        return RUN
    if {"plan", "closed", "classes", "open_classes"} <= set(data):
        _require(p, data, COVERAGE)
        return COVERAGE
    raise WarmupError(f"{p}: {_what(data)}, not a run report, an audit report or a coverage "
                      "record", hint=_HINT)


def _require(p: Path, data: dict, kind: str) -> None:
    """The fields a view reads, with their JSON types."""
    need = {RUN: {"plan": str, "classes": list}, AUDIT: {"steps": list, "url": str},
            COVERAGE: {"plan": str, "classes": list}}[kind]
    for key, typ in need.items():
        if not isinstance(data.get(key), typ):
            raise WarmupError(f"{p}: a {kind} without a valid {key!r} field",
                              hint="it is damaged or hand-edited; write it again")
    rows = data["classes"] if kind != AUDIT else data["steps"]
    if not all(isinstance(r, dict) for r in rows):
        raise WarmupError(f"{p}: a {kind} whose {'classes' if kind != AUDIT else 'steps'} are "
                          "not objects", hint="it is damaged or hand-edited; write it again")


def _what(data: dict) -> str:
    """What a JSON object that is none of ours looks like, in a few words."""
    if {"entries", "fingerprint"} <= set(data) or data.get("format") == "sglang-warmup-cache-archive":
        return "a cache archive's manifest"
    if "event" in data and "phase" in data:
        return "a compile-log line"
    if "steps" in data and "num_requests" in data:
        return "a plan expansion (plan show --format json)"
    keys = ", ".join(sorted(map(str, data))[:5])
    return f"a JSON object with keys {keys}" if keys else "an empty JSON object"
