#!/usr/bin/env python3
"""What the warm-up adds before SGLang's main process spawns its scheduler, on the GPU host's
own install (SGLang 0.5.17 under /tmp/site, ``first_hits.py setup`` first).

SGLang's launcher (``python -m sglang.launch_server``) loads its plugins, parses its arguments
(the log's first line), then imports its HTTP server and spawns the schedulers.  Everything it
does up to that spawn delays the whole start.  Each round times, in fresh processes, in
turn:

* ``python``: the interpreter alone (``-c pass``);
* ``serve``: ``python -m warmup serve --plan … --steps … --dry-run`` (the front end that
  ``exec``s SGLang's launcher);
* ``alone``: ``sglang.launch_server``'s imports, ``load_plugins()`` with the plugin installed
  but not enabled (SGLang alone), then the HTTP server's import;
* ``plan``: the same with the environment ``serve`` sets (WARMUP_ENABLE=1, the plan, the
  steps record), and each step of the plugin's ``register()`` timed on its own.

    python3 scripts/gpu/plugin_startup.py --rounds 3 --steps /tmp/fh/dsv4-eager-C.tar.steps.json \\
      > plugin-startup.json

The answer (JSON): every round's times and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import first_hits  # noqa: E402  (the GPU host's environment: PYTHONPATH over /tmp/site)

PLAN = "deepseek_v4_serving_shapes"

MAIN = r'''
import json, sys, time
t0 = time.perf_counter()
import sglang.launch_server  # noqa: F401  (server_args and the launcher's own imports)
t1 = time.perf_counter()
steps = {}
if "--steps-of-register" in sys.argv:
    from warmup.serve import plugin
    for name, step in plugin.steps():  # what register() runs, each timed
        s = time.perf_counter()
        step()
        steps[name] = round(time.perf_counter() - s, 3)
else:
    from sglang.srt.plugins import load_plugins
    load_plugins()
t2 = time.perf_counter()
import sglang.srt.entrypoints.http_server  # noqa: F401
t3 = time.perf_counter()
print(json.dumps({"launcher_imports_s": round(t1 - t0, 3), "plugins_s": round(t2 - t1, 3),
                  "http_server_import_s": round(t3 - t2, 3), "to_spawn_s": round(t3 - t0, 3),
                  "register_steps_s": steps, "modules": len(sys.modules)}))
'''


def timed(argv: list[str], env: dict[str, str]) -> dict:
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    wall = round(time.perf_counter() - t, 3)
    out: dict = {"wall_s": wall}
    if p.returncode:  # kept with the round, the other rounds still run
        print(f"{argv[:4]} failed ({p.returncode}): {p.stderr[-2000:]}", file=sys.stderr)
        return dict(out, failed=p.returncode)
    last = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if last:
        out.update(json.loads(last[-1]))
    return out


def plan_env(base: dict[str, str], steps: str, state: Path) -> dict[str, str]:
    env = dict(base)
    env.update(WARMUP_ENABLE="1", WARMUP_PLAN=PLAN, WARMUP_NAME=PLAN, WARMUP_STEPS=steps,
               WARMUP_STATE_DIR=str(state), PROMETHEUS_MULTIPROC_DIR=str(state / "prometheus"),
               WARMUP_LENIENT="1", WARMUP_FREEZE_GC="1")
    (state / "prometheus").mkdir(parents=True, exist_ok=True)
    return env


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", required=True, help="a steps record (prebake's ARCHIVE.steps.json)")
    ap.add_argument("--model", default=str(first_hits.MODELS["dsv4"]))
    a = ap.parse_args()
    base = first_hits.base_env()
    py = sys.executable
    rows: dict[str, list[dict]] = {"python": [], "serve": [], "alone": [], "plan": [],
                                   "plan_steps": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            state = Path(tmp) / f"r{r}"
            env = plan_env(base, a.steps, state)
            rows["python"].append(timed([py, "-c", "pass"], base))
            rows["serve"].append(timed([py, "-m", "warmup", "serve", "--plan", PLAN, "--steps",
                                        a.steps, "--dry-run", "--", "--model-path", a.model],
                                       base))
            argv = [py, "-c", MAIN, "--model-path", a.model, "--warmups", PLAN]
            # alternate which goes first, so that a warmer file cache favours neither
            order = [("alone", base), ("plan", env)] if r % 2 == 0 else [("plan", env), ("alone", base)]
            for name, e in order:
                rows[name].append(timed(argv, e))
            rows["plan_steps"].append(timed(argv + ["--steps-of-register"], env))
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in rows.items()),
                  file=sys.stderr)

    def med(name: str, key: str) -> float | None:
        vals = [row[key] for row in rows[name] if key in row]
        return round(statistics.median(vals), 3) if vals else None

    summary = {name: {k: med(name, k) for k in ("wall_s", "launcher_imports_s", "plugins_s",
                                                 "http_server_import_s", "to_spawn_s")}
               for name in rows}
    steps = {}
    for row in rows["plan_steps"]:
        for k, v in row.get("register_steps_s", {}).items():
            steps.setdefault(k, []).append(v)
    summary["register_steps_median_s"] = {k: round(statistics.median(v), 3) for k, v in steps.items()}
    json.dump({"rounds": rows, "median": summary, "host": os.uname().nodename}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
