#!/usr/bin/env python3
"""Render the tables of docs/benchmarks.md from an e2e_warmup.py result file.

    python3 scripts/gpu/summarize_e2e.py docs/data/e2e-eager-default.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    d = json.load(open(path))
    print("| graphs | launch | ready (s) | Triton kernels at ready | compiled after ready: Triton / nvcc "
          "| /metrics serving misses | traffic pass 1 / pass 2 (ms) | steps with pass 1 > 1.5x pass 2 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in d.items():
        graphs, launch = name.split("-")
        if r.get("ready_s") is None:
            print(f"| {graphs} | {launch} | not ready | | | | | |")
            continue
        new_t = r["after_pass2"]["triton"] - r["at_ready"]["triton"]
        new_n = r["after_pass2"]["nvcc"] - r["at_ready"]["nvcc"]
        serving = sum(v for k, v in r.get("metrics_after", {}).items()
                      if 'phase="serving"' in k and 'outcome="miss"' in k)
        p1 = sum(x["ms"] for x in r["pass1"])
        p2 = sum(x["ms"] for x in r["pass2"])
        print(f"| {graphs} | {launch} | {r['ready_s']:.0f} | {r['at_ready']['triton']} | {new_t} / {new_n} "
              f"| {serving:.0f} | {p1:,.0f} / {p2:,.0f} | {len(r['slow_first'])} |")
    print()
    print("| graphs | launch | step | prompts | pass 1 (ms) | pass 2 (ms) |")
    print("|---|---|---|---|---|---|")
    for name, r in d.items():
        graphs, launch = name.split("-")
        for a, b in zip(r.get("pass1", []), r.get("pass2", [])):
            if a["ms"] > 1.5 * b["ms"] and a["ms"] - b["ms"] > 5:
                prompts = "+".join(map(str, a["prompts"][:6])) + ("…" if len(a["prompts"]) > 6 else "")
                print(f"| {graphs} | {launch} | {a['i']} {a['label']} | {prompts} | {a['ms']:.0f} | {b['ms']:.0f} |")
    print()
    for name, r in d.items():
        if r.get("new_entries"):
            print(f"- {name}: new Triton cache entries after ready: " + ", ".join(
                sorted({e.split(':', 1)[1] for e in r['new_entries']})) + f" ({len(r['new_entries'])})")


if __name__ == "__main__":
    main(sys.argv[1])
