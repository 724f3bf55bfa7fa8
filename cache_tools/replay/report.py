"""The replay report: what happened to each recorded cache entry, and its text for people.

Statuses and skip reasons are closed sets of one word each; the detail sentence of a result
says the rest (what was found, and what to do).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cache_tools.render import table

# Statuses of one kernel specialization.
REBUILT = "rebuilt"      # compiled into the cache dir; its key equals the recorded one
PRESENT = "present"      # the cache dir already holds the entry
PLANNED = "planned"      # --dry-run: would be rebuilt
SKIPPED = "skipped"      # cannot give the recorded key; see reason
FAILED = "failed"        # the compile itself raised
STATUSES = (REBUILT, PRESENT, PLANNED, SKIPPED, FAILED)

# Reasons for SKIPPED (and FAILED), one word each; the detail sentence says the rest.
MISSING_FIELDS = "missing-fields"
IR_SOURCE = "ir-source"
NESTED = "nested-function"
NOT_INSTALLED = "not-installed"      # the module is not installed here (never the working dir)
NOT_A_KERNEL = "not-a-kernel"
SOURCE_MISMATCH = "source-mismatch"  # the installed kernel's source hashes to another value
GENERATED = "generated"              # a kernel made at run time (Inductor): never replayed
TRITON_VERSION = "triton-version"
OTHER_TARGET = "other-target"
EXTERN_LIB = "extern-lib"
KEY_MISMATCH = "key-mismatch"
PTXAS_VERSION = "ptxas-version"
COMPILE_ERROR = "compile-error"

# How the compiles ran: in the replaying process, or in worker processes forked from it after
# the kernels' modules were imported there, or in freshly spawned ones.
IN_PROCESS, FORK, SPAWN = "in-process", "fork", "spawn"


@dataclass(frozen=True)
class KernelResult:
    """What happened to one recorded specialization (one cache entry).

    ``kernel``: ``module:qualname``; ``name``: the kernel's function name; ``specialization``:
    a short human summary (constexprs, warps, stages); ``hash``: the recorded cache key (the
    entry's directory name); ``status``: one of STATUSES; ``reason``: for skipped/failed, one
    word (MISSING_FIELDS, NESTED, ...); ``detail``: one sentence; ``seconds``: time spent on
    it (import excluded); ``records``: how many compile-log lines named this entry (ranks,
    repeated misses, disk hits); ``phases``: the phases those lines were recorded in.
    """

    kernel: str
    name: str
    specialization: str
    hash: str | None
    target: str
    status: str
    reason: str = ""
    detail: str = ""
    seconds: float = 0.0
    records: int = 1
    phases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["phases"] = list(self.phases)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KernelResult":
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["phases"] = tuple(values.get("phases") or ())
        return cls(**values)


@dataclass(frozen=True)
class ReplayReport:
    """The outcome of one replay.

    ``logs``: the compile-log files read; ``cache_dir``: where entries were written;
    ``target``: the ``--target`` filter (None: every recorded target); ``python`` /
    ``triton_version``: the interpreter that compiled and its Triton; ``jobs``: how many
    processes compiled; ``pool``: how (IN_PROCESS, FORK or SPAWN); ``results``: one per
    distinct recorded cache entry, in log order; ``ignored``: log lines that are not Triton
    compiles (device loads, nvcc builds); ``warnings``: unreadable lines, incomplete
    autotuning records.
    """

    logs: tuple[str, ...]
    cache_dir: str
    target: str | None
    python: str
    triton_version: str | None
    dry_run: bool
    jobs: int
    results: tuple[KernelResult, ...]
    ignored: int = 0
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    pool: str = IN_PROCESS

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def counts(self) -> dict[str, int]:
        return {s: self.count(s) for s in STATUSES}

    @property
    def skip_reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            if r.status in (SKIPPED, FAILED):
                out[r.reason] = out.get(r.reason, 0) + 1
        return dict(sorted(out.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "logs": list(self.logs), "cache_dir": self.cache_dir,
            "target": self.target, "python": self.python,
            "triton_version": self.triton_version, "dry_run": self.dry_run, "jobs": self.jobs,
            "pool": self.pool, "counts": self.counts, "skip_reasons": self.skip_reasons,
            "ignored": self.ignored, "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReplayReport":
        # "manifests": the key of reports written before the compile log had its name (an
        # older sglang-warmup in the interpreter that --python runs).
        logs = data["logs"] if "logs" in data else data["manifests"]
        return cls(
            logs=tuple(logs), cache_dir=data["cache_dir"],
            target=data.get("target"), python=data["python"],
            triton_version=data.get("triton_version"), dry_run=bool(data["dry_run"]),
            jobs=int(data["jobs"]),
            results=tuple(KernelResult.from_json(r) for r in data["results"]),
            ignored=int(data.get("ignored", 0)), warnings=tuple(data.get("warnings") or ()),
            seconds=float(data.get("seconds", 0.0)), pool=str(data.get("pool", IN_PROCESS)))


def summary_line(report: ReplayReport) -> str:
    """One sentence: how many entries were rebuilt, found, skipped and failed, and why."""
    c = report.counts
    verb = "would rebuild" if report.dry_run else "rebuilt"
    count = c[PLANNED] if report.dry_run else c[REBUILT]
    text = (f"{count} {verb}, {c[PRESENT]} already present, {c[SKIPPED]} skipped, "
            f"{c[FAILED]} failed in {report.seconds:.1f} s into {report.cache_dir}")
    if report.skip_reasons:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in report.skip_reasons.items()) + ")"
    return text


def report_text(report: ReplayReport) -> str:
    """A table of every entry, then warnings and one summary sentence."""
    if not report.results:
        lines = [f"No Triton compile records in {', '.join(report.logs)}"
                 + (f" ({report.ignored} other lines)" if report.ignored else "") + "."]
    else:
        rows = [[r.status, r.kernel, r.specialization, (r.hash or "-")[:12], r.target,
                 f"{r.seconds:.1f}s" if r.status in (REBUILT, FAILED) else "",
                 (f"{r.reason}: {r.detail}" if r.reason else r.detail)]
                for r in report.results]
        lines = [table(["STATUS", "KERNEL", "SPECIALIZATION", "KEY", "TARGET", "TIME", "WHY"],
                       rows)]
    lines += [f"warning: {w}" for w in report.warnings]
    lines.append(summary_line(report))
    return "\n".join(lines)
