"""Saved documents: what a JSON file the project wrote is, read within a size limit and turned
into typed reports by their ``from_json``: a run report (with its coverage when the second pass
ran), an audit report, a coverage record, or any other JSON document (a benchmark file under
``docs/data/``, the sidecar's ``/report``, a plan expansion) as an :class:`Outline` of its
fields and of the reports it holds.  A report of ours that is damaged, or newer than this
sglang-warmup, is refused in one line naming the file and the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from cache_tools import jsonfile
from warmup.coverage import audit, classes
from warmup.coverage.audit import AuditReport
from warmup.coverage.classes import Coverage, RecordError
from warmup.coverage.second_pass import CoverageReport
from warmup.errors import WarmupError
from warmup.serve import report

RUN, AUDIT, COVERAGE, OTHER = "run report", "audit report", "coverage record", "JSON document"
#: format marker -> (kind, the newest version this sglang-warmup reads)
FORMATS = {report.FORMAT: (RUN, report.VERSION), audit.FORMAT: (AUDIT, audit.VERSION),
           classes.FORMAT: (COVERAGE, classes.VERSION)}
#: A saved report is a few hundred KiB; anything this large is not one.
MAX_BYTES = 64 * 1024 * 1024
#: What an outline keeps of another document: its scalar fields, the reports it holds, the
#: text of one field, and the JSON values it walks (a 64 MiB file has millions).
MAX_FIELDS, MAX_PARTS, MAX_TEXT, MAX_NODES = 400, 50, 160, 2_000_000
_HINT = ("pass a run report (serve --report, <state dir>/report.json), an audit-*.json, a "
         "coverage.json, or another JSON document sglang-warmup wrote")
_DAMAGED = "it is damaged or hand-edited; write it again"


@dataclass(frozen=True)
class Outline:
    """A JSON document that is none of the three reports: what it looks like (``what``), the
    reports found inside it (``parts``, each with its JSON path as ``path``), and its other
    scalar fields as (JSON path, value text) rows; ``more_fields`` / ``more_parts`` count what
    is left out past the limits."""

    what: str
    parts: tuple["Document", ...]
    fields: tuple[tuple[str, str], ...]
    more_fields: int = 0
    more_parts: int = 0
    tables: tuple["Records", ...] = ()


@dataclass(frozen=True)
class Records:
    """A list of flat objects inside another document (one benchmark row per step, per run),
    shown as one table: its JSON path, the keys of its objects, a row of value texts per
    object, and how many objects were left out."""

    path: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    more: int = 0


@dataclass(frozen=True)
class Document:
    """One saved document: its kind (:data:`RUN`, :data:`AUDIT`, :data:`COVERAGE` or
    :data:`OTHER`), where it came from (a file, or ``FILE: json.path`` for a report inside
    another document), its JSON as read, and the typed report: a ``CoverageReport`` (the run
    report and its coverage), an ``AuditReport``, a ``Coverage`` or an :class:`Outline`."""

    kind: str
    path: str
    data: Any
    report: Any


def load(path: str | Path) -> Document:
    """Read and identify a saved document; errors name the file and what is wrong."""
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
    return read(data, str(p))


def read(data: Any, path: str) -> Document:
    """The document that ``data`` (JSON as read from ``path``) is; a damaged or newer report of
    ours is a WarmupError naming ``path`` and the field."""
    kind = identify(data)
    if kind is None:
        return Document(OTHER, path, data, _outline(data, path))
    problem = _problem(data, kind)
    if problem:
        raise WarmupError(f"{path}: {problem}", hint=_DAMAGED if "newer" not in problem else
                          "upgrade sglang-warmup, or render it where it was written")
    try:
        typed = _typed(kind, data)
    except RecordError as exc:
        raise WarmupError(f"{path}: {exc}", hint=_DAMAGED) from None
    return Document(kind, path, data, typed)


def identify(data: Any) -> str | None:
    """Which of our reports ``data`` is, by its format marker or, for files written before the
    marker, by its fields; None for anything else."""
    if not isinstance(data, dict):
        return None
    fmt = data.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt][0]
    if {"plan", "expansion_digest", "classes"} <= set(data):
        return RUN
    if {"plan", "closed", "classes", "open_classes"} <= set(data):
        return COVERAGE
    return None


def _problem(data: dict, kind: str) -> str:
    """Why a report of ours cannot be read (a newer version, a field a view needs of the wrong
    JSON type), or empty."""
    fmt = data.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        newest = FORMATS[fmt][1]
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > newest:
            return (f"a {kind} of format version {version!r}, newer than this sglang-warmup "
                    f"reads ({newest})")
    need = {RUN: {"plan": str, "classes": list}, AUDIT: {"steps": list, "url": str},
            COVERAGE: {"plan": str, "classes": list}}[kind]
    for key, typ in need.items():
        if not isinstance(data.get(key), typ):
            return f"a {kind} without a valid {key!r} field"
    rows = "steps" if kind == AUDIT else "classes"
    if not all(isinstance(r, dict) for r in data[rows]):
        return f"a {kind} whose {rows} are not objects"
    return ""


def _typed(kind: str, data: dict) -> Any:
    if kind == RUN:
        return CoverageReport.from_json(data)
    if kind == AUDIT:
        return AuditReport.from_json(data)
    return Coverage.from_json(data)


# --- other documents -------------------------------------------------------------------------
def _outline(data: Any, path: str) -> Outline:
    """The reports inside ``data`` (any depth, document order) and its other scalar fields."""
    parts: list[Document] = []
    fields: list[tuple[str, str]] = []
    tables: list[Records] = []
    more_fields = more_parts = 0
    for where, value in _walk(data):
        if _flat_records(value):
            room = MAX_FIELDS - len(fields) - sum(len(t.rows) for t in tables)
            if room <= 0:
                more_fields += len(value)
                continue
            headers = tuple(dict.fromkeys(str(k) for v in value for k in v))
            rows = tuple(tuple(_value_text(v.get(h)) if h in v else "" for h in headers)
                         for v in value[:room])
            tables.append(Records(where or "(the document)", headers, rows,
                                  max(0, len(value) - room)))
            continue
        kind = identify(value)
        if kind is not None:
            if len(parts) >= MAX_PARTS:
                more_parts += 1
                continue
            try:
                parts.append(read(value, f"{path}: {where}"))
            except WarmupError as exc:   # one damaged report does not hide the rest
                fields.append((where, f"(a {kind} not shown: {exc.message.split(': ', 1)[-1]})"))
            continue
        if len(fields) >= MAX_FIELDS:
            more_fields += 1
        else:
            fields.append((where or "(the document)", _value_text(value)))
    what = _what(data)
    if parts:
        what += f" holding {len(parts) + more_parts} saved report(s)"
    return Outline(what, tuple(parts), tuple(fields), more_fields, more_parts, tuple(tables))


def _flat_records(value: Any) -> bool:
    """A list of two or more objects whose values are scalars or lists of scalars, none of
    them a report of ours: one table."""
    return (isinstance(value, list) and len(value) >= 2
            and all(isinstance(v, dict) and identify(v) is None and v for v in value)
            and all(not isinstance(x, dict) and not (isinstance(x, list) and any(
                isinstance(y, (dict, list)) for y in x)) for v in value for x in v.values())
            and len({k for v in value for k in v}) <= 24)


def _walk(data: Any) -> Iterator[tuple[str, Any]]:
    """(JSON path, value) of every report of ours (not entered) and every scalar, or list of
    scalars, in document order; iterative, and bounded by MAX_NODES."""
    stack: list[tuple[str, Any]] = [("", data)]
    seen = 0
    while stack and seen < MAX_NODES:
        where, value = stack.pop()
        seen += 1
        if identify(value) is not None or _flat_records(value) or \
                not isinstance(value, (dict, list)) or (
                isinstance(value, list) and value
                and not any(isinstance(v, (dict, list)) for v in value)):
            yield where, value
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        children = [(f"{where}.{k}" if where else str(k)) if isinstance(value, dict)
                    else f"{where}[{k}]" for k, _ in items]
        values = list(value.values()) if isinstance(value, dict) else list(value)
        if not values:
            yield where, value
        stack.extend(reversed(list(zip(children, values))))


def _value_text(value: Any) -> str:
    """A scalar, an empty container or a list of scalars in one line of at most MAX_TEXT."""
    if isinstance(value, list):
        text = ", ".join(_value_text(v) for v in value[:40]) if value else "[]"
        if len(value) > 40:
            text += f", … ({len(value)} values)"
    elif isinstance(value, dict):
        text = "{}"
    elif isinstance(value, str):
        lines = value.strip().splitlines() or [""]
        text = lines[0] + (f" … ({len(lines)} lines)" if len(lines) > 1 else "")
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = str(value) if len(str(value)) <= 40 else f"an integer of {len(str(value))} digits"
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"


def _what(data: Any) -> str:
    """What a JSON document that is none of our reports looks like, in a few words."""
    if isinstance(data, list):
        return f"a JSON list of {len(data)} value(s)"
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}"
    if {"entries", "fingerprint"} <= set(data) or data.get("format") == "sglang-warmup-cache-archive":
        return "a cache archive's manifest"
    if "event" in data and "phase" in data:
        return "a compile-log line"
    if "steps" in data and "num_requests" in data:
        return "a plan expansion (plan show --format json)"
    if "state" in data and "timeline" in data:
        return "the sidecar's /report"
    return "a JSON document (benchmark data and the like)"
