"""A/B of one cache operation between a base revision and this tree, interleaved.

Each round runs the operation once with the base revision's ``cache_tools`` and once with this
tree's (the order alternating), each in a fresh Python process that has imported everything
before the clock starts, on the same data: a code change's effect, with the host's drift spread
over both sides.  Prints the medians of the wall time and of the CPU time (the process and its
workers: less sensitive to a busy host) and their ratios.

    .venv/bin/python scripts/bench_cache_ab.py --base HEAD~1 --op restore --rounds 16 \\
        --seed /dev/shm/seed --workdir /dev/shm/ab

``--op``: pack, pack-zstd, verify, restore (the Triton-like cache of ``bench_cache.py``, built
once in ``--workdir`` and packed by this tree).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

#: one timed operation in a fresh process: argv = tree, op, workdir
_ONE = r'''
import os, sys, time, shutil
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from cache_tools import archive, fingerprint
from cache_tools.locations import kind, Location
fp = fingerprint.current(probe_gpu=False)
op, w = sys.argv[2], Path(sys.argv[3])
loc = Location(kind("triton"), w / "root" / "triton", "bench")
dest = w / "dest"
shutil.rmtree(dest, ignore_errors=True)
dest.mkdir()
run = {"pack": lambda: archive.pack(w / "x.tar", [loc], fingerprint=fp),
       "pack-zstd": lambda: archive.pack(w / "x.tar.zst", [loc], fingerprint=fp, zstd=True),
       "verify": lambda: archive.verify(w / "ours.tar", local=fp),
       "restore": lambda: archive.plan_restore(w / "ours.tar", dest=dest, local=fp).execute()}[op]
a, t = os.times(), time.perf_counter()
run()
wall, b = time.perf_counter() - t, os.times()
cpu = (b.user - a.user) + (b.system - a.system) + (b.children_user - a.children_user) + \
    (b.children_system - a.children_system)
print(wall, cpu)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision to compare against")
    ap.add_argument("--op", required=True, choices=["pack", "pack-zstd", "verify", "restore"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=Path, required=True,
                    help="compiled Triton entries (bench_cache.py --compile-seed)")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--size-mb", type=int, default=268)
    args = ap.parse_args()
    import bench_cache
    from cache_tools import archive, fingerprint
    from cache_tools.locations import Location, kind

    w = args.workdir
    built = w / f"built-{args.size_mb}-mb"       # a reused --workdir of another size is rebuilt
    if not built.exists():
        shutil.rmtree(w, ignore_errors=True)
        (w / "root").mkdir(parents=True)
        bench_cache.build_triton(args.seed, w / "root" / "triton", args.size_mb << 20)
        archive.pack(w / "ours.tar", [Location(kind("triton"), w / "root" / "triton", "bench")],
                     fingerprint=fingerprint.current(probe_gpu=False))
        built.touch()
    base = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base),
                        args.base], check=True)
        times: dict[str, list[float]] = {"base": [], "this": []}
        cpu: dict[str, list[float]] = {"base": [], "this": []}
        for r in range(args.rounds):
            for side in (("base", "this") if r % 2 else ("this", "base")):
                tree = base if side == "base" else REPO
                out = subprocess.run([sys.executable, "-c", _ONE, str(tree), args.op, str(w)],
                                     capture_output=True, text=True, check=True)
                wall, used = map(float, out.stdout.split()[-2:])
                times[side].append(wall)
                cpu[side].append(used)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                       check=False)
        shutil.rmtree(base, ignore_errors=True)
    b, t = statistics.median(times["base"]), statistics.median(times["this"])
    cb, ct = statistics.median(cpu["base"]), statistics.median(cpu["this"])
    print(f"{args.op}: base {args.base} {b:.3f} s, this tree {t:.3f} s, this/base {t / b:.3f} "
          f"(median of {args.rounds}; min {min(times['base']):.3f} / {min(times['this']):.3f}); "
          f"CPU seconds (workers included) {cb:.2f} / {ct:.2f}, this/base {ct / cb:.3f}")


if __name__ == "__main__":
    main()
