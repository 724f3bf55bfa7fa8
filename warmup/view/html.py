"""One self-contained HTML page of a saved document: inline CSS and SVG charts, no script, no
network at view time.

Charts are drawn here as plain SVG (bars, a timeline strip): the page needs four chart shapes,
and a plotting library would add a dependency and megabytes of script to every report for
them.  Every text from the document is escaped.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, Iterable, Sequence

from warmup.serve.report import allocator_kept, as_number, sweep_processes
from warmup.view.documents import AUDIT, COVERAGE, RUN, Document

#: series colours (colour-blind safe: Okabe-Ito)
BLUE, ORANGE, GREEN, RED, GREY, PURPLE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#999999",
                                          "#CC79A7")
WIDTH, LABEL_W, VALUE_W, ROW_H = 900, 240, 110, 22
MAX_ROWS = 400  # rows drawn per chart; the rest are summarised in a line

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;
color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px;font-size:21px;font-weight:600}
header .meta{opacity:.8}
main{max-width:980px;margin:0 auto;padding:16px 24px 40px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:8px;margin:16px 0;padding:14px 18px}
h2{font-size:16px;margin:0 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:10px;background:none;border:none;padding:0}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:10px 14px;min-width:120px}
.card .v{font-size:22px;font-weight:600}.card .k{color:#5b6373;font-size:12px}
.ok{color:#00774f}.bad{color:#b23b00}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{color:#5b6373;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}
.note{color:#5b6373;font-size:12px}
svg text{font:12px system-ui,-apple-system,Segoe UI,Roboto,sans-serif;fill:#1d2330}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):     # (an integer of 400 digits)
        return "–"
    return f"{number:,.{digits}f}" if math.isfinite(number) else "–"


# --- drawing ---------------------------------------------------------------------------------
def bars(rows: Sequence[tuple[str, Sequence[float]]], series: Sequence[tuple[str, str]], *,
         unit: str = "", stacked: bool = False, digits: int = 0) -> str:
    """Horizontal bars, one row per label: ``series`` values side by side (or stacked)."""
    shown = list(rows)[:MAX_ROWS]
    if not shown:
        return '<p class="note">nothing to draw</p>'
    per_row = 1 if stacked else len(series)
    bar_h = max(6, (ROW_H - 6) // per_row)
    top = max((sum(v) if stacked else max(v, default=0)) for _, v in shown) or 1.0
    area = WIDTH - LABEL_W - VALUE_W
    height = len(shown) * ROW_H + 8
    out = [f'<svg role="img" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">']
    for i, (label, values) in enumerate(shown):
        y = 4 + i * ROW_H
        text = label if len(label) <= 34 else label[:33] + "…"
        out.append(f'<text x="{LABEL_W - 8}" y="{y + ROW_H / 2 + 4:.1f}" text-anchor="end">'
                   f'<title>{e(label)}</title>{e(text)}</text>')
        x = LABEL_W
        for j, ((name, colour), v) in enumerate(zip(series, values)):
            w = max(0.0, float(v)) / top * area
            by = y + 3 + (0 if stacked else j * bar_h)
            bx = x if stacked else LABEL_W
            out.append(f'<rect x="{bx:.1f}" y="{by}" width="{w:.1f}" height="{bar_h - 1}" '
                       f'fill="{colour}" rx="2"><title>{e(label)} · {e(name)}: '
                       f'{num(v, digits)}{e(unit)}</title></rect>')
            if stacked:
                x += w
        total = sum(values) if stacked else values[0]
        extra = "" if stacked or len(values) < 2 else " / " + " / ".join(
            num(v, digits) for v in values[1:])
        end = (x if stacked else LABEL_W + max(float(v) for v in values) / top * area) + 6
        out.append(f'<text x="{end:.1f}" y="{y + ROW_H / 2 + 4:.1f}" fill="#5b6373">'
                   f'{num(total, digits)}{e(extra)}{e(unit)}</text>')
    out.append("</svg>")
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="note">{len(rows) - MAX_ROWS} more rows not drawn</p>')
    return legend(series) + "".join(out)


def legend(series: Iterable[tuple[str, str]]) -> str:
    return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{e(n)}</span>'
                                         for n, c in series) + "</p>"


def timeline(parts: Sequence[tuple[str, float]], colours: Sequence[str]) -> str:
    """One strip, a segment per class in the order it ran, widths in proportion to its time."""
    total = sum(max(0.0, t) for _, t in parts) or 1.0
    out = [f'<svg role="img" width="{WIDTH}" height="44" viewBox="0 0 {WIDTH} 44">']
    x = 0.0
    for i, (name, t) in enumerate(parts):
        w = max(0.0, t) / total * WIDTH
        out.append(f'<rect x="{x:.1f}" y="4" width="{max(w, 0.5):.1f}" height="24" '
                   f'fill="{colours[i % len(colours)]}"><title>{e(name)}: {num(t)} ms '
                   f'(from {num(x / WIDTH * total)} ms)</title></rect>')
        if w > 70:
            out.append(f'<text x="{x + 4:.1f}" y="20" fill="#fff">{e(name[: int(w // 7)])}'
                       "</text>")
        x += w
    out.append(f'<text x="0" y="42" fill="#5b6373">0 s</text><text x="{WIDTH}" y="42" '
               f'text-anchor="end" fill="#5b6373">{num(total / 1000, 1)} s</text></svg>')
    return "".join(out)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: str = "") -> str:
    """An HTML table; ``numeric`` marks with ``n`` the columns aligned right."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(f'<td class="{"n" if i < len(numeric) and numeric[i] == "n" else ""}">'
                        f"{e(v)}</td>" for i, v in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    if not body:
        return '<p class="note">none</p>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def cards(items: Iterable[tuple[str, str, str]]) -> str:
    """Headline numbers: (value, what, css class)."""
    return '<section class="cards">' + "".join(
        f'<div class="card"><div class="v {c}">{e(v)}</div><div class="k">{e(k)}</div></div>'
        for v, k, c in items) + "</section>"


def section(title: str, body: str, note: str = "") -> str:
    tail = f'<p class="note">{e(note)}</p>' if note else ""
    return f"<section><h2>{e(title)}</h2>{body}{tail}</section>"


def page(title: str, meta: str, body: str) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{e(title)}</title>"
            f"<style>{CSS}</style></head><body><header><h1>{e(title)}</h1>"
            f"<div class=\"meta\">{e(meta)}</div></header><main>{body}"
            f"<p class=\"note\">rendered by sglang-warmup report at {stamp}</p></main>"
            "</body></html>\n")


# --- the three documents ---------------------------------------------------------------------
def render(doc: Document) -> str:
    """The page of a saved document."""
    return {RUN: _run, AUDIT: _audit, COVERAGE: _coverage}[doc.kind](doc)


def _f(d: dict, key: str) -> float:
    return as_number(d.get(key))


def _items(d: dict, key: str) -> list:
    """A list field of a saved document (anything else: no items)."""
    value = d.get(key)
    return value if isinstance(value, list) else []


def _run(doc: Document) -> str:
    d = doc.data
    classes = [c for c in d.get("classes") or [] if isinstance(c, dict)]
    by_phase = d.get("compiles_by_phase") if isinstance(d.get("compiles_by_phase"), dict) else {}
    cov = d.get("coverage") if isinstance(d.get("coverage"), dict) else None
    sweeps = sweep_processes(d.get("gemm_sweeps") if isinstance(d.get("gemm_sweeps"), list)
                             else [])
    kept = allocator_kept(d.get("allocator_kept"))[1]
    ok = bool(d.get("ok", True))
    body = [cards([
        ("ok" if ok else "FAILED", "warm-up", "ok" if ok else "bad"),
        (num(d.get("requests") or sum(_f(c, "requests") for c in classes)), "requests", ""),
        (f"{num(d.get('duration_s'), 1)} s", "duration", ""),
        (num(by_phase.get("warmup", 0)), "compiled during the warm-up", ""),
    ] + ([(num(by_phase["serving"]), "compiled while serving",  # written after ready only
           "bad" if by_phase["serving"] else "ok")] if "serving" in by_phase else []) + [
        (str(len(classes)), "classes", ""),
    ] + ([(f"{num(sweeps[0]['duration_s'], 1)} s", "GEMM sweep before it", "")]
         if sweeps else []) + ([(f"{num(kept / 2**20)} MiB", "kept by the allocator", "")]
         if kept > 0 else []) + ([("closed" if cov.get("closed") else "NOT closed", "second replay",
           "ok" if cov.get("closed") else "bad")] if cov else []))]
    body.append(section("Time per class", bars(
        [(str(c.get("shape_class")), [_f(c, "total_ms")]) for c in classes],
        [("warm-up time", BLUE)], unit=" ms"),
        "Each class's requests, in the order the plan sent them."))
    measured = [c for c in _items(cov or {}, "classes")
                if isinstance(c, dict) and isinstance(c.get("latency"), dict)]
    if measured:
        gate = cov.get("first_hit") if isinstance(cov.get("first_hit"), dict) else {}
        body.append(section("First hit against repeat (second replay)", bars(
            [(str(c.get("class")), [_f(c["latency"], "first_ms"), _f(c["latency"], "repeat_ms")])
             for c in measured],
            [("first request after the warm-up", ORANGE), ("the same again", GREEN)],
            unit=" ms"),
            f"Closed needs every class's first hit within {gate.get('max_ratio', 1.1)}x of its "
            f"repeat; slow: {', '.join(map(str, _items(cov, 'slow_classes'))) or 'none'}."))
    body.append(section("Compiles and disk hits per class", bars(
        [(str(c.get("shape_class")), [_f(c, "compiles"), _f(c, "jit_builds"), _f(c, "disk_hits")])
         for c in classes],
        [("Triton compiles", RED), ("nvcc JIT builds", PURPLE), ("disk-cache hits", GREY)],
        stacked=True)))
    if by_phase:
        order = [p for p in ("init", "warmup", "serving") if p in by_phase] + \
            [p for p in by_phase if p not in ("init", "warmup", "serving")]
        body.append(section("Compiles by phase", bars(
            [(str(p), [as_number(by_phase[p])]) for p in order], [("compiles", RED)]),
            "init: model load and graph capture; warmup: this plan; serving: after ready."))
    body.append(section("Timeline of the warm-up", timeline(
        [(str(c.get("shape_class")), _f(c, "total_ms")) for c in classes],
        [BLUE, ORANGE, GREEN, PURPLE, "#56B4E9", RED])))
    skipped = [s for s in d.get("skipped") or [] if isinstance(s, dict)]
    body.append(section("Skipped by the expansion", table(
        ["class", "item", "why"],
        [(s.get("class"), s.get("item") or "(whole class)", s.get("reason")) for s in skipped])))
    failures = [str(f) for f in _items(d, "failures")]
    if failures:
        body.append(section("Failures", table(["failure"], [(f,) for f in failures])))
    meta = (f"{d.get('requests', '')} requests via {d.get('transport', '?')} · flush: "
            f"{d.get('flush') or '–'} · {doc.path}")
    return page(f"Warm-up of plan {d.get('plan')}", meta, "".join(body))


def _audit(doc: Document) -> str:
    d = doc.data
    steps = [s for s in d.get("steps") or [] if isinstance(s, dict)]

    def ms(s: dict, p: str) -> float:
        return _f(s.get(p) if isinstance(s.get(p), dict) else {}, "ms")

    slow = [s for s in steps if s.get("slow_first")]
    body = [cards([
        ("ok" if d.get("ok") else "FAILED", "audit", "ok" if d.get("ok") else "bad"),
        (str(len(steps)), "traffic steps", ""),
        (num(d.get("misses")), "compile events after ready", "bad" if d.get("misses") else "ok"),
        (str(len(slow)), "steps > 1.5x on first pass", "bad" if slow else "ok"),
        (f"{num(d.get('pass1_ms'))} / {num(d.get('pass2_ms'))}", "ms, pass 1 / pass 2", ""),
    ])]
    body.append(section("Every traffic step, first pass against second", bars(
        [(f"{s.get('index')} {s.get('label') or s.get('kind')}", [ms(s, "pass1"), ms(s, "pass2")])
         for s in steps], [("pass 1 (first hit)", ORANGE), ("pass 2", GREEN)], unit=" ms")))
    body.append(section("Slow or compiling steps", table(
        ["step", "label", "prompts", "pass 1 ms", "pass 2 ms", "x", "misses", "slow because"],
        [(s.get("index"), s.get("label") or s.get("kind"),
          "+".join(map(str, _items(s, "prompts")[:6])), num(ms(s, "pass1"), 1),
          num(ms(s, "pass2"), 1), s.get("ratio"), s.get("misses"), s.get("cause") or "–")
         for s in steps if s.get("misses") or s.get("slow_first")], "nnnnnnn")))
    notes = [str(n) for n in d.get("notes") or []]
    if notes:
        body.append(section("Notes", table(["note"], [(n,) for n in notes])))
    meta = f"{d.get('url')} · traffic {d.get('traffic')} · {d.get('mode_note', '')}"
    return page("Audit of a ready server", meta, "".join(body))


def _coverage(doc: Document) -> str:
    d = doc.data
    rows = [c for c in d.get("classes") or [] if isinstance(c, dict)]
    body = [cards([
        ("closed" if d.get("closed") else "NOT closed", "plan", "ok" if d.get("closed") else "bad"),
        (str(len(rows)), "classes", ""),
        (str(len(_items(d, "open_classes"))), "classes still compiling", ""),
        (str(len(_items(d, "slow_classes"))), "classes slow on first hit", ""),
    ])]
    body.append(section("Compile keys per class: first replay, second replay", bars(
        [(str(c.get("class")), [float(len(_items(c, "first"))), float(len(_items(c, "second")))])
         for c in rows], [("first replay (the warm-up)", BLUE), ("second replay", RED)])))
    lat = [c for c in rows if isinstance(c.get("latency"), dict)]
    if lat:
        body.append(section("First hit against repeat (second replay)", bars(
            [(str(c.get("class")), [_f(c["latency"], "first_ms"), _f(c["latency"], "repeat_ms")])
             for c in lat], [("first request", ORANGE), ("the same again", GREEN)], unit=" ms")))
    return page(f"Coverage of plan {d.get('plan')}", doc.path, "".join(body))
