"""An audit file read back (what ``learn`` reads): its size bounded, its facts checked as a facts
file's, each step's shape as a traffic file's line (:func:`traffic.parse_step`), its counts
bounded; a refusal names the file, the step and the field."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cache_tools import jsonfile
from warmup.coverage.audit import FORMAT, VERSION
from warmup.coverage.traffic import MAX_STEPS, STEP_FIELDS, _count, parse_step
from warmup.errors import FactsError, WarmupError
from warmup.plan.facts import ServerFacts
from warmup.plan.facts_file import from_dump

#: An audit file is a few MiB for the largest traffic files; anything this large is not one.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: One count of compile events (a pass's misses or device loads, a key's compiles).
MAX_EVENTS = 1_000_000_000
_HINT = "pass an audit-*.json written by `sglang-warmup audit`"
_AGAIN = "re-run `sglang-warmup audit`"
_PASS_COUNTS = ("misses", "device_loads")
_KEY_COUNTS = ("compiled", "disk_hits", "failed")


@dataclass(frozen=True)
class AuditFile:
    """An audit file read back and checked: its path, its JSON and the server's facts."""

    path: str
    data: Mapping[str, Any]
    facts: ServerFacts

    @property
    def steps(self) -> list[Mapping[str, Any]]:
        return list(self.data["steps"])


def read(path: str | os.PathLike[str]) -> AuditFile:
    """One audit file, every value learn uses checked; errors name the file and what is
    wrong."""
    p = Path(path)
    try:
        data = jsonfile.load(p, MAX_FILE_BYTES)
    except jsonfile.JsonFileError as exc:
        raise WarmupError(f"{p}: {exc}", hint=_HINT) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WarmupError(f"{p}: not an audit file (no \"format\": \"{FORMAT}\")", hint=_HINT)
    if data.get("version") != VERSION:
        raise WarmupError(f"{p}: audit file version {data.get('version')!r} is not supported",
                          hint=f"this sglang-warmup reads version {VERSION}")
    if not isinstance(data.get("steps"), list) or not isinstance(data.get("facts"), dict):
        raise WarmupError(f"{p}: audit file without steps or facts", hint=_AGAIN)
    try:
        facts = from_dump(data["facts"], f"{p}: facts", hint=_AGAIN)
    except FactsError as exc:  # a damaged audit file, not a bad facts source: status 1
        raise WarmupError(exc.message, hint=exc.hint) from None
    for i, step in enumerate(data["steps"]):
        _check_step(step, f"{p}: steps[{i}]")
    _check_objects(data.get("unattributed", []), f"{p}: unattributed", _KEY_COUNTS)
    _check_count(data.get("unseen_events", 0), f"{p}: unseen_events")
    return AuditFile(str(p), data, facts)


def _check_step(s: Any, where: str) -> None:
    """A step: its traffic fields as a traffic file's, its index, and both passes' counts."""
    if not isinstance(s, dict):
        raise WarmupError(f"{where}: expected an object", hint=_AGAIN)
    parse_step({k: s[k] for k in STEP_FIELDS if k in s}, where)
    if not _count(s.get("index"), 2 * MAX_STEPS, minimum=0):
        raise WarmupError(f"{where}: index: expected an integer from 0 to {2 * MAX_STEPS:,}",
                          hint=_AGAIN)
    if not isinstance(s.get("prefix_cached", False), bool):
        raise WarmupError(f"{where}: prefix_cached: expected true or false", hint=_AGAIN)
    for name in ("pass1", "pass2"):
        results = s.get(name, {})
        if not isinstance(results, dict):
            raise WarmupError(f"{where}.{name}: expected an object", hint=_AGAIN)
        for key in _PASS_COUNTS:
            _check_count(results.get(key, 0), f"{where}.{name}.{key}")
        _check_objects(results.get("keys", []), f"{where}.{name}.keys", ())


def _check_objects(items: Any, where: str, counts: tuple[str, ...]) -> None:
    """A list of objects whose ``counts`` (when present) are counts of events."""
    if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
        raise WarmupError(f"{where}: expected a list of objects", hint=_AGAIN)
    for d in items:
        for key in counts:
            _check_count(d.get(key, 0), f"{where}.{key}")


def _check_count(v: Any, where: str) -> None:
    if not _count(v, MAX_EVENTS, minimum=0):
        raise WarmupError(f"{where}: expected an integer from 0 to {MAX_EVENTS:,}", hint=_AGAIN)
