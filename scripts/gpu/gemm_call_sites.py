#!/usr/bin/env python3
"""Does sweeping DeepSeek-V4's GEMMs as its code runs them leave fewer kernel loads to the first
requests than sweeping the same weights as plain linear layers?

SGLang's DeepSeek-V4 multiplies three kinds of weight without calling a linear layer: the
compressors' ``wkv_gate`` (``linear_bf16_fp32``: ``torch.mm(x, W.t(), out_dtype=float32)``),
the MoE router gate (the same bf16 x bf16 -> fp32 GEMM), and the attention's ``wo_a`` (a grouped
``einsum("tgd,grd->tgr")``).  Before ``warmup.serve.gemm_shapes`` knew these call sites the
sweep ran the compressors' and ``wo_a``'s weights through ``quant_method.apply`` (a bf16
output, one GEMM) and the gate not at all.

Each mode runs in a fresh process (cuBLAS loads its kernels once per process) over the tiny
DeepSeek-V4's sizes (hidden 1,024; compressors 2,048 / 1,024 / 512 rows of weight; 16 experts;
8 groups of ``wo_a`` with rank 128 over 4,096), rows up to 4,096:

* ``none``: no sweep;
* ``linear``: the product's sweep (``gemm_sweep.sweep``) over the weights as linear layers
  (``F.linear``, a bf16 output), the gate left out: what it ran before;
* ``sites``: the product's sweep over the shapes as the forward runs them.

Then the probe, the same in every mode: 300 random row counts per call site, each timed first
and again through the forward's own form, the GPU waited for around each call (one block of
the largest output is held first, as the sweep does, so that a first call pays a kernel load
and not a ``cudaMalloc``); a first call more than 1 ms over its repeat paid a first-time cost.

    PYTHONPATH=/tmp/site python3 scripts/gpu/gemm_call_sites.py --runs 2

Prints one JSON document: the call sites (``call_sites``), then under ``runs`` per mode and
run the sweep's calls and seconds and the probe's paid calls per call site.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MAX_ROWS = 4096
HIDDEN = 1024
#: (name, weight rows, weight columns, what the forward runs)
SITES = [("compressor 2048", 2048, HIDDEN, "mm_fp32"), ("compressor 1024", 1024, HIDDEN, "mm_fp32"),
         ("indexer compressor 512", 512, HIDDEN, "mm_fp32"), ("gate 16", 16, HIDDEN, "mm_fp32"),
         ("wo_a 8 x 128 x 4096", 8 * 128, 4096, "einsum")]
GROUPS, RANK = 8, 128


def forward_form(kind: str, w):
    """The call SGLang's forward makes on ``w`` (its input as the sweep hands it: rows x
    in_features), and the shape's in / out features and output dtype."""
    import torch

    if kind == "mm_fp32":
        return (lambda x: torch.mm(x, w.t(), out_dtype=torch.float32)), w.shape[1], w.shape[0], \
            torch.float32
    width = w.shape[1]
    return (lambda x: torch.einsum("tgd,grd->tgr", x.view(x.shape[0], GROUPS, width),
                                   w.view(GROUPS, RANK, width))), GROUPS * width, GROUPS * RANK, None


def child(mode: str) -> dict:
    import torch

    import gemm_sweep_loads  # this folder's: the same probe

    from warmup.serve import allocator, gemm_sweep
    from warmup.serve.gemm_shapes import Shape

    torch.manual_seed(0)
    weights = {name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
               for name, n, k, _ in SITES}
    sites = []
    for name, _, _, kind in SITES:
        run, in_f, out_f, out_dtype = forward_form(kind, weights[name])
        sites.append(Shape((name,), name, in_f, out_f, torch.bfloat16, run, out_dtype=out_dtype))
    out: dict = {"mode": mode, "calls": 0, "seconds": 0.0}
    if mode == "linear":
        swept = [Shape((n,), n, w.shape[1], w.shape[0], w.dtype,
                       lambda x, w=w: torch.nn.functional.linear(x, w))
                 for n, w in weights.items() if not n.startswith("gate")]  # never swept
    else:
        swept = sites if mode == "sites" else []
    if swept:
        result = gemm_sweep.sweep(swept, MAX_ROWS, 600.0, device="cuda",
                                  synchronize=torch.cuda.synchronize)
        out.update(calls=result.calls, seconds=round(result.seconds, 3))
    torch.cuda.current_blas_handle()
    for s in sites:
        s.max_rows = max(1, min(MAX_ROWS, gemm_sweep.MAX_BUFFER_BYTES // s.row_bytes()))
    allocator.reserve(gemm_sweep.largest_output(sites), "cuda")
    x = torch.zeros(MAX_ROWS * max(s.in_features for s in sites), device="cuda",
                    dtype=torch.bfloat16)
    out["paid_of_300"] = gemm_sweep_loads.paid_calls(sites, x, lambda s: s.max_rows)
    return out


def main() -> None:
    if "--child" in sys.argv:
        print(json.dumps(child(sys.argv[sys.argv.index("--child") + 1])))
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 2
    result: dict = {"max_rows": MAX_ROWS, "call_sites": [s[0] for s in SITES], "runs": {}}
    for _ in range(runs):
        for mode in ("none", "linear", "sites"):
            done = subprocess.run([sys.executable, __file__, "--child", mode],
                                  capture_output=True, text=True, check=True)
            result["runs"].setdefault(mode, []).append(
                json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
