#!/usr/bin/env python3
"""Is a GEMM's first-use cost paid per exact row count, or per kernel cuBLAS picks?

``first_use.py`` found that a bf16 GEMM at a row count the process has not run costs 2-3 ms more
than its repeat, also under ``CUDA_MODULE_LOADING=EAGER`` and after ``empty_cache``.  If the cost
is per exact shape, no warm-up can pay it for the row counts of real traffic; if it is per
kernel (cuBLAS loading or preparing each kernel once), a sweep of row counts pays it once for all
later shapes that pick the same kernels.

Each mode runs in a fresh process and times, on the host (``perf_counter`` around the call and a
``synchronize``), the first and the second call of ``[M, K] x [K, N]`` into memory that exists
(no allocation), for the LM head of the rig's model (K 1,024, N 65,600) and a square layer (K = N
= 1,024):

* ``sweep``: every M from 1 to ``--sweep`` in increasing order, then ``--probes`` random M above
  the sweep (never run) and as many random M inside it (run once already);
* ``random``: ``--probes`` random M in [1, ``--max-rows``], with no sweep before;
* ``product``: the product's own sweep (``warmup.serve.gemm_sweep``: 1-64, then ``8k`` and
  ``8k + 1`` up to ``--max-rows``, no time limit), then ``--probes`` random M in
  [1, ``--max-rows``]: whether those row counts load every kernel later row counts use.

Variants: the default, ``torch.backends.cuda.preferred_blas_library("cublaslt")``, and
``CUDA_MODULE_LOADING=EAGER``.  A call "pays" when its first call is over 1 ms slower than its
repeat.

    python3 scripts/gpu/gemm_first_use.py --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"lm_head": (1024, 65600), "square": (1024, 1024)}
PAYS_MS = 1.0


def child(mode: str, blas: str, sweep: int, probes: int, max_rows: int) -> dict:
    import torch

    if blas != "default":
        torch.backends.cuda.preferred_blas_library(blas)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rng = random.Random(1)
    h = torch.randn(max_rows, 1024, device=dev, dtype=torch.bfloat16)
    weights = {name: torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
               for name, (k, n) in SHAPES.items()}
    outs = {name: torch.empty(max_rows, n, device=dev, dtype=torch.bfloat16)
            for name, (_, n) in SHAPES.items()}

    def call(name: str, rows: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.matmul(h[:rows], weights[name].t(), out=outs[name][:rows])
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    def probe(rows_list: list[int]) -> dict:
        res = {}
        for name in SHAPES:
            extra = []
            for rows in rows_list:
                first = call(name, rows)
                extra.append(first - call(name, rows))
            paid = [e for e in extra if e > PAYS_MS]
            res[name] = {"calls": len(extra), "paid": len(paid),
                         "paid_rows": [r for r, e in zip(rows_list, extra) if e > PAYS_MS][:80],
                         "median_extra_ms": round(statistics.median(extra), 3),
                         "paid_median_ms": round(statistics.median(paid), 3) if paid else 0.0,
                         "total_extra_ms": round(sum(max(e, 0.0) for e in extra), 1)}
        return res

    # the process's very first GEMM of each shape pays CUDA/cuBLAS start-up: not counted
    for name in SHAPES:
        call(name, 7)
    out: dict = {"mode": mode, "blas": blas, "loading": os.environ.get("CUDA_MODULE_LOADING", "")}
    t0 = time.perf_counter()
    if mode == "sweep":
        swept = list(range(1, sweep + 1))
        out["sweep"] = probe(swept)
        out["sweep_s"] = round(time.perf_counter() - t0, 2)
        out["above_sweep"] = probe(rng.sample(range(sweep + 1, max_rows + 1), probes))
        out["inside_sweep"] = probe(rng.sample(swept, probes))
    elif mode == "product":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from warmup.serve import gemm_shapes, gemm_sweep

        shapes = [gemm_shapes.Shape((name,), name, k, n, torch.bfloat16,
                                    lambda x, name=name: torch.matmul(x, weights[name].t()))
                  for name, (k, n) in SHAPES.items()]
        result = gemm_sweep.sweep(shapes, max_rows, 1e9, device=dev,
                                  synchronize=torch.cuda.synchronize)
        out["product_sweep"] = {"calls": result.calls, "rows_reached": result.rows_reached,
                                "seconds": round(result.seconds, 2)}
        out["after_product_sweep"] = probe(rng.sample(range(1, max_rows + 1), 3 * probes))
    else:
        out["random"] = probe(rng.sample(range(1, max_rows + 1), probes))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gemm-first-use"))
    ap.add_argument("--sweep", type=int, default=2048)
    ap.add_argument("--probes", type=int, default=100)
    ap.add_argument("--max-rows", type=int, default=8192)
    ap.add_argument("--variants", choices=("all", "default"), default="all",
                    help="default: the default BLAS library and lazy loading only")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "BLAS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], a.sweep, a.probes, a.max_rows)))
        return
    runs = [("product", "default", "LAZY"), ("random", "default", "LAZY"),
            ("sweep", "default", "LAZY"),
            ("random", "cublaslt", "LAZY"), ("sweep", "cublaslt", "LAZY"),
            ("random", "default", "EAGER"), ("sweep", "default", "EAGER")]
    if a.variants == "default":
        runs = [r for r in runs if r[1:] == ("default", "LAZY")]
    results = []
    for mode, blas, loading in runs:
        env = dict(os.environ, CUDA_MODULE_LOADING=loading)
        p = subprocess.run([sys.executable, __file__, "--child", mode, blas, "--sweep",
                            str(a.sweep), "--probes", str(a.probes), "--max-rows",
                            str(a.max_rows)], env=env, capture_output=True, text=True,
                           timeout=400)
        if p.returncode:
            results.append({"mode": mode, "blas": blas, "loading": loading,
                            "error": p.stderr[-2000:]})
            print(mode, blas, loading, "failed:", p.stderr[-800:], flush=True)
            continue
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm-first-use.json").write_text(json.dumps(results, indent=1))
    print(f"\nfirst call > {PAYS_MS} ms slower than its repeat: paid / calls "
          "(median extra of those that paid, ms)")
    print(f"{'blas':9} {'loading':7} {'phase':13} " + "  ".join(f"{s:>22}" for s in SHAPES))
    for r in results:
        if "error" in r:
            continue
        if "product_sweep" in r:
            print(f"{r['blas']:9} {r['loading']:7} product sweep: {r['product_sweep']}")
        for phase in ("random", "sweep", "above_sweep", "inside_sweep", "after_product_sweep"):
            if phase in r:
                cells = "  ".join(f"{r[phase][s]['paid']:5}/{r[phase][s]['calls']:<5} "
                                  f"({r[phase][s]['paid_median_ms']:6.2f})" for s in SHAPES)
                print(f"{r['blas']:9} {r['loading']:7} {phase[:13]:13} {cells}")


if __name__ == "__main__":
    main()
