"""The driver: sends an expansion's steps in order through a transport, then flushes the cache,
and returns a frozen :class:`~warmup.serve.report.RunReport`.

Strict by default: a failed request or a failed flush raises :class:`DriverError` naming the
shape class and the step, which (inside ``--warmups``) makes SGLang's startup fail instead of
serving cold.  ``lenient`` logs the failure and goes on.  While it runs, the phase file says
``warmup`` with the class and step in flight, so every compile in the scheduler processes is
stamped with the class that caused it; when it ends, the phase turns to ``serving``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from cache_tools import compile_log
from warmup.observe import phase as phase_mod
from warmup.errors import DriverError, TransportError
from warmup.plan.model import Expansion, WarmupStep
from warmup.serve.report import ClassReport, RunReport, as_number

if TYPE_CHECKING:  # annotations only: the transports' module imports the HTTP client
    from warmup.observe.metrics import Metrics
    from warmup.serve.transport import Transport

logger = logging.getLogger("sglang_warmup.driver")

#: The warm-up class in the phase file between the end of the plan and the server's readiness
#: (SGLang's own warm-up request runs then, after the ``--warmups`` entries).
AFTER_PLAN = phase_mod.SGLANG_STARTUP


@dataclass
class _Tally:
    """A class's counts while the driver runs (frozen into a ClassReport at the end)."""

    shape_class: str
    phase: str
    kind: str
    steps: int = 0
    requests: int = 0
    failures: int = 0
    total_ms: float = 0.0
    max_step_ms: float = 0.0
    repeat_ms: float = 0.0
    worst_step_ratio: float = 0.0
    errors: list[str] = field(default_factory=list)

    def freeze(self) -> ClassReport:
        return ClassReport(self.shape_class, self.phase, self.kind, steps=self.steps,
                           requests=self.requests, failures=self.failures,
                           total_ms=self.total_ms, max_step_ms=self.max_step_ms,
                           repeat_ms=self.repeat_ms, worst_step_ratio=self.worst_step_ratio,
                           errors=tuple(self.errors))


class Driver:
    """Runs one expansion through one transport.

    ``repeat``: send every step a second time right after it, with fresh token ids, and record
    both latencies per class (``total_ms`` the first sends, ``repeat_ms`` the repeats): how much
    slower the first request of a kind is than the same request again.  The second-pass check
    uses it after the warm-up; a repeat's failure is counted like the step's own.

    ``skip_steps``: the indices of steps not to send (a steps record's quiet steps,
    :mod:`warmup.plan.step_record`); ``steps_note``: where they come from, for the report.

    ``serving_at_end``: the phase turns ``serving`` (and the ready time is recorded) when the run
    returns.  Inside the server it is False: SGLang still sends its own warm-up request after the
    ``--warmups`` entries, so the phase stays ``warmup`` (class :data:`AFTER_PLAN`) until the
    caller calls :meth:`mark_serving` at the real readiness."""

    def __init__(self, transport: Transport, *, lenient: bool = False,
                 flush_timeout_s: float = 60.0, state_dir: str | None = None,
                 metrics: Metrics | None = None, progress: Callable[[str], None] | None = None,
                 repeat: bool = False, serving_at_end: bool = True,
                 skip_steps: frozenset[int] = frozenset(), steps_note: str = "") -> None:
        self.transport = transport
        self.skip_steps = skip_steps
        self.steps_note = steps_note
        self.repeat = repeat
        self.serving_at_end = serving_at_end
        self.lenient = lenient
        self.flush_timeout_s = flush_timeout_s
        self.state_dir = state_dir
        self.metrics = metrics
        self.progress: Callable[[str], None] = progress or (lambda line: logger.info("%s", line))

    def replay(self) -> Driver:
        """A driver for a second replay of the same plan (the second pass): the same transport,
        flush timeout, state directory, progress and readiness; lenient, repeating every step,
        recording no plan metrics."""
        return Driver(self.transport, lenient=True, flush_timeout_s=self.flush_timeout_s,
                      state_dir=self.state_dir, metrics=None, progress=self.progress,
                      repeat=True, serving_at_end=self.serving_at_end)

    async def run(self, exp: Expansion) -> RunReport:
        """Send every step, then flush; the returned report is final.  A DriverError (strict
        mode) carries the report so far as ``.report``."""
        base = RunReport(plan=exp.plan, plan_sha256=exp.plan_sha256, expansion_digest=exp.digest(),
                         transport=type(self.transport).__name__, started_at=time.time(),
                         facts=exp.facts.to_dict(),
                         skipped=tuple({"phase": s.phase, "class": s.shape_class, "item": s.item,
                                        "reason": s.reason} for s in exp.skipped),
                         warnings=tuple(exp.warnings))
        todo = [s for s in exp.steps if s.index not in self.skip_steps]
        if len(todo) < len(exp.steps):
            base = replace(base, quiet_steps=len(exp.steps) - len(todo), steps_record=self.steps_note)
        if exp.facts.disaggregation:
            reason = (f"PD disaggregation ({exp.facts.disaggregation_mode}): "
                      "warm-up requests would need a bootstrap peer")
            self.progress(f"sglang-warmup: {reason}; not warming")
            self._end()
            return replace(base, skipped_reason=reason)
        t0 = time.perf_counter()
        classes: "OrderedDict[str, _Tally]" = OrderedDict()
        failures: list[str] = []
        flush: str | None = None
        step_ms: dict[int, float] = {}

        def final() -> RunReport:
            return self._count_compiles(replace(
                base, ok=not failures, duration_s=time.perf_counter() - t0, flush=flush,
                classes=tuple(c.freeze() for c in classes.values()), failures=tuple(failures),
                step_ms=tuple(step_ms.items())))

        try:
            await self._send_phases(todo, classes, failures, step_ms)
            rest = [s for s in exp.steps if s.index in self.skip_steps]
            compiled = self._kept_misses_since(base.started_at) if rest else 0
            if compiled:
                why = (f"{self.steps_note}: not applied: the steps sent compiled {compiled} "
                       f"kernel(s) a restored cache would have loaded (this is not the cache the "
                       f"record was learned on); the {len(rest)} quiet steps sent after them")
                logger.warning("sglang-warmup: %s", why)
                base = replace(base, quiet_steps=0, steps_record=f"{self.steps_note} (not "
                               f"applied)", warnings=base.warnings + (why,))
                await self._send_phases(rest, classes, failures, step_ms)
        except DriverError as exc:
            exc.report = final()
            raise
        self._set_phase("warmup", phase_mod.FLUSH)
        if exp.flush:
            try:
                flush = await self.transport.flush(self.flush_timeout_s)
                self.progress(f"sglang-warmup: cache flush: {flush}")
            except Exception as exc:  # the transport reaches into SGLang: the failure is reported
                msg = f"cache flush failed: {_describe(exc)}"
                failures.append(msg)
                if not self.lenient:
                    err = DriverError(f"warm-up {exp.plan}: {msg}",
                                      hint="the server would start with warm-up prefixes in its "
                                           "cache; see the scheduler log (--lenient to go on)")
                    err.report = final()
                    raise err from None
                logger.warning("sglang-warmup: %s (lenient: going on)", msg)
        report = final()
        self._record_metrics(report, exp)
        self._end()
        return report

    async def _send_phases(self, todo: list[WarmupStep], classes: OrderedDict[str, _Tally],
                           failures: list[str], step_ms: dict[int, float]) -> None:
        """Send ``todo`` phase by phase, with a progress line at each phase's start and end."""
        phases = list(OrderedDict.fromkeys(s.phase for s in todo))
        for pi, ph in enumerate(phases, 1):
            steps = [s for s in todo if s.phase == ph]
            n_req = sum(s.num_requests for s in steps)
            self.progress(f"sglang-warmup [{pi}/{len(phases)}] phase {ph}: {len(steps)} steps, "
                          f"{n_req} requests")
            p0 = time.perf_counter()
            for step in steps:
                c = classes.get(step.shape_class)
                if c is None:
                    c = classes[step.shape_class] = _Tally(step.shape_class, step.phase, step.kind)
                ms = await self._step(step, c, failures)
                if ms is not None:
                    step_ms[step.index] = ms
            self.progress(f"sglang-warmup [{pi}/{len(phases)}] phase {ph}: done in "
                          f"{time.perf_counter() - p0:.1f} s")

    def _kept_misses_since(self, started_at: float) -> int:
        """How many kernels the warm-up compiled since ``started_at`` that a cache on disk
        would have kept (:func:`compile_log.is_kept_miss`); 0 without a state directory."""
        if self.state_dir is None:
            return 0
        try:
            records = compile_log.read_dir(self.state_dir)
        except OSError:  # bookkeeping never fails the warm-up: the record stays applied
            return 0
        return sum(1 for r in records if compile_log.is_kept_miss(r)
                   and r.get("phase") == "warmup" and as_number(r.get("time")) >= started_at)

    def _end(self) -> None:
        if self.serving_at_end:
            self.mark_serving()
        else:
            self._set_phase("warmup", AFTER_PLAN)

    def mark_serving(self) -> None:
        """The phase turns ``serving``; ``/metrics`` records the ready time."""
        self._set_phase("serving")
        if self.metrics is not None:
            try:
                self.metrics.ready(time.time())
            except Exception as exc:  # a metrics update never fails the warm-up: logged
                logger.debug("sglang-warmup: ready time not recorded: %r", exc)

    async def _step(self, step: WarmupStep, c: _Tally, failures: list[str]) -> float | None:
        """Send a step (and its repeat); the first send's latency in ms, None when it failed."""
        self._set_phase("warmup", step.shape_class, step.index)
        ms, failed = await self._send(step, c, failures, "")
        c.steps += 1
        c.requests += step.num_requests
        c.failures += failed
        c.total_ms += ms
        c.max_step_ms = max(c.max_step_ms, ms)
        if failed:
            return None
        if self.repeat:
            again, again_failed = await self._send(step, c, failures, " (repeat)", salt="/repeat")
            c.failures += again_failed
            c.repeat_ms += again
            if again > 0:
                c.worst_step_ratio = max(c.worst_step_ratio, ms / again)
        return ms

    async def _send(self, step: WarmupStep, c: _Tally, failures: list[str], what: str, *,
                    salt: str = "") -> tuple[float, int]:
        """Send ``step`` once (``salt`` appended to the transport's token salt: fresh ids);
        return its latency in ms and how many requests failed."""
        tokens = self.transport.tokens if salt else None
        old = tokens.salt if tokens is not None else ""
        if tokens is not None:
            tokens.salt = f"{old}{salt}"
        t = time.perf_counter()
        try:
            await self.transport.send(step)
            failed = 0
        except Exception as exc:  # the transport reaches into SGLang: reported with the step
            failed = step.num_requests
            msg = (f"class {step.shape_class}, step {step.index}{what} ({step.mode}: "
                   f"{step.note}): {_describe(exc)}")
            c.errors.append(msg)
            failures.append(msg)
            if not self.lenient:
                c.steps += 1
                c.requests += step.num_requests
                c.failures += failed
                raise DriverError(f"warm-up request failed: {msg}",
                                  hint="fix the server or the plan; --lenient warns and goes on") from None
            logger.warning("sglang-warmup: %s (lenient: going on)", msg)
        finally:
            if tokens is not None:
                tokens.salt = old
        return (time.perf_counter() - t) * 1000, failed

    def _set_phase(self, phase: str, shape_class: str | None = None, request: int | None = None) -> None:
        # set_phase logs a phase file it cannot write (bookkeeping never stops the warm-up);
        # what else it raises (an unknown phase) is a bug of ours
        phase_mod.set_phase(phase, shape_class, request, state_dir=self.state_dir)

    def _count_compiles(self, report: RunReport) -> RunReport:
        """The report counted over the compile log (written by the scheduler processes)."""
        if self.state_dir is None:
            return report
        try:
            records = compile_log.read_dir(self.state_dir)
        except OSError as exc:  # bookkeeping never fails the warm-up
            logger.warning("sglang-warmup: compile log not read, compiles not counted: %s", exc)
            return report
        return report.with_compiles(records)

    def _record_metrics(self, report: RunReport, exp: Expansion) -> None:
        if self.metrics is None:
            return
        try:
            if report.requests_ok:
                self.metrics.plan_request("ok", report.requests_ok)
            if report.requests_failed:
                self.metrics.plan_request("failed", report.requests_failed)
            for c in report.classes:
                self.metrics.class_time(c.shape_class, c.total_ms / 1000.0)
            skipped_classes = {s.shape_class for s in exp.skipped if not s.item}
            self.metrics.plan_coverage(done=sum(1 for c in report.classes if not c.failures),
                                       skipped=len(skipped_classes),
                                       failed=sum(1 for c in report.classes if c.failures))
        except Exception as exc:  # a metrics update never fails the warm-up: logged
            logger.debug("sglang-warmup: plan metrics not recorded: %r", exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, TransportError) else f"{type(exc).__name__}: {text}"
