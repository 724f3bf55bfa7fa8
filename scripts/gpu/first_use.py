#!/usr/bin/env python3
"""First use against repeat of the input-logprob path's GPU work, by row count, without SGLang.

An input-logprob request (``logprob_start_len: 0``) runs the LM head and a log-softmax over
every prompt row: a ``[rows, hidden] x [hidden, vocab]`` GEMM, ``log_softmax`` and ``gather``
over ``[rows, vocab]`` float32, and ``topk`` when top logprobs are asked.  On the GPU rig the
first such request of a new row count stayed slower than its repeat with no compile behind it.

This script times each op's first call, its repeat, and a third call after
``torch.cuda.empty_cache()`` (what SGLang's cache flush does), with CUDA events, at row counts in
the order a server would meet them: the warm-up's rows first, then rows it never ran, then rows
in the same power-of-two range as one already run.  A cost that comes back after the
``empty_cache`` is the caching allocator growing; one that does not outlives a flush.  It runs
once with CUDA's default lazy module loading and once with ``CUDA_MODULE_LOADING=EAGER`` (a
fresh process each): a first-use cost that disappears under EAGER is the lazy loading of a
kernel the process had not launched yet.

    python3 scripts/gpu/first_use.py --out OUT_DIR [--hidden 1024 --vocab 65600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# (label, rows): the default plan's input-logprob lengths, then the traffic's, then a neighbour of each
ORDER = [("warm", 219), ("warm", 2253), ("new", 286), ("new", 543), ("new", 1100),
         ("same range", 300), ("same range", 600), ("same range", 1200), ("new", 37), ("new", 67)]


def child(hidden: int, vocab: int) -> list[dict]:
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    w = torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16) * 0.02
    out = []

    def timed(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        r = fn()
        end.record()
        torch.cuda.synchronize()
        return r, start.elapsed_time(end)

    w_sq = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) * 0.02
    buf = torch.empty(max(r for _, r in ORDER), vocab, device=dev, dtype=torch.bfloat16)
    for label, rows in ORDER:
        h = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16)
        ids = torch.randint(0, vocab, (rows, 1), device=dev)
        rec = {"label": label, "rows": rows}
        for rep in ("first", "repeat", "after empty_cache"):
            if rep == "after empty_cache":
                torch.cuda.empty_cache()
            # the LM head GEMM into memory that exists (no allocation), then its float copy
            # (a new [rows, vocab] block), then a GEMM of the same rows against [hidden, hidden]
            _, t_gemm = timed(lambda h=h, rows=rows: torch.matmul(h, w.t(), out=buf[:rows]))
            logits, t_f = timed(lambda rows=rows: buf[:rows].float())
            _, t_sq = timed(lambda h=h: torch.matmul(h, w_sq))
            lp, t_ls = timed(lambda logits=logits: torch.log_softmax(logits, dim=-1))
            _, t_g = timed(lambda lp=lp, ids=ids: lp.gather(1, ids))
            _, t_k = timed(lambda lp=lp: lp.topk(20, dim=-1))
            rec[rep] = {"lm_head": round(t_gemm, 3), "float_copy": round(t_f, 3),
                        "gemm_hidden": round(t_sq, 3), "log_softmax": round(t_ls, 3),
                        "gather": round(t_g, 3), "topk": round(t_k, 3)}
            del logits, lp
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=65600)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/first-use"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.hidden, a.vocab)))
        return
    results = {}
    for mode in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        p = subprocess.run([sys.executable, __file__, "--child", "--hidden", str(a.hidden),
                            "--vocab", str(a.vocab)], env=env, capture_output=True, text=True,
                           timeout=300)
        if p.returncode:
            results[mode] = {"error": p.stderr[-2000:]}
            continue
        results[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first-use.json").write_text(json.dumps(results, indent=1))
    for mode, recs in results.items():
        if isinstance(recs, dict):
            print(mode, recs["error"][-500:])
            continue
        print(f"CUDA_MODULE_LOADING={mode}: first / repeat / after empty_cache, ms per op")
        print(f"{'':12} {'rows':>5}  " + "  ".join(f"{op:>20}" for op in recs[0]["first"]))
        for r in recs:
            cells = "  ".join(f"{r['first'][op]:6.2f}/{r['repeat'][op]:6.2f}/"
                              f"{r['after empty_cache'][op]:6.2f}" for op in r["first"])
            print(f"{r['label']:12} {r['rows']:5}  {cells}")


if __name__ == "__main__":
    main()
