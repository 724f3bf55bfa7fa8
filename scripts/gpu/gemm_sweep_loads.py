#!/usr/bin/env python3
"""Can a GEMM sweep learn where cuBLAS loads its kernels, and sweep only there in a later
process?  The sweep of ``warmup.serve.gemm_sweep`` runs every shape at every row count it
covers (rows 1-64, then ``8k`` and ``8k + 1``), 6,415 calls and 1.6 s on the tiny DeepSeek-V4.
A kernel load stalls the call that meets it on the CPU (2-4 ms, lazy module loading), so one
full sweep can note the calls that stalled; a later process would run only those.

Each mode runs in a fresh process (cuBLAS loads its kernels once per process), over the GEMM
shapes of ``gemm_sweep_smoke.py`` (the tiny rig's sizes), rows up to 4,096:

* ``learn``: the product's sweep (``gemm_sweep.sweep``), each call timed on the CPU; the calls
  above ``--stall-ms`` are the *load rows* of their shape.
* ``full`` / ``learned`` / ``threads`` / ``none``: the full sweep, only the load rows, the full
  sweep with each shape on its own thread (cuBLAS's loads overlapping, if they can), or
  nothing; then the probe: 300 random row counts per shape, each timed first and again (the GPU waited for around
  each call; every process first has the caching allocator hold one block of the largest
  output, as the product's sweep does, so that a first call pays a kernel load and not a
  ``cudaMalloc``: ``threads`` holds several outputs at once and may still allocate); a first
  call more than 1 ms over its repeat paid a first-time cost.

    python3 scripts/gpu/gemm_sweep_loads.py --runs 2 --stall-ms 0.5

``--compare-reserve``: whether the sweep's reserved output block (``allocator.reserve``)
takes the allocator's growth out of the load rows.  ``learn`` with the block (the product) and
without it, each ``--runs`` times; then ``none`` and ``learned`` at each union of load rows,
every probe after the block too, so that a first call pays a kernel load and not a ``cudaMalloc``:
fewer load rows with the block, and as few paid calls after them, is the answer.

    python3 scripts/gpu/gemm_sweep_loads.py --compare-reserve --runs 2

Prints one JSON document: per mode the sweep's seconds and calls, and the probe's paid calls.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MAX_ROWS = 4096


def shapes():
    import torch

    from warmup.serve.gemm_shapes import Shape

    def linear(out_f, in_f):
        return torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02

    weights = {"qkv_proj": linear(1536, 1024), "o_proj": linear(1024, 1024),
               "gate": linear(128, 1024), "lm_head": linear(65600, 1024)}
    out = []
    for name, w in weights.items():
        out.append(Shape(key=(name,), label=name, in_features=w.shape[1],
                         out_features=w.shape[0], dtype=w.dtype,
                         run=lambda x, w=w: torch.nn.functional.linear(x, w)))
    return out


def rows_of(shape) -> int:
    from warmup.serve import gemm_sweep

    return max(1, min(MAX_ROWS, gemm_sweep.MAX_BUFFER_BYTES // shape.row_bytes()))


def child(mode: str, stall_ms: float, loads: dict[str, list[int]], reserve: bool = True) -> dict:
    """One mode in this process.  ``reserve``: the sweep keeps its output block (the product's
    default), and the other modes run after one block of the largest output too (cuBLAS's
    workspace allocated first, as the sweep does); without it the sweep's outputs grow through
    ``cudaMalloc`` (the sweep before the block)."""
    import torch

    from warmup.serve import allocator, gemm_sweep

    ss = shapes()
    x = torch.zeros(MAX_ROWS * 1024, device="cuda", dtype=torch.bfloat16)
    if not reserve:
        allocator.reserve = lambda nbytes, device: None
    elif mode not in ("learn", "full"):     # the sweep reserves its own
        torch.cuda.current_blas_handle()
        for s in ss:                        # the rows the sweep gives each (it sets them again)
            s.max_rows = rows_of(s)
        allocator.reserve(gemm_sweep.largest_output(ss), "cuda")
    torch.cuda.synchronize()
    found: dict[str, list[int]] = {s.label: [] for s in ss}
    calls = 0
    t0 = time.perf_counter()
    if mode in ("learn", "full"):  # the product's sweep, each call timed on the CPU
        for s in ss:
            def timed_run(x, run=s.run, label=s.label):
                t = time.perf_counter()
                out = run(x)
                if (time.perf_counter() - t) * 1e3 > stall_ms:
                    found[label].append(x.shape[0])
                return out
            s.run = timed_run
        calls = gemm_sweep.sweep(ss, MAX_ROWS, 600.0, device="cuda",
                                 synchronize=torch.cuda.synchronize).calls
    elif mode == "threads":  # every shape on its own thread: do cuBLAS's loads overlap?
        import threading

        def one(s):
            with torch.inference_mode():
                for rows in gemm_sweep.row_counts(rows_of(s)):
                    s.run(x[:rows * s.in_features].view(rows, s.in_features))
        workers = [threading.Thread(target=one, args=(s,)) for s in ss]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        calls = sum(len(list(gemm_sweep.row_counts(rows_of(s)))) for s in ss)
    elif mode == "learned":
        for s in ss:
            for rows in loads.get(s.label, []):
                s.run(x[:rows * s.in_features].view(rows, s.in_features))
                calls += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out = {"mode": mode, "seconds": round(seconds, 3), "calls": calls}
    if mode == "learn":
        out["load_rows"] = found
        return out
    out["paid_of_300"] = paid_calls(ss, x, rows_of)
    return out


def paid_calls(shapes, x, rows_of, n: int = 300) -> dict[str, int]:
    """The probe: ``n`` random row counts per shape (up to ``rows_of(shape)``), each timed first
    and again with the GPU waited for around each call; per shape, how many first calls ran
    more than 1 ms over their repeat (paid a first-time cost).  ``x`` is the input buffer."""
    import torch

    rng = random.Random(7)

    def timed(s, rows):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            s.run(x[:rows * s.in_features].view(rows, s.in_features))
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    paid = {}
    for s in shapes:
        probe = rng.sample(range(1, rows_of(s) + 1), n)
        extra = [timed(s, r) - timed(s, r) for r in probe]
        paid[s.label] = sum(1 for e in extra if e > 1.0)
    return paid


def run(mode: str, stall_ms: float, loads: dict | None = None, reserve: bool = True) -> dict:
    arg = json.dumps(loads or {})
    done = subprocess.run([sys.executable, __file__, "--child", mode, str(stall_ms), arg,
                           "reserve" if reserve else "grow"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(learned: list[dict]) -> dict:
    """Some ``learn`` runs: each run's seconds and calls, the union of their load rows (``rows``)
    and its size per shape, and whether every run found the same rows."""
    rows = {k: sorted(set().union(*(set(r["load_rows"][k]) for r in learned)))
            for k in learned[0]["load_rows"]}
    return {"learn": [{k: v for k, v in r.items() if k != "load_rows"} for r in learned],
            "load_rows": {k: len(v) for k, v in rows.items()},
            "same_rows_in_every_learn": all(r["load_rows"] == learned[0]["load_rows"]
                                            for r in learned),
            "rows": rows}


def compare_reserve(runs: int, stall: float) -> dict:
    """Load rows learned with and without the reserved output block, and what each leaves."""
    out: dict = {"stall_ms": stall}
    for name, reserve in (("with_block", True), ("without_block", False)):
        out[name] = summary([run("learn", stall, reserve=reserve) for _ in range(runs)])
        out[name]["learned"] = [run("learned", stall, out[name]["rows"]) for _ in range(runs)]
    out["none"] = [run("none", stall, reserve=True) for _ in range(runs)]
    return out


def main() -> None:
    if "--child" in sys.argv:
        at = sys.argv.index("--child")
        mode, stall, loads = sys.argv[at + 1], float(sys.argv[at + 2]), json.loads(sys.argv[at + 3])
        print(json.dumps(child(mode, stall, loads, reserve=sys.argv[at + 4] == "reserve")))
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 2
    stall = float(sys.argv[sys.argv.index("--stall-ms") + 1]) if "--stall-ms" in sys.argv else 0.5
    if "--compare-reserve" in sys.argv:
        print(json.dumps(compare_reserve(runs, stall), indent=1))
        return
    result = {"stall_ms": stall, **summary([run("learn", stall) for _ in range(runs)])}
    loads = result["rows"]
    for _ in range(runs):
        for mode in ("none", "full", "learned", "threads"):
            result.setdefault(mode, []).append(run(mode, stall, loads))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
