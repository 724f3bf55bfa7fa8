#!/usr/bin/env python3
"""Where the first requests after ready spend their time: SGLang 0.5.17 servers on one GPU
(the tiny DeepSeek-V4 eager and with the breakable prefill graph, the tiny Qwen3-MoE with
default graphs), random traffic sent twice, and for every step of both passes what each
server process did while it ran.

Probes, all outside the measured requests' path except the first:
  * a stack sampler in every SGLang process (scheduler, detokenizer, HTTP main process),
    loaded through a ``sitecustomize`` on PYTHONPATH: the main thread's Python stack every
    4 ms, summed per step; a sample that comes late (the main thread held the GIL in native
    code) is a *gap*, kept with the stacks before and after it;
  * the server's process session watched every 50 ms: every new process (nvcc, cicc, ptxas,
    ninja, a compile worker) with its command line and when it appeared;
  * every JIT cache directory listed before and after each step: new files by kind;
  * the compile log our plugin writes (``WARMUP_ENABLE=1``, no plan for ``A`` launches):
    records by phase and step window;
  * GPU memory in use (nvidia-smi) before and after each step;
  * the host around each step (``host``): CPU seconds the server's processes and everything
    else on the machine (this harness left out) used while it ran, the time the hypervisor
    stole, the cores' mean clock, the load average and the GPU's SM clock, so that a first
    pass slower throughout can be told apart as the host's (other processes busy, time stolen,
    clocks down) or the server's (more CPU for the same step); and for the server's processes
    their user and system time, minor and major faults, the time their threads waited on a
    run queue and their voluntary and involuntary context switches (more CPU for the same
    step: waiting for a core, faulting memory in, or the same code running slower).

The script runs in phases, one device call each, on one machine kept warm between calls
(servers run in their own sessions, so they outlive a call):

    python3 scripts/gpu/first_hits.py setup --models qwen,dsv4 && \\
      python3 scripts/gpu/first_hits.py launch qwen-default-C          # call 1: base carry
    python3 scripts/gpu/first_hits.py setup && \\
      python3 scripts/gpu/first_hits.py launch dsv4-eager-A,dsv4-bcg-A \\
      && python3 scripts/gpu/first_hits.py traffic qwen-default-C --pause-others --budget 560
    python3 scripts/gpu/first_hits.py traffic dsv4-eager-A,dsv4-bcg-A --pause-others --budget 580
    python3 scripts/gpu/first_hits.py caches dsv4-eager-A                # JIT caches to $OUT

A finished prebake's archive and record can come back too (``keep-bake dsv4-eager-C``: xz
parts ``bake-NAME.partN`` under $OUT) and be carried into a later run, where ``unpack-bake
dsv4-eager-C --from DIR`` puts them back as ``/tmp/fh/dsv4-eager-C.tar`` (and its
``.steps.json``) for ``launch --restore``, without baking again.  They hold compiled kernels for
the GPU they were baked on: launch them on the same kind.

Operators' way (docs/benchmarks.md, "DeepSeek-V4 prebaked, restored under another path"):
``prebake dsv4-eager-C`` runs ``sglang-warmup prebake`` from empty caches in a session of its
own (``wait-prebake`` waits for it and keeps its answer), and ``launch NAMES --restore
/tmp/fh/dsv4-eager-C.tar`` restores that archive with ``sglang-warmup cache restore --dest``
under ``/tmp/fh/restored/NAME`` (a path of its own) before each launch, which then runs on the
``cache env --root`` layout of that directory.

A launch name is ``MODEL-GRAPHS-WARMUP``: MODEL ``dsv4`` or ``qwen``; GRAPHS ``eager``
(``--disable-prefill-cuda-graph``), ``bcg`` (DeepSeek-V4's breakable prefill graph) or
``default``; WARMUP ``A`` (none: the plugin records only) or ``C`` (``sglang-warmup serve
--plan``, the shipped plan for the model, or ``--plan``).  ``--seed-cache FROM`` starts a
launch from the caches under ``/tmp/fh/cache-FROM`` (see ``unpack-caches``).

``stop NAMES`` kills those launches; ``stop`` alone kills every launch but a running prebake
(``stop NAME-prebake`` names one).

Everything measured goes to ``$OUT/<launch>.json`` (rewritten as it goes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
sys.path.append("/tmp/ours")
SITE, SITE_TF, OURS = Path("/tmp/site"), Path("/tmp/site_tf"), Path("/tmp/ours")
WORK = Path("/tmp/fh")
PROBE_SITE = WORK / "probe_site"
MODELS = {"dsv4": Path("/tmp/tinydsv4"), "qwen": Path("/tmp/tiny")}
PLANS = {"dsv4": "deepseek_v4_serving_shapes", "qwen": "default"}
OUT = Path(os.environ.get("OUT", "/tmp/fh-out"))
T0 = time.time()

# The JIT cache variables every launch gets, each a directory of its own under the cache root.
CACHE_VARS = {"SGLANG_CACHE_DIR": "sglang", "SGLANG_JIT_CACHE_DIR": "sglang_jit",
              "TRITON_CACHE_DIR": "triton", "TVM_FFI_CACHE_DIR": "tvm_ffi",
              "FLASHINFER_WORKSPACE_BASE": "flashinfer", "TORCHINDUCTOR_CACHE_DIR": "inductor",
              "SGLANG_DG_CACHE_DIR": "deep_gemm", "TILELANG_CACHE_DIR": "tilelang",
              "CUDA_CACHE_PATH": "nv", "HOME": "home"}


def emit(filename: str, result: dict) -> None:
    """Print a result as JSON and keep it as ``$OUT/filename`` (what comes back from the GPU)."""
    print(json.dumps(result, indent=1))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / filename).write_text(json.dumps(result, indent=1))


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# the stack sampler, loaded into every SGLang process by sitecustomize
# --------------------------------------------------------------------------------------------

SAMPLER = r'''
import os, sys, threading, time, json

def _fh_sampler():
    d = os.environ.get("FH_PROBE_DIR")
    if not d:
        return
    def cmdline():
        try:
            with open("/proc/self/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return ""
    def short(path):
        i = path.rfind("site-packages/")
        if i >= 0:
            return path[i + 14:]
        parts = path.rsplit("/", 2)
        return "/".join(parts[-2:])
    def collapse(frame):
        out = []
        first = True
        while frame is not None and len(out) < 48:
            code = frame.f_code
            name = short(code.co_filename) + ":" + code.co_name
            if first:
                name += ":" + str(frame.f_lineno)
                first = False
            out.append(name)
            frame = frame.f_back
        return ";".join(reversed(out))
    def loop():
        role = None
        c = cmdline()
        if "launch_server" in c:
            role = "main"
        elif "multiprocessing" in c or "spawn" in c:
            for _ in range(2400):
                c = cmdline()
                spt = sys.modules.get("setproctitle")
                if spt is not None:
                    try:
                        c += " " + spt.getproctitle()
                    except Exception:
                        pass
                if "scheduler" in c:
                    role = "scheduler"
                    break
                if "detokenizer" in c:
                    role = "detokenizer"
                    break
                time.sleep(0.5)
        if role is None:
            return
        main = threading.main_thread().ident
        window_path = os.path.join(d, "window")
        out = open(os.path.join(d, f"stacks-{role}-{os.getpid()}.jsonl"), "a", buffering=1)
        agg, gaps = {}, []
        window, mark, started = None, None, time.perf_counter()
        last, last_stack, samples = time.perf_counter(), "", 0
        while True:
            time.sleep(0.004)
            now = time.perf_counter()
            try:
                m = os.stat(window_path).st_mtime_ns
            except OSError:
                m = None
            if m != mark:
                if window and window != "idle":
                    top = sorted(agg.items(), key=lambda kv: -kv[1])[:40]
                    out.write(json.dumps({"window": window, "role": role, "pid": os.getpid(),
                                          "wall_s": round(now - started, 4), "samples": samples,
                                          "stacks": [[s, round(t, 4)] for s, t in top],
                                          "gaps": gaps[:20]}) + "\n")
                try:
                    with open(window_path) as f:
                        window = f.read().strip()
                except OSError:
                    window = None
                mark, agg, gaps, samples, started = m, {}, [], 0, now
            dt, last = now - last, now
            frame = sys._current_frames().get(main)
            stack = collapse(frame) if frame is not None else "<no frame>"
            if window and window != "idle":
                agg[stack] = agg.get(stack, 0.0) + dt
                samples += 1
                if dt > 0.05:
                    gaps.append({"s": round(dt, 3), "before": last_stack[-600:],
                                 "after": stack[-600:]})
            last_stack = stack
    threading.Thread(target=loop, daemon=True, name="fh-sampler").start()

try:
    _fh_sampler()
except Exception:
    pass
'''


# --------------------------------------------------------------------------------------------
# setup
# --------------------------------------------------------------------------------------------

def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{PROBE_SITE}:{SITE_TF}:{SITE}:{OURS}"
    env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    env["PYTHONUNBUFFERED"] = "1"
    env["NCCL_NVLS_ENABLE"] = "0"
    env["NVSHMEM_DISABLE_NVLS"] = "1"
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    return env


def setup(models: list[str]) -> None:
    """Unpack every carried tarball not unpacked yet, install this project from the checkout,
    write the sampler, and the tiny models asked for."""
    carry = ROOT / ".carry"
    t = time.time()
    jobs = []
    for name, dest in (("site.tar.xz", SITE), ("tf.tar.xz", SITE_TF), ("dsv4.tar.xz", SITE)):
        done = dest / f".unpacked-{name}"
        if (carry / name).exists() and (carry / name).stat().st_size and not done.exists():
            dest.mkdir(parents=True, exist_ok=True)
            jobs.append((done, subprocess.Popen(["tar", "-xJf", str(carry / name), "-C", str(dest)])))
    for done, p in jobs:
        if p.wait() != 0:
            raise SystemExit(f"unpacking for {done} failed")
        done.touch()
    log(f"unpacked {len(jobs)} tarballs in {time.time() - t:.1f} s")
    if not OURS.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "--target", str(OURS), str(ROOT)], check=True)
        log("installed sglang-warmup from the checkout")
    PROBE_SITE.mkdir(parents=True, exist_ok=True)
    (PROBE_SITE / "sitecustomize.py").write_text(SAMPLER)
    env = base_env()
    gens = []
    if "qwen" in models and not (MODELS["qwen"] / "config.json").exists():
        gens.append(subprocess.Popen(
            [sys.executable, str(ROOT / "scripts/gpu/gen_tiny_model.py"), str(MODELS["qwen"]),
             "--vocab", "65600"], env=dict(env, TINY_MAX_POS="40960", CUDA_VISIBLE_DEVICES="0")))
    if "dsv4" in models and not (MODELS["dsv4"] / "config.json").exists():
        gens.append(subprocess.Popen(
            [sys.executable, str(ROOT / "scripts/gpu/gen_tiny_dsv4.py"), str(MODELS["dsv4"]),
             "--device", "cuda"], env=dict(env, CUDA_VISIBLE_DEVICES="0")))
    for p in gens:
        if p.wait() != 0:
            raise SystemExit("model generation failed")
    log(f"setup done in {time.time() - t:.1f} s")


# --------------------------------------------------------------------------------------------
# launches
# --------------------------------------------------------------------------------------------

def parse_name(name: str) -> tuple[str, str, str]:
    m = re.fullmatch(r"(dsv4|qwen)-(eager|bcg|default)-(A|C)[A-Za-z0-9]*", name)
    if not m:
        raise SystemExit(f"{name}: expected MODEL-GRAPHS-WARMUP (dsv4|qwen)-(eager|bcg|default)-(A|C)")
    return m.group(1), m.group(2), m.group(3)


def state_path() -> Path:
    return WORK / "state.json"


def load_state() -> dict:
    try:
        return json.loads(state_path().read_text())
    except (OSError, ValueError):
        return {}


def save_state(state: dict) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(state, indent=1))


def server_argv(model: str, graphs: str, port: int, frac: float) -> list[str]:
    if model == "dsv4":
        import dsv4_smoke
        kind = {"eager": "eager", "bcg": "bcg", "default": "bcg"}[graphs]
        argv = dsv4_smoke.server_argv(kind, port, frac)[3:]
        return argv + ["--enable-metrics"]
    import e2e_warmup
    e2e_warmup.MODEL = MODELS["qwen"]
    return e2e_warmup.server_args(str(frac), eager_prefill=graphs == "eager") + ["--port", str(port)]


def root_layout(root: Path) -> dict[str, str]:
    """The cache variables of ``sglang-warmup cache env --root ROOT`` (every kind under one
    directory, the layout ``cache restore --dest`` and ``prebake`` write), and HOME."""
    p = subprocess.run([sys.executable, "-m", "warmup", "cache", "env", "--root", str(root),
                        "--format", "sh"], env=base_env(), capture_output=True, text=True,
                       check=True)
    env = {}
    for line in p.stdout.splitlines():
        if line.startswith("export "):
            var, _, value = line[len("export "):].partition("=")
            env[var] = value.strip("'\"")
    (root / "home").mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(root / "home")
    return env


def restore(archive: Path, dest: Path) -> dict:
    """``sglang-warmup cache restore ARCHIVE --dest DEST``, timed (what an operator's init step
    runs before the server starts)."""
    t = time.time()
    p = subprocess.run([sys.executable, "-m", "warmup", "cache", "restore", str(archive),
                        "--dest", str(dest), "--format", "json", "-q"], env=base_env(),
                       capture_output=True, text=True)
    took = round(time.time() - t, 2)
    if p.returncode:
        raise SystemExit(f"restore into {dest} failed: {p.stderr.strip()[-600:]}")
    log(f"restored {archive.name} into {dest} in {took} s")
    try:
        answer = json.loads(p.stdout)
    except ValueError:
        answer = {"stdout": p.stdout[-2000:]}
    return {"seconds": took, "dest": str(dest), "answer": answer}


def with_flags(args: list[str], flags: list[str]) -> list[str]:
    """SGLang's flags ``args`` with each ``NAME=VALUE`` of ``flags`` set (``--NAME VALUE``,
    replacing the value the rig gives it)."""
    out = list(args)
    for item in flags:
        name, eq, value = item.partition("=")
        if not eq or not name.strip("-"):
            raise SystemExit(f"--server-flag {item!r}: expected NAME=VALUE (one value), e.g. "
                             "max-running-requests=64")
        flag = "--" + name.lstrip("-")
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def launch(names: list[str], frac: dict[str, float], plan: str | None, seed_cache: str | None,
           precompile: bool = False, restore_from: str | None = None,
           steps_record: str | None = None, flags: list[str] | None = None) -> None:
    """Start the launches ``names``; a C launch with ``steps_record`` sends only the steps that
    record found loud (``serve --steps``); ``flags`` (``NAME=VALUE``) change the rig's SGLang
    flags (a request cap, the decode graphs' largest size)."""
    state = load_state()
    env0 = base_env()
    for name in names:
        model, graphs, warm = parse_name(name)
        port = 31000 + 10 * len(state)
        base = WORK / name
        for sub in ("state", "probe"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        env = dict(env0, CUDA_VISIBLE_DEVICES="0", WARMUP_ENABLE="1",
                   WARMUP_STATE_DIR=str(base / "state"), FH_PROBE_DIR=str(base / "probe"))
        restored = None
        if restore_from:
            # the archive restored under a path of its own, not the one it was baked in
            cache = WORK / "restored" / name
            restored = restore(Path(restore_from), cache)
            env.update(root_layout(cache))
        else:
            cache = base / "cache"
            if seed_cache and not cache.exists():
                src = WORK / f"cache-{seed_cache}"
                subprocess.run(["cp", "-a", str(src), str(cache)], check=True)
            for var, sub in CACHE_VARS.items():
                (cache / sub).mkdir(parents=True, exist_ok=True)
                env[var] = str(cache / sub)
        # SGLang's DeepGEMM precompile (M = 1..16,384 per GEMM shape): on, as operators run it,
        # unless --no-precompile (the first window ran without it, to fit a device call)
        env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] = "1" if precompile else "0"
        if warm == "A":
            env["WARMUP_GEMM_SWEEP_S"] = "0"
        args = with_flags(server_argv(model, graphs, port, frac.get(model, 0.3)), flags or [])
        if warm == "C":
            argv = [sys.executable, "-m", "warmup", "serve", "--plan", plan or PLANS[model],
                    "--lenient", "--state-dir", str(base / "state"),
                    "--report", str(base / "report.json"),
                    *(["--steps", steps_record] if steps_record else []), "--", *args]
        else:
            argv = [sys.executable, "-m", "sglang.launch_server", *args]
        logf = open(base / "server.log", "w")
        p = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd="/tmp")
        state[name] = {"pid": p.pid, "port": port, "t0": time.time(), "model": model,
                       "graphs": graphs, "warm": warm, "argv": " ".join(argv[1:]),
                       "cache": str(cache), "base": str(base), "restored": restored,
                       "precompile": env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"]}
        log(f"launched {name} (pid {p.pid}, port {port})")
        save_state(state)
        if len(names) > 1:
            time.sleep(20)  # let the first size its KV pool from the free memory it sees


def start_prebake(name: str, frac: dict[str, float], plan: str | None, precompile: bool) -> None:
    """``sglang-warmup prebake`` of launch ``name`` (a C launch: its plan) from empty caches,
    in a session of its own so that it outlives the call: the cold start operators pay once,
    per image.  The archive is ``WORK/NAME.tar``; ``wait-prebake`` waits for it."""
    model, graphs, warm = parse_name(name)
    if warm != "C":
        raise SystemExit(f"{name}: a prebake runs a plan: name a C launch")
    state = load_state()
    port = 31000 + 10 * len(state)
    bake = WORK / f"{name}-bake"
    shutil.rmtree(bake, ignore_errors=True)
    env = dict(base_env(), CUDA_VISIBLE_DEVICES="0",
               SGLANG_JIT_DEEPGEMM_PRECOMPILE="1" if precompile else "0")
    argv = [sys.executable, "-m", "warmup", "prebake", "--plan", plan or PLANS[model],
            "--out", str(WORK / f"{name}.tar"), "--work-dir", str(bake), "--format", "json",
            "-y", "--", *server_argv(model, graphs, port, frac.get(model, 0.3))]
    out = open(WORK / f"{name}.prebake.json", "w")
    err = open(WORK / f"{name}.prebake.log", "w")
    p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True,
                         cwd="/tmp")
    state[f"{name}-prebake"] = {"pid": p.pid, "port": port, "t0": time.time(), "model": model,
                                "graphs": graphs, "warm": warm, "argv": " ".join(argv[1:]),
                                "cache": str(bake / "cache"), "base": str(bake),
                                "prebake": True, "precompile": env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"]}
    save_state(state)
    log(f"prebake of {name} started (pid {p.pid}, port {port})")


def wait_prebake(name: str, budget: float) -> bool:
    """Wait for the prebake of ``name`` to end; its answer, compiles by phase and archive size
    go to ``$OUT/NAME-prebake.json``."""
    from warmup.prebake.bake import LEARN_REPORT, LEARN_STATE

    state = load_state()
    s = state[f"{name}-prebake"]
    while alive(s["pid"]) and time.time() - T0 < budget:
        time.sleep(3)
    if alive(s["pid"]):
        log(f"prebake of {name} still running after {time.time() - s['t0']:.0f} s")
        return False
    # the exit status of a process of another call's session is not ours to wait for: the
    # answer is the JSON it printed
    text = (WORK / f"{name}.prebake.json").read_text(errors="replace")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"unparsed": text[-3000:]}
    archive = WORK / f"{name}.tar"
    res = {"name": name, "seconds": round((WORK / f"{name}.prebake.json").stat().st_mtime - s["t0"], 1),
           "answer": answer, "archive_bytes": archive.stat().st_size if archive.exists() else None,
           "compiles": compiles_by_phase(Path(s["base"]) / "state"),
           "compiles_learn_start": compiles_by_phase(Path(s["base"]) / LEARN_STATE),
           "stderr_tail": (WORK / f"{name}.prebake.log").read_text(errors="replace")[-4000:]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}-prebake.json").write_text(json.dumps(res, indent=1, default=str))
    # the steps record beside the archive, the cold start's run report, and the report of the
    # start from the baked caches that learned the record (both passes' step times)
    for src, dst in ((WORK / f"{name}.tar.steps.json", f"{name}.tar.steps.json"),
                     (Path(s["base"]) / "report.json", f"{name}-prebake-report.json"),
                     (Path(s["base"]) / LEARN_REPORT, f"{name}-learn-report.json")):
        if src.exists():
            shutil.copy(src, OUT / dst)
    log(f"prebake of {name} ended after {res['seconds']} s: archive "
        f"{res['archive_bytes']} bytes, compiles {res['compiles']}")
    return archive.exists()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def ready(s: dict) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{s['port']}/health", timeout=5) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def wait_ready(names: list[str], budget: float) -> list[str]:
    state = load_state()
    up: list[str] = []
    while time.time() - T0 < budget:
        for name in names:
            s = state[name]
            if name in up:
                continue
            if not alive(s["pid"]):
                log(f"{name} died; log tail:\n{tail(s, 40)}")
                up.append(name)
                s["died"] = True
            elif ready(s):
                s.setdefault("ready_s", round(time.time() - s["t0"], 1))
                s.setdefault("artifacts_at_ready", artifacts(Path(s["cache"])))
                s.setdefault("compiles_at_ready", compiles_by_phase(Path(s["base"]) / "state"))
                log(f"{name} ready after {s['ready_s']} s")
                if not s.get("startup_log"):    # once: a later wait (traffic) finds it ready
                    s["startup_log"] = keep_startup_log(name, s)
                up.append(name)
        save_state(state)
        if len(up) == len(names):
            break
        time.sleep(0.25)  # the ready time to a quarter second
    return [n for n in up if not state[n].get("died")]


_REQUEST_LINES = re.compile(r"POST /generate|GET /health|GET /model_info|GET /get_model_info|"
                            r"Prefill batch|Decode batch|POST /flush_cache")


def keep_startup_log(name: str, s: dict) -> bool:
    """The server's log up to ready without its per-request lines, to ``$OUT/NAME-startup.log``:
    SGLang's own time-stamped milestones (weights, DeepGEMM's precompile, CUDA-graph capture,
    the warm-up's steps) show where a launch spends its start."""
    try:
        lines = (Path(s["base"]) / "server.log").read_text(errors="replace").splitlines()
    except OSError:
        return False
    kept = [ln for ln in lines if not _REQUEST_LINES.search(ln)]
    head = (f"# launch {name} t0={s['t0']:.1f} ready_s={s.get('ready_s')} "
            f"(scripts/gpu/startup_timeline.py reads this line)")
    OUT.mkdir(parents=True, exist_ok=True)
    # the beginning is kept: the timeline counts from the first line
    (OUT / f"{name}-startup.log").write_text(head + "\n" + "\n".join(kept)[:400_000] + "\n")
    return True


def tail(s: dict, n: int) -> str:
    try:
        lines = (Path(s["base"]) / "server.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(line[:300] for line in lines[-n:])


def session_pids(sid: int) -> dict[int, str]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                out[int(d)] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")[:300]
        except (OSError, IndexError, ValueError):
            continue
    return out


def pause(state: dict, names: list[str], stop: bool) -> None:
    for name in names:
        s = state[name]
        if alive(s["pid"]):
            try:
                os.killpg(s["pid"], signal.SIGSTOP if stop else signal.SIGCONT)
            except OSError:
                pass


# --------------------------------------------------------------------------------------------
# per-step probes
# --------------------------------------------------------------------------------------------

def listing(cache: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    subs = sorted(e.name for e in os.scandir(cache) if e.is_dir()) if cache.is_dir() else []
    for sub in subs:
        root = cache / sub
        files: set[str] = set()
        for dirpath, _dirs, names in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            for n in names:
                files.add(os.path.join(rel, n))
        out[sub] = files
    return out


def artifacts(cache: Path) -> dict[str, int]:
    return {k: len(v) for k, v in listing(cache).items()}


def gpu_mem() -> dict[int, int]:
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=10)
        out = {}
        for line in p.stdout.splitlines():
            pid, mem = (x.strip() for x in line.split(","))
            out[int(pid)] = int(mem)
        return out
    except Exception:  # noqa: BLE001
        return {}


def host_sample(pids: list[int]) -> dict:
    """The GPU's SM clock, then the machine's CPU jiffies (busy, steal) and those of each of
    ``pids`` (with their reaped children: a JIT build's compiler), the cores' mean MHz and the
    1-minute load, now.  nvidia-smi runs first, so its own CPU falls outside the step."""
    out: dict = {"t": time.time()}
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
        out["sm_mhz"] = int(p.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:9]]  # guest is inside user already
        cpu += [0] * (8 - len(cpu))
        out["busy"] = sum(cpu) - cpu[3] - cpu[4] - cpu[7]  # less idle, iowait and steal
        out["steal"] = cpu[7]
        with open("/proc/loadavg") as f:
            out["load1"] = float(f.read().split()[0])
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        out["cpu_mhz"] = round(sum(mhz) / len(mhz)) if mhz else None
    except (OSError, ValueError, IndexError):
        pass
    procs, sched = {}, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            procs[pid] = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
        sched[pid] = proc_sched(pid, fields)
    out["procs"], out["sched"] = procs, sched
    out["own"] = sum(os.times()[:4])  # this harness (seconds)
    return out


def proc_sched(pid: int, fields: list[str]) -> dict[str, float]:
    """How one process ran, summed over its threads: user and system jiffies, minor and major
    page faults (``stat``), the nanoseconds its threads waited on a run queue (``schedstat``),
    and its voluntary and involuntary context switches (``status``).  A step that takes more
    CPU for the same work shows here whether the server waited for a core (run-queue delay,
    involuntary switches), faulted memory in (minor faults, system time) or ran its own code
    slower (user time alone)."""
    out: dict[str, float] = {"utime": int(fields[11]), "stime": int(fields[12]),
                             "minflt": int(fields[7]), "majflt": int(fields[9])}
    wait_ns = vcs = ivcs = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                wait_ns += int(f.read().split()[1])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vcs += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        ivcs += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    out.update(run_delay_ns=wait_ns, vcs=vcs, ivcs=ivcs)
    return out


def host_delta(a: dict, b: dict) -> dict:
    """What the host did between two samples of :func:`host_sample`: the server's CPU seconds
    (processes present in both), the rest of the machine's less this harness's, steal."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict = {"load1": b.get("load1"), "cpu_mhz": [a.get("cpu_mhz"), b.get("cpu_mhz")],
                 "sm_mhz": [a.get("sm_mhz"), b.get("sm_mhz")]}
    if "busy" in a and "busy" in b:
        server = sum(b["procs"][pid] - v for pid, v in a["procs"].items()
                     if pid in b["procs"]) / tick
        out["server_cpu_s"] = round(server, 3)
        out["other_cpu_s"] = round((b["busy"] - a["busy"]) / tick - server
                                   - (b["own"] - a["own"]), 3)
        out["steal_s"] = round((b["steal"] - a["steal"]) / tick, 3)
    sa, sb = a.get("sched") or {}, b.get("sched") or {}
    both = [pid for pid in sa if pid in sb]
    if both:
        # a thread that ended between the samples takes its counts with it: never below 0
        d = {k: max(0, sum(sb[pid][k] - sa[pid][k] for pid in both)) for k in sa[both[0]]}
        out.update(user_s=round(d["utime"] / tick, 3), sys_s=round(d["stime"] / tick, 3),
                   minflt=d["minflt"], majflt=d["majflt"],
                   run_delay_s=round(d["run_delay_ns"] / 1e9, 4),
                   vcs=d["vcs"], ivcs=d["ivcs"])
    return out


class Watcher:
    """New processes of one session while a step runs, every 50 ms."""

    def __init__(self, sid: int) -> None:
        self.sid, self.seen = sid, set(session_pids(sid))
        self.new: list[dict] = []
        self.stop_ev = threading.Event()
        self.t0 = time.time()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            for pid, cmd in session_pids(self.sid).items():
                if pid not in self.seen:
                    self.seen.add(pid)
                    self.new.append({"t": round(time.time() - self.t0, 3), "pid": pid,
                                     "cmd": cmd[:240]})
            self.stop_ev.wait(0.05)

    def stop(self) -> list[dict]:
        self.stop_ev.set()
        self.th.join(2)
        return self.new


def log_mark(state_dir: Path) -> dict[str, int]:
    """Where every compile-log file of the launch ends now (for :func:`compile_records`)."""
    from cache_tools.compile_log import Cursor

    return Cursor(state_dir).mark()


def settle(state_dir: Path, quiet: float = 0.3, cap: float = 1.5) -> None:
    """Wait until the compile log has stopped growing for ``quiet`` seconds (at most ``cap``):
    a compile's records (an Inductor graph's files, the Dynamo build) reach the log up to a
    second after the request that caused it, and would otherwise be put on the next step."""
    t_end = time.time() + cap
    last, since = log_mark(state_dir), time.time()
    while time.time() < t_end and time.time() - since < quiet:
        time.sleep(0.05)
        now = log_mark(state_dir)
        if now != last:
            last, since = now, time.time()


def compile_records(state_dir: Path, since: dict[str, int] | None = None) -> list[dict]:
    """The launch's compile-log records, in time order (those written after ``since``, a
    :func:`log_mark`, when given: the files of several processes grow at once, so an index
    into their concatenation would not say which records are new)."""
    from cache_tools.compile_log import Cursor

    out = []
    for rec in Cursor(state_dir).read(since or {}):
        kernel = rec.get("kernel")
        name = kernel.get("name") if isinstance(kernel, dict) else rec.get("module_name")
        row = {"t": rec.get("time"), "event": rec.get("event"), "phase": rec.get("phase"),
               "compiler": rec.get("compiler"), "name": name,
               "seconds": rec.get("seconds") or rec.get("duration_s"),
               "outcome": rec.get("outcome"), "pid": rec.get("pid"),
               "reason": rec.get("reason")}
        if rec.get("event") in ("miss", "hit"):
            # the specialization a Triton miss compiled or a hit loaded from disk (integer and
            # pointer classes, the constexprs): which key the warm-up did not reach
            row.update({k: rec.get(k) for k in ("attrs", "constexprs", "signature", "hash")})
        elif rec.get("event") == "load":
            row["hash"] = rec.get("hash")
        out.append(row)
    return out


def compiles_by_phase(state_dir: Path) -> dict[str, dict[str, int]]:
    """Compiles of the compile log (a Triton miss, a JIT build that built) by phase, then by
    compiler: what 'compiles before and after ready' counts."""
    from cache_tools.compile_log import is_miss

    out: dict[str, dict[str, int]] = {}
    for r in compile_records(state_dir):
        if is_miss(r):
            by = out.setdefault(r.get("phase") or "?", {})
            by[r.get("compiler") or "?"] = by.get(r.get("compiler") or "?", 0) + 1
    return out


# --------------------------------------------------------------------------------------------
# traffic
# --------------------------------------------------------------------------------------------

SAMPLERS = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 0.8, "top_p": 0.9, "top_k": 40},
    "minp": {"temperature": 1.0, "min_p": 0.05},
    "repetition": {"temperature": 0.7, "repetition_penalty": 1.1},
    "freq_presence": {"temperature": 0.7, "frequency_penalty": 0.3, "presence_penalty": 0.2},
    "greedy_penalized": {"temperature": 0, "repetition_penalty": 1.05, "frequency_penalty": 0.1},
}
LOGPROBS = {
    "none": {},
    "output_top": {"return_logprob": True, "top_logprobs_num": 5},
    "input_from_0": {"return_logprob": True, "logprob_start_len": 0},
    "input_offset_top": {"return_logprob": True, "logprob_start_len": -1, "top_logprobs_num": 20},
    "token_ids": {"return_logprob": True, "token_ids_logprob": 4},
}


def random_traffic(seed: int, steps: int, context: int, chunk: int, burst_max: int = 5) -> list:
    """Random steps: single prompts of log-uniform length up to the context, bursts of 2 to
    ``burst_max`` mixed-length prompts (one multi-request extend; a burst of more than 5 gets
    prompts of at most 256 tokens, many short requests at once), and every sampler family
    crossed with every logprob mode, ``n`` and streaming at random.  The default draws the same
    steps as before the option existed."""
    from warmup.coverage.traffic import TrafficStep

    rng = random.Random(seed)
    out = []

    def length(hi: int) -> int:
        return max(1, int(math.exp(rng.uniform(0, math.log(hi)))))

    for i in range(steps):
        samp_name = rng.choice(list(SAMPLERS))
        lp_name = rng.choice(list(LOGPROBS))
        max_new = rng.choice([1, 4, 16, 32, 64])
        r = rng.random()
        if r < 0.45:
            hi = context - max_new - 2
            prompts = [rng.randint(1, hi) if rng.random() < 0.35 else length(hi)]
            kind = "single"
        else:
            size = rng.randint(2, burst_max)
            hi = min(chunk * 3, context // 2) if size <= 5 else 256
            prompts = [length(hi) for _ in range(size)]
            kind = "burst"
        feats = dict(LOGPROBS[lp_name])
        if feats.get("logprob_start_len") == -1:
            feats["logprob_start_len"] = max(0, min(prompts) // 2)
        if feats.get("return_logprob") and feats.get("logprob_start_len", -1) == 0:
            # input logprobs over the whole prompt: keep the rows bounded (the logits of
            # every position are materialised)
            prompts = [min(p, 6000) for p in prompts]
        if rng.random() < 0.15 and SAMPLERS[samp_name]["temperature"] > 0:
            feats["n"] = 2
        if rng.random() < 0.15 and kind == "single":
            feats["stream"] = True
        label = f"{i:02d}-{kind}-{samp_name}-{lp_name}" + ("-n2" if feats.get("n") else "") \
            + ("-stream" if feats.get("stream") else "")
        out.append(TrafficStep(kind=kind, prompts=prompts, max_new_tokens=max_new,
                               sampling=dict(SAMPLERS[samp_name]), features=feats, label=label))
    return out


def send_step(transport, step) -> dict:
    t = time.perf_counter()
    try:
        outs = asyncio.run(transport.send(step))
        known = [o.server_s for o in outs if o.server_s is not None]
        return {"ms": round((time.perf_counter() - t) * 1000, 1),
                "server_ms": round(max(known) * 1000, 1) if known else None}
    except Exception as exc:  # noqa: BLE001
        return {"ms": round((time.perf_counter() - t) * 1000, 1), "error": str(exc)[:300]}


def set_window(base: Path, label: str) -> None:
    p = base / "probe" / "window"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(label)
    os.replace(tmp, p)


def flush(port: int) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/flush_cache", data=b"", method="POST")
    with contextlib_suppress():
        urllib.request.urlopen(req, timeout=60).read()
    time.sleep(1)


class contextlib_suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def run_traffic(name: str, steps_n: int, passes: int, seed: int, budget: float,
                burst_max: int = 5) -> None:
    from warmup.serve.transport import HttpTransport

    state = load_state()
    s = state[name]
    base, cache = Path(s["base"]), Path(s["cache"])
    model = s["model"]
    context = 131072 if model == "dsv4" else 40960
    chunk = 4096 if model == "dsv4" else 8192
    steps = random_traffic(seed, steps_n, context, chunk, burst_max)
    res: dict = {"name": name, "launch": {k: v for k, v in s.items()}, "seed": seed,
                 "steps": [st.to_json() for st in steps], "passes": {}}
    out_path = OUT / f"{name}.json"

    def save() -> None:
        OUT.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=0, default=str))

    res["compile_before"] = len(compile_records(base / "state"))
    for p in range(1, passes + 1):
        if p > 1:
            flush(s["port"])
        tr = HttpTransport(f"http://127.0.0.1:{s['port']}", timeout_s=300, seed=f"fh{seed}")
        tr.tokens.salt = f"pass{p}"
        tr.facts_sync()
        tr.tokens.salt = f"pass{p}"
        rows = []
        res["passes"][str(p)] = rows
        for i, st in enumerate(steps):
            if time.time() - T0 > budget - 30:
                rows.append({"i": i, "skipped": "budget"})
                continue
            before = listing(cache)
            mem0 = gpu_mem()
            server_pids = list(session_pids(s["pid"]))
            host0 = host_sample(server_pids)
            mark = log_mark(base / "state")
            w = Watcher(s["pid"])
            set_window(base, f"p{p}:s{i}")
            t_wall = time.time()
            row = {"i": i, "label": st.label, "t": round(t_wall - s["t0"], 2),
                   **send_step(tr, st.to_step(i))}
            set_window(base, "idle")
            row["host"] = host_delta(host0, host_sample(server_pids))
            row["procs"] = w.stop()
            settle(base / "state")
            after = listing(cache)
            row["new_files"] = {k: sorted(after[k] - before[k])[:12] for k in after
                                if after[k] - before[k]}
            row["new_file_counts"] = {k: len(after[k] - before[k]) for k in after
                                      if after[k] - before[k]}
            mem1 = gpu_mem()
            row["gpu_mib"] = [sum(mem0.values()), sum(mem1.values())]
            row["compile_events"] = compile_records(base / "state", mark)[:30]
            rows.append(row)
            log(f"{name} p{p} s{i:02d} {st.label}: {row.get('ms')} ms"
                + (f" new {row['new_file_counts']}" if row["new_file_counts"] else "")
                + (f" procs {len(row['procs'])}" if row["procs"] else "")
                + (f" ERROR {row['error']}" if row.get("error") else ""))
            save()
            time.sleep(0.05)
    time.sleep(0.3)
    res["stacks"] = read_stacks(base / "probe")
    res["compile_log_tail"] = compile_records(base / "state")[-400:]
    rep = base / "report.json"
    if rep.exists():
        try:
            res["warmup_report"] = json.loads(rep.read_text())
        except ValueError:
            pass
    res["log_tail"] = tail(s, 60)
    save()
    summarize(res)


def read_stacks(probe: Path) -> list[dict]:
    out = []
    for path in sorted(probe.glob("stacks-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def summarize(res: dict) -> None:
    p1, p2 = res["passes"].get("1", []), res["passes"].get("2", [])
    for a, b in zip(p1, p2):
        if "ms" in a and "ms" in b and b["ms"]:
            ratio = a["ms"] / b["ms"]
            if ratio > 1.5:
                log(f"SLOW {res['name']} s{a['i']:02d} {a['label']}: {a['ms']} vs {b['ms']} ms "
                    f"({ratio:.1f}x) new={a.get('new_file_counts')} procs={len(a.get('procs') or [])}"
                    f" host={a.get('host')} repeat host={b.get('host')}")


# --------------------------------------------------------------------------------------------
# caches in and out
# --------------------------------------------------------------------------------------------

def pack_parts(directory: Path, members: list[str], prefix: str, part_mb: int = 15) -> None:
    """``members`` of ``directory`` as one tar.xz in parts of at most ``part_mb`` MB under $OUT
    (``PREFIX.partN``: what comes back from the GPU, at most 8 files of 16 MiB)."""
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = WORK / f"{prefix}.tar.xz"
    subprocess.run(["tar", "-C", str(directory), "-cJf", str(tmp), *members], check=True,
                   env={**os.environ, "XZ_OPT": "-6 -T0"})
    data = tmp.read_bytes()
    size = part_mb * 1024 * 1024
    for i in range(0, len(data), size):
        (OUT / f"{prefix}.part{i // size}").write_bytes(data[i:i + size])
    log(f"{prefix}: {len(data) / 1e6:.1f} MB in {math.ceil(len(data) / size)} parts")


def unpack_parts(prefix: str, src: Path, dest: Path) -> None:
    """The parts :func:`pack_parts` wrote, carried back under ``src``, unpacked into ``dest``."""
    parts = sorted(src.glob(f"{prefix}.part*"), key=lambda p: int(p.suffix[5:]))
    if not parts:
        raise SystemExit(f"no {prefix}.part* under {src}")
    dest.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen(["tar", "-xJf", "-", "-C", str(dest)], stdin=subprocess.PIPE)
    for part in parts:
        p.stdin.write(part.read_bytes())
    p.stdin.close()
    if p.wait():
        raise SystemExit(f"unpacking {prefix} failed")
    log(f"{prefix}: {len(parts)} parts unpacked to {dest}")


def pack_caches(name: str) -> None:
    """The launch's JIT caches (``cache-NAME.partN`` under $OUT)."""
    pack_parts(Path(load_state()[name]["cache"]), ["."], f"cache-{name}")


def keep_bake(name: str) -> None:
    """A finished prebake's archive and steps record (``bake-NAME.partN`` under $OUT), so that a
    later run can carry them in and launch from them without baking again (``unpack-bake``)."""
    members = [f"{name}.tar"] + ([f"{name}.tar.steps.json"]
                                 if (WORK / f"{name}.tar.steps.json").exists() else [])
    pack_parts(WORK, members, f"bake-{name}")


# --------------------------------------------------------------------------------------------

def restrict(record_path: str, ratio: float, min_ms: float, out: str) -> None:
    """The record at ``record_path`` with the steps another timing rule keeps (from its own
    evidence, closed over prefixes as the bake closes them) written to ``out``: what a launch
    sends under that rule, the plan expanded again from the record's facts."""
    import dataclasses

    from warmup.coverage import quiet_steps
    from warmup.plan import facts_file, loader, shipped, step_record
    from warmup.plan.expand import expand

    rec = step_record.read(record_path)
    facts = facts_file.from_dump(dict(rec.facts), record_path, hint="a record prebake wrote")
    plan = shipped.path(rec.plan)
    exp = expand(loader.load(plan if plan is not None else rec.plan), facts)
    why = rec.mismatch(exp)
    if why is not None:  # the same check a launch makes (the device aside: not known here)
        raise SystemExit(f"{record_path}: {why}")
    keep = step_record.prefix_closure(exp, quiet_steps.loud(
        rec.evidence, ratio=ratio, min_ms=min_ms, hitting=quiet_steps.hitting(exp)))
    dataclasses.replace(rec, keep=tuple(sorted(keep)), ratio=ratio, min_ms=min_ms).write(out)
    log(f"{out}: {len(keep)} of {rec.steps} steps (ratio {ratio}, {min_ms} ms; the bake's rule "
        f"kept {len(rec.keep)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("setup", "launch", "prebake", "wait-prebake", "wait",
                                      "traffic", "caches", "restrict", "unpack-caches",
                                      "keep-bake", "unpack-bake", "status", "stop"))
    ap.add_argument("names", nargs="?", default="")
    ap.add_argument("--models", default="qwen,dsv4")
    ap.add_argument("--budget", type=float, default=560)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--plan", default=None)
    ap.add_argument("--frac", default="dsv4=0.3,qwen=0.2")
    ap.add_argument("--seed-cache", default=None)
    ap.add_argument("--pause-others", action="store_true")
    ap.add_argument("--no-precompile", dest="precompile", action="store_false",
                    help="turn SGLang's DeepGEMM precompile off (on by default, as SGLang has it)")
    ap.add_argument("--from", dest="src", default=str(ROOT / ".carry" / "caches"))
    ap.add_argument("--restore", default=None,
                    help="launch from this archive, restored under WORK/restored/NAME first")
    ap.add_argument("--ratio", type=float, default=2.0, help="restrict: the timing rule's ratio")
    ap.add_argument("--min-ms", type=float, default=10.0, help="restrict: and its least gain")
    ap.add_argument("--out", default=None, help="restrict: where the new record goes")
    ap.add_argument("--server-flag", action="append", default=[], metavar="NAME=VALUE",
                    help="launch: set one of the rig's SGLang flags (repeat), e.g. "
                         "max-running-requests=64")
    ap.add_argument("--burst-max", type=int, default=5,
                    help="traffic: the most prompts in one burst (past 5: prompts of at most "
                         "256 tokens)")
    ap.add_argument("--steps-record", default=None,
                    help="C launches send only the loud steps of this record (serve --steps; "
                         "prebake writes WORK/NAME.tar.steps.json)")
    a = ap.parse_args()
    if a.burst_max < 2:
        ap.error("--burst-max: a burst has at least 2 prompts")
    names = [n for n in a.names.split(",") if n]
    if a.phase == "setup":
        setup(a.models.split(","))
    elif a.phase == "launch":
        frac = {k: float(v) for k, v in (x.split("=") for x in a.frac.split(","))}
        launch(names, frac, a.plan, a.seed_cache, a.precompile, a.restore, a.steps_record,
               a.server_flag)
    elif a.phase == "prebake":
        frac = {k: float(v) for k, v in (x.split("=") for x in a.frac.split(","))}
        for name in names:
            start_prebake(name, frac, a.plan, a.precompile)
    elif a.phase == "wait-prebake":
        for name in names:
            wait_prebake(name, a.budget)
    elif a.phase == "wait":
        wait_ready(names, a.budget)
    elif a.phase == "traffic":
        if a.budget < 75:
            # the readiness wait gets the budget less 60 s, and the steps stop 30 s short of
            # it: a smaller budget skips a ready launch as not ready, or sends no step
            raise SystemExit(f"traffic: --budget {a.budget:g} leaves no time for the steps "
                             f"(at least 75 s: the readiness wait keeps 60 s of it)")
        for name in names:
            up = wait_ready([name], a.budget - 60)
            if not up:
                log(f"{name} not ready: {tail(load_state()[name], 20)}")
                continue
            state = load_state()
            others = [n for n in state if n != name] if a.pause_others else []
            pause(state, others, True)
            try:
                run_traffic(name, a.steps, a.passes, a.seed, a.budget, a.burst_max)
            finally:
                pause(state, others, False)
    elif a.phase == "restrict":
        if not a.names:
            raise SystemExit("restrict: name the record (prebake writes ARCHIVE.steps.json)")
        restrict(a.names, a.ratio, a.min_ms, a.out or a.names + f".r{a.ratio:g}")
    elif a.phase == "caches":
        for name in names:
            pack_caches(name)
    elif a.phase == "unpack-caches":
        for name in names:
            unpack_parts(f"cache-{name}", Path(a.src), WORK / f"cache-{name}")
    elif a.phase == "keep-bake":
        for name in names:
            keep_bake(name)
    elif a.phase == "unpack-bake":              # WORK/NAME.tar and its record, as prebake left
        for name in names:
            unpack_parts(f"bake-{name}", Path(a.src), WORK)
    elif a.phase == "status":
        state = load_state()
        for name, s in state.items():
            log(f"{name}: alive={alive(s['pid'])} ready={ready(s)} ready_s={s.get('ready_s')}\n"
                + tail(s, 8))
    elif a.phase == "stop":
        # without names: every launch, never a prebake (named NAME-prebake, it is stopped too)
        state = load_state()
        for name in names or [n for n, s in state.items() if not s.get("prebake")]:
            with contextlib_suppress():
                os.killpg(state[name]["pid"], signal.SIGKILL)


if __name__ == "__main__":
    main()
