"""Coverage: which compile keys each plan class triggered, and whether a second replay of the
plan in the same server triggers any ("plan closed").

A *compile key* is one kernel specialization: a Triton kernel name with its cache hash (the
hash covers signature, constexprs, alignment attributes, options and target), or one SGLang JIT
module.  The compile log (:mod:`cache_tools.compile_log`) holds one record per compile,
disk-cache load, device load or JIT build, stamped with the phase and the shape class in flight.

:func:`compute` turns the compile-log records of two replays into a :class:`Coverage`; the
replays themselves are run by :mod:`warmup.coverage.second_pass` (for the ``--warmups`` hook and
the sidecar alike), which splits the records between them by byte offsets in the log files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from cache_tools import compile_log, jsonfile
from warmup.errors import shown
from warmup.serve.report import as_number

#: The largest count or measure a saved record may hold (compile events, milliseconds).
MAX_AMOUNT = 10 ** 12


class RecordError(ValueError):
    """A saved record (coverage.json, a run report's coverage, an audit file) with a field that
    is not what it should be: ``str()`` is ``FIELD: what`` (the caller names the file)."""


def read_object(v: Any, where: str) -> Mapping[str, Any]:
    """A field of a saved record that must be an object."""
    if not isinstance(v, Mapping):
        raise RecordError(f"{where}: expected an object, not {shown(v)}")
    return v


def read_objects(v: Any, where: str) -> list[Mapping[str, Any]]:
    """A field of a saved record that must be a list of objects (absent: none)."""
    if v is not None and not isinstance(v, list):
        raise RecordError(f"{where}: expected a list of objects, not {shown(v)}")
    return [read_object(x, f"{where}[{i}]") for i, x in enumerate(v or ())]


def read_amount(d: Mapping[str, Any], key: str, where: str, kind: type = int) -> Any:
    """A count (``int``) or a measure (``float``) of a saved record, from 0 to MAX_AMOUNT."""
    v = d.get(key) or 0
    if not (isinstance(v, (int, float) if kind is float else int) and not isinstance(v, bool)
            and 0 <= v <= MAX_AMOUNT):          # compared as is: NaN, inf and 10**400 fail
        what = "a number" if kind is float else "an integer"
        field = f"{where}.{key}" if where else key
        raise RecordError(f"{field}: expected {what} from 0 to 10^12, not {shown(v)}")
    return kind(v)


def _list(d: Mapping[str, Any], key: str) -> list[Any]:
    v = d.get(key) or []
    if not isinstance(v, list):
        raise RecordError(f"{key}: expected a list, not {shown(v)}")
    return v


def _text(v: Any) -> str | None:
    return None if v is None else str(v)

# --------------------------------------------------------------------------------------------
# compile keys
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyEvents:
    """One compile key and what happened to it in one group of records.

    ``compiler``: triton, sglang_jit or tvm_ffi.  ``name``: the Triton kernel name or the JIT
    module name.  ``module``: the Python module of a Triton kernel.  ``hash``: Triton's cache
    hash (None for JIT modules).  ``signature``: argument types and constexpr values, as text
    (empty when no record of the key carried them, e.g. a device load alone); for a
    ``torch.compile`` graph compiled again, ``guard failed: `` and Dynamo's reason.  ``compiled``:
    Triton compiles and JIT builds; ``disk_hits``: loads from the Triton or JIT disk cache;
    ``device_loads``: first launches; ``failed``: failed JIT builds.  ``processes``: how many
    distinct processes (TP ranks) recorded the key.  ``seconds``: compile/build time summed.
    """

    compiler: str
    name: str
    module: str | None
    hash: str | None
    signature: str
    compiled: int = 0
    disk_hits: int = 0
    device_loads: int = 0
    failed: int = 0
    processes: int = 0
    seconds: float = 0.0

    @property
    def ident(self) -> tuple[str, str, str | None]:
        return (self.compiler, self.name, self.hash if self.compiler == "triton" else None)

    @property
    def events(self) -> int:
        """Compile events (everything but device loads)."""
        return self.compiled + self.disk_hits + self.failed

    def to_json(self) -> dict[str, Any]:
        return {"compiler": self.compiler, "name": self.name, "module": self.module,
                "hash": self.hash, "signature": self.signature, "compiled": self.compiled,
                "disk_hits": self.disk_hits, "device_loads": self.device_loads,
                "failed": self.failed, "processes": self.processes,
                "seconds": round(self.seconds, 4)}

    @classmethod
    def from_json(cls, d: Any, where: str = "key") -> "KeyEvents":
        """A key read back from a saved record; RecordError names the field that is wrong."""
        d = read_object(d, where)
        counts = {k: read_amount(d, k, where) for k in ("compiled", "disk_hits", "device_loads",
                                                      "failed", "processes")}
        return cls(compiler=str(d.get("compiler") or "triton"), name=str(d.get("name") or "?"),
                   module=_text(d.get("module")), hash=_text(d.get("hash")),
                   signature=str(d.get("signature") or ""), **counts,
                   seconds=read_amount(d, "seconds", where, float))


def signature_text(record: Mapping[str, Any]) -> str:
    """Argument types and constexprs of a Triton record, ``:16`` marking an argument
    specialized as divisible by 16: ``*fp32:16,*fp32:16,i32; BLOCK=128``."""
    sig = record.get("signature")
    divisible = set()
    for a in record.get("attrs") or ():
        if isinstance(a, Mapping) and any(isinstance(x, (list, tuple)) and len(x) == 2
                                          and x[0] == "tt.divisibility" and x[1] == 16
                                          for x in a.get("attrs") or ()):
            divisible.add(a.get("name"))
    types = []
    if isinstance(sig, Mapping):
        types = [str(v) + (":16" if k in divisible else "") for k, v in sig.items()
                 if v != "constexpr"]
    consts = []
    for c in record.get("constexprs") or ():
        if not isinstance(c, Mapping):
            continue
        value = c.get("value")
        if isinstance(value, Mapping) and "constexpr" in value:
            value = value["constexpr"]
        consts.append(f"{c.get('name') or c.get('path')}={value}")
    parts = [",".join(types)] if types else []
    if consts:
        parts.append(",".join(consts))
    return "; ".join(parts)


def _key_ident(record: Mapping[str, Any]) -> tuple[str, str, str | None, str | None]:
    """(compiler, name, hash, module) of a record."""
    compiler = str(record.get("compiler") or compile_log.TRITON)
    if record.get("event") == compile_log.JIT_BUILD:
        name = record.get("module_name") or Path(str(record.get("path") or "?")).name
        return compiler, str(name), None, None
    kernel = record.get("kernel")
    if isinstance(kernel, Mapping):
        name, module = kernel.get("name"), kernel.get("module")
    else:
        name, module = kernel, None
    h = record.get("hash")
    return compiler, str(name or "?"), (str(h) if h is not None else None), module


def aggregate(records: Iterable[Mapping[str, Any]]) -> list[KeyEvents]:
    """Group records by compile key, in order of first appearance."""
    acc: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.get("event") not in compile_log.KERNEL_EVENTS:    # e.g. a garbage collection
            continue
        compiler, name, h, module = _key_ident(r)
        ident = (compiler, name, h if compiler == compile_log.TRITON else None)
        a = acc.get(ident)
        if a is None:
            a = acc[ident] = {"compiler": compiler, "name": name, "module": module, "hash": h,
                              "signature": "", "compiled": 0, "disk_hits": 0,
                              "device_loads": 0, "failed": 0, "pids": set(), "seconds": 0.0}
        if module and not a["module"]:
            a["module"] = module
        if not a["signature"] and r.get("event") in (compile_log.MISS, compile_log.HIT):
            a["signature"] = signature_text(r)
        elif not a["signature"] and isinstance(r.get("reason"), str) and r["reason"]:
            # a torch.compile recompile (the log is data: cut short here, made printable where
            # it is shown, view.text.key_label)
            a["signature"] = f"guard failed: {r['reason'][:compile_log.MAX_REASON]}"
        event = r.get("event")
        if event == compile_log.MISS:
            a["compiled"] += 1
        elif event == compile_log.HIT:
            a["disk_hits"] += 1
        elif event == compile_log.LOAD:
            a["device_loads"] += 1
        elif event == compile_log.JIT_BUILD:
            outcome = r.get("outcome")
            if outcome == compile_log.CACHED:
                a["disk_hits"] += 1
            elif outcome == compile_log.FAILED:
                a["failed"] += 1
            else:
                a["compiled"] += 1
        if event in (compile_log.MISS, compile_log.JIT_BUILD):
            a["seconds"] += max(0.0, as_number(r.get("duration_s")))
        if isinstance(r.get("pid"), (int, str)):
            a["pids"].add(r["pid"])
    out = []
    for a in acc.values():
        pids = a.pop("pids")
        out.append(KeyEvents(processes=len(pids), **a))
    return out


# --------------------------------------------------------------------------------------------
# coverage of a plan
# --------------------------------------------------------------------------------------------

#: The coverage record's JSON format and version (``coverage.json``).
FORMAT = "sglang-warmup-coverage"
VERSION = 1
#: A coverage record (or the run report holding one) is KiBs; anything this large is not one.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: A class's first hit after the warm-up may be at most this many times its repeat, and at
#: most :data:`FIRST_HIT_MIN_MS` slower (below that, timing noise), for the plan to be closed.
FIRST_HIT_RATIO = 1.10
FIRST_HIT_MIN_MS = 5.0


@dataclass(frozen=True)
class ClassLatency:
    """One class on the second replay: its steps' first sends after the warm-up (``first_ms``),
    the same steps again right after (``repeat_ms``), and the worst step's ratio."""

    first_ms: float
    repeat_ms: float
    worst_step_ratio: float = 0.0

    @property
    def ratio(self) -> float | None:
        return self.first_ms / self.repeat_ms if self.repeat_ms > 0 else None

    def slow(self, max_ratio: float, min_ms: float) -> bool:
        """The first hit is over ``max_ratio`` times the repeat and over ``min_ms`` slower."""
        return (self.ratio is not None and self.ratio > max_ratio
                and self.first_ms - self.repeat_ms > min_ms)

    def to_json(self) -> dict[str, Any]:
        return {"first_ms": self.first_ms, "repeat_ms": self.repeat_ms,
                "ratio": None if self.ratio is None else round(self.ratio, 3),
                "worst_step_ratio": self.worst_step_ratio}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "latency") -> "ClassLatency":
        return cls(*(read_amount(d, k, where, float)
                     for k in ("first_ms", "repeat_ms", "worst_step_ratio")))


@dataclass(frozen=True)
class ClassCoverage:
    """One plan class: the keys its requests triggered on the first replay (``first``) and on
    the second (``second``; empty when no compile is left), and the second replay's first-hit
    latency against its repeat (``latency``; None when not measured)."""

    shape_class: str
    first: tuple[KeyEvents, ...]
    second: tuple[KeyEvents, ...]
    latency: ClassLatency | None = None

    @property
    def closed(self) -> bool:
        """No compile key left (the latency gate is the Coverage's: it holds the threshold)."""
        return not self.second

    def to_json(self) -> dict[str, Any]:
        return {"class": self.shape_class, "closed": self.closed,
                "first": [k.to_json() for k in self.first],
                "second": [k.to_json() for k in self.second],
                "latency": self.latency.to_json() if self.latency is not None else None}


@dataclass(frozen=True)
class Coverage:
    """The compile keys of every plan class over two replays of the plan in one server.

    ``classes``: in plan order.  ``outside_first`` / ``outside_second``: keys recorded during a
    replay that no plan class was stamped on (another phase, the final flush, or another
    process's traffic).  ``second_pass_failures``: requests of the second replay that failed.
    """

    plan: str
    classes: tuple[ClassCoverage, ...]
    outside_first: tuple[KeyEvents, ...] = ()
    outside_second: tuple[KeyEvents, ...] = ()
    second_pass_failures: tuple[str, ...] = ()
    note: str = ""
    max_ratio: float = FIRST_HIT_RATIO
    min_ms: float = FIRST_HIT_MIN_MS

    @property
    def closed(self) -> bool:
        """True when the second replay triggered no compile, load or JIT build at all, and no
        class's first hit was slower than ``max_ratio`` times its repeat."""
        return (all(c.closed for c in self.classes) and not self.outside_second
                and not self.slow_classes)

    @property
    def open_classes(self) -> tuple[str, ...]:
        return tuple(c.shape_class for c in self.classes if not c.closed)

    @property
    def slow_classes(self) -> tuple[str, ...]:
        """Classes whose first hit after the warm-up was too slow against its repeat."""
        return tuple(c.shape_class for c in self.classes
                     if c.latency is not None and c.latency.slow(self.max_ratio, self.min_ms))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                "plan": self.plan, "closed": self.closed, "open_classes": list(self.open_classes),
                "slow_classes": list(self.slow_classes),
                "first_hit": {"max_ratio": self.max_ratio, "min_ms": self.min_ms},
                "classes": [c.to_json() for c in self.classes],
                "outside_first": [k.to_json() for k in self.outside_first],
                "outside_second": [k.to_json() for k in self.outside_second],
                "second_pass_failures": list(self.second_pass_failures),
                "note": self.note}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Coverage":
        """A coverage record read back; RecordError names the field that is wrong."""
        def keys(c: Mapping[str, Any], name: str, where: str) -> tuple[KeyEvents, ...]:
            return tuple(KeyEvents.from_json(k, f"{where}{name}[{i}]")
                         for i, k in enumerate(read_objects(c.get(name), f"{where}{name}")))

        def one(c: Mapping[str, Any], where: str) -> ClassCoverage:
            latency = c.get("latency")
            return ClassCoverage(str(c.get("class")), keys(c, "first", f"{where}."),
                                 keys(c, "second", f"{where}."),
                                 None if latency is None else
                                 ClassLatency.from_json(read_object(latency, f"{where}.latency"),
                                                        f"{where}.latency"))

        gate = read_object(d.get("first_hit") or {}, "first_hit")
        return cls(plan=str(d.get("plan") or ""),
                   classes=tuple(one(c, f"classes[{i}]")
                                 for i, c in enumerate(read_objects(d.get("classes"), "classes"))),
                   outside_first=keys(d, "outside_first", ""),
                   outside_second=keys(d, "outside_second", ""),
                   second_pass_failures=tuple(map(str, _list(d, "second_pass_failures"))),
                   note=str(d.get("note") or ""),
                   max_ratio=read_amount(gate, "max_ratio", "first_hit", float) or FIRST_HIT_RATIO,
                   min_ms=read_amount(gate, "min_ms", "first_hit", float) or FIRST_HIT_MIN_MS)


def compute(first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]], *,
            classes: Sequence[str], plan: str = "", phase: str = "warmup",
            latency: Mapping[str, ClassLatency] | None = None,
            max_ratio: float = FIRST_HIT_RATIO, min_ms: float = FIRST_HIT_MIN_MS) -> Coverage:
    """Coverage from the compile-log records of two replays of a plan, and (``latency``) the
    second replay's first-hit latency per class.

    A record counts for a class when it was stamped with that class in ``phase``; the rest of
    a replay's records are reported as outside the plan's classes.
    """
    wanted = list(dict.fromkeys(classes))

    def split(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, list], list]:
        by: dict[str, list] = {c: [] for c in wanted}
        other: list = []
        for r in records:
            cls = r.get("shape_class")
            if r.get("phase") == phase and cls in by:
                by[cls].append(r)
            else:
                other.append(r)
        return by, other

    by1, other1 = split(first)
    by2, other2 = split(second)
    lat = latency or {}
    return Coverage(plan=plan,
                    classes=tuple(ClassCoverage(c, tuple(aggregate(by1[c])),
                                                tuple(aggregate(by2[c])), lat.get(c))
                                  for c in wanted),
                    outside_first=tuple(aggregate(other1)), outside_second=tuple(aggregate(other2)),
                    max_ratio=max_ratio, min_ms=min_ms)


def load(path: str | os.PathLike[str]) -> Coverage:
    """A coverage from ``coverage.json``, a run report with a ``coverage`` field, or a state
    directory holding ``coverage.json``."""
    from warmup.errors import WarmupError

    p = Path(path)
    if p.is_dir():
        p = p / "coverage.json"
    if not p.exists():
        raise WarmupError(f"{p}: no coverage recorded",
                          hint="run the warm-up with WARMUP_SECOND_PASS=1 (a second replay "
                               "measures coverage)")
    try:
        data = jsonfile.load(p, MAX_FILE_BYTES)
    except jsonfile.JsonFileError as exc:
        raise WarmupError(f"{p}: {exc}", hint="pass coverage.json or a run report") from None
    if isinstance(data, dict) and isinstance(data.get("coverage"), dict):
        data = data["coverage"]
    if not isinstance(data, dict) or "classes" not in data:
        raise WarmupError(f"{p}: not a coverage record",
                          hint="pass coverage.json, a run report written with "
                               "WARMUP_SECOND_PASS=1, or the state directory")
    try:
        return Coverage.from_json(data)
    except RecordError as exc:
        raise WarmupError(f"{p}: {exc}", hint="it is damaged or hand-edited; write it again") from None
