#!/usr/bin/env python3
"""DeepSeek-V4 smoke test on the GPU machine: a tiny random-weight DSv4 (gen_tiny_dsv4.py) served
by SGLang 0.5.17 (the .carry built by ``DSV4=1 bash scripts/gpu/build_carry.sh``), one launch per
GPU at once, then a handful of /generate requests with ``input_ids`` against each.

    python3 scripts/gpu/dsv4_smoke.py --out $OUT [--launches bcg:0,eager:1] [--budget 500]

Launch kinds (``name:gpu``; a name is a kind with any suffix, e.g. ``bcg2:1``, ``eagerb:0``):
  bcg    --cuda-graph-backend-prefill breakable with explicit token buckets (SGLang disables the
         prefill graph for DeepSeek-V4 unless the backend is given explicitly)
  eager  --disable-prefill-cuda-graph (decode graphs kept): DSv4's default state
  tp2    bcg at --tp 2 over GPUs "0,1" (gpu field ignored), --cuda-graph-max-bs 16
  quick  no CUDA graphs, --skip-server-warmup, --fp8-gemm-backend triton, mHC prewarm off: the
         shortest cold start (for a short device call)
  sgw    eager with SGLang's own ``--warmups prefill_shapes``
  plan   eager, launched by ``sglang-warmup serve --plan deepseek_v4_serving_shapes`` (the project
         installed from the wheel carried in .carry/wheel/, built by build_wheel.sh): the DSv4 plan warmed before ready
  planbcg  bcg through ``sglang-warmup serve`` with the DSv4 plan
  mixed  plan with ``--enable-mixed-chunk``: the mixed class runs; the log's prefill batches that
         carried running decoders (SGLang's MIXED forward mode) are counted
With ``--separate-caches`` every launch has its own JIT cache (a fair cold comparison); with
``--passes 2`` the traffic is sent twice (new token ids, same lengths) and first/second compared.
Traffic is sent to one launch at a time (a lock), so timings of launches sharing the GPU do not
contend with each other's requests (their startups do overlap).

Prebaked comparison (two calls on one machine, /tmp kept between them):
  --prebake           bring every launch to ready (the plan launches through their warm-up),
                      record it, stop: no traffic.  Each launch's cache then holds what its own
                      startup compiled, as a cache volume or a prebaked image would.
  --seed B=eager      before launching B, copy /tmp/dsv4_eager/cache to B's cache (if B has none)

Does not use the ``warmup`` package.  Writes, under --out (at most 8 files come back):
  dsv4_smoke.json       everything measured (rewritten after each phase, so a timeout keeps it)
  <name>.log            the tail of each server log plus its error / milestone lines
  probe.txt             import probe of the DSv4 kernel packages (deep_gemm, tilelang, flash_mla)
The launches share one JIT cache (/tmp/dsv4_cache): artifact counts are for the whole run.
Every phase is guarded by the elapsed time (--budget seconds from the start).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE, SITE_TF = Path("/tmp/site"), Path("/tmp/site_tf")
MODEL = Path("/tmp/tinydsv4")
T0 = time.time()
RESULT: dict = {"t0": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}, "launches": {}}
OUT = Path(".")
DEADLINE = float("inf")
LOCK = threading.Lock()

CHUNK = 4096
PREFILL_BUCKETS = [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096]
# A "small prefill-graph context" in PR #44627's sense; used only where this SGLang has the flags.
GRAPH_CONTEXT = 16384


def el() -> float:
    return round(time.time() - T0, 1)


def log(msg: str) -> None:
    print(f"[{el():7.1f}s] {msg}", flush=True)


def save() -> None:
    with LOCK:
        RESULT["elapsed_s"] = el()
        (OUT / "dsv4_smoke.json").write_text(json.dumps(RESULT, indent=1, default=str))


def sh(cmd: str, timeout: float = 120) -> tuple[int, str]:
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr)[-3000:]


# ---------------------------------------------------------------------------------------------
OURS = Path("/tmp/ours")


def setup() -> dict[str, str]:
    t = time.time()
    carry = ROOT / ".carry"
    jobs = []
    for name, dest in (("site.tar.xz", SITE), ("tf.tar.xz", SITE_TF), ("dsv4.tar.xz", SITE)):
        if (carry / name).exists() and not (dest / f".unpacked-{name}").exists():
            dest.mkdir(parents=True, exist_ok=True)
            jobs.append((name, dest, subprocess.Popen(["tar", "-xJf", str(carry / name), "-C", str(dest)])))
    for name, dest, p in jobs:
        if p.wait() != 0:
            raise SystemExit(f"unpacking {name} failed")
        (dest / f".unpacked-{name}").touch()
    RESULT["phases"]["unpack_s"] = round(time.time() - t, 1)
    RESULT["carry_bytes"] = {p.name: p.stat().st_size for p in carry.glob("*.tar.xz")}
    wheels = sorted((carry / "wheel").glob("sglang_warmup-*.whl"))
    if wheels and not OURS.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--target", str(OURS), str(wheels[-1])], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SITE_TF}:{SITE}" + (f":{OURS}" if OURS.exists() else "")
    env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    env.setdefault("CUDA_HOME", "/usr/local/cuda")
    env["PYTHONUNBUFFERED"] = "1"
    # SGLang's DeepGEMM precompile (M = 1..16,384 per GEMM shape) stays on, as operators run
    # it: with it off, DeepGEMM builds a kernel per new M range after ready (docs/first-hits.md);
    # with it on, the tiny model's cold start took 573 s against 518 s (docs/benchmarks.md).
    # DSV4_SMOKE_NO_PRECOMPILE=1 turns it off to fit a shorter call.
    if os.environ.get("DSV4_SMOKE_NO_PRECOMPILE") == "1":
        env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] = "0"
    for k in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
        env.setdefault(k, "0" if k == "NCCL_NVLS_ENABLE" else "1")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    return env


def probe(env: dict[str, str]) -> None:
    """Import the DSv4 kernel packages in a side process (runs while the servers start)."""
    code = r"""
import time, traceback
t = time.time()
for stmt in ["import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))",
             "import sgl_kernel; print('sgl_kernel', sgl_kernel.__file__)",
             "import sgl_kernel.flash_mla as f; print('flash_mla ok', [n for n in dir(f) if 'sparse' in n][:4])",
             "import deep_gemm; print('deep_gemm', getattr(deep_gemm, '__version__', '?'), deep_gemm.get_num_sms())",
             "import tilelang; print('tilelang', tilelang.__version__)",
             "import sglang; print('sglang', sglang.__version__)",
             "from sglang.kernels.ops.layernorm import mhc; print('mhc module ok')"]:
    try:
        exec(stmt)
    except BaseException:
        print('FAILED:', stmt); traceback.print_exc(limit=3)
print('probe seconds', round(time.time() - t, 1))
"""
    try:
        p = subprocess.run([sys.executable, "-c", code], env=dict(env, CUDA_VISIBLE_DEVICES="0"),
                           capture_output=True, text=True, timeout=180)
        txt = (p.stdout + p.stderr)[-6000:]
    except Exception as e:  # noqa: BLE001
        txt = f"probe failed: {e!r}"
    (OUT / "probe.txt").write_text(txt)
    with LOCK:
        RESULT["probe_tail"] = txt[-1500:]


def gen_model(env: dict[str, str]) -> None:
    t = time.time()
    if not (MODEL / "config.json").exists():
        p = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/gen_tiny_dsv4.py"), str(MODEL),
                            "--device", "cuda"], env=dict(env, CUDA_VISIBLE_DEVICES="0"),
                           capture_output=True, text=True, timeout=180)
        RESULT["gen_model"] = (p.stdout + p.stderr)[-800:]
        if p.returncode:
            raise SystemExit("model generation failed:\n" + p.stderr[-2000:])
    RESULT["phases"]["gen_model_s"] = round(time.time() - t, 1)
    RESULT["model_config"] = json.loads((MODEL / "config.json").read_text())


# ---------------------------------------------------------------------------------------------
def has_flag(field: str) -> bool:
    src = SITE / "sglang/srt/server_args.py"
    return src.exists() and re.search(rf"^\s+{field}\s*:", src.read_text(), re.M) is not None


def server_argv(kind: str, port: int, mem_frac: float = 0.5) -> list[str]:
    a = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(MODEL),
         "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port),
         "--chunked-prefill-size", str(CHUNK), "--max-running-requests", "16",
         "--cuda-graph-max-bs-decode", "8", "--mem-fraction-static", str(mem_frac),
         "--max-total-tokens", "262144", "--sampling-backend", "pytorch",
         "--grammar-backend", "none", "--mm-feature-transport", "cpu",
         "--watchdog-timeout", "600", "--log-level", "info"]
    if kind in ("bcg", "tp2", "planbcg"):
        a += ["--cuda-graph-backend-prefill", "breakable",
              "--cuda-graph-bs-prefill", *map(str, PREFILL_BUCKETS),
              "--cuda-graph-max-bs-prefill", str(max(PREFILL_BUCKETS))]
        # PR #44627's context flags exist from 0.5.21 on; 0.5.17 has neither (checked here so the
        # same script runs on a newer carry).
        if has_flag("cuda_graph_prefill_max_context"):
            a += ["--cuda-graph-prefill-max-context", str(GRAPH_CONTEXT)]
        if has_flag("cuda_graph_max_seq_len_prefill"):
            a += ["--cuda-graph-max-seq-len-prefill", str(GRAPH_CONTEXT)]
    elif kind in ("eager", "plan", "sgw", "mixed"):
        a += ["--disable-prefill-cuda-graph"]
        if kind == "sgw":
            a += ["--warmups", "prefill_shapes"]
        if kind == "mixed":
            a += ["--enable-mixed-chunk"]
    elif kind == "quick":
        # Fastest cold start: no graphs, no startup warm-up request, Triton FP8 GEMMs instead of
        # DeepGEMM's nvcc JIT (the indexer still JIT-builds its DeepGEMM kernels), and the mHC
        # TileLang kernels compiled on first use (SGLANG_DSV4_MHC_PREWARM=0 in Server).
        a += ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph", "--skip-server-warmup",
              "--fp8-gemm-backend", "triton"]
    if kind == "tp2":
        a += ["--tp", "2"]
        a[a.index("--cuda-graph-max-bs-decode") + 1] = "16"  # --cuda-graph-max-bs 16 at TP 2
    return a


PLAN_KINDS = ("plan", "planbcg", "mixed")
KINDS = ("bcg", "eager", "tp2", "quick", "sgw", "plan", "planbcg", "mixed")


def kind_of(name: str) -> str:
    """A launch's kind: the longest kind its name starts with (``eager2``, ``eagerb``: eager;
    ``planbcg``: planbcg), so that a second launch of a kind gets a cache of its own."""
    kinds = [k for k in KINDS if name.startswith(k)]
    if not kinds:
        raise SystemExit(f"--launches: {name!r} names no kind ({', '.join(KINDS)})")
    return max(kinds, key=len)
TRAFFIC_LOCK = threading.Lock()


def plan_argv(argv: list[str], base: Path) -> list[str]:
    """The same launch through ``sglang-warmup serve`` with the shipped DeepSeek-V4 plan."""
    plan = ROOT / "plans" / "deepseek_v4_serving_shapes.yaml"
    if not plan.exists():
        plan = ROOT / "warmup" / "plans" / "deepseek_v4_serving_shapes.yaml"  # an older tree
    return [sys.executable, "-m", "warmup", "serve", "--plan", str(plan), "--lenient",
            "--state-dir", str(base / "state"), "--report", str(base / "report.json"), "--",
            *argv[3:]]


def cache_env(base: Path) -> dict[str, str]:
    d = {"SGLANG_CACHE_DIR": "sglang", "SGLANG_JIT_CACHE_DIR": "sglang_jit", "TRITON_CACHE_DIR": "triton",
         "TVM_FFI_CACHE_DIR": "tvm_ffi", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
         "TORCHINDUCTOR_CACHE_DIR": "inductor", "SGLANG_DG_CACHE_DIR": "deep_gemm",
         "TILELANG_CACHE_DIR": "tilelang", "CUDA_CACHE_PATH": "nv", "HOME": "home"}
    out = {}
    for k, v in d.items():
        (base / v).mkdir(parents=True, exist_ok=True)
        out[k] = str(base / v)
    return out


def count_artifacts(base: Path) -> dict[str, int]:
    def n(sub: str, *pats: str) -> int:
        d = base / sub
        return sum(1 for p in pats for _ in d.rglob(p)) if d.exists() else 0
    return {"triton_cubin": n("triton", "*.cubin"), "sglang_jit_so": n("sglang_jit", "*.so"),
            "tvm_ffi_so": n("tvm_ffi", "*.so"), "flashinfer_so": n("flashinfer", "*.so"),
            "deep_gemm": n("deep_gemm", "*.cubin", "*.so"), "tilelang": n("tilelang", "*.so", "*.cubin"),
            "home_tilelang": n("home", "*.so", "*.cubin"), "inductor": n("inductor", "*.py")}


class Server:
    def __init__(self, name: str, kind: str, gpus: str, port: int, env: dict[str, str],
                 mem_frac: float = 0.5) -> None:
        self.name, self.kind, self.port = name, kind, port
        self.base = Path(f"/tmp/dsv4_{name}")
        self.base.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = self.base / "server.log"
        self.argv = server_argv(kind, port, mem_frac)
        if kind in PLAN_KINDS:
            self.argv = plan_argv(self.argv, self.base)
        # One JIT cache for all launches of a run (DeepGEMM, SGLang's JIT and TileLang lock or
        # write atomically): what one launch compiles, the others load.  --separate-caches:
        # one each (a fair cold comparison).
        self.cache = (self.base / "cache" if env.get("DSV4_SEPARATE_CACHES") == "1"
                      else Path(env.get("DSV4_SMOKE_CACHE", "/tmp/dsv4_cache")))
        e = dict(env, CUDA_VISIBLE_DEVICES=gpus, **cache_env(self.cache))
        if kind in PLAN_KINDS:
            e["WARMUP_STATE_DIR"] = str(self.base / "state")
        if kind == "quick":
            e["SGLANG_DSV4_MHC_PREWARM"] = "0"
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.argv, env=e, stdout=open(self.log_path, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd="/tmp")
        self.ready_s: float | None = None
        self.res = {"kind": kind, "gpus": gpus, "argv": " ".join(self.argv[1:]),
                    "env": {k: e[k] for k in ("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "SGLANG_DSV4_MHC_PREWARM") if k in e}}
        RESULT["launches"][name] = self.res

    def fired_up_s(self) -> float | None:
        """Seconds from launch to SGLang's "fired up" line.  /health answers 200 only later: in
        0.5.17 it generates one token (503 after its timeout), and a cold DSv4 server's first
        forward JIT-compiles (TileLang mHC, DeepGEMM indexer, Triton) for longer than that."""
        try:
            txt = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        m = re.search(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] The server is fired up", txt, re.M)
        if not m:
            return None
        return round(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) - self.t0, 1)

    def wait_ready(self, deadline: float) -> bool:
        while time.time() < deadline:
            if "fired_up_s" not in self.res and (f := self.fired_up_s()) is not None:
                self.res["fired_up_s"] = f
            if self.proc.poll() is not None:
                self.res["exit_code"] = self.proc.returncode
                self.res["died_after_s"] = round(time.time() - self.t0, 1)
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.ready_s = round(time.time() - self.t0, 1)
                        self.res["ready_s"] = self.ready_s
                        self.res["artifacts_at_ready"] = count_artifacts(self.cache)
                        return True
            except Exception:  # noqa: BLE001
                pass
            time.sleep(2)
        self.res["not_ready_by_deadline"] = True
        return False

    def generate(self, ids: list[int], max_new: int = 8, timeout: float = 180,
                 sampling: dict | None = None, extra: dict | None = None) -> dict:
        timeout = max(5.0, min(timeout, DEADLINE - time.time() - 8))
        sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **(sampling or {})}
        body = json.dumps({"input_ids": ids, "sampling_params": sp, **(extra or {})}).encode()
        req = urllib.request.Request(self.url + "/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        t = time.time()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
            if (extra or {}).get("stream"):  # SSE: the last "data: {...}" line before [DONE]
                chunks = [ln[6:] for ln in raw.decode().splitlines()
                          if ln.startswith("data: {")]
                out = json.loads(chunks[-1]) if chunks else {}
            else:
                out = json.loads(raw)
            if isinstance(out, list):  # n > 1
                out = out[0] if out else {}
            ms = round((time.time() - t) * 1000, 1)
            mi = out.get("meta_info", {}) if isinstance(out, dict) else {}
            return {"ms": ms, "in": len(ids), "out_ids": (out.get("output_ids") or [])[:4],
                    "cached": mi.get("cached_tokens"), "e2e": mi.get("e2e_latency")}
        except urllib.error.HTTPError as e:
            return {"ms": round((time.time() - t) * 1000, 1), "in": len(ids),
                    "error": f"HTTP {e.code}: {e.read()[:300]!r}"}
        except Exception as e:  # noqa: BLE001
            return {"ms": round((time.time() - t) * 1000, 1), "in": len(ids), "error": repr(e)[:300]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except Exception:  # noqa: BLE001
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except Exception:  # noqa: BLE001
                    pass

    def serving_compiles(self) -> list[dict]:
        """The compile log's misses after ready (plan launches: the state directory the hooks
        write), compact: when, which kernel, its specialization key and constexprs, so that the
        request that met a new key can be named."""
        out = []
        for path in sorted((self.base / "state" / "compile_log").glob("*.jsonl")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("phase") != "serving" or rec.get("event") not in ("miss", "jit_build"):
                    continue
                kernel = rec.get("kernel")
                name = kernel.get("name") if isinstance(kernel, dict) else rec.get("module_name")
                out.append({"t": round(float(rec.get("time") or 0) - self.t0, 2), "event": rec["event"],
                            "kernel": name, "key": str(rec.get("key"))[:600],
                            "constexprs": str(rec.get("constexprs"))[:300]})
        return sorted(out, key=lambda r: r["t"])

    def mixed_batches(self) -> dict:
        """SGLang logs a MIXED forward (mixed chunk: a prefill chunk carrying the running
        decoders) as a "Prefill batch" line with #running-req > 0."""
        try:
            txt = self.log_path.read_text(errors="replace")
        except OSError:
            return {}
        pat = re.compile(r"Prefill batch.*?#new-token: (\d+).*?#running-req: (\d+)")
        rows = [(int(m[1]), int(m[2])) for m in pat.finditer(txt)]
        mixed = [r for r in rows if r[1] > 0]
        return {"prefill_batches": len(rows), "with_running": len(mixed),
                "max_running": max((r[1] for r in mixed), default=0), "first": mixed[:12]}

    def log_excerpt(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keys = re.compile(r"Traceback|Error|error|exception|Exception|WARNING|warning|Capture|capture|"
                          r"prewarm|DeepGEMM|deep_gemm|tilelang|TileLang|Load weight|KV Cache|"
                          r"max_total_num_tokens|fired up|ready|Memory pool|compile|Compile|"
                          r"not initialized|not found|disabl", re.I)
        marked = [ln[:400] for ln in lines if keys.search(ln)]
        # de-duplicate repeated lines, keep order
        seen, uniq = set(), []
        for ln in marked:
            k = re.sub(r"\d+", "#", ln)
            if k not in seen:
                seen.add(k)
                uniq.append(ln)
        return ("== milestone / error lines ==\n" + "\n".join(uniq[-150:]) +
                "\n\n== last 80 lines ==\n" + "\n".join(ln[:600] for ln in lines[-80:]))


def traffic(s: Server, deadline: float, seed: int = 1234, key: str = "requests") -> None:
    """Requests: short, 8K, past a 16K graph context, a prefix hit, 12 concurrent, repeats."""
    rng = random.Random(seed)

    def rand_ids(n: int) -> list[int]:
        return [rng.randrange(1000, 65535) for _ in range(n)]

    base8k = rand_ids(8192)
    sampled = {"temperature": 0.7, "top_p": 0.9, "top_k": 40}
    plan = [("short_16", rand_ids(16)), ("short_300", rand_ids(300)), ("p8k", base8k),
            ("p20k_past_16k_ctx", rand_ids(20000)), ("prefix_hit_8k+200", base8k + rand_ids(200)),
            ("repeat_short_16", None), ("repeat_8k_new_ids", rand_ids(8192)),
            # chat lengths with the model's sampling family, and the request features
            ("chat_sampled_733", rand_ids(733), {"sampling": sampled, "max_new": 32}),
            ("chat_sampled_1501", rand_ids(1501), {"sampling": sampled, "max_new": 16}),
            ("logprobs_from_0_611", rand_ids(611),
             {"extra": {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5}}),
            ("logprobs_offset_2000", rand_ids(2000),
             {"extra": {"return_logprob": True, "logprob_start_len": 1000, "top_logprobs_num": 20}}),
            ("n2_sampled_411", rand_ids(411), {"sampling": dict(sampled, n=2), "max_new": 16}),
            ("stream_stop_389", rand_ids(389),
             {"sampling": {"stop_token_ids": [7]}, "extra": {"stream": True}, "max_new": 16}),
            ("long_decode_300", rand_ids(300), {"max_new": 400})]
    conc_sizes = [512, 1000, 2000, 3000]
    if s.kind == "quick":  # a cold eager server compiles per new shape: keep the list short
        base2k = rand_ids(2000)
        plan = [("short_16", rand_ids(16)), ("repeat_short_16", None), ("short_300", rand_ids(300)),
                ("p2000", base2k), ("prefix_hit_2000+100", base2k + rand_ids(100)), ("p8k", base8k)]
        conc_sizes = [64]
    reqs: dict = {}
    s.res[key] = reqs
    first_short = plan[0][1]
    plan = [tuple(p) for p in plan]
    for name, ids, *kw in plan:
        if time.time() > deadline - 20:
            reqs[name] = {"skipped": "budget"}
            continue
        if ids is None:
            ids = first_short
        started = round(time.time() - s.t0, 2)  # to match serving_compiles()' "t"
        reqs[name] = dict(s.generate(ids, **(kw[0] if kw else {})), t=started)
        log(f"{s.name} {name}: {reqs[name]}")
        save()
    if time.time() < deadline - 30:
        n, res = 12, [None] * 12
        prompts = [rand_ids(rng.choice(conc_sizes)) for _ in range(n)]

        def one(i: int) -> None:
            res[i] = s.generate(prompts[i], max_new=16)
        t = time.time()
        th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for x in th:
            x.start()
        for x in th:
            x.join(timeout=max(5, deadline - time.time()))
        reqs["concurrent_12"] = {"wall_ms": round((time.time() - t) * 1000, 1),
                                 "each": [r for r in res if r is not None]}
        log(f"{s.name} concurrent_12: wall {reqs['concurrent_12']['wall_ms']} ms")
    else:
        reqs["concurrent_12"] = {"skipped": "budget"}
    if time.time() < deadline - 15:
        reqs["repeat_p8k_exact"] = s.generate(base8k)
    s.res[f"artifacts_after_{key}"] = count_artifacts(s.cache)
    save()


# ---------------------------------------------------------------------------------------------
def main() -> None:
    global OUT, DEADLINE
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/dsv4_out"))
    ap.add_argument("--launches", default="bcg:0,eager:1")
    ap.add_argument("--budget", type=float, default=500.0)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--separate-caches", action="store_true")
    ap.add_argument("--prebake", action="store_true", help="ready, record, stop: no traffic")
    ap.add_argument("--seed", default="", help="NAME=FROM,...: copy FROM's cache to NAME's first")
    a = ap.parse_args()
    RESULT["mode"] = "prebake" if a.prebake else "traffic"
    if a.separate_caches:
        os.environ["DSV4_SEPARATE_CACHES"] = "1"
    OUT = Path(a.out)
    OUT.mkdir(parents=True, exist_ok=True)
    deadline = DEADLINE = T0 + a.budget
    servers: list[Server] = []
    try:
        env = setup()
        log(f"unpacked in {RESULT['phases']['unpack_s']} s")
        gen_model(env)
        log(f"model written in {RESULT['phases']['gen_model_s']} s")
        save()
        for pair in filter(None, a.seed.split(",")):
            name, _, src = pair.partition("=")
            dst, frm = Path(f"/tmp/dsv4_{name}/cache"), Path(f"/tmp/dsv4_{src}/cache")
            if frm.exists() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-a", str(frm), str(dst)], check=True)
                RESULT.setdefault("seeded", {})[name] = src
        port = 30000
        specs = [s.partition(":")[::2] for s in a.launches.split(",")]
        per_gpu: dict[str, int] = {}
        for name, gpu in specs:
            for g in ("0,1" if name.startswith("tp2") else gpu).split(","):
                per_gpu[g] = per_gpu.get(g, 0) + 1
        for name, gpu in specs:
            kind = kind_of(name)
            gpus = "0,1" if kind == "tp2" else gpu
            # launches sharing a GPU split its memory (and its cores: timings are contended)
            frac = round(min(0.45, 0.6 / max(per_gpu[g] for g in gpus.split(","))), 2)
            servers.append(Server(name, kind, gpus, port, env, frac))
            port += 10
        threading.Thread(target=probe, args=(env,), daemon=True).start()
        if OURS.exists():  # which prefill-graph fixes this SGLang needs (0.5.17: none exist)
            threading.Thread(target=lambda: RESULT.__setitem__("patches_status", sh(
                f"cd /tmp && PYTHONPATH={env['PYTHONPATH']} {sys.executable} -m warmup patches "
                "status --json --detect-only", timeout=240)[1]), daemon=True).start()

        def snapshots() -> None:  # log excerpts come back even if the call is cut short
            while True:
                time.sleep(45)
                for s in servers:
                    (OUT / f"{s.name}.log").write_text(s.log_excerpt())
                save()
        threading.Thread(target=snapshots, daemon=True).start()

        def run_one(s: Server) -> None:
            ok = s.wait_ready(deadline - min(40.0, 0.1 * a.budget))
            log(f"{s.name}: ready={ok} after {s.res.get('ready_s', s.res.get('died_after_s'))} s")
            save()
            if ok and a.prebake:
                s.stop()
            elif ok:
                with TRAFFIC_LOCK:
                    s.res["traffic_start_s"] = round(time.time() - s.t0, 1)
                    traffic(s, deadline)
                    for n in range(2, a.passes + 1):
                        if time.time() < deadline - 30:
                            traffic(s, deadline, seed=1234 + n, key=f"requests_pass{n}")
            if ok:
                s.res["mixed_batches"] = s.mixed_batches()
                s.res["serving_compiles"] = s.serving_compiles()
                rep = s.base / "report.json"
                if rep.exists():
                    s.res["warmup_report"] = json.loads(rep.read_text())
                    save()

        th = [threading.Thread(target=run_one, args=(s,)) for s in servers]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=max(1, deadline - time.time() + 5))
    except BaseException as e:  # noqa: BLE001
        RESULT["fatal"] = repr(e)[:2000]
        log(f"fatal: {e!r}")
    finally:
        for s in servers:
            s.stop()
            (OUT / f"{s.name}.log").write_text(s.log_excerpt())
        save()
        log("done")


if __name__ == "__main__":
    main()
