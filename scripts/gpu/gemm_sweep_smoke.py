#!/usr/bin/env python3
"""The GEMM sweep's own entry point (``warmup.serve.gemm_sweep.after_load``) on a GPU, without
SGLang: a stand-in runner whose model holds layers with an ``UnquantizedLinearMethod`` (the same
``F.linear`` SGLang's applies) and an LM head, at the tiny rig model's shapes.  It prints what the
sweep did, the memory the caching allocator holds before and after, and how many of 300 random
row counts then still pay a first-call cost (over 1 ms above the repeat) on each shape.

    python3 scripts/gpu/gemm_sweep_smoke.py
    python3 scripts/gpu/gemm_sweep_smoke.py --compare-sync 1,16 --runs 3

``--compare-sync`` times the sweep alone (rows up to 4,096, the DeepSeek-V4 rig's chunk), one
fresh process per run (cuBLAS loads its kernels once per process), alternating the number of
row counts between two waits for the GPU (``SYNC_ROWS``).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def compare_sync(values: list[int], runs: int) -> None:
    import subprocess

    seconds: dict[int, list[float]] = {v: [] for v in values}
    for _ in range(runs):
        for v in values:
            out = subprocess.run([sys.executable, __file__, "--sweep-only", str(v)],
                                 capture_output=True, text=True, check=True).stdout
            seconds[v].append(json.loads(out.strip().splitlines()[-1])["seconds"])
    print(json.dumps({f"sync every {v} row counts": {"seconds": s, "median": sorted(s)[len(s) // 2]}
                      for v, s in seconds.items()}, indent=1))


def main() -> None:
    if "--compare-sync" in sys.argv:
        at = sys.argv.index("--compare-sync")
        runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
        compare_sync([int(v) for v in sys.argv[at + 1].split(",")], runs)
        return
    import torch
    import torch.nn.functional as F

    from warmup.serve import gemm_sweep

    class UnquantizedLinearMethod:
        def apply(self, layer, x, bias=None):
            return F.linear(x, layer.weight, bias)

    def linear(out_f, in_f, bias=False):
        m = torch.nn.Module()
        m.quant_method = UnquantizedLinearMethod()
        m.weight = torch.nn.Parameter(torch.randn(out_f, in_f, device="cuda",
                                                  dtype=torch.bfloat16) * 0.02, requires_grad=False)
        m.bias = torch.nn.Parameter(torch.zeros(out_f, device="cuda", dtype=torch.bfloat16),
                                    requires_grad=False) if bias else None
        return m

    model = torch.nn.Module()
    model.qkv_proj = linear(1536, 1024)
    model.o_proj = linear(1024, 1024)
    model.gate = linear(128, 1024)
    model.biased = linear(1024, 1024, bias=True)
    model.lm_head = linear(65600, 1024)
    runner = type("Runner", (), {})()
    runner.model = model
    runner.server_args = type("ServerArgs", (), {"chunked_prefill_size": 8192,
                                                 "max_prefill_tokens": 16384})()
    if "--sweep-only" in sys.argv:
        gemm_sweep.SYNC_ROWS = int(sys.argv[sys.argv.index("--sweep-only") + 1])
        runner.server_args.chunked_prefill_size = 4096
        torch.cuda.synchronize()
        result = gemm_sweep.after_load(runner)
        print(json.dumps({"seconds": round(result.seconds, 3), "calls": result.calls}))
        return
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    result = gemm_sweep.after_load(runner)
    after = torch.cuda.memory_reserved()
    out = {"summary": result.summary() if result else None,
           "reserved_before_mib": before >> 20, "reserved_after_mib": after >> 20}
    rng = random.Random(3)
    x = torch.zeros(8192, 1024, device="cuda", dtype=torch.bfloat16)

    def call(m, rows):
        torch.cuda.synchronize()
        t = time.perf_counter()
        m.quant_method.apply(m, x[:rows], m.bias)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    paid = {}
    for name in ("qkv_proj", "o_proj", "gate", "biased", "lm_head"):
        m = getattr(model, name)
        rows_list = rng.sample(range(1, 4029 if name == "lm_head" else 8193), 300)
        extra = [call(m, r) - call(m, r) for r in rows_list]
        paid[name] = sum(1 for e in extra if e > 1.0)
    out["paid_of_300_after_the_sweep"] = paid
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
