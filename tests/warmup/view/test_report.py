"""sglang-warmup report: saved documents identified (or refused in one line), rendered for a
terminal, and as one self-contained HTML page that a real headless Chromium draws."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmup.coverage.classes import ClassLatency, compute
from warmup.cli import main
from warmup.errors import WarmupError, shown
from warmup.serve.report import ClassReport, RunReport
from warmup.view import documents, html, text

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def run_report(tmp_path: Path) -> Path:
    """A run report with a second replay's coverage, as the --warmups hook writes it."""
    classes = (ClassReport("extend_int_classes", "extends", "extend", steps=16, requests=16,
                           total_ms=9271.0, compiles=9, jit_builds=1),
               ClassReport("input_logprobs", "features", "extend", steps=2, requests=2,
                           total_ms=57.0, disk_hits=2),
               ClassReport("concurrency_buckets", "features", "decode", steps=12, requests=1213,
                           total_ms=1235.0, compiles=1))
    run = RunReport(plan="default", plan_sha256="x", expansion_digest="d",
                    transport="InProcessTransport", started_at=1.0, duration_s=15.9,
                    flush="flushed on 1 rank(s)", classes=classes,
                    skipped=({"phase": "long_context", "class": "past_context_bucket",
                              "item": "", "reason": "the prefill CUDA graph is disabled"},),
                    compiles_total=39, compiles_by_phase={"init": 26, "warmup": 13},
                    gemm_sweeps=({"pid": 7, "shapes": 4, "calls": 7343, "rows_reached": 8192,
                                  "max_rows": 8192, "duration_s": 2.43,
                                  "stopped_by_budget": False},),
                    allocator_kept=({"pid": 7, "kept_bytes": 3390 << 20},))
    cov = compute((), (), classes=[c.shape_class for c in classes], plan="default",
                  latency={"extend_int_classes": ClassLatency(40.0, 38.0, 1.1),
                           "input_logprobs": ClassLatency(30.0, 12.0, 2.6),
                           "concurrency_buckets": ClassLatency(200.0, 190.0, 1.05)})
    doc = run.to_dict()
    doc["coverage"] = cov.to_json()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_run_report_renders_for_the_terminal(tmp_path, capsys):
    path = run_report(tmp_path)
    code, out, err = cli(capsys, "report", str(path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{path}: run report"
    assert lines[1] == ("warm-up default: ok, 1,231 requests in 15.9 s via InProcessTransport; "
                        "flush: flushed on 1 rank(s)")
    assert lines[2].split() == ["phase", "class", "requests", "ms", "ms/request", "failed",
                                "compiles", "jit", "disk", "hits", "first/repeat"]
    rows = {line.split()[1]: line.split() for line in lines[4:7]}
    # compiles, JIT builds and disk hits apart; first/repeat from the second replay
    assert rows["extend_int_classes"][6:10] == ["9", "1", "0", "1.05x"]
    assert rows["input_logprobs"][6:10] == ["0", "0", "2", "2.50x"]
    assert "compiles by phase: init=26, warmup=13" in lines
    assert next(x for x in lines if x.startswith("compiled after ready: ")).startswith(
        "compiled after ready: not measured (the report is written before the server takes "
        "traffic): `sglang-warmup audit --url URL --traffic FILE --state-dir DIR`")
    assert ("GEMM sweep before the warm-up: 1 scheduler(s), 4 shapes, rows 1-8192 of 8192, "
            "2.4 s") in lines
    assert ("the warm-up's flush kept the caching allocator's blocks in 1 scheduler(s), at most "
            "3,390 MiB cached and unused in one (WARMUP_KEEP_ALLOCATOR=0 empties them)") in lines
    assert ("skipped class past_context_bucket: the prefill CUDA graph is disabled") in lines
    assert "plan default NOT closed: first hit over 1.1x its repeat in input_logprobs" in lines


def test_terminal_tables_fit_the_terminal(tmp_path, capsys, monkeypatch):
    """On a terminal of 80 columns every line fits: the bar, ms/request, phase and failed
    columns go first, then long class names are cut, and sentences wrap.  Off a terminal
    (a file, a pipe) every column is kept."""
    from warmup.cli import output

    path = run_report(tmp_path)
    data = json.loads(path.read_text())
    data["classes"][0]["shape_class"] = "a_class_name_far_too_long_for_a_narrow_terminal_x"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(output, "width", lambda: 80)
    monkeypatch.chdir(tmp_path)                   # a short path on the first line
    code, out, _ = cli(capsys, "report", "report.json")
    assert code == 0 and max(map(len, out.splitlines())) <= 80, out
    head = next(x for x in out.splitlines() if x.startswith("class "))
    assert head.split() == ["class", "requests", "ms", "compiles", "jit", "disk", "hits",
                            "first/repeat"]
    assert any(x.startswith("a_class_name_far_too_l…") for x in out.splitlines())
    monkeypatch.setattr(output, "width", lambda: None)
    code, wide, _ = cli(capsys, "report", str(path))
    assert max(map(len, wide.splitlines())) > 150 and "█" in wide


def test_the_html_page_is_self_contained_and_escaped(tmp_path):
    path = run_report(tmp_path)
    data = json.loads(path.read_text())
    data["classes"][0]["shape_class"] = "<script>alert(1)</script>"
    path.write_text(json.dumps(data))
    page = html.render(documents.load(path))
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http://" not in page and "https://" not in page  # nothing fetched at view time
    assert "2.4 s" in page and "GEMM sweep before it" in page       # the sweep's card
    assert "3,390 MiB" in page and "kept by the allocator" in page   # the allocator's card
    data["gemm_sweeps"] = [{"pid": "<b>", "duration_s": "<i>", "capped_rows": 3,
                            "capped_shape": " "}, "x"]             # hostile: no card text
    data["allocator_kept"] = [{"pid": "<b>", "kept_bytes": "<i>"}, None, {"kept_bytes": True}]
    path.write_text(json.dumps(data))
    hostile = html.render(documents.load(path))
    assert "<b>" not in hostile and "<i>" not in hostile and "kept by the allocator" not in hostile


def test_numbers_too_large_or_not_finite_render_as_nothing(tmp_path, capsys):
    """An integer of 400 digits does not fit a float, NaN and infinity are not sizes: the
    views show no number for them instead of failing."""
    path = run_report(tmp_path)
    data = json.loads(path.read_text())
    data["duration_s"] = 10 ** 400
    data["allocator_kept"] = [{"pid": 1, "kept_bytes": 10 ** 400}, {"kept_bytes": -5}]
    data["gemm_sweeps"][0]["duration_s"] = 10 ** 400
    path.write_text(json.dumps(data).replace('"rows_reached": 8192', '"rows_reached": NaN'))
    code, out, err = cli(capsys, "report", str(path))
    assert code == 0, err
    assert ("the warm-up's flush kept the caching allocator's blocks in 2 scheduler(s) "
            "(WARMUP_KEEP_ALLOCATOR=0 empties them)") in out.splitlines()
    assert "nan" not in out.lower() and "inf" not in out.lower()
    page = html.render(documents.load(path))
    assert "kept by the allocator" not in page and "NaN" not in page
    for title in ("Legend", "Compiles after ready", "First hit against repeat, per class",
                  "Time per class", "Compiles and disk hits per class", "Compiles by phase",
                  "Timeline of the warm-up", "Skipped by the expansion"):
        assert f"<h2>{title}</h2>" in page


def _section(page: str, title: str) -> str:
    start = page.index(f"<h2>{title}</h2>")
    return page[start:page.index("</section>", start)]


def test_the_page_tells_not_measured_from_nothing_compiled_after_ready(tmp_path):
    """A report written before ready cannot know what compiled after it: the page says so and
    how to measure it; one that knows (a 'serving' phase) shows the count, 0 included."""
    path = run_report(tmp_path)
    page = html.render(documents.load(path))
    assert "Not measured: this report is written before the server takes traffic" in \
        _section(page, "Compiles after ready")
    assert "<code>sglang-warmup audit --url URL --traffic FILE --state-dir DIR</code>" in page
    assert "serving (after ready)" in _section(page, "Compiles by phase")
    assert "not measured" in _section(page, "Compiles by phase")
    data = json.loads(path.read_text())
    data["compiles_by_phase"]["serving"] = 0
    path.write_text(json.dumps(data))
    page = html.render(documents.load(path))
    assert "Nothing compiled after ready (0 compile events)." in page
    assert "not measured" not in _section(page, "Compiles by phase")
    text_out = text.render(documents.load(path))
    assert "compiled after ready: 0" in text_out.splitlines()


def test_first_hit_against_repeat_and_compiles_apart_from_disk_hits(tmp_path):
    path = run_report(tmp_path)
    page = html.render(documents.load(path))
    first = _section(page, "First hit against repeat, per class")
    assert "input_logprobs · first hit: 30.0 ms" in first and "repeat: 12.0 ms" in first
    assert "slow: input_logprobs" in first
    compiles = _section(page, "Compiles and disk hits per class")
    # one bar and one number per measure: 9 compiles, 1 JIT build, 0 disk hits (not 10)
    assert 'title="extend_int_classes · Triton compiles: 9"' in compiles
    assert 'title="extend_int_classes · JIT builds: 1"' in compiles
    assert 'title="extend_int_classes · disk hits: 0"' in compiles
    assert ": 10\"" not in compiles
    data = json.loads(path.read_text())
    data["coverage"] = None
    path.write_text(json.dumps(data))
    page = html.render(documents.load(path))
    assert "Not measured: this run had no second replay." in page
    assert "<code>sglang-warmup serve --second-pass</code>" in page


def test_the_timeline_names_every_class_in_full(tmp_path):
    path = run_report(tmp_path)
    data = json.loads(path.read_text())
    long = "a_class_whose_name_is_much_longer_than_its_share_of_the_strip"
    data["classes"][1]["shape_class"] = long
    path.write_text(json.dumps(data))
    timeline = _section(html.render(documents.load(path)), "Timeline of the warm-up")
    assert f"<td>{long}</td>" in timeline and "…" not in timeline
    assert timeline.count('<i class="sw"') == 3


def test_audit_and_coverage_documents(tmp_path, capsys):
    audit = tmp_path / "audit-1.json"
    audit.write_text(json.dumps({
        "format": "sglang-warmup-audit", "version": 1, "url": "http://127.0.0.1:30000",
        "traffic": "t.jsonl", "mode_note": "compile log", "ok": True, "misses": 0,
        "pass1_ms": 120.0, "pass2_ms": 60.0, "steps": [
            {"index": 0, "kind": "single", "label": "logprobs_from_0", "prompts": [300],
             "features": {"return_logprob": True, "logprob_start_len": 0},
             "pass1": {"ms": 100.0, "misses": 0}, "pass2": {"ms": 20.0, "misses": 0},
             "misses": 0, "slow_first": True, "ratio": 5.0,
             "cause": "first use of input logprobs, logprobs"},
            {"index": 1, "kind": "burst", "prompts": [20, 30], "pass1": {"ms": 20.0},
             "pass2": {"ms": 40.0}, "misses": 0, "slow_first": False}]}))
    code, out, _ = cli(capsys, "report", str(audit))
    assert code == 0
    assert out.splitlines()[:2] == [
        f"{audit}: audit report",
        "audit of http://127.0.0.1:30000: 2 traffic steps from t.jsonl, sent twice (pass 1 120 "
        "ms, pass 2 60 ms)"]
    assert "compiled after ready: 0 compile event(s); --max-misses 0: ok" in out.splitlines()
    assert "first use of input logprobs, logprobs" in out
    assert "median step with nothing recorded, pass 1 over pass 2: 2.75x (2 steps)" in out
    assert "slower throughout" not in out  # two steps say nothing of a whole pass
    page = html.render(documents.load(audit))
    assert "first use of input logprobs, logprobs" in page
    assert "compiled after ready" in page
    cov = tmp_path / "coverage.json"
    cov.write_text(json.dumps(json.loads(run_report(tmp_path).read_text())["coverage"]))
    assert documents.load(cov).kind == documents.COVERAGE
    assert documents.load(tmp_path).kind == documents.RUN  # a state directory: report.json


@pytest.mark.parametrize("content, message", [
    ('{"format": "sglang-warmup-run", "version": 2, "plan": "p", "classes": []}',
     "a run report of format version 2, newer than this sglang-warmup reads (1)"),
    ('{"format": "sglang-warmup-run", "version": 1, "plan": "p", "classes": [1]}',
     "a run report whose classes are not objects"),
    ('{"format": "sglang-warmup-audit", "version": 1, "url": "u", "steps": [{"prompts": []}]}',
     "steps[0]: prompts: expected a non-empty list of positive integers"),
    ('{"format": "sglang-warmup-audit", "version": 1, "url": "u", "steps": '
     '[{"prompts": [3], "pass1": {"ms": "slow"}}]}',
     "steps[0].pass1.ms: expected a number from 0 to 10^12, not 'slow'"),
    ("{oops", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
              "(char 1)"),
])
def test_a_file_of_another_kind_or_version_is_one_line(tmp_path, content, message):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(WarmupError) as err:
        documents.load(p)
    assert err.value.message == f"{p}: {message}"


@pytest.mark.parametrize("content, what", [
    ('{"format": "sglang-warmup-cache-archive", "version": 1, "entries": []}',
     "a cache archive's manifest"),
    ('{"event": "miss", "phase": "warmup"}', "a compile-log line"),
    ('[1, 2]', "a JSON list of 2 value(s)"),
    ('{"format": ["sglang-warmup-run"], "plan": "p", "classes": []}',
     "a JSON document (benchmark data and the like)"),
])
def test_any_other_json_document_is_an_outline_of_its_fields(tmp_path, capsys, content, what):
    p = tmp_path / "x.json"
    p.write_text(content)
    code, out, err = cli(capsys, "report", str(p), "--html", str(tmp_path / "x.html"))
    assert code == 0, err
    assert out.splitlines()[:2] == [f"{p}: JSON document", what]
    assert (tmp_path / "x.html").read_text().startswith("<!doctype html>")


DATA = REPO / "docs" / "data"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_every_benchmark_file_under_docs_data_renders(name, tmp_path, capsys):
    """`report` accepts every JSON document the project writes: the benchmark files show the
    run reports they hold (at their JSON path), then their own fields and tables."""
    code, out, err = cli(capsys, "report", str(DATA / name), "--html", str(tmp_path / "b.html"))
    assert code == 0, err
    assert out.splitlines()[0] == f"{DATA / name}: JSON document"
    held = [x for x in out.splitlines() if x.startswith("== ") and x.endswith(": run report")]
    assert len(held) == EMBEDDED.get(name, 0), held
    page = (tmp_path / "b.html").read_text()
    assert page.count('<article class="part">') == len(held)


#: the run reports held by the benchmark files (the GPU scripts keep each launch's report)
EMBEDDED = {"buckets-lo1-eager.json": 1, "dsv4-h200-abc.json": 3, "dsv4-h200-c128.json": 2,
            "e2e-eager-default.json": 2, "e2e-features-abc-freeze.json": 2,
            "e2e-features-abc-logprob-rows.json": 2, "e2e-features-abc-long256.json": 2,
            "e2e-features-abc-trimmed.json": 2, "e2e-features-default.json": 1,
            "e2e-features-eager.json": 1, "e2e-features-gc.json": 4, "e2e-solo.json": 6,
            "sampling4-eager.json": 1, "dsv4-eager-restored-plan4-reports.json": 3,
            "dsv4-bcg-C-cold-reports.json": 1, "dsv4-eager-steps-reports.json": 3,
            "dsv4-eager-restart-steps-reports.json": 4, "dsv4-eager-chained-steps-reports.json": 7,
            "dsv4-eager-learned-rows-bake.json": 6, "dsv4-eager-host-probe-bake.json": 5,
            "dsv4-bcg-record-bake.json": 7, "dsv4-eager-reserve-bake.json": 7,
            "dsv4-eager-sites-bake.json": 8}


def test_a_benchmark_file_shows_its_report_and_its_rows(capsys):
    code, out, _ = cli(capsys, "report", str(DATA / "e2e-features-default.json"))
    assert code == 0
    lines = out.splitlines()
    assert lines[3] == f"== {DATA / 'e2e-features-default.json'}: default-C.report: run report"
    assert lines[4].startswith("warm-up default: ok, 1,711 requests in 13.1 s")
    assert "default-A.ready_s  107.069" in " ".join(lines) or any(
        x.split() == ["default-A.ready_s", "107.069"] for x in lines)
    assert "default-A.pass1:" in lines      # a list of flat rows is one table


def test_the_html_file_is_not_overwritten_without_yes(tmp_path, capsys):
    path = run_report(tmp_path)
    out = tmp_path / "r.html"
    out.write_text("mine")
    code, _, err = cli(capsys, "report", str(path), "--html", str(out))
    assert code == 1 and out.read_text() == "mine"
    assert err.splitlines()[0] == f"error: --html {out} exists"
    code, _, err = cli(capsys, "report", str(path), "--html", str(out), "-y")
    assert code == 0 and out.read_text().startswith("<!doctype html>")


def _png_colours(png: bytes) -> int:
    """How many distinct pixel colours an 8-bit RGB(A) PNG has (a blank page has one)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        chunk = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8
            channels = {2: 3, 6: 4}[colour]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    seen, prev = set(), bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 8 == 0:
            seen.update(bytes(line[i:i + 3]) for i in range(0, stride, channels * 8))
        prev = line
    return len(seen)


#: Appended to a copy of the page (the page itself has no script): what Chromium laid out.
PROBE = """<script>
const out = {width: innerWidth, scroll: document.documentElement.scrollWidth, clipped: [],
             outside: [], bars: document.querySelectorAll(".bar").length,
             swatches: document.querySelectorAll(".legend .sw").length,
             sections: [...document.querySelectorAll("h2")].map(h => h.textContent)};
for (const el of document.querySelectorAll("main *")) {
  if (el.closest(".scroll")) continue;           // a wide table scrolls in its own box
  const text = el.children.length === 0 ? el.textContent.trim() : "";
  if (text && el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflow !== "visible")
    out.clipped.push(text.slice(0, 60));
  if (el.getBoundingClientRect().right > innerWidth + 1) out.outside.push(el.className || el.tagName);
}
const pre = document.createElement("pre");
pre.id = "probe";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _audit_doc(tmp_path: Path) -> Path:
    steps = [{"index": i, "kind": "single", "label": f"step_with_a_rather_long_label_{i}",
              "prompts": [300 + i], "pass1": {"ms": 40.0 + 30 * (i % 3), "misses": i % 2,
                                                "keys": [{"name": "kernel_" + str(i),
                                                          "hash": "ab" * 20, "compiled": 1}]
                                                if i % 2 else []},
              "pass2": {"ms": 20.0}} for i in range(8)]
    path = tmp_path / "audit-1.json"
    path.write_text(json.dumps({"format": "sglang-warmup-audit", "version": 1, "url": "http://h:1",
                                "traffic": "t.jsonl", "mode_note": "compile log", "steps": steps,
                                "max_misses": 0}))
    return path


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/test.sh installs it)")
@pytest.mark.parametrize("kind", ["run", "audit", "benchmark"])
@pytest.mark.parametrize("width", [900, 1400])
def test_chromium_draws_the_page_from_900_px_up(tmp_path, kind, width):
    """The page as a user sees it, in a real headless Chromium at two widths: a screenshot with
    the charts' colours in it, and (a copy of the page with a probe script) nothing wider than
    the window, no text cut, every chart and legend laid out."""
    source = {"run": lambda: run_report(tmp_path), "audit": lambda: _audit_doc(tmp_path),
              "benchmark": lambda: DATA / "e2e-features-default.json"}[kind]()
    page = tmp_path / "report.html"
    page.write_text(html.render(documents.load(source)))
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
             f"--window-size={width},2400"]
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], check=True,
                   capture_output=True, timeout=120)
    assert _png_colours(shot.read_bytes()) > 8, "the screenshot is (nearly) blank"
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([*flags, "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    import html as html_lib
    import re

    laid = json.loads(html_lib.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom,
                                                  re.S).group(1)))
    assert laid["width"] == width
    assert laid["scroll"] <= width and laid["outside"] == [], laid
    assert laid["clipped"] == [], laid
    assert laid["bars"] >= 8 and laid["swatches"] >= 2, laid
    if kind == "run":
        assert {"Legend", "Compiles after ready", "First hit against repeat, per class",
                "Compiles and disk hits per class", "Timeline of the warm-up"} <= set(
            laid["sections"])


def test_the_run_report_names_what_no_plan_class_warms():
    from warmup.view.text import run_report as render

    report = RunReport(plan="p", plan_sha256="", expansion_digest="", transport="T",
                       started_at=0.0,
                       skipped=({"phase": "long_context", "class": "c128_widths",
                                 "item": "65574..1048448", "reason": "prompts of 65574..1048448 "
                                 "tokens are not warmed"},
                                {"phase": "b", "class": "mixed", "item": "",
                                 "reason": "mixed chunk is off"}),
                       warnings=("SGLANG_JIT_DEEPGEMM_PRECOMPILE is off: ...",))
    lines = render(report).splitlines()
    assert "not warmed: c128_widths: prompts of 65574..1048448 tokens are not warmed" in lines
    assert "warning: SGLANG_JIT_DEEPGEMM_PRECOMPILE is off: ..." in lines
    assert report.to_dict()["warnings"] == ["SGLANG_JIT_DEEPGEMM_PRECOMPILE is off: ..."]


# --- hostile saved documents: rendered, or one line naming the file and the field --------------
@pytest.mark.parametrize("doc, message", [
    ({"format": "sglang-warmup-coverage", "version": 1, "plan": "p",
      "classes": [{"class": "c", "first": ["x"]}]},
     "classes[0].first[0]: expected an object, not 'x'"),
    ({"format": "sglang-warmup-coverage", "version": 1, "plan": "p",
      "classes": [{"class": "c", "second": [{"compiled": "2"}]}]},
     "classes[0].second[0].compiled: expected an integer from 0 to 10^12, not '2'"),
    ({"format": "sglang-warmup-coverage", "version": 1, "plan": "p",
      "classes": [{"class": "c", "latency": {"first_ms": -1}}]},
     "classes[0].latency.first_ms: expected a number from 0 to 10^12, not -1"),
    ({"format": "sglang-warmup-coverage", "version": 1, "plan": "p",       # no float holds it
      "classes": [{"class": "c", "second": [{"seconds": 10**400}]}]},
     "classes[0].second[0].seconds: expected a number from 0 to 10^12, not " + shown(10**400)),
    ({"format": "sglang-warmup-run", "version": 1, "plan": "p", "classes": [],
      "coverage": {"plan": "p", "classes": [], "outside_second": {"a": 1}}},
     "coverage.outside_second: expected a list of objects, not {'a': 1}"),
])
def test_a_damaged_document_is_one_line_naming_the_field(tmp_path, capsys, doc, message):
    p = tmp_path / "doc.json"
    p.write_text(json.dumps(doc))
    for argv in (("report", str(p)), ("report", str(p), "--html", str(tmp_path / "o.html"))):
        code, _, err = cli(capsys, *argv)
        assert code == 1 and err.splitlines()[0] == f"error: {p}: {message}", err
    if doc.get("format") == "sglang-warmup-coverage":
        code, _, err = cli(capsys, "coverage", str(p))
        assert code == 1 and err.splitlines()[0] == f"error: {p}: {message}"


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5))
_KEYS = st.sampled_from([
    "plan", "classes", "steps", "url", "class", "first", "second", "latency", "first_ms",
    "repeat_ms", "ratio", "requests", "ms", "compiles", "name", "compiled", "disk_hits", "failed",
    "pass1", "pass2", "misses", "prompts", "kind", "closed", "open_classes", "slow_classes",
    "skipped", "reason", "keys", "coverage", "outside_first", "outside_second", "first_hit",
    "second_pass_failures", "gemm_sweeps", "allocator_kept", "compiles_by_phase", "notes"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=5)), max_leaves=25)
_KINDS = [("sglang-warmup-run", {"plan": "x", "classes": []}, "classes"),
          ("sglang-warmup-audit", {"steps": [], "url": "u"}, "steps"),
          ("sglang-warmup-coverage", {"plan": "x", "classes": []}, "classes")]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(_KINDS), st.dictionaries(_KEYS, _VALUES, max_size=6),
       st.lists(st.dictionaries(_KEYS, _VALUES, max_size=6), max_size=3), st.booleans())
def test_saved_documents_render_or_refuse_in_one_line(tmp_path_factory, kind, extra, rows, page):
    """Whatever a saved run report, audit or coverage record holds, `report` renders it or
    refuses it in one line naming the file (the terminal summary and the HTML page alike)."""
    fmt, base, rows_key = kind
    doc = {**base, **extra, "format": fmt, "version": 1}
    if isinstance(doc.get(rows_key), list):
        doc[rows_key] = rows
    d = tmp_path_factory.mktemp("doc")
    (d / "doc.json").write_text(json.dumps(doc))
    argv = ["report", str(d / "doc.json")] + (["--html", str(d / "o.html")] if page else [])
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code in (0, 1, None)
