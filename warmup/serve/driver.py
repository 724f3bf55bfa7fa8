"""The driver: sends an expansion's steps in order through a transport, then flushes the cache,
and returns a :class:`RunReport`.

Strict by default: a failed request or a failed flush raises :class:`DriverError` naming the
shape class and the step, which (inside ``--warmups``) makes SGLang's startup fail instead of
serving cold.  ``lenient`` logs the failure and goes on.  While it runs, the phase file says
``warmup`` with the class and step in flight, so every compile in the scheduler processes is
stamped with the class that caused it; when it ends, the phase turns to ``serving``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from cache_tools import compile_log
from cache_tools.compile_log import is_miss, kernel_name
from warmup.observe import phase as phase_mod
from warmup.errors import DriverError, TransportError
from warmup.plan.model import Expansion, WarmupStep
from cache_tools.render import bar, table

logger = logging.getLogger("sglang_warmup.driver")


@dataclass
class ClassReport:
    """Per shape class: what was sent, how long it took, what failed, what compiled."""

    shape_class: str
    phase: str
    kind: str
    steps: int = 0
    requests: int = 0
    failures: int = 0
    total_ms: float = 0.0
    max_step_ms: float = 0.0
    compiles: int = 0  # Triton misses stamped with this class (from the compile log)
    disk_hits: int = 0
    jit_builds: int = 0
    kernels: list[str] = field(default_factory=list)  # distinct kernel names that compiled
    errors: list[str] = field(default_factory=list)

    @property
    def ms_per_request(self) -> float:
        return self.total_ms / self.requests if self.requests else 0.0


@dataclass
class RunReport:
    """The outcome of one warm-up run (JSON via :meth:`to_dict`, a table via :meth:`render`)."""

    plan: str
    plan_sha256: str
    expansion_digest: str
    transport: str
    started_at: float
    ok: bool = True
    skipped_reason: str | None = None
    duration_s: float = 0.0
    flush: str | None = None
    classes: list[ClassReport] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    compiles_total: int = 0
    compiles_by_phase: dict[str, int] = field(default_factory=dict)
    # Set by warmup.coverage.classes.run when the plan is replayed a second time (JSON of a Coverage).
    coverage: dict[str, Any] | None = None

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.classes)

    def count_compiles(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Set the compile counts from compile-log records: per phase, and per class for
        the warm-up's own (``compiles``, ``jit_builds``, ``disk_hits``, kernel names)."""
        by_class = {c.shape_class: c for c in self.classes}
        for c in self.classes:
            c.compiles = c.jit_builds = c.disk_hits = 0
            c.kernels = []
        self.compiles_by_phase = {}
        self.compiles_total = 0
        for r in records:
            c = by_class.get(r.get("shape_class") or "")
            if not is_miss(r):
                if r.get("event") == "hit" and c is not None:
                    c.disk_hits += 1
                continue
            ph = r.get("phase") or "init"
            self.compiles_by_phase[ph] = self.compiles_by_phase.get(ph, 0) + 1
            self.compiles_total += 1
            if c is None or ph != "warmup":
                continue
            if r.get("event") == "jit_build":
                c.jit_builds += 1
            else:
                c.compiles += 1
            name = kernel_name(r)
            if name not in c.kernels:
                c.kernels.append(name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = self.requests
        for c, cd in zip(self.classes, d["classes"]):
            cd["ms_per_request"] = round(c.ms_per_request, 2)
        return d

    def write(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        tmp.replace(p)

    def render(self) -> str:
        if self.skipped_reason:
            return f"warm-up {self.plan}: skipped ({self.skipped_reason})"
        longest = max((c.total_ms for c in self.classes), default=0.0)
        rows = [[c.phase, c.shape_class, c.requests, round(c.total_ms), round(c.ms_per_request, 1),
                 c.failures, c.compiles, bar(c.total_ms, longest, 20)] for c in self.classes]
        head = (f"warm-up {self.plan}: {'ok' if self.ok else 'FAILED'}, {self.requests} requests "
                f"in {self.duration_s:.1f} s via {self.transport}"
                + (f"; flush: {self.flush}" if self.flush else ""))
        out = [head, table(["phase", "class", "requests", "total ms", "ms/request", "failed",
                            "compiles", ""], rows, align="llrrrrrl")]
        if self.compiles_by_phase:
            out.append("compiles by phase: " + ", ".join(f"{k}={v}" for k, v in self.compiles_by_phase.items()))
        if self.skipped:
            out.append(f"{len(self.skipped)} item(s) skipped by the expansion "
                       "(`sglang-warmup plan show` lists them)")
        for f in self.failures:
            out.append(f"failure: {f}")
        if self.coverage is not None:
            from warmup.coverage.classes import Coverage

            out.append(Coverage.from_json(self.coverage).render())
        return "\n".join(out)


class Driver:
    """Runs one expansion through one transport."""

    def __init__(self, transport: Any, *, lenient: bool = False, flush_timeout_s: float = 60.0,
                 state_dir: str | None = None, metrics: Any = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.transport = transport
        self.lenient = lenient
        self.flush_timeout_s = flush_timeout_s
        self.state_dir = state_dir
        self.metrics = metrics
        self.progress = progress or (lambda line: logger.info("%s", line))

    async def run(self, exp: Expansion) -> RunReport:
        report = RunReport(plan=exp.plan, plan_sha256=exp.plan_sha256, expansion_digest=exp.digest(),
                           transport=type(self.transport).__name__, started_at=time.time(),
                           facts=exp.facts.to_dict(),
                           skipped=[{"phase": s.phase, "class": s.shape_class, "item": s.item,
                                     "reason": s.reason} for s in exp.skipped])
        if exp.facts.disaggregation:
            report.skipped_reason = (f"PD disaggregation ({exp.facts.disaggregation_mode}): "
                                     "warm-up requests would need a bootstrap peer")
            self.progress(f"sglang-warmup: {report.skipped_reason}; not warming")
            self._set_phase("serving")
            return report
        t0 = time.perf_counter()
        classes: "OrderedDict[str, ClassReport]" = OrderedDict()
        phases = list(OrderedDict.fromkeys(s.phase for s in exp.steps))
        try:
            for pi, ph in enumerate(phases, 1):
                steps = [s for s in exp.steps if s.phase == ph]
                n_req = sum(s.num_requests for s in steps)
                self.progress(f"sglang-warmup [{pi}/{len(phases)}] phase {ph}: {len(steps)} steps, "
                              f"{n_req} requests")
                p0 = time.perf_counter()
                for step in steps:
                    c = classes.get(step.shape_class)
                    if c is None:
                        c = classes[step.shape_class] = ClassReport(step.shape_class, step.phase, step.kind)
                    await self._step(step, c, report)
                self.progress(f"sglang-warmup [{pi}/{len(phases)}] phase {ph}: done in "
                              f"{time.perf_counter() - p0:.1f} s")
        except DriverError as exc:
            report.classes = list(classes.values())
            report.duration_s = time.perf_counter() - t0
            self._attach_compiles(report)
            exc.report = report  # type: ignore[attr-defined]
            raise
        report.classes = list(classes.values())
        self._set_phase("warmup", "flush")
        if exp.flush:
            try:
                report.flush = await self.transport.flush(self.flush_timeout_s)
                self.progress(f"sglang-warmup: cache flush: {report.flush}")
            except Exception as exc:
                msg = f"cache flush failed: {_describe(exc)}"
                report.failures.append(msg)
                report.ok = False
                if not self.lenient:
                    report.duration_s = time.perf_counter() - t0
                    err = DriverError(f"warm-up {exp.plan}: {msg}",
                                      hint="the server would start with warm-up prefixes in its "
                                           "cache; see the scheduler log (--lenient to go on)")
                    err.report = report  # type: ignore[attr-defined]
                    raise err from None
                logger.warning("sglang-warmup: %s (lenient: going on)", msg)
        report.duration_s = time.perf_counter() - t0
        self._attach_compiles(report)
        self._record_metrics(report, exp)
        self._set_phase("serving")
        if self.metrics is not None:
            try:
                self.metrics.ready(time.time())
            except Exception:
                pass
        return report

    async def _step(self, step: WarmupStep, c: ClassReport, report: RunReport) -> None:
        self._set_phase("warmup", step.shape_class, step.index)
        t = time.perf_counter()
        try:
            await self.transport.send(step)
            failed = 0
        except Exception as exc:  # every failure is reported with its class and step
            failed = step.num_requests
            msg = (f"class {step.shape_class}, step {step.index} ({step.mode}: {step.note}): "
                   f"{_describe(exc)}")
            c.errors.append(msg)
            report.failures.append(msg)
            report.ok = False
            if not self.lenient:
                c.steps += 1
                c.requests += step.num_requests
                c.failures += failed
                raise DriverError(f"warm-up request failed: {msg}",
                                  hint="fix the server or the plan; --lenient warns and goes on") from None
            logger.warning("sglang-warmup: %s (lenient: going on)", msg)
        ms = (time.perf_counter() - t) * 1000
        c.steps += 1
        c.requests += step.num_requests
        c.failures += failed
        c.total_ms += ms
        c.max_step_ms = max(c.max_step_ms, ms)

    def _set_phase(self, phase: str, shape_class: str | None = None, request: int | None = None) -> None:
        try:
            phase_mod.set_phase(phase, shape_class, request, state_dir=self.state_dir)
        except Exception as exc:  # bookkeeping never stops the warm-up
            logger.debug("sglang-warmup: phase not recorded: %s", exc)

    def _attach_compiles(self, report: RunReport) -> None:
        """Count compile-log records per class (written by the scheduler processes)."""
        if self.state_dir is None:
            return
        try:
            records = compile_log.read_dir(self.state_dir)
        except Exception:
            return
        report.count_compiles(records)

    def _record_metrics(self, report: RunReport, exp: Expansion) -> None:
        if self.metrics is None:
            return
        try:
            ok = sum(c.requests - c.failures for c in report.classes)
            failed = sum(c.failures for c in report.classes)
            if ok:
                self.metrics.plan_request("ok", ok)
            if failed:
                self.metrics.plan_request("failed", failed)
            skipped_classes = {s.shape_class for s in exp.skipped if not s.item}
            self.metrics.plan_coverage(done=sum(1 for c in report.classes if not c.failures),
                                       skipped=len(skipped_classes),
                                       failed=sum(1 for c in report.classes if c.failures))
        except Exception as exc:
            logger.debug("sglang-warmup: plan metrics not recorded: %s", exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, TransportError) else f"{type(exc).__name__}: {text}"
