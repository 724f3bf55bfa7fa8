"""Every report as one self-contained HTML page, the one place it is drawn: inline CSS, no
script, nothing fetched when it is viewed.

The charts are horizontal bars and a timeline strip drawn with CSS (a bar is a box whose width
is its share), so the page reflows from 900 px up and no label is cut: a plotting library
would add a dependency and megabytes of script for four chart shapes.  Every series has its
legend, every measure its own bar and number (compiles and disk hits are never added up), and
what a report could not measure says so and how to measure it.  Every text is escaped.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, Iterable, Sequence

from warmup.coverage.audit import SLOW_RATIO, AuditReport
from warmup.coverage.classes import Coverage
from warmup.coverage.second_pass import CoverageReport
from warmup.serve.report import RunReport, allocator_kept, sweep_processes
from warmup.view import text
from warmup.view.documents import AUDIT, COVERAGE, OTHER, RUN, Document, Outline

#: series colours (colour-blind safe: Okabe-Ito)
BLUE, ORANGE, GREEN, RED, SKY, PURPLE, YELLOW, GREY = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#999999")
TIMELINE = (BLUE, ORANGE, GREEN, PURPLE, SKY, RED, YELLOW, GREY)
MAX_ROWS = 400  # rows drawn per chart; the rest are counted in a line
#: what the legend says of each term a page uses
TERMS = {
    "first hit": "the first time a request of the class reaches the warm server (second "
                 "replay)",
    "repeat": "the same requests again right after: what the class costs once warm",
    "Triton compile": "a Triton kernel built from source (seconds of compiler time)",
    "JIT build": "an nvcc / tvm-ffi module built by SGLang's JIT",
    "disk hit": "a kernel loaded from the disk cache: no compile, but not free",
    "phases": "init: model load and graph capture; warmup: this plan; serving: after ready",
    "after ready": "once the server takes traffic: what users would wait for",
    "pass 1": "the traffic sample replayed on the ready server: each step's first hit",
    "pass 2": "the same steps again (fresh prompts, cache flushed): the steady state",
    "cold step": f"a first pass over {SLOW_RATIO:g}x its second and 5 ms slower; the cause "
                 "names what the audit saw behind it",
}

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;
background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:16px 24px}
header h1{margin:0 0 4px;font-size:20px;font-weight:600}
header .meta{opacity:.8;overflow-wrap:anywhere}
main{max-width:1100px;margin:0 auto;padding:12px 20px 40px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:8px;margin:14px 0;
padding:12px 16px;min-width:0}
h2{font-size:16px;margin:0 0 8px}h3{font-size:15px;margin:0 0 8px}
article.part{border-top:3px solid #1d2330;margin-top:28px;padding-top:4px}
article.part>h2{font-size:17px;overflow-wrap:anywhere}
.cards{display:flex;flex-wrap:wrap;gap:10px;background:none;border:none;padding:0}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:8px 12px;
flex:1 1 150px;max-width:260px}
.card .v{font-size:20px;font-weight:600;overflow-wrap:anywhere}
.card .k{color:#5b6373;font-size:12px}
.ok{color:#00774f}.bad{color:#b23b00}.unknown{color:#5b6373}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top;
overflow-wrap:anywhere}
th{color:#5b6373;font-weight:600}th.n,td.n{text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:0 0 8px;font-size:13px}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
vertical-align:-1px}
.note{color:#5b6373;font-size:12px;margin:6px 0 0}
.row{display:grid;grid-template-columns:minmax(7rem,15rem) minmax(0,1fr);gap:10px;
align-items:center;padding:3px 0;border-bottom:1px solid #f2f3f6}
.label{overflow-wrap:anywhere;font-size:13px}
.track{display:flex;align-items:center;gap:6px;min-height:15px}
.bar{display:block;height:11px;border-radius:2px;flex:none;min-width:1px}
.val{font-size:12px;color:#3b4252;white-space:nowrap;font-variant-numeric:tabular-nums}
.strip{display:flex;height:30px;border-radius:4px;overflow:hidden;margin:4px 0 2px}
.strip span{display:flex;align-items:center;justify-content:center;color:#fff;
font-size:11px;font-weight:600;min-width:1px;overflow:hidden}
.axis{display:flex;justify-content:space-between;color:#5b6373;font-size:12px}
dl.terms{display:grid;grid-template-columns:minmax(6rem,max-content) 1fr;gap:3px 14px;
margin:0;font-size:13px}dl.terms dt{font-weight:600}dl.terms dd{margin:0}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def prose(value: str) -> str:
    """A sentence, escaped, its `commands` as code."""
    parts = e(value).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def num(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):     # (an integer of 400 digits)
        return "–"
    return f"{number:,.{digits}f}" if math.isfinite(number) else "–"


# --- drawing ---------------------------------------------------------------------------------
def legend(series: Iterable[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i class="sw" style="background:{c}"></i>{e(n)}</span>' for n, c in series) + \
        "</div>"


def bars(rows: Sequence[tuple[str, Sequence[float]]], series: Sequence[tuple[str, str]], *,
         unit: str = "", digits: int = 0, texts: Sequence[Sequence[str]] | None = None) -> str:
    """One row per label, one bar per series under it, each with its own number (``texts``
    replaces a number's text, e.g. "not measured"); one scale per chart."""
    shown = list(rows)[:MAX_ROWS]
    if not shown:
        return '<p class="note">nothing to draw</p>'
    top = max((max((max(0.0, float(v)) for v in values), default=0.0) for _, values in shown),
              default=0.0) or 1.0
    out = [legend(series) if len(series) > 1 else ""]
    for r, (label, values) in enumerate(shown):
        tracks = []
        for j, ((name, colour), v) in enumerate(zip(series, values)):
            share = max(0.0, float(v)) / top * 82          # room left for the number
            said = texts[r][j] if texts and texts[r][j] else f"{num(v, digits)}{unit}"
            tracks.append(f'<div class="track" title="{e(label)} · {e(name)}: {e(said)}">'
                          f'<i class="bar" style="width:{share:.2f}%;background:{colour}"></i>'
                          f'<span class="val">{e(said)}</span></div>')
        out.append(f'<div class="row"><div class="label">{e(label)}</div><div>'
                   f'{"".join(tracks)}</div></div>')
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="note">{len(rows) - MAX_ROWS} more rows not drawn</p>')
    return "".join(out)


def timeline(parts: Sequence[tuple[str, float]]) -> str:
    """One strip, a numbered segment per class in the order it ran, widths in proportion to
    its time; the table under it names every segment (no label is cut)."""
    total = sum(max(0.0, t) for _, t in parts) or 1.0
    strip, rows, start = [], [], 0.0
    for i, (name, t) in enumerate(parts[:MAX_ROWS], 1):
        share = max(0.0, t) / total * 100
        colour = TIMELINE[(i - 1) % len(TIMELINE)]
        ink = "#1d2330" if colour in (YELLOW, SKY) else "#fff"     # readable on the colour
        strip.append(f'<span style="flex:0 0 {share:.3f}%;background:{colour};color:{ink}" '
                     f'title="{i}. {e(name)}: {num(t)} ms">{i if share >= 2.5 else ""}</span>')
        rows.append((f'<i class="sw" style="background:{colour}"></i>{i}', name,
                     f"{start / 1000:,.2f} s", f"{num(t)} ms", f"{share:.1f}%"))
        start += max(0.0, t)
    head = "".join(f"<th>{h}</th>" for h in ("#", "class", "starts at", "took", "share"))
    body = "".join(f'<tr><td class="n">{sw}</td><td>{e(name)}</td><td class="n">{a}</td>'
                   f'<td class="n">{b}</td><td class="n">{c}</td></tr>'
                   for sw, name, a, b, c in rows)
    return (f'<div class="strip">{"".join(strip)}</div><div class="axis"><span>0 s</span>'
            f'<span>{num(total / 1000, 1)} s</span></div><div class="scroll"><table>'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: str = "") -> str:
    """An HTML table; ``numeric`` marks with ``n`` the columns aligned right."""
    head = "".join(f'<th class="{"n" if numeric[i:i + 1] == "n" else ""}">{e(h)}</th>'
                   for i, h in enumerate(headers))
    body = ["<tr>" + "".join(f'<td class="{"n" if numeric[i:i + 1] == "n" else ""}">{e(v)}</td>'
                             for i, v in enumerate(row)) + "</tr>" for row in rows]
    if not body:
        return '<p class="note">none</p>'
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            "</tbody></table></div>")


def cards(items: Iterable[tuple[str, str, str]]) -> str:
    """Headline numbers: (value, what, css class)."""
    return '<section class="cards">' + "".join(
        f'<div class="card"><div class="v {c}">{e(v)}</div><div class="k">{e(k)}</div></div>'
        for v, k, c in items) + "</section>"


def section(title: str, body: str, note: str = "", level: int = 2) -> str:
    tail = f'<p class="note">{e(note)}</p>' if note else ""
    return f"<section><h{level}>{e(title)}</h{level}>{body}{tail}</section>"


def terms(series: Sequence[tuple[str, str]], words: Sequence[str], level: int = 2) -> str:
    """The legend of a page: the colours of its series and the words it uses."""
    rows = "".join(f'<dt>{e(w)}</dt><dd>{e(TERMS[w])}</dd>' for w in words)
    return section("Legend", legend(series) + f'<dl class="terms">{rows}</dl>', level=level)


def page(title: str, meta: str, body: str) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><header>"
            f"<h1>{e(title)}</h1><div class=\"meta\">{e(meta)}</div></header><main>{body}"
            f"<p class=\"note\">rendered by sglang-warmup report at {stamp}</p></main>"
            "</body></html>\n")


# --- the documents ---------------------------------------------------------------------------
def render(doc: Document) -> str:
    """The page of a saved document."""
    title, meta, body = _parts(doc, 2)
    return page(title, meta, body)


def _parts(doc: Document, level: int) -> tuple[str, str, str]:
    r = doc.report
    if doc.kind == RUN:
        return run_report(r, doc.path, level)
    if doc.kind == AUDIT:
        return audit(r, doc.path, level)
    if doc.kind == COVERAGE:
        return (f"Coverage of plan {r.plan}", doc.path, coverage(r, level))
    assert doc.kind == OTHER
    return outline(r, doc.path)


def run_report(cr: CoverageReport, path: str, level: int = 2) -> tuple[str, str, str]:
    run, cov = cr.run, cr.coverage
    sweeps = sweep_processes(run.gemm_sweeps)
    kept = allocator_kept(run.allocator_kept)[1]
    serving = run.compiles_by_phase.get("serving")
    jit = sum(c.jit_builds for c in run.classes)
    body = [cards([
        ("ok" if run.ok else "FAILED", "warm-up", "ok" if run.ok else "bad"),
        (num(run.requests), "requests", ""),
        (f"{num(run.duration_s, 1)} s", "duration", ""),
        (num(sum(c.compiles for c in run.classes)), "Triton compiles in the warm-up", ""),
        (num(jit), "JIT builds in the warm-up", ""),
        (num(sum(c.disk_hits for c in run.classes)), "disk hits in the warm-up", ""),
        (("not measured", "compiled after ready", "unknown") if serving is None else
         (num(serving), "compiled after ready", "bad" if serving else "ok")),
    ] + ([("closed" if cov.closed else "NOT closed", "second replay",
           "ok" if cov.closed else "bad")] if cov is not None else [])
      + ([(f"{num(sweeps[0]['duration_s'], 1)} s", "GEMM sweep before it", "")] if sweeps else [])
      + ([(f"{num(kept / 2**20)} MiB", "kept by the allocator", "")] if kept > 0 else []))]
    body.append(terms([("first hit", ORANGE), ("repeat", GREEN), ("Triton compiles", RED),
                       ("JIT builds", PURPLE), ("disk hits", SKY), ("time", BLUE)],
                      ["first hit", "repeat", "Triton compile", "JIT build", "disk hit", "phases",
                       "after ready"], level))
    body.append(_after_ready(run, cov, level))
    body.append(_first_hits(run, cov, level))
    body.append(section("Time per class", bars(
        [(c.shape_class, [c.total_ms]) for c in run.classes], [("warm-up time", BLUE)],
        unit=" ms"), "Each class's requests, in the order the plan sent them.", level))
    busy = [c for c in run.classes if c.compiles or c.jit_builds or c.disk_hits]
    idle = [c.shape_class for c in run.classes if c not in busy]
    body.append(section("Compiles and disk hits per class", bars(
        [(c.shape_class, [c.compiles, c.jit_builds, c.disk_hits]) for c in busy],
        [("Triton compiles", RED), ("JIT builds", PURPLE), ("disk hits", SKY)]),
        "Counted apart: a compile built a kernel during the warm-up, a disk hit loaded one "
        "built before." + (f" No compile and no disk hit in {len(idle)} other class(es): "
                           f"{', '.join(idle)}." if idle else ""), level))
    body.append(_phases(run, level))
    body.append(section("Timeline of the warm-up", timeline(
        [(c.shape_class, c.total_ms) for c in run.classes]), level=level))
    lines = text.skipped_lines(run)
    body.append(section("Skipped by the expansion", table(
        ["class", "item", "why"], [(s.get("class"), s.get("item") or "(whole class)",
                                    s.get("reason")) for s in run.skipped]),
        "; ".join(x for x in lines if x.startswith("not warmed")), level))
    for title, items in (("Warnings", run.warnings), ("Failures", run.failures)):
        if items:
            body.append(section(title, table([title[:-1].lower()], [(x,) for x in items]),
                                level=level))
    if cov is not None:
        body.append(coverage(cov, level, with_latency=False))
    quiet = (f" · {run.quiet_steps} steps not sent, quiet when the cache was baked"
             if run.quiet_steps else "")
    meta = (f"{run.requests} requests via {run.transport} · flush: {run.flush or '–'}{quiet} · "
            f"{path}")
    return f"Warm-up of plan {run.plan}", meta, "".join(body)


def _after_ready(run: RunReport, cov: Coverage | None, level: int) -> str:
    serving = run.compiles_by_phase.get("serving")
    if serving is not None:
        said = (f"{serving} compile event(s) after ready." if serving else
                "Nothing compiled after ready (0 compile events).")
    else:
        said = ("Not measured: this report is written before the server takes traffic, so it "
                "cannot know. To measure: " + text.MEASURE_AFTER_READY + ".")
    if cov is not None:
        left = sum(len(c.second) for c in cov.classes) + len(cov.outside_second)
        said += (f" Before ready, the second replay of the plan triggered {left} compile "
                 "key(s).")
    return section("Compiles after ready", f"<p>{prose(said)}</p>", level=level)


def _first_hits(run: RunReport, cov: Coverage | None, level: int) -> str:
    """Per class, first hit against repeat: the second replay's, else the report's repeats."""
    measured: list[tuple[str, float, float]] = []
    if cov is not None:
        measured = [(c.shape_class, c.latency.first_ms, c.latency.repeat_ms)
                    for c in cov.classes if c.latency is not None]
    if not measured:
        measured = [(c.shape_class, c.total_ms, c.repeat_ms) for c in run.classes if c.repeat_ms]
    title = "First hit against repeat, per class"
    if not measured:
        return section(title, '<p>Not measured: this run had no second replay. To measure: '
                       "<code>sglang-warmup serve --second-pass</code> (or WARMUP_SECOND_PASS=1) "
                       "replays the plan once warm and times each class's first hit against "
                       "its repeat.</p>", level=level)
    gate = cov.max_ratio if cov is not None else 1.1
    slow = ", ".join(cov.slow_classes) if cov is not None else ""
    return section(title, bars(
        [(name, [first, repeat]) for name, first, repeat in measured],
        [("first hit", ORANGE), ("repeat", GREEN)], unit=" ms", digits=1),
        f"A class passes when its first hit is within {gate:g}x of its repeat; "
        f"slow: {slow or 'none'}.", level)


def _phases(run: RunReport, level: int) -> str:
    order = ["init", "warmup", "serving"] + [p for p in run.compiles_by_phase
                                             if p not in ("init", "warmup", "serving")]
    rows = [(p + (" (after ready)" if p == "serving" else ""),
             [float(run.compiles_by_phase.get(p, 0))]) for p in order]
    said = [["" if p in run.compiles_by_phase else "not measured"] for p in order]
    return section("Compiles by phase", bars(rows, [("compiles", RED)], texts=said),
                   "Triton compiles and JIT builds in every process of the server, by the "
                   "phase they happened in.", level)


def audit(report: AuditReport, path: str, level: int = 2) -> tuple[str, str, str]:
    slow = [s for s in report.steps if s.slow_first]
    body = [cards([
        ("ok" if report.ok else "FAILED", "audit", "ok" if report.ok else "bad"),
        (str(len(report.steps)), "traffic steps", ""),
        (num(report.misses), "compiled after ready", "bad" if report.misses else "ok"),
        (str(len(slow)), f"cold steps (first pass over {SLOW_RATIO:g}x)",
         "bad" if slow else "ok"),
        (f"{num(sum(s.first.ms for s in report.steps))} / "
         f"{num(sum(s.second.ms for s in report.steps))}", "ms, pass 1 / pass 2", ""),
        ("–" if report.median_ratio is None else f"{report.median_ratio:.2f}x",
         "median step with nothing recorded, pass 1 / pass 2", "bad" if report.drift_note else ""),
    ])]
    body.append(terms([("pass 1 (first hit)", ORANGE), ("pass 2 (repeat)", GREEN)],
                      ["pass 1", "pass 2", "cold step", "Triton compile", "disk hit",
                       "after ready"], level))
    body.append(section("Every traffic step, first pass against second", bars(
        [(f"{s.index} {s.step.label or s.step.kind}", [s.first.ms, s.second.ms])
         for s in report.steps], [("pass 1 (first hit)", ORANGE), ("pass 2 (repeat)", GREEN)],
        unit=" ms", digits=1), level=level))
    body.append(section("Slow or compiling steps", table(
        ["step", "label", "prompts", "pass 1 ms", "pass 2 ms", "x", "compiles", "slow because"],
        [(s.index, s.step.label or s.step.kind, text.prompts_text(s), num(s.first.ms, 1),
          num(s.second.ms, 1), "–" if s.ratio is None else f"{s.ratio:.1f}", s.misses,
          s.cause or "–") for s in report.steps if s.misses or s.slow_first], "n-nnnnn-"),
        level=level))
    keys: list[tuple[int | str, int | str, str, str, str]] = [
        (s.index, n, k.compiler, text.key_label(k), text.key_events(k))
        for s in report.steps for n, p in ((1, s.first), (2, s.second)) for k in p.keys]
    keys += [("–", "–", k.compiler, text.key_label(k), text.key_events(k))
             for k in report.unattributed]
    if keys:
        body.append(section("Compiles after ready, by key", table(
            ["step", "pass", "compiler", "kernel", "events"], keys, "nn"), level=level))
    if report.all_notes:
        body.append(section("Notes", table(["note"], [(n,) for n in report.all_notes]),
                            level=level))
    meta = f"{report.url} · traffic {report.traffic} · {report.mode_note} · {path}"
    return "Audit of a ready server", meta, "".join(body)


def coverage(cov: Coverage, level: int = 2, *, with_latency: bool = True) -> str:
    body = [] if not with_latency else [cards([
        ("closed" if cov.closed else "NOT closed", "plan", "ok" if cov.closed else "bad"),
        (str(len(cov.classes)), "classes", ""),
        (str(len(cov.open_classes)), "classes still compiling", ""),
        (str(len(cov.slow_classes)), "classes slow on first hit", "")]),
        terms([("first replay (the warm-up)", BLUE), ("second replay", RED),
               ("first hit", ORANGE), ("repeat", GREEN)], ["first hit", "repeat"], level)]
    body.append(section("Compile keys per class: first replay, second replay", bars(
        [(c.shape_class, [len(c.first), len(c.second)]) for c in cov.classes],
        [("first replay (the warm-up)", BLUE), ("second replay", RED)]),
        text.coverage_summary(cov), level))
    lat = [(c.shape_class, c.latency) for c in cov.classes if c.latency is not None]
    if with_latency and lat:
        body.append(section("First hit against repeat, per class", bars(
            [(name, [latency.first_ms, latency.repeat_ms]) for name, latency in lat],
            [("first hit", ORANGE), ("repeat", GREEN)], unit=" ms", digits=1), level=level))
    left = [(c.shape_class, text.key_label(k), text.key_events(k))
            for c in cov.classes for k in c.second]
    left += [("(outside the plan's classes)", text.key_label(k), text.key_events(k))
             for k in cov.outside_second]
    if left:
        body.append(section("Still triggered on the second replay", table(
            ["class", "kernel", "events"], left), level=level))
    return "".join(body)


def outline(o: Outline, path: str) -> tuple[str, str, str]:
    """The reports the document holds first (what people open it for), then its fields."""
    body = []
    for part in o.parts:
        title, meta, inner = _parts(part, 3)
        body.append(f'<article class="part"><h2>{e(title)}</h2><p class="note">{e(meta)}</p>'
                    f"{inner}</article>")
    if o.more_parts:
        body.append(f'<p class="note">{o.more_parts} more saved report(s) not shown</p>')
    body.append(section("Fields", table(["field", "value"], o.fields) + (
        f'<p class="note">{o.more_fields} more field(s): --format json prints the whole '
        "document</p>" if o.more_fields else "")))
    body += [section(t.path, table(t.headers, t.rows),
                     f"{t.more} more row(s) not shown" if t.more else "") for t in o.tables]
    return f"{path}: {o.what}", path, "".join(body)
