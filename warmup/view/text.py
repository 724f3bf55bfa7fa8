"""Every report as text, the one place it is drawn: the run report (the ``--warmups`` hook's
log lines and ``sglang-warmup report``), the audit (``audit`` and ``report``), the coverage
(``coverage``, the second pass's log lines and ``report``), and any other saved document as
an outline.  Tables fit ``width`` columns when one is given (a terminal's): the least useful
columns go first, then long names are cut."""

from __future__ import annotations

from typing import Any, Iterable

from cache_tools.errors import printable
from cache_tools.render import bar, lines, table
from warmup.coverage.audit import SLOW_RATIO, AuditReport, StepAudit
from warmup.coverage.classes import Coverage, KeyEvents
from warmup.serve.report import RunReport, allocator_kept, sweep_processes
from warmup.view.documents import AUDIT, COVERAGE, OTHER, RUN, Document, Outline

#: How compiles after ready are measured, where a report cannot know them.
MEASURE_AFTER_READY = ("`sglang-warmup audit --url URL --traffic FILE --state-dir DIR` replays "
                       "traffic on the ready server and names each one; /metrics counts them "
                       "as sglang_warmup_compile_events_total{phase=\"serving\"}")


def render(doc: Document, *, width: int | None = None) -> str:
    """A saved document for a terminal: a line naming it, then its report."""
    return f"{doc.path}: {doc.kind}\n" + body(doc, width=width)


def body(doc: Document, *, width: int | None = None) -> str:
    """The report a document holds, as text."""
    r = doc.report
    if doc.kind == RUN:
        return run_report(r.run, r.coverage, width=width)
    if doc.kind == AUDIT:
        return audit(r, width=width)
    if doc.kind == COVERAGE:
        return coverage(r, width=width)
    assert doc.kind == OTHER
    return outline(r, width=width)


# --- the run report --------------------------------------------------------------------------
def run_report(report: RunReport, cov: Coverage | None = None, *,
               width: int | None = None) -> str:
    """A head line, one row per class, compiles by phase and after ready, the GEMM sweep and
    the allocator, what the expansion left out, warnings and failures, and the coverage when
    the second pass ran (its first hit against repeat also fills the class rows)."""
    if report.skipped_reason:
        return f"warm-up {report.plan}: skipped ({report.skipped_reason})"
    out = [f"warm-up {report.plan}: {'ok' if report.ok else 'FAILED'}, {report.requests:,} "
           f"requests in {report.duration_s:.1f} s via {report.transport}"
           + (f"; flush: {report.flush}" if report.flush else ""),
           table(["phase", "class", "requests", "ms", "ms/request", "failed", "compiles", "jit",
                  "disk hits", "first/repeat", ""], class_rows(report, cov),
                 align="llrrrrrrrrl", width=width, drop=(10, 4, 0, 5))]
    if report.compiles_by_phase:
        out.append("compiles by phase: " + ", ".join(f"{k}={v}" for k, v in
                                                     report.compiles_by_phase.items()))
    out.append(after_ready_line(report))
    if report.gemm_sweeps:
        out.append(sweep_line(report.gemm_sweeps))
    kept = allocator_line(report.allocator_kept)
    if kept:
        out.append(kept)
    out += skipped_lines(report)
    if report.quiet_steps:
        out.append(f"not sent: {report.quiet_steps:,} steps quiet when the cache was baked "
                   f"({report.steps_record})")
    out += [f"warning: {w}" for w in report.warnings]
    out += [f"failure: {f}" for f in report.failures]
    if cov is not None:
        out.append(coverage(cov, width=width))
    return lines(out, width)


def class_rows(report: RunReport, cov: Coverage | None) -> list[list[Any]]:
    longest = max((c.total_ms for c in report.classes), default=0.0)
    ratios = first_hit_ratios(report, cov)
    return [[c.phase, c.shape_class, c.requests, round(c.total_ms), round(c.ms_per_request, 1),
             c.failures, c.compiles, c.jit_builds, c.disk_hits,
             None if ratios.get(c.shape_class) is None else f"{ratios[c.shape_class]:.2f}x",
             bar(c.total_ms, longest, 20)] for c in report.classes]


def first_hit_ratios(report: RunReport, cov: Coverage | None) -> dict[str, float | None]:
    """Per class, its first hit over its repeat: the second replay's (coverage), else the
    report's own repeats (a driver that repeated every step)."""
    out: dict[str, float | None] = {c.shape_class: c.first_hit_ratio for c in report.classes}
    for c in cov.classes if cov is not None else ():
        if c.latency is not None and c.latency.ratio is not None:
            out[c.shape_class] = c.latency.ratio
    return out


def after_ready_line(report: RunReport) -> str:
    """Compiles after ready: the count when the report was written after ready (the sidecar's
    and the sidecar's second pass), else that it was not measured and how to measure it."""
    if "serving" in report.compiles_by_phase:
        return f"compiled after ready: {report.compiles_by_phase['serving']}"
    return ("compiled after ready: not measured (the report is written before the server "
            f"takes traffic): {MEASURE_AFTER_READY}")


def skipped_lines(report: RunReport) -> list[str]:
    """Whole classes skipped, prompt ranges a class did not reach, and how many other items."""
    out, others = [], 0
    for skip in report.skipped:
        item = str(skip.get("item") or "")
        if not item:
            out.append(f"skipped class {skip.get('class')}: {skip.get('reason')}")
        elif ".." in item:
            out.append(f"not warmed: {skip.get('class')}: {skip.get('reason')}")
        else:
            others += 1
    if others:
        out.append(f"{others} other item(s) skipped by the expansion (`sglang-warmup plan show` "
                   "lists them)")
    return out


def sweep_line(sweeps: Iterable[Any]) -> str:
    """One line for the GEMM sweeps: scheduler processes, and the longest one's numbers."""
    procs = sweep_processes(sweeps)
    if not procs:
        return "GEMM sweep before the warm-up: none recorded"
    worst = procs[0]
    cut = sum(1 for p in procs if p["cut"])
    failed = sum(p["failed"] for p in procs)
    capped = worst["capped"]
    learned = (f" ({worst['learned']:.0f} at the rows where the bake's starts loaded a kernel)"
               if worst["learned"] else "")
    return (f"GEMM sweep before the warm-up: {len(procs)} scheduler(s), {worst['shapes']:.0f} "
            f"shapes{learned}, rows 1-{worst['rows_reached']:.0f} of {worst['max_rows']:.0f}"
            + (f" ({capped[1]} to {capped[0]:.0f})" if capped else "")
            + f", {worst['duration_s']:.1f} s"
            + (f"; {cut} stopped by WARMUP_GEMM_SWEEP_S" if cut else "")
            + (f"; {failed} shape(s) failed (the scheduler log names them)" if failed else ""))


def allocator_line(kept: Any) -> str | None:
    """One line for the schedulers whose allocator kept its blocks, or None."""
    count, most = allocator_kept(kept)
    if not count:
        return None
    return (f"the warm-up's flush kept the caching allocator's blocks in {count} scheduler(s)"
            + (f", at most {most / 2**20:,.0f} MiB cached and unused in one" if most > 0 else "")
            + " (WARMUP_KEEP_ALLOCATOR=0 empties them)")


# --- compile keys and coverage ---------------------------------------------------------------
def key_label(k: KeyEvents) -> str:
    """``name [hash10] (signature)``, printable: its parts come from a compile log (data)."""
    short = f" [{k.hash[:10]}]" if k.hash else ""
    sig = f" ({k.signature})" if k.signature else ""
    return printable(f"{k.name}{short}{sig}")


def key_events(k: KeyEvents) -> str:
    """``compiled 2, disk 1, loads 2``."""
    parts = [(k.compiled, "compiled"), (k.disk_hits, "disk"), (k.failed, "failed"),
             (k.device_loads, "loads")]
    return ", ".join(f"{label} {n}" for n, label in parts if n) or "-"


def coverage_summary(cov: Coverage) -> str:
    """Closed or not, in one line, and why."""
    measured = any(c.latency is not None for c in cov.classes)
    gate = f" and every class's first hit within {cov.max_ratio:g}x of its repeat"
    if cov.closed:
        return (f"plan {cov.plan} closed: a second replay in the same server compiled and "
                f"loaded nothing" + (gate if measured else ""))
    n = sum(len(c.second) for c in cov.classes) + len(cov.outside_second)
    parts = []
    if n:
        where = ", ".join(cov.open_classes) or "outside the plan's classes"
        parts.append(f"{n} compile key(s) still triggered on a second replay ({where})")
    if cov.slow_classes:
        parts.append(f"first hit over {cov.max_ratio:g}x its repeat in "
                     f"{', '.join(cov.slow_classes)}")
    return f"plan {cov.plan} NOT closed: " + "; ".join(parts)


def coverage(cov: Coverage, *, width: int | None = None) -> str:
    """The summary, one row per class, and every key the second replay still triggered."""
    rows = []
    for c in cov.classes:
        lat = c.latency
        slow = lat is not None and lat.slow(cov.max_ratio, cov.min_ms)
        rows.append([c.shape_class, len(c.first), sum(k.compiled for k in c.first),
                     sum(k.disk_hits for k in c.first), sum(k.device_loads for k in c.first),
                     len(c.second),
                     None if lat is None or lat.ratio is None else f"{lat.ratio:.2f}x",
                     "closed" if c.closed and not slow else ("SLOW" if c.closed else "OPEN")])
    out = [coverage_summary(cov), table(["class", "keys", "compiled", "disk", "loads",
                                         "2nd replay", "first/repeat", "state"], rows,
                                        align="lrrrrrrl", width=width)]
    for c in cov.classes:
        for k in c.second:
            out.append(f"  still triggered by {c.shape_class}: {key_label(k)} ({key_events(k)})")
    for k in cov.outside_second:
        out.append(f"  still triggered outside the plan's classes: {key_label(k)} "
                   f"({key_events(k)})")
    if cov.outside_first:
        out.append(f"{len(cov.outside_first)} key(s) on the first replay were not stamped "
                   "with a plan class (flush, another phase or other traffic)")
    out += [f"second replay failure: {f}" for f in cov.second_pass_failures]
    if cov.note:
        out.append(f"note: {cov.note}")
    return lines(out, width)


# --- the audit -------------------------------------------------------------------------------
def prompts_text(step: StepAudit, limit: int = 5) -> str:
    """``300+412+…`` and the cached prefix, for a table cell."""
    p = [str(n) for n in step.step.prompts]
    text = "+".join(p[:limit]) + ("+…" if len(p) > limit else "")
    return text + (f" (prefix {step.step.prefix_len})" if step.step.prefix_group else "")


def audit(report: AuditReport, *, width: int | None = None) -> str:
    """The head (passes, attribution, misses against --max-misses), the steps that compiled or
    were slow on their first pass, and one line per compile key after ready."""
    n = len(report.steps)
    missed = [s for s in report.steps if s.misses]
    out = [f"audit of {report.url}: {n} traffic steps from {report.traffic}, sent twice "
           f"(pass 1 {sum(s.first.ms for s in report.steps):,.0f} ms, pass 2 "
           f"{sum(s.second.ms for s in report.steps):,.0f} ms)",
           f"attribution: {report.mode_note or report.mode or '?'}",
           f"compiled after ready: {report.misses} compile event(s)"
           + (f" in {len(missed)} step(s)" if missed else "")
           + f"; --max-misses {report.max_misses}: {'ok' if report.ok else 'FAILED'}"]
    shown = [s for s in report.steps if s.misses or s.slow_first]
    if shown:
        rows = [[s.index, s.step.label or s.step.kind, s.step.kind, prompts_text(s),
                 round(s.first.ms, 1), round(s.second.ms, 1),
                 round(s.ratio, 1) if s.ratio is not None else None, s.first.misses,
                 s.second.misses, s.cause or "-",
                 ", ".join(dict.fromkeys(k.name for k in s.first.keys + s.second.keys)) or "-"]
                for s in shown]
        out.append(table(["step", "label", "kind", "prompts", "pass 1 ms", "pass 2 ms", "x",
                          "miss 1", "miss 2", "slow because", "kernels"], rows,
                         align="rllrrrrrrll", width=width, drop=(10, 2, 3)))
    quiet = n - len(shown)
    if quiet:
        out.append(f"{quiet} other step(s): no misses, first pass within {SLOW_RATIO:g}x of the "
                   "second")
    for s in missed:
        for number, p in ((1, s.first), (2, s.second)):
            for k in p.keys:
                out.append(f"  miss: step {s.index} {s.step.label or s.step.kind} pass {number}: "
                           f"{k.compiler} {key_label(k)}: {key_events(k)}"
                           + (f" in {k.processes} processes" if k.processes > 1 else "")
                           + (f", {k.seconds:.2f} s" if k.seconds else ""))
    for k in report.unattributed:
        out.append(f"  unattributed: {k.compiler} {key_label(k)}: {key_events(k)}")
    if report.unseen_events:
        out.append(f"  /metrics counted {report.unseen_events} serving compile event(s) the "
                   "compile log did not record")
    if report.median_ratio is not None:
        out.append(f"median step with nothing recorded, pass 1 over pass 2: "
                   f"{report.median_ratio:.2f}x ({len(report.quiet_ratios)} steps)")
    out += [f"note: {note}" for note in report.all_notes]
    if report.file:
        out.append(f"audit file: {report.file}")
    return lines(out, width)


# --- any other document ----------------------------------------------------------------------
def outline(o: Outline, *, width: int | None = None) -> str:
    """What the document is, each report it holds under its JSON path, then its fields."""
    out = [o.what]
    for part in o.parts:
        out += ["", f"== {part.path}: {part.kind}", body(part, width=width)]
    if o.more_parts:
        out.append(f"… {o.more_parts} more saved report(s) not shown")
    if o.parts:
        out += ["", "== the document's own fields"]
    if o.fields:
        out.append(table(["field", "value"], [list(f) for f in o.fields], align="ll",
                         width=width))
    for t in o.tables:
        out += ["", f"{t.path}:", table(list(t.headers), [list(r) for r in t.rows],
                                        align="l" * len(t.headers), width=width)]
        if t.more:
            out.append(f"… {t.more} more row(s)")
    if o.more_fields:
        out.append(f"… {o.more_fields} more field(s) (--format json prints the whole document)")
    return "\n".join(out)
