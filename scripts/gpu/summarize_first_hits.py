#!/usr/bin/env python3
"""Attribute every slow first-pass step of a ``first_hits.py`` run to its cause, and keep a
trimmed copy of the run for docs/data/.

    python3 scripts/gpu/summarize_first_hits.py RUN.json [--out docs/data/first-hits-NAME.json]
        [--ratio 1.5]

For each step whose first pass took more than ``--ratio`` times its repeat, the cause is read
off the probes that ran beside it, in this order: JIT cache files that appeared during the
step (by library: DeepGEMM, Triton, Inductor, TileLang, FlashInfer, SGLang's and tvm-ffi's
nvcc modules), the compiler processes the server started (nvcc, ptxas, ...), the compile-log
events our hooks wrote, and the scheduler's Python stack samples (the frame the step spent
most of its time under).  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cache_tools.compile_log import is_miss  # noqa: E402  (the repository's, not installed)

LIBRARIES = {"deep_gemm": "DeepGEMM", "triton": "Triton", "inductor": "Inductor",
             "tilelang": "TileLang", "flashinfer": "FlashInfer", "sglang_jit": "SGLang JIT",
             "tvm_ffi": "tvm-ffi", "nv": "driver PTX"}
COMPILERS = re.compile(r"\b(nvcc|ptxas|cicc|ninja|c\+\+|g\+\+|gcc)\b")


def compilers(procs: list[dict]) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for p in procs or ():
        words = p.get("cmd", "").split()
        if not words:
            continue
        m = COMPILERS.search(words[0].rsplit("/", 1)[-1])
        if m:
            out[m.group(1)] += 1
    return out


def top_frame(stacks: list[dict], window: str) -> str:
    """The scheduler's deepest frames the step spent most time under."""
    for s in stacks:
        if s.get("window") == window and s.get("role") == "scheduler" and s.get("stacks"):
            stack, seconds = s["stacks"][0]
            frames = stack.split(";")
            return f"{';'.join(frames[-2:])} ({seconds:.2f} s of {s.get('wall_s', 0):.2f} s)"
    return ""


def cause(row: dict) -> str:
    parts = []
    counts = row.get("new_file_counts") or {}
    procs = compilers(row.get("procs") or [])
    if counts.get("deep_gemm"):
        kernels = sorted({f.split("/")[1].split(".")[1] for f in row["new_files"]["deep_gemm"]
                          if f.startswith("cache/kernel.")})
        parts.append(f"DeepGEMM JIT: {counts['deep_gemm'] // 2} kernel(s) built with nvcc "
                     f"({', '.join(kernels)})")
    events = collections.Counter((e.get("event"), e.get("compiler")) for e in
                                 row.get("compile_events") or ())
    misses = events.get(("miss", "triton"), 0)
    if counts.get("triton") or misses:
        names = sorted({e.get("name") for e in row.get("compile_events") or ()
                        if e.get("event") == "miss" and e.get("name")})
        parts.append(f"Triton: {misses} compile(s)" + (f" ({', '.join(names[:4])})" if names else ""))
    if counts.get("inductor"):
        parts.append(f"Inductor: graph compiled ({counts['inductor']} cache files)")
    for kind in ("tilelang", "flashinfer", "sglang_jit", "tvm_ffi", "nv"):
        if counts.get(kind):
            parts.append(f"{LIBRARIES[kind]}: {counts[kind]} new cache files")
    if procs and not parts:
        parts.append("compiler processes: " + ", ".join(f"{k} x{v}" for k, v in procs.items()))
    return "; ".join(parts) or "no compile seen"


def compiled(row: dict) -> dict[str, int]:
    """The compiles the compile log put on a step, by compiler: a Triton miss, a JIT build that
    built (what 'compiles after ready' counts)."""
    return dict(collections.Counter(e.get("compiler") or "?"
                                    for e in row.get("compile_events") or () if is_miss(e)))


def by_compiler(rows: list[dict]) -> dict[str, int]:
    out: collections.Counter = collections.Counter()
    for r in rows:
        out.update(compiled(r))
    return dict(sorted(out.items()))


def recorded(row: dict) -> str:
    events = collections.Counter(f"{e.get('event')}/{e.get('compiler')}@{e.get('phase')}"
                                 for e in row.get("compile_events") or ()
                                 if e.get("event") in ("miss", "jit_build", "dynamo"))
    return ", ".join(f"{k} x{v}" for k, v in sorted(events.items())) or "nothing"


def median_ratio(rows: list[dict]) -> float:
    """The median step's first over repeat, from the times (the rows' ratios are rounded)."""
    ratios = [r["first_ms"] / max(r["repeat_ms"], 0.001) for r in rows]
    return statistics.median(ratios) if ratios else 0.0


def host_text(row: dict) -> str:
    """The server's and the rest of the host's CPU seconds, first against repeat (runs whose
    harness sampled the host)."""
    a, b = row.get("host") or {}, row.get("repeat_host") or {}
    if "server_cpu_s" not in a or "server_cpu_s" not in b:
        return ""
    return (f"; server CPU {a['server_cpu_s']:.2f} / {b['server_cpu_s']:.2f} s, others "
            f"{a['other_cpu_s']:.2f} / {b['other_cpu_s']:.2f} s, stolen "
            f"{a.get('steal_s', 0):.2f} / {b.get('steal_s', 0):.2f} s, cores {a['cpu_mhz'][1]} / "
            f"{b['cpu_mhz'][1]} MHz, SM {a['sm_mhz'][1]} / {b['sm_mhz'][1]} MHz"
            + sched_text(a, b))


def sched_text(a: dict, b: dict) -> str:
    """The server's user and system seconds, run-queue wait, involuntary switches and minor
    faults, first against repeat (runs whose harness read them)."""
    if "user_s" not in a or "user_s" not in b:
        return ""
    return (f", user {a['user_s']:.2f} / {b['user_s']:.2f} s, system {a['sys_s']:.2f} / "
            f"{b['sys_s']:.2f} s, run-queue wait {a['run_delay_s']:.3f} / "
            f"{b['run_delay_s']:.3f} s, involuntary switches {a['ivcs']} / {b['ivcs']}, "
            f"minor faults {a['minflt']} / {b['minflt']}")


def later_passes(run: dict) -> dict:
    """Runs sent more than twice (``traffic --passes N``): every pass's total and step times,
    and per pair of passes how many steps ran 1.5x or more over the other: on a server warm
    since pass 1, pass 3 against pass 2 has no first-time cost to pay, so its count is what
    the host alone gives."""
    passes = {k: v for k, v in run["passes"].items() if k.isdigit()}
    if len(passes) <= 2:
        return {}
    ms = {k: [r.get("ms") for r in v] for k, v in sorted(passes.items())}
    out: dict = {"pass_totals_ms": {k: round(sum(x for x in v if x), 1) for k, v in ms.items()},
                 "pass_steps_ms": ms, "pairs": {}}
    for a in ms:
        for b in ms:
            if a == b:
                continue
            rs = [x / y for x, y in zip(ms[a], ms[b]) if x and y]
            out["pairs"][f"{a}/{b}"] = {"total": round(out["pass_totals_ms"][a]
                                                       / max(out["pass_totals_ms"][b], 1), 3),
                                        "worst": round(max(rs), 2) if rs else None,
                                        "at_or_above_1.5": sum(r >= 1.5 for r in rs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--out")
    ap.add_argument("--ratio", type=float, default=1.5)
    a = ap.parse_args()
    run = json.loads(Path(a.run).read_text())
    p1, p2 = run["passes"].get("1", []), run["passes"].get("2", [])
    rows = []
    total1 = sum(r.get("ms") or 0 for r in p1)
    total2 = sum(r.get("ms") or 0 for r in p2)
    for first, repeat in zip(p1, p2):
        if "ms" not in first or "ms" not in repeat:
            continue
        ratio = first["ms"] / max(repeat["ms"], 0.001)
        step = run["steps"][first["i"]]
        rows.append({"i": first["i"], "label": first["label"], "prompts": step["prompts"],
                     "max_new_tokens": step["max_new_tokens"], "first_ms": first["ms"],
                     "repeat_ms": repeat["ms"], "ratio": round(ratio, 2),
                     "slow": ratio > a.ratio, "cause": cause(first),
                     "recorded": recorded(first), "repeat_cause": cause(repeat),
                     "compiles": compiled(first), "repeat_compiles": compiled(repeat),
                     "stack": top_frame(run.get("stacks") or [], f"p1:s{first['i']}"),
                     "new_file_counts": first.get("new_file_counts"),
                     "compilers": dict(compilers(first.get("procs") or [])),
                     "gpu_mib": first.get("gpu_mib"),
                     "host": first.get("host"), "repeat_host": repeat.get("host")})
    launch = run["launch"]
    print(f"{run['name']}: ready after {launch.get('ready_s')} s; pass 1 / pass 2 = "
          f"{total1 / max(total2, 1):.2f} ({total1:.0f} / {total2:.0f} ms); "
          f"median step {median_ratio(rows):.2f}x; "
          f"{sum(r['slow'] for r in rows)} of {len(rows)} steps above {a.ratio}x; "
          f"compiles after ready: pass 1 {by_compiler(p1) or 'none'}, "
          f"pass 2 {by_compiler(p2) or 'none'}\n")
    # every slow step, and every step that compiled in either pass (a compile in pass 2 is
    # after ready too, even when its step is not slow against pass 1)
    print("| step | prompts | first / repeat ms | ratio | cause (probes) | compile log |")
    print("|---|---|---:|---:|---|---|")
    for r in rows:
        if r["slow"] or r["compiles"] or r["repeat_compiles"]:
            prompts = "+".join(map(str, r["prompts"]))
            late = f"; pass 2: {r['repeat_cause']}" if r["repeat_compiles"] else ""
            print(f"| {r['label']} | {prompts} | {r['first_ms']:.0f} / {r['repeat_ms']:.0f} | "
                  f"{r['ratio']:.1f} | {r['cause']}{late}{host_text(r)} | {r['recorded']} |")
    later = later_passes(run)
    if later:
        print("\n| passes | total | worst step | steps at or above 1.5x |")
        print("|---|---:|---:|---:|")
        for pair, v in later["pairs"].items():
            print(f"| {pair} | {v['total']:.2f} | {v['worst']}x | {v['at_or_above_1.5']} |")
    if a.out:
        restored = launch.get("restored")
        if isinstance(restored, dict):  # the restore's answer lists every entry: keep its size
            answer = restored.get("answer") or {}
            launch = dict(launch, restored={
                "seconds": restored.get("seconds"), "dest": restored.get("dest"),
                "entries": len((answer.get("plan") or {}).get("entries") or [])
                if isinstance(answer.get("plan"), dict) else None})
        keep = {"name": run["name"], "seed": run["seed"], "launch": launch,
                "pass_ratio": round(total1 / max(total2, 1), 3),
                "compiles_after_ready": {"1": by_compiler(p1), "2": by_compiler(p2)},
                **later,
                "steps": rows,
                "log_tail": run.get("log_tail", "")[-3000:]}
        Path(a.out).write_text(json.dumps(keep, indent=1) + "\n")


if __name__ == "__main__":
    main()
