"""Benchmark: what one fork costs from a light process and from one that has imported torch and
SGLang (a pytest worker, a zygote): the CPU of the parent's fork and wait, and of the child's
short life and exit, per fork.  Page tables are copied on fork and torn down on exit, so the
cost follows the resident size.  Used for the hostile corpus's light interpreter
(tests/cache_tools/hostile.py) and in docs/benchmarks.md.

    .venv/bin/python scripts/bench_fork.py [--forks 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_PROBE = r"""
import json, os, resource, sys, time
import pytest, cache_tools.archive  # noqa: F401, E401  (the corpus's light interpreter)
if sys.argv[1] == "heavy":
    import warnings
    warnings.simplefilter("ignore")
    import torch, sglang.srt.server_args  # noqa: F401, E401
n = int(sys.argv[2])
self0, child0 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
t0 = time.perf_counter()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        sum(range(1000))
        os._exit(0)
    os.waitpid(pid, 0)
wall = time.perf_counter() - t0
self1, child1 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
cpu = lambda a, b: b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime
print(json.dumps({"wall_ms": wall / n * 1e3, "parent_ms": cpu(self0, self1) / n * 1e3,
                  "child_ms": cpu(child0, child1) / n * 1e3,
                  "rss_mb": self1.ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forks", type=int, default=50)
    args = ap.parse_args()
    print("| process | resident MB | wall ms / fork | parent CPU ms | child CPU ms |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("light", "heavy"):
        done = subprocess.run([sys.executable, "-c", _PROBE, kind, str(args.forks)],
                              capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.splitlines()[-1])
        name = ("pytest and the cache tools" if kind == "light" else
                "pytest, the cache tools, torch and SGLang")
        print(f"| {name} | {r['rss_mb']:.0f} | {r['wall_ms']:.1f} | {r['parent_ms']:.1f} | "
              f"{r['child_ms']:.1f} |")


if __name__ == "__main__":
    main()
