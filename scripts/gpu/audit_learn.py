#!/usr/bin/env python3
"""Audit, learn, re-audit on a GPU host: does a plan learned from post-ready misses close them?

    python3 scripts/gpu/audit_learn.py --out OUT_DIR [--deadline 540]

1. Launch SGLang (eager prefill: ``--disable-prefill-cuda-graph``, decode graphs kept, metrics
   on) through ``python -m warmup serve --plan default --state-dir S1`` with empty
   cache directories (the tiny random-weight MoE of e2e_warmup.py).
2. For each synthetic traffic kind (chat, rag, agent, batch) run ``sglang-warmup audit
   --state-dir S1``: every compile after ready attributed to its traffic step.
3. ``sglang-warmup learn --audits S1 --plan default --write OUT/learned.yaml``.
4. Stop the server; launch again with the learned plan, fresh caches and a fresh state
   directory; audit the same four samples again.

Writes OUT/audit_learn.json (misses per kind before/after, the learned stanzas, per-step
detail of every step that missed), OUT/learned.yaml and the tails of both server logs.
Needs what e2e_warmup.py needs (.carry/ site-packages, nvcc); it reuses its setup() and Server.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
from e2e_warmup import Server, cache_env, log, server_args, setup  # noqa: E402

#: Steps per traffic kind: small samples, so four audits (two passes each) fit the budget.
KINDS = {"chat": 8, "rag": 5, "agent": 6, "batch": 3}
MAX_PROMPT = 12000
PORTS = (31500, 31510)


def sglang_args(port: int) -> list[str]:
    return server_args("0.30", eager_prefill=True) + ["--port", str(port)]


def launch(name: str, plan: Path, workdir: Path, env: dict[str, str], port: int) -> Server:
    workdir.mkdir(parents=True)
    state = workdir / "state"
    (state / "prometheus").mkdir(parents=True)
    senv = dict(env, **cache_env(workdir / "cache"))
    senv["PROMETHEUS_MULTIPROC_DIR"] = str(state / "prometheus")
    argv = [sys.executable, "-m", "warmup", "serve", "--plan", str(plan), "--state-dir",
            str(state), "--report", str(workdir / "report.json"), "--", *sglang_args(port)]
    log(f"starting {name} with {plan.name} on port {port}")
    return Server(name, port, argv, senv, workdir)


def wait_ready(server: Server, until: float) -> bool:
    while time.time() < until and server.alive():
        if server.poll_ready():
            return True
        time.sleep(2)
    return server.poll_ready()


def cli(env: dict[str, str], args: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "warmup", *args], env=env, cwd=str(ROOT),
                           capture_output=True, text=True, timeout=max(10.0, timeout))
    except subprocess.TimeoutExpired as exc:
        return 124, exc.stdout or "", f"timed out after {timeout:.0f} s"
    return p.returncode, p.stdout, p.stderr


def summarize(report: dict) -> dict:
    """The part of an audit worth keeping: totals, and every step that missed."""
    steps = []
    for s in report["steps"]:
        if not s["misses"] and not s["slow_first"]:
            continue
        keys = s["pass1"]["keys"] + s["pass2"]["keys"]
        steps.append({"i": s["index"], "label": s.get("label"), "kind": s["kind"],
                      "prompts": s["prompts"][:6] + (["..."] if len(s["prompts"]) > 6 else []),
                      "prefix": s.get("prefix"), "prefix_cached": s["prefix_cached"],
                      "ms": [s["pass1"]["ms"], s["pass2"]["ms"]],
                      "misses": [s["pass1"]["misses"], s["pass2"]["misses"]],
                      "kernels": sorted({f"{k['name']}:{(k['hash'] or '')[:10]}" for k in keys})})
    return {"misses": report["misses"], "steps": len(report["steps"]),
            "steps_with_misses": report["steps_with_misses"], "slow_first": report["slow_first"],
            "pass1_ms": report["pass1_ms"], "pass2_ms": report["pass2_ms"],
            "unattributed": [f"{k['name']}:{k['compiled']}c/{k['disk_hits']}d"
                             for k in report["unattributed"]],
            "unseen_events": report["unseen_events"], "notes": report["notes"],
            "detail": steps}


def audit_all(server: Server, env: dict[str, str], traffic: dict[str, Path], until: float) -> dict:
    state = server.workdir / "state"
    out: dict[str, dict] = {}
    for kind, path in traffic.items():
        left = until - time.time()
        if left < 15:
            out[kind] = {"skipped": "deadline"}
            continue
        rc, stdout, stderr = cli(env, ["audit", "--url", server.url, "--traffic", str(path),
                                       "--state-dir", str(state), "--json", "--max-misses", "0",
                                       "--out", str(state)], timeout=left)
        try:
            out[kind] = dict(summarize(json.loads(stdout)), rc=rc)
        except (ValueError, KeyError) as exc:
            out[kind] = {"rc": rc, "error": f"{type(exc).__name__}: {exc}",
                         "stderr": stderr[-1500:]}
        log(f"{server.name} audit {kind}: rc {rc}, misses {out[kind].get('misses')}, "
            f"steps with misses {out[kind].get('steps_with_misses')}")
    return out


def warmup_report(server: Server) -> dict | None:
    path = server.workdir / "report.json"
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    return {"ok": r.get("ok"), "requests": r.get("requests"), "duration_s": r.get("duration_s"),
            "compiles_by_phase": r.get("compiles_by_phase"),
            "classes": {c["shape_class"]: [c["requests"], c["compiles"]] for c in r["classes"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan", default="default")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    a = ap.parse_args()
    start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = setup()
    log(f"setup done in {time.time() - start:.0f} s")
    from warmup.coverage import traffic as traffic_mod

    run = Path("/tmp/audit_learn")
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    samples = {}
    for kind, n in KINDS.items():
        samples[kind] = run / f"traffic-{kind}.jsonl"
        samples[kind].write_text(traffic_mod.dump(traffic_mod.synth(kind, seed=1, steps=n,
                                                                    max_prompt=MAX_PROMPT)))
    result: dict = {"deadline_s": a.deadline, "setup_s": round(time.time() - start, 1),
                    "kinds": KINDS, "plan": a.plan, "notes": []}
    plan = ROOT / a.plan if (ROOT / a.plan).is_file() else Path(a.plan)  # a file or a shipped name
    learned = out / "learned.yaml"
    servers: list[Server] = []
    end = start + a.deadline
    try:
        first = launch("before", plan, run / "before", env, PORTS[0])
        servers.append(first)
        ready = wait_ready(first, start + 0.48 * a.deadline)
        result["before"] = {"ready_s": first.ready_s, "warmup": warmup_report(first)}
        if not ready:
            result["before"]["log_tail"] = first.tail(40)
            result["notes"].append("the first server was not ready in time")
            return
        result["before"]["audits"] = audit_all(first, env, samples, start + 0.62 * a.deadline)
        rc, stdout, stderr = cli(env, ["learn", "--audits", str(first.workdir / "state"),
                                       "--plan", str(plan), "--write", str(learned), "--json"],
                                 timeout=60)
        try:
            result["learn"] = dict(json.loads(stdout), rc=rc)
            result["learn"].pop("misses", None)  # the per-step detail is in the audits
        except ValueError:
            result["learn"] = {"rc": rc, "stderr": stderr[-1500:]}
        log(f"learn: rc {rc}, {len(result['learn'].get('shapes', []))} learned class(es)")
        first.stop()
        second_plan = learned if learned.exists() else plan
        if second_plan == plan:
            result["notes"].append("learn failed: the second launch uses the same plan" if rc
                                   else "nothing learned: the second launch uses the same plan")
        time.sleep(3)  # let the first server's GPU memory go
        if end - time.time() < 150:
            result["notes"].append(f"only {end - time.time():.0f} s left: second launch skipped")
            return
        second = launch("after", second_plan, run / "after", env, PORTS[1])
        servers.append(second)
        ready = wait_ready(second, end - 45)
        result["after"] = {"plan": str(second_plan.name), "ready_s": second.ready_s,
                           "warmup": warmup_report(second)}
        if not ready:
            result["after"]["log_tail"] = second.tail(40)
            result["notes"].append("the second server was not ready in time")
            return
        result["after"]["audits"] = audit_all(second, env, samples, end - 5)
    finally:
        for s in servers:
            s.stop()
        for s in servers:
            (out / f"server-{s.name}.log").write_text(s.tail(200))
        before = (result.get("before") or {}).get("audits") or {}
        after = (result.get("after") or {}).get("audits") or {}
        result["misses"] = {k: [before.get(k, {}).get("misses"), after.get(k, {}).get("misses")]
                            for k in KINDS}
        result["duration_s"] = round(time.time() - start, 1)
        (out / "audit_learn.json").write_text(json.dumps(result, indent=1, default=str))
        log(f"misses per kind [before, after]: {result['misses']}; done in "
            f"{result['duration_s']:.0f} s")


if __name__ == "__main__":
    main()
