#!/usr/bin/env python3
"""Where a launch spends its start: SGLang's own time-stamped milestones, read from the
``NAME-startup.log`` files ``first_hits.py`` keeps at ready, side by side for several launches.

    python3 scripts/gpu/startup_timeline.py DIR/NAME-startup.log ... [--ready NAME=SECONDS,...]
        [--json OUT.json]

Each column is a launch; each row the seconds from the launch's first logged line to a
milestone (SGLang logs whole seconds), and the rows the user waits for: the time before the
first line (Python's start and SGLang's imports in the launching process, plus the delay
until the harness's ``/health`` poll, every 3 s, saw the server ready, and up to a second of
SGLang's whole-second stamps: ``ready_s`` less the "ready to roll" line; ``ready_s`` from the
log's first line, or ``--ready`` for logs written without it) and the time to ready.  The
stages between milestones are what to compare: the scheduler's start, the weights, the GEMM
sweep, the prefill- and decode-graph captures, the warm-up, and what follows it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path

#: SGLang's time stamp, with the rank tag of a tensor- or data-parallel scheduler (``TP0``)
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: [^\]]*)?\] (.*)$")
HEAD = re.compile(r"^# launch (\S+) t0=\S+ ready_s=(\S+)")
#: (milestone, pattern); the first line matching each counts
MILESTONES = [
    ("scheduler process up", re.compile(r"Init torch distributed begin")),
    ("weights loaded", re.compile(r"Load weight end")),
    ("GEMM sweep done", re.compile(r"sglang-warmup: GEMM sweep: ")),
    # SGLang 0.5.17 logs "Capture target prefill CUDA graph ..." for a breakable prefill graph
    # before "Capture target decode CUDA graph ..."; older logs name no kind (decode graphs)
    ("prefill graphs: capture begins", re.compile(r"Capture .*prefill CUDA graph begin")),
    ("prefill graphs: captured", re.compile(r"Capture .*prefill CUDA graph end")),
    ("decode graphs: capture begins", re.compile(r"Capture (?!.*prefill).*CUDA graph begin")),
    ("decode graphs: captured", re.compile(r"Capture (?!.*prefill).*CUDA graph end")),
    ("warm-up begins", re.compile(r"Running warmup")),
    ("warm-up ends (after its flush)", re.compile(r"warm-up \S+: ok")),
    ("SGLang: ready to roll", re.compile(r"fired up and ready to roll")),
]


def timeline(path: Path, ready: dict[str, float]) -> dict:
    name = path.name.removesuffix("-startup.log")
    first: dt.datetime | None = None
    marks: dict[str, float] = {}
    ready_s = ready.get(name)
    for line in path.read_text(errors="replace").splitlines():
        head = HEAD.match(line)
        if head:
            name = head.group(1)
            ready_s = float(head.group(2)) if head.group(2) != "None" else ready.get(name)
            continue
        m = STAMP.match(line)
        if not m:
            continue
        t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        first = first or t
        for label, pattern in MILESTONES:
            if label not in marks and pattern.search(m.group(2)):
                marks[label] = (t - first).total_seconds()
    out = {"name": name, "ready_s": ready_s, "from_first_line": marks}
    last = marks.get("SGLang: ready to roll")
    if ready_s is not None and last is not None:
        out["before_first_line_s"] = round(ready_s - last, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--ready", default="", help="NAME=SECONDS,... for logs without a head line")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    ready: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in a.ready.split(","))):
        name, sep, value = item.partition("=")
        try:
            ready[name.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"--ready: {item!r} is not NAME=SECONDS") from None
        if not sep:
            raise SystemExit(f"--ready: {item!r} is not NAME=SECONDS")
    rows = [timeline(p, ready) for p in a.logs]
    print("| seconds | " + " | ".join(r["name"] for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    print("| before SGLang's first line, and the readiness poll | "
          + " | ".join(str(r.get("before_first_line_s", "")) for r in rows) + " |")
    for label, _ in MILESTONES:
        cells = [r["from_first_line"].get(label) for r in rows]
        if any(c is not None for c in cells):
            print(f"| {label} | " + " | ".join("" if c is None else f"{c:.0f}" for c in cells)
                  + " |")
    print("| **ready** (the harness's `/health`) | "
          + " | ".join(str(r["ready_s"]) for r in rows) + " |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
