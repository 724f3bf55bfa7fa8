"""The second-pass check: run a plan, run it again in the same server with fresh prompts, and
read what the SGLang processes compiled during each pass.

One implementation for both users: the ``--warmups`` hook (through :func:`run`, the runner the
plugin hands to :mod:`warmup.serve.hook` with ``WARMUP_SECOND_PASS=1``), which reports the
plan's coverage, and the sidecar (through :func:`run_passes`), which gates ``/ready`` on a
second pass that compiled nothing.

What a pass compiled is read from what the SGLang processes wrote: the bytes appended to the
compile log during the pass (a :class:`cache_tools.compile_log.Cursor`, so no clock is compared
across processes), else the ``sglang_warmup_compile_events_total{outcome="miss"}`` counters of
the Prometheus multiprocess directory before and after.  The driver's report is never changed:
a :class:`PassResult` holds it with what was measured around it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from cache_tools import atomic, compile_log, jsonfile
from cache_tools.compile_log import is_miss, kernel_name
from warmup.coverage.classes import ClassLatency, Coverage, RecordError, compute, read_object
from warmup import settings
from warmup.errors import DriverError, shown
from warmup.observe import metrics
from warmup.serve.report import MAX_REPORT_BYTES, RunReport

if TYPE_CHECKING:  # annotations only (the transports' module imports the HTTP client)
    from warmup.observe.metrics import Metrics
    from warmup.plan.model import Expansion
    from warmup.serve.transport import Transport

logger = logging.getLogger("sglang_warmup.coverage")


class PassDriver(Protocol):
    """What a pass uses of its driver (:class:`warmup.serve.driver.Driver` is one)."""

    #: the second pass appends to its token salt for the replay (fresh ids), then restores it
    transport: Transport
    #: where the SGLang processes write the compile log (None: ``WARMUP_STATE_DIR``)
    state_dir: str | None
    #: where the coverage's first-hit ratios and the ready time go; None: nowhere
    metrics: Metrics | None
    #: False inside the server: the caller records the ready time at the real readiness
    serving_at_end: bool
    #: one line of progress (the second replay's announcement, the coverage's lines)
    progress: Callable[[str], None]

    async def run(self, exp: Expansion) -> RunReport:
        """Send the expansion; the final report.  A failure in strict mode raises
        :class:`~warmup.errors.DriverError` carrying the report so far."""
        ...

    def replay(self) -> PassDriver:
        """A driver for the second replay: the same transport, state directory, progress and
        readiness; lenient, repeating every step, recording no plan metrics."""
        ...


@dataclass(frozen=True)
class PassCheck:
    """The compile misses of one pass, read from what the SGLang processes wrote.

    ``verified``: False when nothing shared could be read (then ``misses`` means nothing).
    ``source``: ``compile_log`` (``<state_dir>/compile_log``) or ``metrics`` (the
    multiprocess directory).  ``kernels``: ``class: kernel (compiler)`` per miss, from the
    compile log only.
    """

    verified: bool
    misses: int
    source: str
    kernels: tuple[str, ...] = ()
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "misses": self.misses, "source": self.source,
                "kernels": list(self.kernels), "detail": self.detail}


class PassWindow:
    """What the SGLang processes write from now until :meth:`close`: the new bytes of the
    compile log, and the multiprocess miss counter before and after."""

    def __init__(self, state_dir: str | os.PathLike[str] | None, mp_dir: str | None) -> None:
        self.state_dir = str(state_dir) if state_dir else None
        self.mp_dir = mp_dir
        self.cursor = compile_log.Cursor(self.state_dir) if self.state_dir else None
        self.start = self.cursor.mark() if self.cursor is not None else {}
        self.misses_before = metrics.compile_misses(mp_dir)
        #: the compile-log records of the window; None without a shared compile log
        self.records: tuple[dict, ...] | None = None

    def close(self) -> PassCheck:
        """End the window; the misses of the pass, from the compile log when SGLang writes one
        into the shared state directory, else from the multiprocess metrics."""
        end = self.cursor.mark() if self.cursor is not None else None
        misses_after = metrics.compile_misses(self.mp_dir)
        if self.state_dir is not None and self.cursor is not None and compile_log.files(self.state_dir):
            self.records = tuple(self.cursor.read(self.start, end))
            missed = [r for r in self.records if is_miss(r)]
            kernels = tuple(f"{r.get('shape_class') or r.get('phase') or '?'}: "
                            f"{kernel_name(r)} ({r.get('compiler') or '?'})" for r in missed)
            return PassCheck(True, len(missed), "compile_log", kernels,
                             f"{len(self.records)} records of the pass in "
                             f"{compile_log.directory(self.state_dir)}")
        if misses_after is not None:  # none before the pass: none had been counted yet
            before = self.misses_before or 0.0
            return PassCheck(True, int(round(misses_after - before)), "metrics", (),
                             f"sglang_warmup_compile_events_total{{outcome=\"miss\"}} in "
                             f"{self.mp_dir}")
        where = [f"no compile log under {compile_log.directory(self.state_dir)}"
                 if self.state_dir else "no shared state directory",
                 f"no sglang-warmup compile metrics in {self.mp_dir}" if self.mp_dir
                 else "no Prometheus multiprocess directory"]
        return PassCheck(False, 0, "", (), "; ".join(where))


@dataclass(frozen=True)
class PassResult:
    """One pass of the plan.  ``report``: the driver's report as it returned it (or as its
    DriverError carried it; None when the pass ended otherwise); ``error``: what ended the pass
    early; ``check``: its compile misses; ``records``: its compile-log records (None without a
    shared compile log)."""

    report: RunReport | None
    error: Exception | None
    check: PassCheck
    records: tuple[dict, ...] | None

    @property
    def pass_report(self) -> RunReport | None:
        """The report counted over this pass's records only (the driver counts the whole
        compile log: earlier passes and earlier server lifetimes included)."""
        if self.report is None or self.records is None:
            return self.report
        return self.report.with_compiles(self.records)


@dataclass(frozen=True)
class Passes:
    """The first pass, the second (None when it did not run: the first failed or skipped the
    plan, or none was asked for) and the coverage of both (None without both compile logs)."""

    first: PassResult
    second: PassResult | None = None
    coverage: Coverage | None = None


async def _one_pass(driver: PassDriver, exp: Expansion,
                    state_dir: str | os.PathLike[str] | None, mp_dir: str | None) -> PassResult:
    window = PassWindow(state_dir, mp_dir)
    report: RunReport | None = None
    error: Exception | None = None
    try:
        report = await driver.run(exp)
    except DriverError as exc:  # strict mode: it carries the report so far
        report, error = exc.report, exc
    # What else ended the pass is its result's too; the callers decide: run() raises the first
    # pass's again and lists the second's in the coverage, the sidecar fails the attempt on a
    # WarmupError and raises anything else (a bug of ours) as its internal error.
    except Exception as exc:  # the pass's result carries it: its caller raises or reports it
        error = exc
    check = window.close()
    return PassResult(report, error, check, window.records)


def latency(report: RunReport | None) -> dict[str, ClassLatency]:
    """Per class, the first sends and the repeats of a repeating driver's report."""
    if report is None:
        return {}
    return {c.shape_class: ClassLatency(c.total_ms, c.repeat_ms, c.worst_step_ratio)
            for c in report.classes if c.repeat_ms > 0}


async def run_passes(driver: PassDriver, exp: Expansion, *, second: PassDriver | None = None,
                     state_dir: str | os.PathLike[str] | None = None, mp_dir: str | None = None,
                     salt: str = "second-pass",
                     on_pass: Callable[[int, PassResult], None] | None = None) -> Passes:
    """Run ``exp`` with ``driver``, then (when ``second`` is a driver and the first pass sent
    the plan) once more with ``second``: fresh token ids (the transport's token salt gets
    ``salt`` appended for the pass, then is restored), so no radix-cache entry of the first
    pass is hit.  A ``second`` driver that repeats its steps also measures each class's first
    hit against its repeat (the coverage's latency gate).  ``on_pass(n, result)`` runs after
    each pass."""
    first = await _one_pass(driver, exp, state_dir, mp_dir)
    if on_pass is not None:
        on_pass(1, first)
    if second is None or first.error is not None or first.report is None \
            or first.report.skipped_reason:
        return Passes(first)
    tokens = second.transport.tokens
    old_salt = tokens.salt
    tokens.salt = f"{old_salt}{salt}"
    try:
        again = await _one_pass(second, exp, state_dir, mp_dir)
    finally:
        tokens.salt = old_salt
    if on_pass is not None:
        on_pass(2, again)
    cov = None
    if first.records is not None and again.records is not None:
        from warmup import settings

        cov = compute(first.records, again.records, classes=exp.classes, plan=exp.plan,
                      latency=latency(again.report), max_ratio=settings.FIRST_HIT_RATIO.get(),
                      min_ms=settings.FIRST_HIT_MIN_MS.get())
    return Passes(first, again, cov)


# --- the --warmups hook's runner ----------------------------------------------------------------
@dataclass(frozen=True)
class CoverageReport:
    """The first replay's run report and the coverage measured around it (None when no second
    replay was asked for).  JSON: the run report's fields plus ``coverage``."""

    run: RunReport
    coverage: Coverage | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self.run.to_dict()
        d["coverage"] = self.coverage.to_json() if self.coverage is not None else None
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CoverageReport":
        """A run report read back, with its coverage when the second pass ran; RecordError
        names a damaged coverage field (``coverage.classes[0]...``)."""
        cov = d.get("coverage")
        if cov is None:
            return cls(RunReport.from_json(d))
        try:
            return cls(RunReport.from_json(d), Coverage.from_json(read_object(cov, "coverage")))
        except RecordError as exc:
            text = str(exc)
            raise RecordError(text if text.startswith("coverage") else f"coverage.{text}") from None


async def run(driver: PassDriver, exp: Expansion, *, second_pass: bool | None = None,
              state_dir: str | os.PathLike[str] | None = None,
              describe: Callable[[Coverage], str] | None = None) -> CoverageReport:
    """Run the expansion with ``driver``; with ``second_pass`` (default: WARMUP_SECOND_PASS),
    replay it once more through the same transport and measure the :class:`Coverage` (also
    written as ``<state_dir>/coverage.json``).

    The second replay is lenient, sends fresh token ids, records no plan metrics, and ends
    with the plan's flush as the first did.  Its failures never fail the warm-up: they are
    listed in the coverage.  Without a state directory there is no compile log to read; the
    second replay is skipped and the coverage says so.  A failure of the first replay raises
    as the driver raised it.  ``describe``: the coverage as text, whose lines go to the
    driver's progress (the plugin passes the view's; this layer renders nothing itself).
    """
    from warmup import settings

    if second_pass is None:
        second_pass = settings.SECOND_PASS.get()
    if not second_pass:
        return CoverageReport(await driver.run(exp))
    sdir = state_dir if state_dir is not None else driver.state_dir
    if not sdir:
        sdir = settings.STATE_DIR.get() or None
    if not sdir:
        return CoverageReport(await driver.run(exp), Coverage(
            plan=exp.plan, classes=(), note="no state directory: the compile log that coverage "
            "reads is not written; second replay skipped"))
    replay = driver.replay()

    def announce(n: int, result: PassResult) -> None:
        if n == 1 and result.error is None and result.report is not None \
                and not result.report.skipped_reason:
            driver.progress("sglang-warmup: second replay of the plan (coverage)")

    passes = await run_passes(driver, exp, second=replay, state_dir=sdir, salt="second-pass",
                              on_pass=announce)
    first = passes.first
    if first.error is not None:
        raise first.error
    assert first.report is not None  # a pass without an error returned its report
    if passes.second is None:  # the plan was skipped (PD disaggregation)
        return CoverageReport(first.report)
    second = passes.second
    if second.error is not None:  # lenient: only an unexpected error lands here
        failures: tuple[str, ...] = (f"{type(second.error).__name__}: {second.error}",)
    else:
        failures = tuple(second.report.failures) if second.report is not None else ()
    cov = passes.coverage or compute((), (), classes=exp.classes, plan=exp.plan)
    cov = replace(cov, second_pass_failures=failures)
    _write(cov, sdir)
    _learn_steps(exp, passes, sdir, driver.progress)
    recorder = driver.metrics
    if recorder is not None:
        try:
            for c in cov.classes:
                if c.latency is not None and c.latency.ratio is not None:
                    recorder.class_first_hit_ratio(c.shape_class, c.latency.ratio)
            if driver.serving_at_end:  # else the caller marks it at readiness
                recorder.ready(time.time())  # ready is after the second replay
        except Exception as exc:  # a metrics update never fails the warm-up: logged
            logger.debug("sglang-warmup: coverage metrics not recorded: %r", exc)
    for line in (describe(cov) if describe is not None else "").splitlines():
        driver.progress(line)
    return CoverageReport(first.report, cov)


def _learn_steps(exp: Expansion, passes: Passes, state_dir: str | os.PathLike[str],
                 progress: Callable[[str], None]) -> None:
    """Write ``<state_dir>/steps.json``: the steps of the first pass that paid a first-time
    cost (:mod:`warmup.coverage.quiet_steps`), when it sent the whole plan in its order (no
    steps record was in play: neither trimmed nor sent out of order after one) and both passes
    left their reports and the first its compile-log records."""
    first, second = passes.first, passes.second
    if second is None or first.report is None or second.report is None \
            or first.records is None or first.report.quiet_steps or first.report.steps_record:
        return
    from warmup.coverage import quiet_steps
    from warmup.plan.step_record import STATE_FILE, this_device

    path = Path(state_dir) / STATE_FILE
    try:
        record = quiet_steps.learn(exp, first.report, first.records, second.report,
                                   device=this_device(), baked=_baked_records(exp))
        record.write(path)
    except OSError as exc:
        logger.warning("sglang-warmup: cannot write %s: %s", path, exc)
        return
    except Exception:  # the record is an extra: a bug of ours learning it never fails a warm-up
        logger.exception("sglang-warmup: learning the steps record failed; none written")
        return
    progress(f"sglang-warmup: {len(record.keep)} of {record.steps} steps paid a first-time "
             f"cost, {record.quiet} were quiet: {path} (serve --steps sends only the first)")


def _baked_records(exp: Expansion) -> list[dict[str, Any]] | None:
    """The compile-log records of the start that baked the caches (``WARMUP_BAKED_STATE``,
    which prebake sets for the start that learns), when its run report names this expansion's
    digest (its step indices are this start's); None otherwise, with a warning where it was
    named (the record says it was not read, and prebake warns)."""
    baked = settings.BAKED_STATE.get()
    if not baked:
        return None
    try:
        digest, ours = jsonfile.load(Path(baked) / "report.json", MAX_REPORT_BYTES).get(
            "expansion_digest"), exp.digest()
        if digest != ours:
            raise ValueError(f"its run report names expansion {shown(digest)}, this start's is "
                             f"{ours}")
        return compile_log.read_dir(baked)
    except Exception as exc:  # an extra for the record: never the record's loss
        logger.warning("sglang-warmup: the baking start's records (%s) are not used for the "
                       "steps record: %s", baked, exc)
        return None


def _write(cov: Coverage, state_dir: str | os.PathLike[str]) -> None:
    path = Path(state_dir) / "coverage.json"
    try:
        atomic.write_text(path, json.dumps(cov.to_json(), indent=2) + "\n")
    except OSError as exc:
        logger.warning("sglang-warmup: cannot write %s: %s", path, exc)

