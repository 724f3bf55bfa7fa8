#!/usr/bin/env python3
"""The warm-up's own duration, cold and on the cache it left: per graph setting, one launch of
``sglang-warmup serve --plan PLAN`` with empty cache directories (the settings' cold launches
start together), stopped once ready, then the same launch again on the same cache directories
(what a restored archive or a cache volume gives; one at a time), each reporting its warm-up
duration, request count, time per class and compiles by phase.

    python3 scripts/gpu/restored_warmup.py --graphs eager,default --out OUT_DIR [--plan default]

Setup (the carried SGLang, the tiny model, the wheel) is scripts/gpu/e2e_warmup.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_warmup as e2e  # noqa: E402


MEM = "0.3"  # two launches fit side by side


def start(env: dict[str, str], wd: Path, graphs: str, plan: str, port: int) -> tuple[e2e.Server, Path]:
    """Start ``serve --plan`` on the cache directories under ``wd`` (made empty only by the
    caller), with a fresh state directory."""
    state = wd / "state"
    shutil.rmtree(state, ignore_errors=True)
    (state / "prometheus").mkdir(parents=True)
    senv = dict(env, **e2e.cache_env(wd / "cache"))
    senv.update({"WARMUP_ENABLE": "1", "WARMUP_STATE_DIR": str(state),
                 "PROMETHEUS_MULTIPROC_DIR": str(state / "prometheus")})
    report = wd / "report.json"
    report.unlink(missing_ok=True)
    args = e2e.server_args(MEM, eager_prefill=graphs == "eager") + ["--port", str(port)]
    argv = [sys.executable, "-m", "warmup", "serve", "--plan", plan, "--state-dir", str(state),
            "--report", str(report), "--", *args]
    return e2e.Server(graphs, port, argv, senv, wd), report


def finish(server: e2e.Server, report: Path, wd: Path, deadline: float) -> dict:
    """Wait for ready (or the deadline), read the report, stop."""
    try:
        while not server.poll_ready() and server.alive() and time.time() < deadline:
            time.sleep(1)
        out: dict = {"ready_s": server.ready_s, "artifacts": e2e.count_artifacts(wd / "cache")}
        if report.exists():
            rep = json.loads(report.read_text())
            out.update({k: rep.get(k) for k in ("duration_s", "requests", "compiles_by_phase")})
            out["classes"] = {c["shape_class"]: [c["requests"], round(c["total_ms"]), c.get("compiles")]
                              for c in rep.get("classes", [])}
        if server.ready_s is None:
            out["log_tail"] = server.tail(30)
        return out
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", default="default", help="eager, default, or both: eager,default")
    ap.add_argument("--plan", default="default")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/restored-out"))
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    a = ap.parse_args()
    t0 = time.time()
    deadline = t0 + a.deadline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = e2e.setup()
    graphs = [g for g in a.graphs.split(",") if g]
    assert graphs and set(graphs) <= {"eager", "default"}, a.graphs
    wds = {g: Path("/tmp/restored") / g for g in graphs}
    for wd in wds.values():
        shutil.rmtree(wd, ignore_errors=True)
        wd.mkdir(parents=True)
    result: dict = {"plan": a.plan, "mem_fraction": MEM}
    try:
        # Cold launches start together (their warm-ups may overlap); the relaunches on the
        # caches they left run one at a time, so each restored warm-up has the GPU to itself.
        cold = {g: start(env, wds[g], g, a.plan, 31900 + i) for i, g in enumerate(graphs)}
        for g, (server, report) in cold.items():
            result.setdefault(g, {})["cold"] = finish(server, report, wds[g], deadline)
            e2e.log(f"{g} cold: {json.dumps({k: v for k, v in result[g]['cold'].items() if k != 'classes'})}")
        for i, g in enumerate(graphs):
            server, report = start(env, wds[g], g, a.plan, 31900 + i)
            result[g]["restored"] = finish(server, report, wds[g], deadline)
            e2e.log(f"{g} restored: {json.dumps({k: v for k, v in result[g]['restored'].items() if k != 'classes'})}")
    finally:
        (out / "restored-warmup.json").write_text(json.dumps(result, indent=1))
        e2e.log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
