#!/usr/bin/env python3
"""Benchmark: `cache replay` with one job and with N jobs against raw `triton.compile` of the
same specializations in a pool of the same size, on real SGLang kernels (CPU, sm_90).

    .venv/bin/python scripts/bench_replay.py --rounds 3 --jobs 2

First it records a compile log the way a server does: a fresh interpreter installs
sglang-warmup's events and compiles SGLang's decode-attention and kv-indices kernels (12
specializations) through the real `@triton.jit` path.  Then, in every round and in a rotating
order, each contender runs in a fresh interpreter into an empty cache directory:

* `replay -j1`, `replay -jN`: `python -m cache_tools.replay LOG --jobs 1|N` (every record must
  come back `rebuilt`);
* `raw -j1`, `raw -jN`: this script's `--raw` mode, the strongest plain pool: import the
  kernels' modules once, hash Triton once (`triton_key()`), fork N workers (none for N=1), each
  `kernel.warmup(...)`s (the JIT path into `triton.compile`) the same specializations; the
  cache keys must equal the recorded ones.

Wall-clock time of each interpreter, start to exit, so every contender pays its imports.
Prints per-round ratios and their medians (the machines are shared and noisy: ratios, not
times), with the CPU time of each interpreter and its workers beside the wall time (the CPU
time is what a loaded machine cannot hide).  `--before-tree DIR` adds the replay of another
checkout (a before/after comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def specs():
    """(label, call) per specialization: SGLang's own kernels, compiled through the JIT path
    with mock tensors (``kernel.warmup`` compiles without launching)."""
    import triton.language as tl
    from sglang.kernels.ops.attention import decode_attention as d
    from sglang.kernels.ops.kvcache.kv_indices import create_flashinfer_kv_indices_triton as kv
    from triton.runtime.jit import MockTensor

    bf16, i32, f32 = MockTensor(tl.bfloat16), MockTensor(tl.int32), MockTensor(tl.float32)
    strides = [256] * 13
    out = []
    for dm, bn, page in ((128, 64, 1), (64, 32, 1), (256, 32, 1), (128, 64, 16)):
        out.append((f"stage1 d{dm} n{bn} p{page}", lambda dm=dm, bn=bn, page=page:
                    d._fwd_kernel_stage1.warmup(
                        bf16, bf16, bf16, 0.1, i32, i32, f32, f32, i32, *strides,
                        kv_group_num=1, BLOCK_DMODEL=dm, BLOCK_DV=dm, BLOCK_N=bn,
                        MIN_BLOCK_KV=32, logit_cap=0.0, Lk=dm, Lv=dm, xai_temperature_len=-1,
                        PAGE_SIZE=page, num_warps=4, num_stages=2, grid=(1, 1, 1))))
    for lk, dm, dpe, dv, bh in ((128, 128, 0, 128, 16), (576, 512, 64, 512, 16),
                                (128, 128, 0, 128, 32)):
        out.append((f"grouped d{lk} h{bh}", lambda lk=lk, dm=dm, dpe=dpe, dv=dv, bh=bh:
                    d._fwd_grouped_kernel_stage1.warmup(
                        bf16, bf16, bf16, 0.1, i32, i32, f32, f32, i32, *strides,
                        kv_group_num=8, q_head_num=32, BLOCK_DMODEL=dm, BLOCK_DPE=dpe,
                        BLOCK_DV=dv, BLOCK_N=32, BLOCK_H=bh, MIN_BLOCK_KV=32, logit_cap=0.0,
                        xai_temperature_len=-1, Lk=lk, Lv=dv, num_warps=4, num_stages=2,
                        grid=(1, 1, 1))))
    for dv in (128, 256, 512):
        out.append((f"stage2 dv{dv}", lambda dv=dv: d._fwd_kernel_stage2.warmup(
            f32, f32, bf16, 1.0, i32, i32, None, 256, 256, 256, 256, 256, MAX_KV_SPLITS=16,
            MIN_BLOCK_KV=32, BLOCK_DV=dv, Lv=dv, HAS_SINK=False, num_warps=4, num_stages=2,
            grid=(1, 1, 1))))
    out.append(("kv_indices", lambda: kv.warmup(i32, i32, i32, i32, None, i32, 4096,
                                                grid=(1,))))
    out.append(("kv_indices paged", lambda: kv.warmup(
        i32, i32, i32, i32, i32, i32, 4097, ENTRY_PAGE_SIZE=16, TOKEN_BLOCK_PARALLEL=True,
        grid=(1,))))
    return out


# --- the modes this script runs itself in (each in a fresh interpreter) -----------------------

def record(state: Path, cache: Path) -> None:
    """Compile every spec with sglang-warmup's events installed: the compile log to replay."""
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    from cache_tools import compile_log
    from warmup.observe import events
    from warmup.observe.doctor import compile_only_target

    events.install(state_dir=state)
    with compile_only_target():
        for _label, call in specs():
            call()
    events.uninstall()
    misses = [r for r in compile_log.read_dir(state) if r["event"] == "miss"]
    print(json.dumps({"records": len(misses), "hashes": sorted(r["hash"] for r in misses)}))


_SPECS: list = []


def _raw_compile(index: int) -> str:
    from warmup.observe.doctor import compile_only_target

    with compile_only_target():
        return _SPECS[index][1]().hash


def raw(cache: Path, jobs: int) -> None:
    """The plain pool: imports and Triton's own hash once, then ``jobs`` forked workers."""
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    from triton.runtime.cache import triton_key

    _SPECS.extend(specs())
    triton_key()
    indices = range(len(_SPECS))
    if jobs == 1:
        hashes = [_raw_compile(i) for i in indices]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            hashes = list(pool.map(_raw_compile, indices))
    print(json.dumps({"hashes": sorted(hashes)}))


# --- the benchmark -------------------------------------------------------------------------------

def timed(argv: list[str], env: dict, cwd: Path = ROOT) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and every process it waited for, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])}... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return seconds, cpu, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="the pool size compared with one job")
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="also run the replay of this checkout (a before/after comparison)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write raw numbers here")
    ap.add_argument("--record", nargs=2, type=Path, metavar=("STATE", "CACHE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--raw", type=Path, metavar="CACHE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.record:
        return record(*args.record)
    if args.raw:
        return raw(args.raw, args.jobs)

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-replay-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "WARMUP_", "PROMETHEUS_"))}
    env["PYTHONPATH"] = str(ROOT)
    _, _, out = timed([sys.executable, __file__, "--record", str(work / "state"),
                       str(work / "jit-cache")], env)
    recorded = json.loads(out.splitlines()[-1])
    n = recorded["records"]
    jobs = args.jobs

    def replay(tree: Path, jobs: int, cache: Path) -> tuple[float, float, str]:
        seconds, cpu, out = timed(
            [sys.executable, "-m", "cache_tools.replay", str(work / "state"), "--cache-dir",
             str(cache), "--jobs", str(jobs), "--json"],
            # -m puts the working directory first on sys.path: run from the tree under test.
            dict(env, PYTHONPATH=os.pathsep.join([str(tree.resolve()), str(ROOT)])),
            cwd=tree.resolve())
        report = json.loads(out)
        rebuilt = sorted(r["hash"] for r in report["results"] if r["status"] == "rebuilt")
        if rebuilt != recorded["hashes"]:
            sys.exit(f"replay -j{jobs} rebuilt {len(rebuilt)} of {n}: {report['counts']}")
        return seconds, cpu, report.get("pool", "spawn" if jobs > 1 else "in-process")

    def raw_pool(jobs: int, cache: Path) -> tuple[float, float, str]:
        seconds, cpu, out = timed([sys.executable, __file__, "--raw", str(cache), "--jobs",
                                   str(jobs)], env)
        if json.loads(out.splitlines()[-1])["hashes"] != recorded["hashes"]:
            sys.exit("the raw pool compiled other keys than the recorded ones")
        return seconds, cpu, "fork" if jobs > 1 else "in-process"

    contenders = {"replay -j1": lambda c: replay(ROOT, 1, c),
                  f"replay -j{jobs}": lambda c: replay(ROOT, jobs, c),
                  "raw -j1": lambda c: raw_pool(1, c),
                  f"raw -j{jobs}": lambda c: raw_pool(jobs, c)}
    if args.before_tree is not None:
        contenders["before -j1"] = lambda c: replay(args.before_tree, 1, c)
        contenders[f"before -j{jobs}"] = lambda c: replay(args.before_tree, jobs, c)
    names = list(contenders)
    rounds = []
    for r in range(args.rounds):
        wall, cpu = {}, {}
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            cache = work / f"cache-{r}-{name.replace(' ', '')}"
            wall[name], cpu[name], pool = contenders[name](cache)
            shutil.rmtree(cache, ignore_errors=True)
            print(f"round {r + 1}: {name:12s} {wall[name]:6.1f} s wall, {cpu[name]:6.1f} s CPU "
                  f"({pool})", flush=True)
        rounds.append({"wall": wall, "cpu": cpu})

    pairs = [(f"replay -j{jobs}", "replay -j1"), (f"replay -j{jobs}", f"raw -j{jobs}"),
             ("replay -j1", "raw -j1"), (f"raw -j{jobs}", "raw -j1")]
    if args.before_tree is not None:
        pairs += [(f"before -j{jobs}", "before -j1"), ("replay -j1", "before -j1"),
                  (f"replay -j{jobs}", f"before -j{jobs}")]
    load = os.getloadavg()
    print(f"\n{n} specializations of SGLang kernels; {os.cpu_count()} CPUs; load average "
          f"{load[0]:.1f}; {args.rounds} rounds; medians\n")
    print("| contender | wall (s) | kernels/s | CPU (s) |")
    print("|---|---:|---:|---:|")
    for name in names:
        wall = statistics.median(t["wall"][name] for t in rounds)
        cpu = statistics.median(t["cpu"][name] for t in rounds)
        print(f"| {name} | {wall:.1f} | {n / wall:.2f} | {cpu:.1f} |")
    print("\n| ratio | wall, per round | wall, median | CPU, median |")
    print("|---|---|---:|---:|")
    ratios = {}
    for a, b in pairs:
        per = [t["wall"][a] / t["wall"][b] for t in rounds]
        cpu = statistics.median(t["cpu"][a] / t["cpu"][b] for t in rounds)
        ratios[f"{a} / {b}"] = {"wall": per, "cpu_median": cpu}
        print(f"| {a} / {b} | {', '.join(f'{v:.2f}' for v in per)} | "
              f"{statistics.median(per):.2f} | {cpu:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"specializations": n, "cpus": os.cpu_count(),
                                         "rounds": rounds, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
