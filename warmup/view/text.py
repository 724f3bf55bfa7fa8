"""The terminal summary of a saved document: a head line, a table, what went wrong."""

from __future__ import annotations

from cache_tools.render import bar, table
from warmup.coverage.classes import Coverage, RecordError
from warmup.errors import WarmupError
from warmup.serve.report import allocator_line, as_number as _n, sweep_line
from warmup.view.documents import AUDIT, COVERAGE, RUN, Document


def render(doc: Document) -> str:
    """The summary of a saved document for a terminal."""
    return {RUN: _run, AUDIT: _audit, COVERAGE: _coverage}[doc.kind](doc)




def _run(doc: Document) -> str:
    d = doc.data
    classes = [c for c in d["classes"] if isinstance(c, dict)]
    longest = max((_n(c.get("total_ms")) for c in classes), default=0.0)
    rows = [[c.get("phase"), c.get("shape_class"), int(_n(c.get("requests"))),
             round(_n(c.get("total_ms"))), int(_n(c.get("compiles"))),
             int(_n(c.get("disk_hits"))),
             None if c.get("first_hit_ratio") is None else f"{_n(c['first_hit_ratio']):.2f}x",
             bar(_n(c.get("total_ms")), longest, 20)] for c in classes]
    by_phase = d.get("compiles_by_phase") or {}
    out = [f"run report {doc.path}: plan {d.get('plan')}, "
           f"{'ok' if d.get('ok', True) else 'FAILED'}, {int(_n(d.get('requests')))} requests "
           f"in {_n(d.get('duration_s')):.1f} s via {d.get('transport', '?')}",
           table(["phase", "class", "requests", "ms", "compiles", "disk hits", "first/repeat", ""],
                 rows, align="llrrrrrl")]
    if isinstance(by_phase, dict) and by_phase:
        out.append("compiles by phase: " + ", ".join(f"{k}={v}" for k, v in by_phase.items()))
    if isinstance(d.get("gemm_sweeps"), list) and d["gemm_sweeps"]:
        out.append(sweep_line(d["gemm_sweeps"]))
    kept = allocator_line(d.get("allocator_kept"))
    if kept:
        out.append(kept)
    skipped = [s for s in d.get("skipped") or [] if isinstance(s, dict) and not s.get("item")]
    for s in skipped:
        out.append(f"skipped class {s.get('class')}: {s.get('reason')}")
    for f in d.get("failures") or []:
        out.append(f"failure: {f}")
    if isinstance(d.get("coverage"), dict):
        out.append(_coverage_text(doc, d["coverage"], "coverage."))
    return "\n".join(out)


def _audit(doc: Document) -> str:
    d = doc.data
    steps = [s for s in d["steps"] if isinstance(s, dict)]
    shown = [s for s in steps if s.get("misses") or s.get("slow_first")]

    def ms(s: dict, p: str) -> float:
        return _n((s.get(p) or {}).get("ms")) if isinstance(s.get(p), dict) else 0.0

    out = [f"audit {doc.path}: {d.get('url')}, {len(steps)} steps, "
           f"{int(_n(d.get('misses')))} compile event(s) after ready, "
           f"{'ok' if d.get('ok') else 'FAILED'} (pass 1 {_n(d.get('pass1_ms')):,.0f} ms, "
           f"pass 2 {_n(d.get('pass2_ms')):,.0f} ms)"]
    if shown:
        out.append(table(["step", "label", "pass 1 ms", "pass 2 ms", "x", "misses",
                          "slow because"],
                         [[s.get("index"), s.get("label") or s.get("kind"), round(ms(s, "pass1"), 1),
                           round(ms(s, "pass2"), 1), s.get("ratio"), s.get("misses"),
                           s.get("cause") or "-"] for s in shown], align="rlrrrrl"))
    out.append(f"{len(steps) - len(shown)} other step(s): no misses, first pass within 1.5x")
    return "\n".join(out)


def _coverage(doc: Document) -> str:
    return f"coverage {doc.path}\n" + _coverage_text(doc, doc.data)


def _coverage_text(doc: Document, data: dict, where: str = "") -> str:
    """A coverage record rendered; a damaged one is one line naming the file and the field."""
    try:
        return Coverage.from_json(data).render()
    except RecordError as exc:
        raise WarmupError(f"{doc.path}: {where}{exc}",
                          hint="it is damaged or hand-edited; write it again") from None
