#!/usr/bin/env python3
"""GPU benchmark of the sidecar and of prebake on one host (SGLang 0.5.17, the tiny model of
``e2e_warmup.py``, eager prefill: ``--disable-prefill-cuda-graph``).

    python3 scripts/gpu/sidecar_prebake.py --out OUT_DIR [--plan default]

(a) Sidecar end to end.  Server **A** starts plainly (no warm-up); server **B** starts plainly
    with ``sglang-warmup sidecar --second-pass`` next to it (sharing B's state and Prometheus
    directories, as in docker/k8s).  The sidecar's ``/ready`` is polled every 0.5 s (timeline).
    Then one long prompt (``--long`` tokens, 6,000 by default) is timed on each: first on A
    (cold), then a second long prompt on A (same length, fresh tokens: the warm reference),
    then the same two on B after the sidecar's warm-up.
(b) Prebake.  ``sglang-warmup prebake`` runs its own server **P** against empty caches and packs
    the archive; the archive is restored into a fresh cache root, and server **C** starts with
    ``sglang-warmup serve --plan`` over those caches.  Recorded: P's and C's time to ready, their
    warm-up seconds, and the compile misses in each phase from their compile manifests (C's
    ``warmup`` misses should be zero).

A, B and P start together (a fifth of the GPU's memory each); C starts as soon as the archive is
restored.  The long prompts are sent one server at a time, but other launches may still be
compiling on the CPUs meanwhile (noted in the result).  Every wait is bounded by ``--deadline``
(540 s); every server, the sidecar and the prebake are stopped on every path.  Writes
``OUT/sidecar_prebake.json`` and six short logs (seven files).

Needs what e2e_warmup.py needs (``.carry/`` from scripts/gpu/build_carry.sh) and a wheel of this
checkout in ``.carry/wheel/`` (``bash scripts/gpu/build_wheel.sh``; rebuild it after pulling).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_warmup import MODEL, ROOT, Server, cache_env, log, server_args, setup  # noqa: E402

RUN = Path("/tmp/sidecar_prebake")
PORTS = {"A": 32000, "B": 32010, "sidecar": 32015, "P": 32020, "C": 32030}


def sglang_args(port: int) -> list[str]:
    return server_args("0.18", eager_prefill=True) + ["--port", str(port)]


def http_json(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, None
    except Exception as exc:  # not up yet, refused, timed out
        return None, str(exc)


def long_prompt(url: str, n: int, seed: int, timeout: float) -> dict:
    """One prompt of n tokens, one output token; wall time in ms."""
    rng = random.Random(seed)
    body = {"input_ids": [rng.randrange(1000, 30000) for _ in range(n)],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return {"ms": round((time.perf_counter() - t0) * 1000, 1), "status": r.status}
    except Exception as exc:
        return {"ms": round((time.perf_counter() - t0) * 1000, 1), "error": str(exc)[:200]}


def manifest_counts(state: Path) -> dict:
    """Compile events per phase from a state directory's compile manifest."""
    from cache_tools import compile_log
    from cache_tools.compile_log import is_miss

    out: dict[str, dict[str, int]] = {}
    try:
        records = compile_log.read_dir(str(state))
    except Exception as exc:
        return {"error": str(exc)}
    for r in records:
        ph = out.setdefault(r.get("phase") or "?", {"misses": 0, "disk_hits": 0, "loads": 0})
        if is_miss(r):
            ph["misses"] += 1
        elif r.get("event") == "hit" or (r.get("event") == "jit_build" and r.get("outcome") == "hit"):
            ph["disk_hits"] += 1
        elif r.get("event") == "load":
            ph["loads"] += 1
    return out


def report_summary(path: Path) -> dict | None:
    try:
        rep = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {k: rep.get(k) for k in ("ok", "requests", "duration_s", "compiles_by_phase", "flush")}


def stop_group(proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except Exception:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except Exception:
            pass


def tail(path: Path, n: int = 200) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) + "\n"
    except OSError:
        return f"(no {path})\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/sidecar-prebake-out"))
    ap.add_argument("--plan", default="default")
    ap.add_argument("--long", type=int, default=6000, help="tokens of the long prompt")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    a = ap.parse_args()
    start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def left() -> float:
        return a.deadline - (time.time() - start)

    env = setup()
    try:
        import warmup.prebake.bake  # noqa: F401  (the wheel in .carry/wheel must be this checkout's)
        import warmup.sidecar.machine  # noqa: F401
    except ImportError as exc:
        sys.exit(f"sglang-warmup without the sidecar/prebake: {exc}; rebuild .carry/wheel "
                 "(bash scripts/gpu/build_wheel.sh) and remove /tmp/ours")
    from cache_tools import locations

    log("setup done")
    shutil.rmtree(RUN, ignore_errors=True)
    RUN.mkdir(parents=True)
    plan = a.plan
    py = sys.executable
    result: dict = {"model": str(MODEL), "graphs": "eager (--disable-prefill-cuda-graph)",
                    "long_prompt_tokens": a.long, "plan": a.plan, "sidecar": {}, "prebake": {},
                    "servers": {}, "notes": []}
    servers: dict[str, Server] = {}
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        # --- A and B: plain SGLang, compile events recorded (plugin without a plan) ------------
        for name in ("A", "B"):
            wd = RUN / name
            state = wd / "state"
            (state / "prometheus").mkdir(parents=True)
            senv = dict(env, **cache_env(wd / "cache"), WARMUP_ENABLE="1",
                        WARMUP_STATE_DIR=str(state),
                        PROMETHEUS_MULTIPROC_DIR=str(state / "prometheus"))
            argv = [py, "-m", "sglang.launch_server", *sglang_args(PORTS[name])]
            servers[name] = Server(name, PORTS[name], argv, senv, wd)
            log(f"started {name} on port {PORTS[name]}")
        # --- the sidecar next to B ------------------------------------------------------------
        stateB = RUN / "B" / "state"
        logs["sidecar"] = RUN / "sidecar.log"
        budget = max(60, int(left() - 120))
        procs["sidecar"] = subprocess.Popen(
            [py, "-m", "warmup", "sidecar", "--plan", plan, "--url", servers["B"].url,
             "--port", str(PORTS["sidecar"]), "--bind", "127.0.0.1",
             "--deadline", str(int(left() * 0.6)), "--startup-budget", str(budget),
             "--second-pass", "--state-dir", str(stateB), "--watch-interval", "0"],
            env=dict(env, PROMETHEUS_MULTIPROC_DIR=str(stateB / "prometheus")),
            stdout=open(logs["sidecar"], "w"), stderr=subprocess.STDOUT, start_new_session=True,
            cwd=str(ROOT))
        # --- P: prebake against empty caches ---------------------------------------------------
        archive = RUN / "prebake.tar"
        logs["prebake"] = RUN / "prebake.log"
        procs["P"] = subprocess.Popen(
            [py, "-m", "warmup", "prebake", "--plan", plan, "--out", str(archive),
             "--port", str(PORTS["P"]), "--work-dir", str(RUN / "P"),
             "--deadline", str(int(left() * 0.7)), "--stop-timeout", "20", "--format", "json",
             "--", *sglang_args(PORTS["P"])],
            env=env, stdout=open(RUN / "prebake.json", "w"), stderr=open(logs["prebake"], "w"),
            start_new_session=True, cwd=str(ROOT))
        log("started the sidecar (next to B) and the prebake (P)")

        sidecar_url = f"http://127.0.0.1:{PORTS['sidecar']}"
        ready_timeline: list[dict] = []
        last_ready = None
        measured = False
        c_started = False
        while left() > 5:
            # /ready timeline of the sidecar
            status, body = http_json(sidecar_url + "/ready", timeout=2)
            state = body.get("state") if isinstance(body, dict) else None
            if (status, state) != last_ready:
                ready_timeline.append({"t_s": round(time.time() - start, 1), "status": status,
                                       "state": state})
                last_ready = (status, state)
            for s in servers.values():
                was = s.ready_s
                if s.poll_ready() and was is None and s.name == "A":
                    from warmup.observe import phase

                    # no plan and no sidecar: serving starts at ready (as a sidecar would mark it)
                    phase.set_phase("serving", state_dir=str(RUN / "A" / "state"))
            # (b) the prebake finished: restore into a fresh root and start C
            p = procs["P"]
            if not c_started and p.poll() is not None:
                c_started = True
                result["prebake"]["exit_code"] = p.returncode
                result["prebake"]["seconds"] = round(time.time() - start, 1)
                try:
                    result["prebake"]["result"] = json.loads((RUN / "prebake.json").read_text())
                except (OSError, ValueError):
                    result["prebake"]["result"] = None
                result["prebake"]["server_report"] = report_summary(RUN / "P" / "report.json")
                result["prebake"]["manifest"] = manifest_counts(RUN / "P" / "state")
                if p.returncode == 0 and archive.exists():
                    root = RUN / "C" / "cache"
                    r = subprocess.run([py, "-m", "warmup", "cache", "restore", str(archive),
                                        "--dest", str(root)], env=env, capture_output=True,
                                       text=True, timeout=max(10, min(120, left())), cwd=str(ROOT))
                    result["prebake"]["restore"] = {"exit_code": r.returncode,
                                                    "stdout": r.stdout[-2000:],
                                                    "stderr": r.stderr[-2000:]}
                    if r.returncode == 0:
                        cenv = dict(env, **dict(locations.exports(str(root)).pairs))
                        argv = [py, "-m", "warmup", "serve", "--plan", plan, "--state-dir",
                                str(RUN / "C" / "state"), "--report", str(RUN / "C" / "report.json"),
                                "--", *sglang_args(PORTS["C"])]
                        servers["C"] = Server("C", PORTS["C"], argv, cenv, RUN / "C")
                        log(f"prebake done in {result['prebake']['seconds']} s; restored; started C")
                else:
                    log(f"prebake failed (exit {p.returncode}); see prebake.log")
            # (a) A ready and the sidecar done: time the long prompts
            sc_done = state in ("ready", "failed") or procs["sidecar"].poll() is not None
            if not measured and servers["A"].ready_s is not None and sc_done \
                    and servers["B"].ready_s is not None:
                measured = True
                others = [n for n in ("P", "C") if (n == "P" and procs["P"].poll() is None)
                          or (n == "C" and "C" in servers and servers["C"].ready_s is None)]
                if others:
                    result["notes"].append(f"long prompts timed while {', '.join(others)} "
                                           "was still starting (CPU contention)")
                t = max(10.0, min(120.0, left() / 5))
                lat = {"A_first": long_prompt(servers["A"].url, a.long, 1, t),
                       "A_second": long_prompt(servers["A"].url, a.long, 2, t),
                       "B_first_after_sidecar": long_prompt(servers["B"].url, a.long, 3, t),
                       "B_second": long_prompt(servers["B"].url, a.long, 4, t)}
                result["long_prompt_ms"] = lat
                log(f"long prompt ({a.long} tokens): " + ", ".join(
                    f"{k} {v.get('ms')} ms" for k, v in lat.items()))
            c_done = "C" in servers and (servers["C"].ready_s is not None
                                         or not servers["C"].alive())
            p_failed = c_started and "C" not in servers
            if measured and (c_done or p_failed):
                break
            time.sleep(0.5)
        else:
            result["notes"].append(f"deadline {a.deadline:g} s reached")

        result["sidecar"]["ready_timeline"] = ready_timeline
        status, report = http_json(sidecar_url + "/report", timeout=5)
        if isinstance(report, dict):
            result["sidecar"]["report"] = {k: report.get(k) for k in (
                "state", "reason", "health_wait_s", "warmup_s", "expansion", "projection",
                "timeline", "counts")}
            second = report.get("second_pass_run") or {}
            result["sidecar"]["second_pass_check"] = second.get("check")
            run = report.get("run") or {}
            result["sidecar"]["first_pass"] = {k: run.get(k) for k in (
                "ok", "requests", "duration_s", "compiles_by_phase")}
        result["sidecar"]["B_manifest"] = manifest_counts(stateB)
        result["servers"]["A_manifest"] = manifest_counts(RUN / "A" / "state")
        for name, s in servers.items():
            result["servers"][name] = {"ready_s": s.ready_s, "alive": s.alive()}
        if "C" in servers:
            result["prebake"]["C_report"] = report_summary(RUN / "C" / "report.json")
            result["prebake"]["C_manifest"] = manifest_counts(RUN / "C" / "state")
            pm = (result["prebake"].get("manifest") or {}).get("warmup", {})
            cm = result["prebake"]["C_manifest"].get("warmup", {}) \
                if isinstance(result["prebake"]["C_manifest"], dict) else {}
            pr, cr = result["prebake"].get("server_report") or {}, result["prebake"]["C_report"] or {}
            result["prebake"]["summary"] = {
                "cold_ready_s (P, empty caches)": (result["prebake"].get("result") or {}).get("ready_s"),
                "warm_ready_s (C, restored caches)": servers["C"].ready_s,
                "cold_warmup_s (P)": pr.get("duration_s"), "warm_warmup_s (C)": cr.get("duration_s"),
                "cold_warmup_misses (P)": pm.get("misses"), "warm_warmup_misses (C)": cm.get("misses"),
                "note": "P's ready time includes its own warm-up and packing is after it; C's "
                        "ready time includes its warm-up; both launched contended"}
            log(f"prebake summary: {result['prebake']['summary']}")
    finally:
        for name in ("sidecar", "P"):
            stop_group(procs.get(name))
        for s in servers.values():
            s.stop()
        result["seconds"] = round(time.time() - start, 1)
        (out / "sidecar_prebake.json").write_text(json.dumps(result, indent=1, default=str))
        (out / "sidecar.log").write_text(tail(logs.get("sidecar", RUN / "sidecar.log"), 300))
        (out / "prebake.log").write_text(tail(logs.get("prebake", RUN / "prebake.log"), 200))
        for name in ("A", "B", "C"):
            (out / f"server-{name}.log").write_text(tail(RUN / name / "server.log", 150))
        (out / "server-P.log").write_text(tail(RUN / "P" / "server.log", 150))
        log(f"done in {result['seconds']} s")


if __name__ == "__main__":
    main()
