#!/usr/bin/env python3
"""End-to-end warm-up benchmark on a GPU host: cold launches of a real SGLang server serving a
tiny random-weight MoE, with no warm-up (A), SGLang's own ``--warmups prefill_shapes`` (B), and
``sglang-warmup serve --plan default`` (C), the same with ``--freeze-gc`` (CG), without the
GEMM sweep (CN, ``WARMUP_GEMM_SWEEP_S=0``; A and B run without it too) or with SGLang's flush
emptying the caching allocator after the warm-up (CE, ``WARMUP_KEEP_ALLOCATOR=0``); then the same
traffic sample twice against each, measuring per-step latency (and SGLang's own, ``server_ms``)
and the kernels compiled after ready.  The flush between the two passes is each server's own
kind: the phase file names it the warm-up's flush, so C keeps the allocator's blocks there as
after its warm-up and CE empties them; A and B (no plugin) empty them, so their pass 2 starts
colder than their pass 1, which follows start-up's allocations.

    python3 scripts/gpu/e2e_warmup.py --graphs eager --out OUT_DIR [--launches A,B,C]

``--graphs eager`` adds ``--disable-prefill-cuda-graph`` (decode graphs kept), the state in which
DeepSeek-V4 and MLA models serve; ``--graphs default`` keeps SGLang's default graphs.

The launches of one run start one after another, each once the previous one has allocated its
KV pool (one GPU, a quarter of its memory each: SGLang sizes its pool from the free memory it
sees, so two sizings at once leave one of them none), so that their cold starts overlap; the
traffic is then sent to one server at a time, the others idle, so the measured latencies are
not shared.  Startup times are therefore upper bounds (contended).
``--solo`` goes further: while one server gets its traffic, every other one is stopped
(SIGSTOP) and continued after, so that no neighbour's processes run at all.

Needs: the SGLang site-packages built by scripts/gpu/build_carry.sh under .carry/ (unpacked
here on first use), nvcc on PATH or in /usr/local/cuda/bin.

``--gc-log`` sets ``SGLANG_LOG_GC=1`` (the scheduler logs every collection) and, where the
SGLang has it, ``--gc-warning-threshold-secs 0.02`` (the tokenizer manager warns on long ones);
each step records its start time, so a slow step can be matched to a collection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE, SITE_TF, OURS = Path("/tmp/site"), Path("/tmp/site_tf"), Path("/tmp/ours")
MODEL = Path("/tmp/tiny")
#: How setup() found sglang-warmup on this host: "already installed", "checkout" or a wheel.
INSTALLED_FROM = "already installed"


def server_args(mem_fraction: str, *, eager_prefill: bool, metrics: bool = True) -> list[str]:
    """The flags every GPU script serves the tiny model with (no port).  ``eager_prefill``:
    --disable-prefill-cuda-graph, the state DeepSeek-V4 and MLA models serve in."""
    args = ["--model-path", str(MODEL), "--skip-tokenizer-init", "--attention-backend", "triton",
            "--sampling-backend", "pytorch", "--grammar-backend", "none",
            "--moe-runner-backend", "triton", "--mem-fraction-static", mem_fraction,
            "--max-total-tokens", "131072", "--mm-feature-transport", "cpu",
            "--host", "127.0.0.1"]
    if metrics:
        args.append("--enable-metrics")
    if eager_prefill:
        args.append("--disable-prefill-cuda-graph")
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def setup() -> dict[str, str]:
    carry = ROOT / ".carry"
    for name, dest in (("site.tar.xz", SITE), ("tf.tar.xz", SITE_TF)):
        if not dest.exists():
            with tarfile.open(carry / name) as tf:
                tf.extractall(dest)
    global INSTALLED_FROM
    if not OURS.exists():
        # A wheel built beforehand (scripts/gpu/build_wheel.sh) installs without a
        # build backend; otherwise build from the checkout with the host's setuptools.
        wheels = sorted((carry / "wheel").glob("sglang_warmup-*.whl"))
        src = str(wheels[-1]) if wheels else str(ROOT)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-build-isolation", "--target", str(OURS), src], check=True)
        INSTALLED_FROM = f"wheel {wheels[-1].name}" if wheels else "checkout"
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SITE_TF}:{SITE}:{OURS}"
    env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if not (MODEL / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts/gpu/gen_tiny_model.py"), str(MODEL),
                        "--vocab", "65600"], check=True, env=dict(env, TINY_MAX_POS="40960"))
    sys.path[:0] = [str(SITE_TF), str(SITE), str(OURS)]
    return env


def cache_env(base: Path) -> dict[str, str]:
    dirs = {"TRITON_CACHE_DIR": base / "triton", "TVM_FFI_CACHE_DIR": base / "tvm_ffi",
            "FLASHINFER_WORKSPACE_BASE": base / "flashinfer", "TORCHINDUCTOR_CACHE_DIR": base / "inductor",
            "SGLANG_CACHE_DIR": base / "sglang", "SGLANG_JIT_CACHE_DIR": base / "sglang_jit"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}


def triton_entries(base: Path) -> set[str]:
    """Triton cache entries on disk, as ``<hash prefix>:<kernel name>``."""
    d = base / "triton"
    return {f"{c.parent.name[:10]}:{c.stem}" for c in d.rglob("*.cubin")} if d.exists() else set()


def count_artifacts(base: Path) -> dict[str, int]:
    """Compiled artifacts on disk: Triton cubins, nvcc/tvm-ffi and FlashInfer modules."""
    def count(d: Path, pattern: str) -> int:
        return sum(1 for _ in d.rglob(pattern)) if d.exists() else 0

    return {"triton": count(base / "triton", "*.cubin"),
            "nvcc": count(base / "tvm_ffi", "*.so") + count(base / "sglang_jit", "*.so")
            + count(base / "flashinfer", "*.so")}


class Server:
    def __init__(self, name: str, port: int, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        self.name, self.port, self.workdir = name, port, workdir
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "server.log"
        self.t0 = time.time()
        self.proc = subprocess.Popen(argv, env=env, stdout=open(self.log_path, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=str(ROOT))
        self.ready_s: float | None = None

    def poll_ready(self) -> bool:
        if self.ready_s is not None:
            return True
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    self.ready_s = time.time() - self.t0
                    return True
        except Exception:
            pass
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pause(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the server (``--solo``)."""
        try:
            os.killpg(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        except OSError:
            pass

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except Exception:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except Exception:
                pass

    def sized(self) -> bool:
        """True once SGLang has sized and allocated its KV pool (or the server has died)."""
        try:
            return "Memory pool end" in self.log_path.read_text(errors="replace") or not self.alive()
        except OSError:
            return not self.alive()

    def log_lines(self, marker: str, most: int = 4) -> list[str]:
        """The first ``most`` lines of the server's log holding ``marker``, from it on."""
        return [line[line.index(marker):] for line in
                self.log_path.read_text(errors="replace").splitlines() if marker in line][:most]

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def traffic_sample(max_prompt: int, kind: str = "shapes", chunk: int = 8192):
    """``shapes``: chat-like lengths, shared prefixes, concurrent bursts, batched requests, long
    chunked prompts and several sampling settings.  ``features``: request features of every
    kind (logprobs from 0 / an offset / top-k / token ids, n > 1, streaming with stop ids),
    bursts of 20-64, long decodes, chunk-boundary prompts and long shared prefixes, plus chat
    and RAG steps.  The same sample for every launch."""
    from warmup.coverage import traffic

    if kind == "features":
        return (traffic.synth("features", seed=1, steps=16, max_prompt=max_prompt, chunk=chunk)
                + traffic.synth("chat", seed=2, steps=6, max_prompt=max_prompt)
                + traffic.synth("rag", seed=2, steps=3, max_prompt=max_prompt))
    steps = (traffic.synth("chat", seed=1, steps=14, max_prompt=max_prompt)
             + traffic.synth("rag", seed=1, steps=6, max_prompt=max_prompt)
             + traffic.synth("batch", seed=1, steps=4, max_prompt=max_prompt)
             + traffic.synth("agent", seed=1, steps=6, max_prompt=max_prompt))
    return steps


async def replay(url: str, steps, salt: str) -> list[dict]:
    from warmup.serve.transport import HttpTransport

    t = HttpTransport(url, timeout_s=300, seed="e2e")
    t.tokens.salt = salt
    t.facts_sync()
    t.tokens.salt = salt
    out = []
    for i, s in enumerate(steps):
        step = s.to_step(i)
        t0 = time.perf_counter()
        wall = time.time()
        err = None
        server = None
        try:
            outs = await t.send(step)
            known = [o.server_s for o in outs if o.server_s is not None]
            server = round(max(known) * 1000, 1) if known else None
        except Exception as exc:  # report, keep going
            err = str(exc)[:200]
        out.append({"i": i, "label": step.shape_class, "mode": step.mode,
                    "prompts": [r.input_len for r in step.requests],
                    "ms": round((time.perf_counter() - t0) * 1000, 1), "server_ms": server,
                    "t": round(wall, 3), "error": err})
    return out


def row_probe(url: str, n: int, seed: int = 7) -> dict:
    """``n`` input-logprob requests (``logprob_start_len`` 0, one new token) at prompt lengths
    drawn from 40-4,000 that no plan class sends, each followed by two requests of the same
    length with other token ids (no prefix hit), the faster of which is its repeat: with eager
    prefill every length is a new GEMM row count for every dense layer and the LM head."""
    import random
    import statistics

    from warmup.coverage.traffic import TrafficStep

    rng = random.Random(seed)
    rows = []
    for i, length in enumerate(rng.sample(range(40, 4000), n)):
        step = TrafficStep("single", (length,), 1, {"temperature": 0}, label=f"rows_{length}",
                           features={"return_logprob": True, "logprob_start_len": 0})
        first = asyncio.run(replay(url, [step], f"ra{i}"))[0]["ms"]
        repeat = min(asyncio.run(replay(url, [step], f"r{salt}{i}"))[0]["ms"] for salt in "bc")
        rows.append({"rows": length, "first_ms": first, "repeat_ms": repeat})
    ratios = [r["first_ms"] / r["repeat_ms"] for r in rows if r["repeat_ms"] > 0]
    return {"requests": n, "first_ms": sum(r["first_ms"] for r in rows),
            "repeat_ms": sum(r["repeat_ms"] for r in rows),
            "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
            "median_extra_ms": round(statistics.median(r["first_ms"] - r["repeat_ms"]
                                                       for r in rows), 1) if rows else None,
            "over_1_5": sum(1 for x in ratios if x > 1.5), "steps": rows}


def has_flag(field: str) -> bool:
    """Whether the carried SGLang declares a server argument (0.5.17 and later differ)."""
    src = SITE / "sglang/srt"
    return any(field in f.read_text(errors="replace")
               for f in [src / "server_args.py", *src.glob("arg_groups/fields/*.py")] if f.exists())


GC_END = re.compile(r"GC end: Time ([0-9.]+) \| Generation (\d) \| Duration: ([0-9.]+)s \| Collected: (\d+)")


def gc_events(log_path: Path, min_s: float = 0.005) -> dict:
    """Collections from the server log: the scheduler's (SGLANG_LOG_GC) of at least ``min_s``,
    as (end time, generation, seconds, collected), plus a count per generation, and the tokenizer
    manager's long-collection warnings verbatim."""
    text = log_path.read_text(errors="replace")
    events, per_gen = [], {}
    for m in GC_END.finditer(text):
        gen, dur = int(m.group(2)), float(m.group(3))
        per_gen[gen] = per_gen.get(gen, 0) + 1
        if dur >= min_s:
            events.append([float(m.group(1)), gen, dur, int(m.group(4))])
    warnings = [ln[-300:] for ln in text.splitlines() if "LONG GARBAGE COLLECTION" in ln]
    return {"scheduler_long": events, "scheduler_per_generation": per_gen, "tokenizer_warnings": warnings}


def metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return r.read().decode()
    except Exception as exc:
        return f"# unavailable: {exc}"


def serving_misses(text: str) -> dict[str, float]:
    """sglang_warmup compile events after ready, from /metrics text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang_warmup_compile_events_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels[len("sglang_warmup_compile_events_total"):]] = float(value)
    return out


def passes(s: Server, r: dict, steps) -> None:
    """The traffic twice against ``s``, with the server's own kind of flush in between (the
    phase file names it the warm-up's: see the module docstring)."""
    from warmup.observe import phase

    r["pass1"] = asyncio.run(replay(s.url, steps, "p1"))
    r["after_pass1"] = count_artifacts(s.workdir / "cache")
    phase.set_phase("warmup", phase.FLUSH, state_dir=str(s.workdir / "state"))
    urllib.request.urlopen(urllib.request.Request(s.url + "/flush_cache?timeout=30", method="POST"),
                           timeout=60).read()
    phase.set_phase("serving", state_dir=str(s.workdir / "state"))
    r["pass2"] = asyncio.run(replay(s.url, steps, "p2"))
    r["after_pass2"] = count_artifacts(s.workdir / "cache")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", default="eager", help="eager, default, or eager,default")
    ap.add_argument("--launches", default="A,B,C")
    ap.add_argument("--plan", default="default")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/e2e-out"))
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    ap.add_argument("--traffic", default="shapes", choices=("shapes", "features"))
    ap.add_argument("--idle-probe", type=float, default=0.0, metavar="S",
                    help="after every launch's two passes, leave all servers idle S seconds, then "
                         "send each the traffic's first step twice (new token ids): the first "
                         "request after an idle spell against its repeat, to tell an idle cost "
                         "from a first-hit cost")
    ap.add_argument("--row-probe", type=int, default=0, metavar="N",
                    help="after the passes, N input-logprob prompts of new lengths, each against "
                         "a repeat of its length (other token ids): the GEMM sweep's effect")
    ap.add_argument("--solo", action="store_true",
                    help="while one server gets its traffic, stop (SIGSTOP) every other one, so "
                         "that no neighbour's processes share the host's CPUs or the GPU")
    ap.add_argument("--gc-log", action="store_true",
                    help="log every Python GC of the scheduler and the tokenizer manager's long ones")
    a = ap.parse_args()
    start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = setup()
    log("setup done")
    graphs = a.graphs.split(",")
    launches = [(g, n) for g in graphs for n in a.launches.split(",")]
    run = Path("/tmp/e2e")
    shutil.rmtree(run, ignore_errors=True)
    frac = f"{min(0.25, 0.9 / len(launches)):.2f}"
    servers: list[Server] = []
    for i, (graph, name) in enumerate(launches):
        common = server_args(frac, eager_prefill=graph == "eager")
        name = f"{graph}-{name}"
        wd = run / name
        wd.mkdir(parents=True)
        senv = dict(env, **cache_env(wd / "cache"))
        state = wd / "state"
        state.mkdir()
        senv.update({"WARMUP_ENABLE": "1", "WARMUP_STATE_DIR": str(state),
                     "PROMETHEUS_MULTIPROC_DIR": str(state / "prometheus")})
        (state / "prometheus").mkdir()
        if name.endswith(("-A", "-B", "-CN")):
            senv["WARMUP_GEMM_SWEEP_S"] = "0"   # A, B: no sglang-warmup in the forward path
        if name.endswith("-CE"):
            senv["WARMUP_KEEP_ALLOCATOR"] = "0"
        port = 31000 + i * 10
        args = common + ["--port", str(port)]
        if name.endswith("-A"):
            argv = [sys.executable, "-m", "sglang.launch_server", *args]
        elif name.endswith("-B"):
            argv = [sys.executable, "-m", "sglang.launch_server", *args, "--warmups", "prefill_shapes"]
        else:  # C: the plan; CG: + SGLang's freeze_gc; CN: no GEMM sweep; CE: allocator emptied
            argv = [sys.executable, "-m", "warmup", "serve", "--plan", a.plan,
                    "--state-dir", str(state), "--report", str(wd / "report.json"),
                    *(["--freeze-gc"] if name.endswith("-CG") else []), "--", *args]
        if a.gc_log:
            senv["SGLANG_LOG_GC"] = "1"  # the scheduler logs every collection with its duration
            if has_flag("gc_warning_threshold_secs"):  # the tokenizer manager warns on long ones
                argv += ["--gc-warning-threshold-secs", "0.02"]
        if servers:  # one KV sizing at a time: SGLang sizes its pool from the free memory it
            # sees, and a neighbour's pool allocated in between leaves it none
            t_wait = time.time()
            while not servers[-1].sized() and time.time() - t_wait < 180:
                time.sleep(0.5)
        servers.append(Server(name, port, argv, senv, wd))
        log(f"started {name}: {' '.join(argv[2:6])} ... port {port}")
    results: dict[str, dict] = {}
    try:
        while not all(s.poll_ready() or not s.alive() for s in servers):
            if time.time() - start > a.deadline * 0.7:
                break
            time.sleep(2)
        for s in servers:
            r = results[s.name] = {"ready_s": s.ready_s, "alive": s.alive()}
            if s.ready_s is None:
                r["log_tail"] = s.tail(40)
                log(f"{s.name} not ready: {s.tail(15)}")
                continue
            r["at_ready"] = count_artifacts(s.workdir / "cache")
            r["entries_at_ready"] = sorted(triton_entries(s.workdir / "cache"))
            if s.name.endswith(("-A", "-B")):  # no plan: mark the serving phase at ready, as a sidecar does
                from warmup.observe import phase

                phase.set_phase("serving", state_dir=str(s.workdir / "state"))
            r["gemm_sweep"] = s.log_lines("GEMM sweep")
            r["allocator"] = s.log_lines("the warm-up's flush kept")
            r["http_app"] = s.log_lines("in-process HTTP") + s.log_lines("HTTP app")  # empty: used
            log(f"{s.name} ready in {s.ready_s:.0f} s, artifacts {r['at_ready']}, "
                f"{r['gemm_sweep'] or 'no GEMM sweep'}")
        max_prompt = 12000
        chunk = 8192
        for s in servers:  # the chunk-boundary prompts need the server's chunk size
            if s.ready_s is not None:
                try:
                    from warmup.serve.transport import HttpTransport

                    chunk = HttpTransport(s.url, timeout_s=30).facts_sync().chunked_prefill_size or chunk
                except Exception as exc:  # keep the default
                    log(f"facts not read: {exc}")
                break
        steps = traffic_sample(max_prompt, a.traffic, chunk)
        Path("/tmp/traffic.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in steps))
        for s in servers:
            r = results[s.name]
            if s.ready_s is None:
                continue
            if time.time() - start > a.deadline:
                r["note"] = "deadline: traffic not sent"
                continue
            r["metrics_at_ready"] = serving_misses(metrics_text(s.url))
            others = [o for o in servers if o is not s and o.alive()] if a.solo else []
            for o in others:
                o.pause(True)
            r["solo"] = bool(others)
            try:
                passes(s, r, steps)
            finally:
                for o in others:
                    o.pause(False)
            r["new_entries"] = sorted(triton_entries(s.workdir / "cache") - set(r["entries_at_ready"]))
            try:
                from cache_tools import compile_log

                recs = compile_log.read_dir(str(s.workdir / "state"))
                r["manifest_serving"] = [
                    f"{(x.get('kernel') or {}).get('name')}:{x.get('event')}:"
                    f"{str(x.get('hash'))[:10]}:pid{x.get('pid')}"
                    for x in recs if x.get("phase") == "serving"]
                r["manifest_counts"] = {}
                for x in recs:
                    k = f"{x.get('phase')}/{x.get('event')}/{x.get('compiler')}"
                    r["manifest_counts"][k] = r["manifest_counts"].get(k, 0) + 1
            except Exception as exc:
                r["manifest_error"] = str(exc)
            r["metrics_after"] = serving_misses(metrics_text(s.url))
            if a.gc_log:
                r["gc"] = gc_events(s.log_path)
            rep = s.workdir / "report.json"
            if rep.exists():
                r["report"] = json.loads(rep.read_text())
            slow = [(p1["label"], p1["ms"], p2["ms"]) for p1, p2 in zip(r["pass1"], r["pass2"])
                    if p1["ms"] > 1.5 * p2["ms"] and p1["ms"] - p2["ms"] > 5]
            r["slow_first"] = slow
            log(f"{s.name}: first steps, pass 1 / pass 2 ms (SGLang's own): " + "; ".join(
                f"{p1['label']} {p1['ms']} / {p2['ms']} ({p1['server_ms']} / {p2['server_ms']})"
                for p1, p2 in list(zip(r["pass1"], r["pass2"]))[:4]))
            t1, t2 = sum(x["ms"] for x in r["pass1"]), sum(x["ms"] for x in r["pass2"])
            r["first_over_second"] = round(t1 / t2, 3) if t2 else None
            r["worst_step_ratio"] = max((round(p1["ms"] / p2["ms"], 2), p1["label"])
                                        for p1, p2 in zip(r["pass1"], r["pass2"]) if p2["ms"] > 0)
            log(f"{s.name}: compiles after ready {r['after_pass2']['triton'] - r['at_ready']['triton']} "
                f"triton, {r['after_pass2']['nvcc'] - r['at_ready']['nvcc']} nvcc; "
                f"first-pass total {sum(x['ms'] for x in r['pass1']):.0f} ms vs second "
                f"{sum(x['ms'] for x in r['pass2']):.0f} ms; steps >1.5x slower: {len(slow)}")
        if a.idle_probe > 0 and time.time() - start + a.idle_probe < a.deadline:
            log(f"idle probe: all servers idle for {a.idle_probe:.0f} s")
            time.sleep(a.idle_probe)
            for s in servers:
                if s.name in results and "pass2" in results[s.name]:
                    probe = [asyncio.run(replay(s.url, steps[:1], salt))[0] for salt in ("i1", "i2")]
                    results[s.name]["idle_probe"] = {"idle_s": a.idle_probe, "steps": probe}
                    log(f"{s.name}: after {a.idle_probe:.0f} s idle {probe[0]['label']} "
                        f"{probe[0]['ms']} ms, repeated {probe[1]['ms']} ms")
        if a.row_probe > 0 and time.time() - start < a.deadline:
            for s in servers:
                if s.name in results and "pass2" in results[s.name]:
                    results[s.name]["row_probe"] = row_probe(s.url, a.row_probe)
                    rp = results[s.name]["row_probe"]
                    log(f"{s.name}: row probe, {rp['requests']} input-logprob prompts of new "
                        f"lengths: first / repeat {rp['first_ms']:.0f} / {rp['repeat_ms']:.0f} "
                        f"ms, median ratio {rp['median_ratio']}, median extra "
                        f"{rp['median_extra_ms']} ms, over 1.5x: {rp['over_1_5']}")
    finally:
        for s in servers:
            s.stop()
            (out / f"server-{s.name}.log").write_text(s.tail(300))
        (out / f"e2e-{a.graphs.replace(',', '-')}.json").write_text(json.dumps(results, indent=1))
        log(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
