#!/usr/bin/env python3
"""Benchmark: `cache pack / verify / restore` against `tar` on the same data, as ratios.

Two caches are built from real artifacts:

* **triton**: a few dozen real kernels compiled on CPU for sm_90 (Triton's own cache entries),
  cloned under new hash names with their group files rewritten for the clone, until the cache
  holds ``--size-mb`` MiB (268 MiB: about 4,300 entries and 34,400 files);
* **flashinfer**: real CUDA shared libraries of this environment (torch, nvidia, triton wheels)
  cloned into FlashInfer's layout, ``<version>/<archs>/cached_ops/<op>/<op>.so``, until it holds
  ``--so-mb`` MiB (default: 1 GiB, scaled with ``--size-mb``).

``--entries N`` clones the Triton seed to exactly N entries instead (8 files each).

Ours is timed as a user runs it: the whole ``sglang-warmup cache ...`` process (start-up,
imports, planning, the work, the forked workers, the output), against the baseline's whole
process; the library call the command makes is timed in this process beside it.  Each round
runs the command, the library call and the baseline back to back (the order rotates between
rounds), and the table prints medians of the per-round ratios to the baseline:

| operation | ours: the command (and the library call) | baseline |
|---|---|---|
| pack | ``cache pack OUT --root DIR --kinds K -y -q`` (``archive.pack``) | ``tar -cf`` |
| pack zstd | the same with ``--zstd`` (``archive.pack(zstd=True)``) | ``tar -cf - | zstd -3 -T0`` |
| verify | ``cache verify ARCHIVE -q`` (``archive.verify``) | ``tar -xOf ARCHIVE | sha256sum`` (same archive) |
| restore | ``cache restore ARCHIVE --dest DIR -q`` (``plan_restore().execute()``) | ``tar -xf ARCHIVE`` |
| restore j1 | the same with ``--jobs 1`` (one process) | the same |
| restore zstd | the same on the zstd archive | ``zstd -dc ARCHIVE | tar -xf -`` |

    .venv/bin/python scripts/bench_cache.py                    # full size, 5 rounds
    .venv/bin/python scripts/bench_cache.py --size-mb 40 --rounds 3   # a quick run
    .venv/bin/python scripts/bench_cache.py --seed /dev/shm/seed --caches triton \
        --entries 2000 --ops pack,restore --rounds 7 --workdir /dev/shm/b   # as the issue timed

Ratios, not absolute times, are what this measures: shared machines are noisy, and a ratio of
two runs made seconds apart on the same data cancels most of the noise.
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
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cache_tools import archive, fingerprint, forks  # noqa: E402
from cache_tools.locations import Location, kind  # noqa: E402
from cache_tools.scan import scan  # noqa: E402

OPS = ("pack", "pack zstd", "verify", "restore", "restore j1", "restore zstd")


# --- building the caches ----------------------------------------------------------------------


def compile_seed(seed: Path) -> None:
    """Compile the seed kernels in a fresh interpreter (Triton reads TRITON_CACHE_DIR once)."""
    subprocess.run([sys.executable, __file__, "--compile-seed", str(seed)], check=True)


def compile_kernels(seed: Path) -> None:
    """Real Triton compiles on CPU for sm_90: element-wise, reductions and matmuls with several
    block sizes and warp counts (27 entries, 64 KiB each on average)."""
    os.environ["TRITON_CACHE_DIR"] = str(seed)
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
    def scale_kernel(x, out, n, factor, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x + offs, mask=mask) * factor
        if SQUARE:
            v = v * v
        tl.store(out + offs, v, mask=mask)

    @triton.jit
    def softmax_kernel(x, out, stride, n, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        v = tl.load(x + row * stride + offs, mask=offs < n, other=-float("inf"))
        v = v - tl.max(v, axis=0)
        e = tl.exp(v)
        tl.store(out + row * stride + offs, e / tl.sum(e, axis=0), mask=offs < n)

    @triton.jit
    def rmsnorm_kernel(x, w, out, stride, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        v = tl.load(x + row * stride + offs, mask=offs < n, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
        g = tl.load(w + offs, mask=offs < n, other=0.0)
        tl.store(out + row * stride + offs, (v * r * g).to(out.dtype.element_ty), mask=offs < n)

    @triton.jit
    def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
            y = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty))

    target = GPUTarget("cuda", 90, 32)
    vec = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
    row = {"x": "*fp16", "out": "*fp16", "stride": "i32", "n": "i32"}
    norm = {"x": "*bf16", "w": "*bf16", "out": "*bf16", "stride": "i32", "n": "i32",
            "eps": "fp32"}
    mm = {"a": "*fp16", "b": "*fp16", "c": "*fp16", **{k: "i32" for k in (
        "M", "N", "K", "sam", "sak", "sbk", "sbn", "scm", "scn")}}
    scale = {"x": "*fp32", "out": "*fp32", "n": "i32", "factor": "fp32"}
    specs = [(add_kernel, vec, {"BLOCK": b}, 4) for b in (64, 128, 256, 512, 1024, 2048)]
    specs += [(scale_kernel, scale, {"BLOCK": b, "SQUARE": sq}, 4)
              for b in (128, 512, 2048) for sq in (False, True)]
    specs += [(softmax_kernel, row, {"BLOCK": b}, w)
              for b, w in ((128, 4), (256, 4), (512, 4), (1024, 4), (256, 8), (1024, 8))]
    specs += [(rmsnorm_kernel, norm, {"BLOCK": b}, w)
              for b, w in ((256, 4), (512, 4), (1024, 4), (2048, 4), (512, 8), (2048, 8))]
    specs += [(matmul_kernel, mm, {"BM": 32, "BN": 32, "BK": 32}, 4),
              (matmul_kernel, mm, {"BM": 64, "BN": 64, "BK": 32}, 4),
              (matmul_kernel, mm, {"BM": 128, "BN": 64, "BK": 32}, 4)]
    for fn, sig, const, warps in specs:
        triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const),
                       target=target, options={"num_warps": warps})


def clone_name(src: str, i: int) -> str:
    """A Triton-style hash directory name (base32 of a sha256, 52 characters)."""
    digest = hashlib.sha256(f"{src}-{i}".encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def build_triton(seed: Path, cache: Path, size: int, count: int | None = None) -> int:
    """Clone the seed entries under new hash names until ``cache`` holds ``size`` bytes (or
    ``count`` entries); each clone's group file lists the clone's own files, as Triton would
    have written it there."""
    entries = sorted(p for p in seed.iterdir() if p.is_dir())
    total = i = made = 0
    cache.mkdir(parents=True)
    while (made < count) if count is not None else (total < size):
        for src in entries:
            if count is not None and made >= count:
                break
            made += 1
            dst = cache / clone_name(src.name, i)
            dst.mkdir()
            for f in sorted(src.iterdir()):
                data = f.read_bytes()
                if f.name.startswith("__grp__"):
                    children = json.loads(data)["child_paths"]
                    data = json.dumps({"child_paths": {c: str(dst / os.path.basename(p))
                                                       for c, p in children.items()}}).encode()
                (dst / f.name).write_bytes(data)
                total += len(data)
            if count is None and total >= size:
                break
        i += 1
    return total


def real_shared_libraries(source: Path | None, low: int = 1 << 20, high: int = 64 << 20
                          ) -> list[Path]:
    """Shared libraries between ``low`` and ``high`` bytes, largest first (real machine code,
    as FlashInfer's ops are): under ``source``, or this environment's CUDA, torch and Triton
    wheels."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    roots = [source] if source else [site / "nvidia", site / "torch" / "lib", site / "triton"]
    found = []
    for root in roots:
        for p in root.rglob("*.so*"):
            if p.is_file() and not p.is_symlink() and low <= p.stat().st_size <= high:
                found.append(p)
    if not found:
        raise SystemExit(f"no shared libraries of 1-64 MiB under {[str(r) for r in roots]}")
    return sorted(found, key=lambda p: (-p.stat().st_size, str(p)))


def build_flashinfer(cache: Path, size: int, source: Path | None = None) -> int:
    """Ops in FlashInfer's layout (``<version>/<archs>/cached_ops/<op>/<op>.so`` plus its
    ``build.ninja``) until ``cache`` holds ``size`` bytes; libraries are used round-robin."""
    libs = real_shared_libraries(source)
    ops = cache / "0.2.14" / "90" / "cached_ops"
    total = i = 0
    while total < size:
        lib = libs[i % len(libs)]
        name = f"op_{i:04d}_{lib.name.split('.')[0]}"
        d = ops / name
        d.mkdir(parents=True)
        shutil.copyfile(lib, d / f"{name}.so")
        os.chmod(d / f"{name}.so", 0o755)
        ninja = f"rule link\n  command = nvcc -shared $in -o $out\nbuild {name}.so: link\n"
        (d / "build.ninja").write_text(ninja)
        total += lib.stat().st_size + len(ninja)
        i += 1
    return total


# --- timing -----------------------------------------------------------------------------------


def sh(cmd: str) -> None:
    subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True, stdout=subprocess.DEVNULL)


def cli() -> list[str]:
    """The ``sglang-warmup`` a user runs: the console script beside this interpreter (this
    tree's code: the environment's editable install, or PYTHONPATH), else ``python -m``."""
    script = Path(sys.executable).parent / "sglang-warmup"
    return [str(script)] if script.exists() else [sys.executable, "-m", "warmup"]


def command(args: list[str], cwd: str | os.PathLike[str] | None = None,
            tree: Path = REPO) -> Callable[[], object]:
    """One run of ``sglang-warmup ARGS`` (the code of ``tree``: this one by default), in
    ``cwd``: a directory with no package metadata of its own (the repository's root holds the
    editable install's ``sglang_warmup.egg-info``, which makes metadata lookups take the slow
    way there)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]))
    # An installed package's modules are compiled: bytecode is written on the first run here
    # too, never compiled again on every run (a machine may set PYTHONDONTWRITEBYTECODE).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    where = str(cwd) if cwd is not None else tempfile.gettempdir()
    return lambda: subprocess.run([*cli(), *args], check=True, env=env, cwd=where,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def clock(fn: Callable[[], object], before: Callable[[], None] | None) -> float:
    if before:
        before()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


#: ``--wait-idle``: before each round, wait until the CPUs were at most this busy for a second
IDLE: float | None = None


def busy(seconds: float = 1.0) -> float:
    """The share of the machine's CPU time spent busy over the next ``seconds`` (/proc/stat)."""
    def sample() -> list[int]:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:]]
    a = sample()
    time.sleep(seconds)
    d = [y - x for x, y in zip(a, sample())]
    return 1 - (d[3] + d[4]) / max(sum(d), 1)


def wait_idle(deadline_s: float = 1800.0) -> float:
    """Wait (at most ``deadline_s``) for a second in which the CPUs were at most ``IDLE`` busy
    (a machine shared with other work: each round then runs as on an idle one); how busy."""
    if IDLE is None:
        return -1.0
    end = time.monotonic() + deadline_s
    while True:
        b = busy()
        if b <= IDLE or time.monotonic() > end:
            return b


def paired(rounds: int, cmd: Callable[[], object], ours: Callable[[], object],
           base: Callable[[], object], before: Callable[[], None] | None = None
           ) -> dict[str, object]:
    """Median times, and the medians of the per-round ratios of the command and of the library
    call to the baseline; the order of the three rotates per round."""
    runs: dict[str, list[float]] = {"cmd": [], "ours": [], "base": []}
    ratios: list[float] = []
    inproc: list[float] = []
    waited: list[float] = []
    order = ["cmd", "ours", "base"]
    fns = {"cmd": cmd, "ours": ours, "base": base}
    for r in range(rounds):
        waited.append(wait_idle())
        got = {}
        for who in order[r % 3:] + order[:r % 3]:
            got[who] = clock(fns[who], before)
            runs[who].append(got[who])
        ratios.append(got["cmd"] / got["base"])
        inproc.append(got["ours"] / got["base"])
    return {"cmd_s": statistics.median(runs["cmd"]), "ours_s": statistics.median(runs["ours"]),
            "base_s": statistics.median(runs["base"]), "ratio": statistics.median(ratios),
            "ratios": ratios, "inproc_ratio": statistics.median(inproc),
            "inproc_ratios": inproc, "load": os.getloadavg()[0], "busy_before": waited}


STARTUP = (["--version"], ["--help"], ["cache", "--help"], ["cache", "restore", "--help"],
           ["cache", "pack", "--help"])


def startup(runs: int, against: Path | None = None) -> None:
    """Wall time of each command's whole process, ``runs`` times each in rotation: the start-up
    a user waits for before a command does anything (in a directory of no package metadata).
    ``against``: another checkout (an export of an older commit), run in turn with this one."""
    trees = {"this tree": REPO, **({"against": against} if against else {})}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(runs):
            wait_idle()
            times.setdefault(("python -c pass", ""), []).append(clock(lambda: subprocess.run(
                [sys.executable, "-c", "pass"], check=True, cwd=cwd), None))
            for args in STARTUP:
                order = list(trees.items())
                for name, tree in (order if r % 2 == 0 else order[::-1]):
                    times.setdefault((" ".join(args), name), []).append(
                        clock(command(args, cwd, tree), None))
    print(f"{runs} runs; load {os.getloadavg()[0]:.1f}\n")
    print("| command | " + " | ".join(f"{t}: min / median (ms)" for t in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    print(f"| `python -c pass` | {_ms(times[('python -c pass', '')])} |" +
          " |" * (len(trees) - 1))
    for args in STARTUP:
        cmd = " ".join(args)
        print(f"| `{cmd}` | " + " | ".join(_ms(times[(cmd, t)]) for t in trees) + " |")


def _ms(ts: list[float]) -> str:
    return f"{min(ts) * 1000:.0f} / {statistics.median(ts) * 1000:.0f}"


def bench_cache(name: str, root: Path, kind_dir: str, loc: Location, work: Path, rounds: int,
                ops: tuple[str, ...]) -> dict[str, dict[str, float]]:
    fp = fingerprint.current(probe_gpu=False)
    dest = work / "dest"
    ours_tar, ours_zst = work / "ours.tar", work / "ours.tar.zst"
    base_tar, base_zst = work / "base.tar", work / "base.tar.zst"

    def fresh() -> None:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()

    def restore(path: Path, jobs: int | None = None) -> Callable[[], object]:
        return lambda: archive.plan_restore(path, dest=dest, local=fp).execute(jobs=jobs)

    out: dict[str, dict[str, object]] = {}
    # The archives the read-side operations use exist before those are timed.
    archive.pack(ours_tar, [loc], fingerprint=fp)
    if "pack zstd" in ops or "restore zstd" in ops:
        archive.pack(ours_zst, [loc], zstd=True, fingerprint=fp)
    packed = work / "cmd.tar"                   # the command's own output (ours_tar stays)
    pack_args = ["cache", "pack", "--root", str(root), "--kinds", loc.kind.name, "-y", "-q"]
    for op in ops:
        if op == "pack":
            out[op] = paired(rounds, command([*pack_args, str(packed)]),
                             lambda: archive.pack(packed, [loc], fingerprint=fp),
                             lambda: sh(f"tar -cf {base_tar} -C {root} {kind_dir}"))
        elif op == "pack zstd":
            out[op] = paired(rounds, command([*pack_args, "--zstd", f"{packed}.zst"]),
                             lambda: archive.pack(f"{packed}.zst", [loc], zstd=True,
                                                  fingerprint=fp),
                             lambda: sh(f"tar -cf - -C {root} {kind_dir} | zstd -q -3 -T0 -f "
                                        f"-o {base_zst}"))
        elif op == "verify":
            out[op] = paired(rounds, command(["cache", "verify", str(ours_tar), "-q"]),
                             lambda: archive.verify(ours_tar, local=fp),
                             lambda: sh(f"tar -xOf {ours_tar} | sha256sum"))
        elif op in ("restore", "restore j1", "restore zstd"):
            path = ours_zst if op == "restore zstd" else ours_tar
            jobs = 1 if op == "restore j1" else None
            out[op] = paired(rounds, command(["cache", "restore", str(path), "--dest", str(dest),
                                              "-q", *(["--jobs", "1"] if jobs else [])]),
                             restore(path, jobs),
                             lambda op=op: sh(f"zstd -q -dc {ours_zst} | tar -xf - -C {dest}"
                                              if op == "restore zstd" else
                                              f"tar -xf {ours_tar} -C {dest}"), fresh)
        t = out[op]
        print(f"  {name:10} {op:13} command {t['cmd_s']:7.3f}s  in-process {t['ours_s']:7.3f}s"
              f"  baseline {t['base_s']:7.3f}s  ratio {t['ratio']:.2f} (in-process "
              f"{t['inproc_ratio']:.2f})  load {t['load']:.1f}", flush=True)
    shutil.rmtree(dest, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=268, help="Triton cache size (MiB)")
    ap.add_argument("--entries", type=int, default=None,
                    help="Triton cache: exactly this many entries (8 files each) instead of "
                         "--size-mb")
    ap.add_argument("--so-mb", type=int, default=None,
                    help="FlashInfer cache size (MiB; default: 1024 scaled like --size-mb)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--caches", default="triton,flashinfer")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where caches, archives and restores go (default: a temporary "
                         "directory, removed afterwards); the file system under test")
    ap.add_argument("--json", type=Path, default=None, help="write raw numbers here")
    ap.add_argument("--seed", type=Path, default=None,
                    help="compiled Triton entries to clone (default: compile them here; a "
                         "machine without Triton can use a copy made by --compile-seed)")
    ap.add_argument("--so-source", type=Path, default=None,
                    help="where to find real shared libraries (default: this environment's "
                         "CUDA, torch and Triton wheels)")
    ap.add_argument("--compile-seed", type=Path, default=None,
                    help="only compile the seed Triton entries into this directory")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="SHARE",
                    help="before each round, wait until the CPUs were at most SHARE busy "
                         "(e.g. 0.08) for a second: rounds as on an idle machine, on a shared "
                         "one")
    ap.add_argument("--startup", type=int, default=None, metavar="N",
                    help="only time the start-up of --version, --help and the cache commands' "
                         "--help, N runs each (rotating), against `python -c pass`")
    ap.add_argument("--against", type=Path, default=None, metavar="DIR",
                    help="--startup: also time another checkout's code (e.g. an export of an "
                         "older commit), in turn with this tree's")
    args = ap.parse_args()
    if args.compile_seed:
        compile_kernels(args.compile_seed)
        return
    global IDLE
    IDLE = args.wait_idle
    if args.startup:
        startup(args.startup, args.against)
        return
    so_mb = args.so_mb if args.so_mb is not None else max(1, args.size_mb * 1024 // 268)
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    unknown = set(ops) - set(OPS)
    if unknown:
        raise SystemExit(f"--ops: unknown {sorted(unknown)}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {"python": platform.python_version(),
                                  "cpus": forks.usable_cpus(),   # taskset and cgroup limits count
                                  "rounds": args.rounds, "caches": {}}
    try:
        for name in [c.strip() for c in args.caches.split(",") if c.strip()]:
            cw = work / name
            shutil.rmtree(cw, ignore_errors=True)
            root = cw / "root"
            if name == "triton":
                seed = args.seed or work / "seed-triton"
                if not seed.is_dir():
                    compile_seed(seed)
                data = build_triton(seed, root / "triton", args.size_mb << 20, args.entries)
                kind_dir, loc = "triton", Location(kind("triton"), root / "triton", "bench")
            elif name == "flashinfer":
                base = root / ".cache" / "flashinfer"
                data = build_flashinfer(base, so_mb << 20, args.so_source)
                kind_dir, loc = ".cache", Location(kind("flashinfer"), base, "bench")
            else:
                raise SystemExit(f"--caches: unknown {name!r} (triton, flashinfer)")
            files = sum(1 for p in root.rglob("*") if p.is_file())
            entries = len(scan([loc]).entries)
            print(f"{name}: {data / (1 << 20):.0f} MiB, {entries} entries, {files} files",
                  flush=True)
            numbers = bench_cache(name, root, kind_dir, loc, cw, args.rounds, ops)
            results["caches"][name] = {"bytes": data, "entries": entries, "files": files,  # type: ignore[index]
                                       "ops": numbers}
            shutil.rmtree(cw, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian of {args.rounds} rounds; {results['cpus']} CPUs; "
          f"Python {results['python']}\n")
    print("| cache | operation | command / baseline (median) | in-process / baseline | "
          "command (s) | in-process (s) | baseline (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, c in results["caches"].items():  # type: ignore[union-attr]
        for op, t in c["ops"].items():
            print(f"| {name} | {op} | {t['ratio']:.2f} | {t['inproc_ratio']:.2f} | "
                  f"{t['cmd_s']:.2f} | {t['ours_s']:.2f} | {t['base_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
