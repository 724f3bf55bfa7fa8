#!/usr/bin/env python3
"""The warm-up's own duration, cold and on the cache it left: one launch of
``sglang-warmup serve --plan PLAN`` with empty cache directories, stopped once ready, then the
same launch again on the same cache directories (what a restored archive or a cache volume
gives), each reporting its warm-up duration, request count and compiles by phase.

    python3 scripts/gpu/restored_warmup.py --graphs default --out OUT_DIR [--plan default]

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


def launch(env: dict[str, str], wd: Path, graphs: str, plan: str, deadline: float) -> dict:
    """Start, wait for ready (or the deadline), read the report, stop."""
    state = wd / "state"
    shutil.rmtree(state, ignore_errors=True)
    (state / "prometheus").mkdir(parents=True)
    senv = dict(env, **e2e.cache_env(wd / "cache"))
    senv.update({"WARMUP_ENABLE": "1", "WARMUP_STATE_DIR": str(state),
                 "PROMETHEUS_MULTIPROC_DIR": str(state / "prometheus")})
    report = wd / "report.json"
    report.unlink(missing_ok=True)
    args = e2e.server_args("0.5", eager_prefill=graphs == "eager") + ["--port", "31900"]
    argv = [sys.executable, "-m", "warmup", "serve", "--plan", plan, "--state-dir", str(state),
            "--report", str(report), "--", *args]
    server = e2e.Server("restored", 31900, argv, senv, wd)
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
    ap.add_argument("--graphs", default="default", choices=("eager", "default"))
    ap.add_argument("--plan", default="default")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/restored-out"))
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run")
    a = ap.parse_args()
    start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = e2e.setup()
    wd = Path("/tmp/restored")
    shutil.rmtree(wd, ignore_errors=True)
    wd.mkdir(parents=True)
    result = {"graphs": a.graphs, "plan": a.plan}
    try:
        for name in ("cold", "restored"):
            result[name] = launch(env, wd, a.graphs, a.plan, start + a.deadline)
            e2e.log(f"{name}: {json.dumps({k: v for k, v in result[name].items() if k != 'classes'})}")
    finally:
        (out / "restored-warmup.json").write_text(json.dumps(result, indent=1))
        e2e.log(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
