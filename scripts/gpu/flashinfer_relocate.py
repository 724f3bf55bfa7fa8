#!/usr/bin/env python3
"""A FlashInfer JIT op baked in one directory, packed, restored under another, loaded: does
FlashInfer's ninja build it again?  Three fresh processes time the same first call
(``flashinfer.norm.rmsnorm``, the op SGLang 0.5.17's DeepSeek-V4 builds):

* ``bake``: empty cache under /tmp/fi/bake (ninja builds the op);
* ``plain``: the archive restored under /tmp/fi/plain, ninja's records removed (what every
  restore left before ``cache_tools.ninja_log``);
* ``restored``: the archive restored under /tmp/fi/restored by ``sglang-warmup cache restore``
  as it is now (ninja's records written).

Each reports the seconds of its first call and the op's files that changed (an object or the
``.so`` rewritten means ninja built again).  Needs the carried SGLang site (``first_hits.py
setup``); prints one JSON object and writes it to ``$OUT/flashinfer-relocate.json``.

    python3 scripts/gpu/first_hits.py setup --models none && python3 scripts/gpu/flashinfer_relocate.py [--no-plain]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import first_hits as fh  # noqa: E402

WORK = Path("/tmp/fi")
CALL = r"""
import time, os, json, sys
t0 = time.perf_counter()
import torch, flashinfer
from flashinfer.norm import rmsnorm
t1 = time.perf_counter()
x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
rmsnorm(x, w); torch.cuda.synchronize()
t2 = time.perf_counter()
rmsnorm(x, w); torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_call_s": t2 - t1, "second_call_s": t3 - t2}))
"""


def op_files(base: Path) -> dict[str, int]:
    root = base / ".cache" / "flashinfer"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file() and "cached_ops" in p.parts}


def load(name: str, base: Path) -> dict:
    env = dict(fh.base_env(), CUDA_VISIBLE_DEVICES="0", FLASHINFER_WORKSPACE_BASE=str(base))
    before = op_files(base)
    t = time.time()
    done = subprocess.run([sys.executable, "-c", CALL], env=env, capture_output=True, text=True,
                          cwd="/tmp", timeout=400)
    res = {"name": name, "wall_s": round(time.time() - t, 2), "rc": done.returncode}
    if done.returncode == 0:
        res.update(json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        res["stderr"] = done.stderr[-2000:]
    after = op_files(base)
    res["changed"] = sorted(k for k in after if before.get(k) != after[k])
    fh.log(f"{name}: {res}")
    return res


def cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "warmup", *argv], env=fh.base_env(),
                          capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"sglang-warmup {' '.join(argv)}: {done.stderr[-1500:]}")
    return done.stdout + done.stderr


def main() -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    ninja = shutil.which("ninja", path=fh.base_env()["PATH"])
    version = subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout.strip() \
        if ninja else None
    out: dict = {"ninja": ninja, "ninja_version": version}
    out["bake"] = load("bake", WORK / "bake")
    cli("cache", "pack", str(WORK / "a.tar"), "--root", str(WORK / "bake"), "--kinds",
        "flashinfer", "-q")
    restored = json.loads(cli("cache", "restore", str(WORK / "a.tar"), "--dest",
                              str(WORK / "restored"), "--format", "json", "-q"))
    out["restore_detail"] = [o["detail"] for o in restored["outcomes"]]
    if "--no-plain" not in sys.argv:
        cli("cache", "restore", str(WORK / "a.tar"), "--dest", str(WORK / "plain"), "-q")
        for p in (WORK / "plain").rglob(".ninja_*"):
            p.unlink()
        out["plain"] = load("plain", WORK / "plain")
    out["restored"] = load("restored", WORK / "restored")
    fh.emit("flashinfer-relocate.json", out)


if __name__ == "__main__":
    main()
