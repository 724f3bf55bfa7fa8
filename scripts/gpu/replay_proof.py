#!/usr/bin/env python3
"""Proof that a CPU replay of a recorded compile manifest pre-builds the Triton entries a real
SGLang server looks up: record on the GPU, replay on a machine without one, verify on the GPU.

  1. GPU:  python3 scripts/gpu/replay_proof.py record --out "$OUT"
           a cold SGLang 0.5.17 launch (tiny random-weight Qwen3-MoE, empty caches) with
           sglang-warmup's events recording the compile manifest (WARMUP_ENABLE=1,
           WARMUP_STATE_DIR) and a short traffic sample -> $OUT/manifest.jsonl, $OUT/record.json
  2. CPU:  python3 scripts/gpu/replay_proof.py replay --manifest DIR/manifest.jsonl \\
               --record DIR/record.json
           builds (once) .deps/replay-py312: Python 3.12 with torch 2.11.0 and the Triton it
           pins (3.6.0, the GPU image's), SGLang 0.5.17 and friends from .carry/site.tar.xz;
           runs `sglang-warmup cache replay --python .deps/replay-py312/bin/python` into an
           empty /tmp/sgw-replay-proof/triton -> .gpu-out/replay-proof/{triton-cache.tar.xz,
           manifest.jsonl, replay.json}
  3. GPU:  python3 scripts/gpu/replay_proof.py verify --out "$OUT"
           (with .gpu-out/replay-proof carried) a second cold launch, same traffic, with
           TRITON_CACHE_DIR = the replayed cache unpacked at the same absolute path ->
           $OUT/verify.json: the fraction of run 1's Triton misses that became disk hits.

Python 3.12, not the project's 3.11 venv: Triton's cache key hashes libtriton.so, and the cp311
and cp312 wheels of triton 3.6.0 ship different binaries, so only a cp312 Triton reproduces the
GPU's keys.  Each GPU subcommand stays under --deadline (default 280 s).  Needs on the GPU
machine what scripts/gpu/e2e_warmup.py needs (.carry/ built by build_carry.sh, nvcc).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
from e2e_warmup import server_args  # noqa: E402  (the flags every GPU script serves with)
# The replayed cache lives at the same absolute path on both machines: Triton's group files
# list their children by absolute path (`sglang-warmup cache pack/restore` rewrites them when
# a cache moves; here nothing moves).
REPLAY_CACHE = Path("/tmp/sgw-replay-proof/triton")
WORK = ROOT / ".gpu-out" / "replay-proof"
ENV_DIR = ROOT / ".deps" / "replay-py312"
ENV_SITE, ENV_SITE_TF = ROOT / ".deps" / "replay-site", ROOT / ".deps" / "replay-site-tf"
# What the SGLang 0.5.17 kernel modules import on a machine without a GPU, beyond the carry.
# torch 2.11.0 is the GPU image's and pins triton 3.6.0.
ENV_PACKAGES = ["torch==2.11.0", "torchvision==0.26.0", "numpy", "psutil", "requests",
                "pillow", "pyyaml", "packaging", "huggingface_hub>=1.5,<2", "safetensors", "tqdm",
                "regex", "einops", "aiohttp", "uvloop", "sentencepiece", "pygments", "httpx"]
SERVER_ARGS = server_args("0.5", eager_prefill=False, metrics=False)

# Facts about the interpreter's Triton that decide cache keys (run with `python -c`).
TOOLCHAIN = r"""
import hashlib, json, os, sys
import triton
from triton.runtime.cache import triton_key
from triton.compiler.compiler import make_backend
from triton.backends.compiler import GPUTarget
lib = os.path.join(os.path.dirname(triton.__file__), "_C", "libtriton.so")
h = hashlib.sha256()
with open(lib, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
try:
    from importlib.metadata import version
    sglang = version("sglang")
except Exception as exc:
    sglang = repr(exc)
try:
    backend = make_backend(GPUTarget("cuda", 90, 32)).hash()
except Exception as exc:
    backend = repr(exc)
print(json.dumps({"python": sys.version.split()[0], "triton": triton.__version__,
                  "libtriton_sha256": h.hexdigest(),
                  "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
                  "backend_hash_sm90": backend, "sglang": sglang,
                  "ptxas_env": os.environ.get("TRITON_PTXAS_PATH")}))
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------
# the GPU side: environment, server, traffic
# --------------------------------------------------------------------------------------------

def gpu_setup() -> tuple[dict[str, str], str]:
    """e2e_warmup.setup(): unpack the carry, install this checkout (for its plugin entry point),
    write the model.  Returns the server environment and how sglang-warmup was installed."""
    import e2e_warmup

    env = e2e_warmup.setup()
    return env, e2e_warmup.INSTALLED_FROM


def cache_env(base: Path, triton_dir: Path | None = None) -> dict[str, str]:
    dirs = {"TRITON_CACHE_DIR": triton_dir or base / "triton",
            "TVM_FFI_CACHE_DIR": base / "tvm_ffi",
            "FLASHINFER_WORKSPACE_BASE": base / "flashinfer",
            "TORCHINDUCTOR_CACHE_DIR": base / "inductor", "SGLANG_CACHE_DIR": base / "sglang",
            "SGLANG_JIT_CACHE_DIR": base / "sglang_jit"}
    for d in dirs.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}


def traffic() -> list[list[list[int]]]:
    """The same requests in both launches: three single prompts, then 8 concurrent ones."""
    rng = random.Random(1234)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 30000) for _ in range(n)]

    return [[ids(7)], [ids(16)], [ids(300)],
            [ids(n) for n in (5, 33, 64, 100, 129, 200, 257, 511)]]


def generate(url: str, input_ids: list[int]) -> float:
    body = json.dumps({"input_ids": input_ids,
                       "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).encode()
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    return round((time.perf_counter() - t0) * 1000, 1)


def serve_and_send(name: str, cache_base: Path, triton_dir: Path | None, state: Path,
                   env: dict[str, str], deadline: float, graphs: str) -> dict:
    """One cold launch with events on, the traffic sample, then stop.  Returns timings."""
    senv = dict(env, **cache_env(cache_base, triton_dir))
    prom = state / "prometheus"
    prom.mkdir(parents=True, exist_ok=True)
    senv.update({"WARMUP_ENABLE": "1", "WARMUP_STATE_DIR": str(state),
                 "PROMETHEUS_MULTIPROC_DIR": str(prom)})
    args = SERVER_ARGS + ["--port", "31555"]
    if graphs == "eager":
        args.append("--disable-cuda-graph")
    url = "http://127.0.0.1:31555"
    log_path = state.parent / f"{name}-server.log"
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=senv,
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=str(ROOT))
    out: dict = {"ready_s": None, "steps_ms": [], "error": None}
    try:
        while time.time() < deadline - 25:
            if proc.poll() is not None:
                out["error"] = f"server exited with {proc.returncode}"
                break
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        out["ready_s"] = round(time.time() - t0, 1)
                        break
            except Exception:
                pass
            time.sleep(2)
        if out["ready_s"] is None:
            out["error"] = out["error"] or "not ready before the deadline"
        else:
            for step in traffic():
                if time.time() > deadline - 15:
                    out["error"] = "deadline: traffic cut short"
                    break
                with concurrent.futures.ThreadPoolExecutor(len(step)) as pool:
                    out["steps_ms"].append(list(pool.map(lambda ids: generate(url, ids), step)))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except Exception:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except Exception:
                pass
    if out["error"]:
        out["log_tail"] = log_path.read_text(errors="replace").splitlines()[-40:]
    return out


def triton_records(state: Path) -> list[dict]:
    from cache_tools import compile_log

    return [r for r in compile_log.read_dir(str(state))
            if r.get("compiler") == "triton" and r.get("event") in ("miss", "hit")]


def toolchain(python: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([python, "-c", TOOLCHAIN], capture_output=True, text=True, env=env,
                          timeout=120)
    if done.returncode != 0:
        return {"error": done.stderr[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------------

def cmd_record(a: argparse.Namespace) -> None:
    deadline = time.time() + a.deadline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env, how = gpu_setup()
    run = Path("/tmp/sgw-replay-record")
    shutil.rmtree(run, ignore_errors=True)
    state = run / "state"
    log(f"setup done (sglang-warmup from {how}); cold launch 1")
    result = serve_and_send("record", run / "cache", None, state, env, deadline, a.graphs)
    records = triton_records(state) if state.exists() else []
    with open(out / "manifest.jsonl", "w") as fh:
        for r in records:
            # What a replay reads; the jit_cache_hook copy, stage times and file lists would
            # triple the size for nothing.
            slim = {k: v for k, v in r.items()
                    if k not in ("specialization", "stages", "key", "artifacts")}
            fh.write(json.dumps(slim, separators=(",", ":")) + "\n")
    misses = {r["hash"] for r in records if r["event"] == "miss"}
    result.update({
        "sglang_warmup_from": how, "graphs": a.graphs,
        "toolchain": toolchain(sys.executable, env),
        "records": len(records), "distinct_misses": len(misses),
        "misses_by_phase": _count(r.get("phase") for r in records if r["event"] == "miss"),
        "kernels": sorted({(r.get("kernel") or {}).get("name") or "?" for r in records}),
        "cubins_on_disk": len(glob.glob(str(run / "cache" / "triton" / "*" / "*.cubin"))),
    })
    write_json(out / "record.json", result)
    log(f"record: ready {result['ready_s']} s, {len(misses)} distinct Triton misses, "
        f"error {result['error']}")


def build_cpu_env(python312: str) -> str:
    """Python 3.12 venv with the GPU's torch/Triton and the carry's SGLang; returns its python."""
    py = ENV_DIR / "bin" / "python"
    if not py.exists():
        log(f"creating {ENV_DIR} with {python312} (downloads torch 2.11.0, ~4 GB installed)")
        subprocess.run([python312, "-m", "venv", str(ENV_DIR)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *ENV_PACKAGES], check=True)
    for name, dest in (("site.tar.xz", ENV_SITE), ("tf.tar.xz", ENV_SITE_TF)):
        if not dest.exists():
            with tarfile.open(ROOT / ".carry" / name) as tf:
                tf.extractall(dest)
    # The carry ahead of the venv's own packages, as PYTHONPATH puts it on the GPU machine.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    pth = Path(purelib.stdout.strip()) / "sgw_replay_carry.pth"
    pth.write_text(f"import sys; sys.path[0:0] = [{str(ENV_SITE_TF)!r}, {str(ENV_SITE)!r}]\n")
    return str(py)


def find_python312(given: str | None) -> str:
    candidates = ([given] if given else []) + sorted(
        glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12")) + [
        shutil.which("python3.12") or ""]
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 12)":
            return candidate  # (a pyenv shim for a version it has not selected fails here)
    raise SystemExit("no Python 3.12 interpreter: pass --python312 PATH (pyenv install 3.12, "
                     "or apt-get install python3.12)")


def cmd_replay(a: argparse.Namespace) -> None:
    manifest = Path(a.manifest).resolve()
    WORK.mkdir(parents=True, exist_ok=True)
    py = build_cpu_env(find_python312(a.python312))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_CACHE_DIR")}
    facts = toolchain(py, env)
    recorded = {}
    if a.record:
        recorded = json.loads(Path(a.record).read_text()).get("toolchain", {})
    same = {k: recorded.get(k) == facts.get(k) for k in
            ("python", "triton", "libtriton_sha256", "triton_key_sha256", "backend_hash_sm90",
             "sglang")} if recorded else {}
    log(f"replay interpreter: {facts}; same as the GPU: {same or 'no --record given'}")
    shutil.rmtree(REPLAY_CACHE.parent, ignore_errors=True)
    if manifest != (WORK / "manifest.jsonl").resolve():
        shutil.copyfile(manifest, WORK / "manifest.jsonl")
    t0 = time.time()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "sglang-warmup"), "cache", "replay",
                           str(WORK / "manifest.jsonl"), "--target", "cuda:90",
                           "--cache-dir", str(REPLAY_CACHE), "--python", py,
                           "--jobs", str(a.jobs), "--json"],
                          env=env, capture_output=True, text=True)
    seconds = round(time.time() - t0, 1)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"replay failed ({done.returncode}): {done.stderr[-3000:]}") from None
    with tarfile.open(WORK / "triton-cache.tar.xz", "w:xz") as tf:
        tf.add(REPLAY_CACHE, arcname="triton")
    summary = {"seconds": seconds, "exit_code": done.returncode, "counts": report["counts"],
               "skip_reasons": report["skip_reasons"], "warnings": report["warnings"],
               "toolchain": facts, "same_as_gpu": same,
               "archive_bytes": (WORK / "triton-cache.tar.xz").stat().st_size,
               "results": [{k: r[k] for k in ("name", "hash", "status", "reason", "detail",
                                              "phases")} for r in report["results"]]}
    write_json(WORK / "replay.json", summary)
    log(f"replay: {report['counts']} {report['skip_reasons']} in {seconds} s -> {WORK}")


def cmd_verify(a: argparse.Namespace) -> None:
    deadline = time.time() + a.deadline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env, how = gpu_setup()
    shutil.rmtree(REPLAY_CACHE.parent, ignore_errors=True)
    REPLAY_CACHE.parent.mkdir(parents=True)
    with tarfile.open(WORK / "triton-cache.tar.xz") as tf:
        tf.extractall(REPLAY_CACHE.parent)
    replayed = {p.parent.name for p in REPLAY_CACHE.glob("*/__grp__*.json")}
    run = Path("/tmp/sgw-replay-verify")
    shutil.rmtree(run, ignore_errors=True)
    state = run / "state"
    log(f"setup done; {len(replayed)} replayed entries; cold launch 2 on the replayed cache")
    result = serve_and_send("verify", run / "cache", REPLAY_CACHE, state, env, deadline,
                            a.graphs)
    run1 = [json.loads(x) for x in (WORK / "manifest.jsonl").read_text().splitlines() if x]
    replay_results = []
    if (WORK / "replay.json").exists():
        replay_results = json.loads((WORK / "replay.json").read_text())["results"]
    run2 = triton_records(state) if state.exists() else []
    result.update(compare_runs(run1, run2, replay_results))
    result.update({
        "sglang_warmup_from": how, "graphs": a.graphs, "replayed_entries": len(replayed),
        "toolchain": toolchain(sys.executable, env),
    })
    write_json(out / "verify.json", result)
    log(f"verify: {result['became_disk_hits']} of {result['run1_distinct_misses']} run-1 "
        f"misses were disk hits ({len(result['still_compiled'])} compiled again, "
        f"{len(result['not_requested_again'])} not requested); ready {result['ready_s']} s, "
        f"error {result['error']}")


def compare_runs(run1: list[dict], run2: list[dict], replay_results: list[dict]) -> dict:
    """Run 1's distinct Triton misses against what run 2 did with the same cache keys."""
    replay_status = {r["hash"]: r for r in replay_results}
    run1_misses = {r["hash"]: (r.get("kernel") or {}).get("name") for r in run1
                   if r.get("event") == "miss"}
    outcome: dict[str, str] = {}
    for r in run2:  # a key missed in one process and hit in another counts as missed
        if r["hash"] in run1_misses and outcome.get(r["hash"]) != "miss":
            outcome[r["hash"]] = r["event"]
    hits = sorted(h for h, o in outcome.items() if o == "hit")
    missed = sorted(h for h, o in outcome.items() if o == "miss")
    return {
        "run1_distinct_misses": len(run1_misses),
        "requested_again": len(outcome),
        "became_disk_hits": len(hits),
        "fraction_of_run1_misses_hit": round(len(hits) / len(run1_misses), 4)
        if run1_misses else None,
        "fraction_of_those_requested_again_hit": round(len(hits) / len(outcome), 4)
        if outcome else None,
        "still_compiled": [{"name": run1_misses[h], "hash": h[:16],
                            "replay": {k: replay_status.get(h, {}).get(k)
                                       for k in ("status", "reason", "detail")}}
                           for h in missed],
        "not_requested_again": sorted(run1_misses[h] or "?" for h in run1_misses
                                      if h not in outcome),
        "run2_new_misses": sorted({(r.get("kernel") or {}).get("name") or "?" for r in run2
                                   if r["event"] == "miss" and r["hash"] not in run1_misses}),
    }


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("record", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=os.environ.get("OUT", "/tmp/replay-proof-out"))
        p.add_argument("--deadline", type=float, default=280.0,
                       help="seconds for the whole subcommand")
        p.add_argument("--graphs", choices=("eager", "default"), default="eager",
                       help="eager: --disable-cuda-graph (faster cold start); default: "
                            "SGLang's graphs")
    p = sub.add_parser("replay")
    p.add_argument("--manifest", required=True, help="manifest.jsonl from `record`")
    p.add_argument("--record", help="record.json from `record` (compares the toolchains)")
    p.add_argument("--python312", help="a Python 3.12 interpreter for the replay venv")
    p.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    {"record": cmd_record, "replay": cmd_replay, "verify": cmd_verify}[a.cmd](a)


if __name__ == "__main__":
    main()
