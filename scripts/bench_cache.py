#!/usr/bin/env python3
"""Benchmark: `cache pack` / `cache restore` throughput against plain `tar` and `tar --zstd` on
the same data: a real Triton cache from CPU compiles (sm_90 cubins), replicated to a target size.

    .venv/bin/python scripts/bench_cache.py --size-mb 200 --repeat 3

Prints a Markdown table (for docs/benchmarks.md) and, with --json, writes the raw numbers.
Times are wall-clock medians with a warm page cache; restores go into a fresh directory each run.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache_tools import archive  # noqa: E402
from cache_tools.locations import Location, kind  # noqa: E402


def compile_seed(cache: Path) -> None:
    """Compile a few distinct kernels on CPU for sm_90 into ``cache`` (TRITON_CACHE_DIR)."""
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    @triton.jit
    def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask),
                 mask=mask)

    @triton.jit
    def softmax_kernel(x, out, stride, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        v = tl.load(x + row * stride + offs, mask=offs < n, other=-float("inf"))
        v = v - tl.max(v, axis=0)
        e = tl.exp(v)
        tl.store(out + row * stride + offs, e / tl.sum(e, axis=0), mask=offs < n)

    target = GPUTarget("cuda", 90, 32)
    specs = [(add_kernel, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}, {"BLOCK": b})
             for b in (64, 128, 256, 512, 1024)]
    specs += [(softmax_kernel, {"x": "*fp32", "out": "*fp32", "stride": "i32", "n": "i32"},
               {"BLOCK": b}) for b in (128, 256, 512, 1024, 2048)]
    for fn, sig, const in specs:
        triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const),
                       target=target)


def replicate(seed: Path, cache: Path, size: int) -> int:
    """Copy the seed entries under new hash names (groups pointing at the copy) until the
    cache holds ``size`` bytes."""
    entries = sorted(p for p in seed.iterdir() if p.is_dir())
    total = i = 0
    while total < size:
        for src in entries:
            name = base64.b32encode(hashlib.sha256(f"{src.name}-{i}".encode()).digest()
                                    ).decode().rstrip("=")
            dst = cache / name
            shutil.copytree(src, dst)
            for grp in dst.glob("__grp__*.json"):
                grp.write_text(grp.read_text().replace(str(src), str(dst)))
            total += sum(f.stat().st_size for f in dst.iterdir())
        i += 1
    return total


def timed(fn, repeat: int, before=None) -> float:
    times = []
    for _ in range(repeat):
        if before:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write raw numbers here")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    seed, root = work / "seed", work / "root"
    cache = root / "triton"
    shutil.rmtree(seed, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    cache.mkdir(parents=True)
    compile_seed(seed)
    data = replicate(seed, cache, args.size_mb << 20)
    files = sum(1 for _ in cache.rglob("*") if _.is_file())
    loc = [Location(kind("triton"), cache, "bench")]
    dest = work / "dest"

    def fresh():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()

    out = {}
    results = {"bytes": data, "files": files, "entries": len(list(cache.iterdir())),
               "python": platform.python_version(), "cpus": os.cpu_count(), "ops": out}
    tar_plain, tar_zst = work / "tar.tar", work / "tar.tar.zst"
    ours_plain, ours_zst = work / "ours.tar", work / "ours.tar.zst"
    zstd_flag = ["-I", "zstd -3 -T1"]
    out["pack"] = {
        "ours": timed(lambda: archive.pack(ours_plain, loc), args.repeat),
        "tar": timed(lambda: run(["tar", "-cf", str(tar_plain), "-C", str(root), "triton"]),
                     args.repeat)}
    out["pack zstd"] = {
        "ours": timed(lambda: archive.pack(ours_zst, loc, zstd=True), args.repeat),
        "tar": timed(lambda: run(["tar", *zstd_flag, "-cf", str(tar_zst), "-C", str(root),
                                  "triton"]), args.repeat)}
    out["verify (tar: -t)"] = {"ours": timed(lambda: archive.verify(ours_plain), args.repeat),
                     "tar": timed(lambda: run(["tar", "-tf", str(tar_plain)]), args.repeat)}
    out["restore"] = {
        "ours": timed(lambda: archive.plan_restore(ours_plain, dest=dest).execute(),
                      args.repeat, fresh),
        "tar": timed(lambda: run(["tar", "-xf", str(tar_plain), "-C", str(dest)]),
                     args.repeat, fresh)}
    out["restore zstd"] = {
        "ours": timed(lambda: archive.plan_restore(ours_zst, dest=dest).execute(),
                      args.repeat, fresh),
        "tar": timed(lambda: run(["tar", *zstd_flag, "-xf", str(tar_zst), "-C", str(dest)]),
                     args.repeat, fresh)}
    sizes = {"ours": ours_plain.stat().st_size, "tar": tar_plain.stat().st_size,
             "ours zstd": ours_zst.stat().st_size, "tar zstd": tar_zst.stat().st_size}
    results["archive_bytes"] = sizes

    mib = data / (1 << 20)
    print(f"data: {mib:.0f} MiB, {results['entries']} Triton entries, {files} files; "
          f"{results['cpus']} CPUs; median of {args.repeat}\n")
    print("| operation | ours (s) | ours (MiB/s) | tar (s) | tar (MiB/s) | ours / tar time |")
    print("|---|---:|---:|---:|---:|---:|")
    for op, t in out.items():
        print(f"| {op} | {t['ours']:.2f} | {mib / t['ours']:.0f} | {t['tar']:.2f} | "
              f"{mib / t['tar']:.0f} | {t['ours'] / t['tar']:.2f} |")
    print("\n| archive | bytes | ratio to data |")
    print("|---|---:|---:|")
    for name, n in sizes.items():
        print(f"| {name} | {n} | {n / data:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
