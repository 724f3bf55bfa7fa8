"""A fake ``python -m sglang.launch_server`` for the prebake tests (put ``fake_sglang`` first on
PYTHONPATH).

It holds ``serve``'s contract the way SGLang does: it refuses to start unless the environment
``serve`` builds is there (WARMUP_ENABLE=1, WARMUP_PLAN, WARMUP_NAME listed in ``--warmups``);
it starts a child process in its process group (as SGLang starts its schedulers); it runs the
plan before it listens (the real loader, expansion and Driver, with sglang-warmup's real
compile-event hooks, and the second-pass check with WARMUP_SECOND_PASS=1) where every request
compiles a real Triton kernel for sm_90 into TRITON_CACHE_DIR, writes the run report to
WARMUP_REPORT, then serves the stand-in HTTP API
on ``--host``/``--port``.

FAKE_SGLANG_MODE selects a fault: ``exit`` (exit 3 before listening), ``never-ready`` (listen
but answer 503 forever), ``ignore-term`` (ignore SIGTERM, child too), ``no-report`` (write no
run report, as when the plugin is not loaded), ``forget-cache`` (a start with the second pass on
compiles into a fresh Triton cache: kernels that do not persist), ``exit-on-restart`` (a start
with the second pass on exits 3 before listening), ``slow-first-pass`` (a start with the second
pass on takes 10 ms a send and 30 ms a step's first: a host slower for a while).  The child's
pid goes to
``$WARMUP_STATE_DIR/child.pid``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # sidecar_support/, for standin

import standin  # noqa: E402


class CompilingTransport:
    """Runs each warm-up step as the scheduler would: one kernel per prompt-length class."""

    def __init__(self, send_s: float = 0.0, first_send_s: float = 0.0) -> None:
        from warmup.serve.transport import TokenMaker

        self.tokens = TokenMaker(32000)
        self.kernels: dict[int, object] = {}
        self.send_s, self.first_send_s, self.sent = send_s, first_send_s, set()

    async def send(self, step):
        import triton
        from triton.backends.compiler import GPUTarget

        from warmup.serve.transport import Outcome

        await asyncio.sleep(self.send_s if step.index in self.sent else self.first_send_s)
        self.sent.add(step.index)

        outs = []
        for r in list(step.requests) + list(step.background):
            block = standin._block_for(r.input_len, False)
            if block not in self.kernels:
                src = triton.compiler.ASTSource(fn=standin._kernel(), signature={
                    "x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"},
                    constexprs={"BLOCK": block})
                self.kernels[block] = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            outs.append(Outcome(output_tokens=r.max_new_tokens, finish_reason="length",
                                latency_s=0.0))
        return outs

    async def flush(self, timeout_s: float) -> str:
        return "flushed on 1 rank(s)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--warmups", default="")
    args, _unknown = ap.parse_known_args()
    mode = os.environ.get("FAKE_SGLANG_MODE", "")
    env = os.environ
    if env.get("WARMUP_ENABLE") != "1" or not env.get("WARMUP_PLAN"):
        sys.exit("fake sglang: WARMUP_ENABLE=1 and WARMUP_PLAN are not set: not launched by serve")
    if env.get("WARMUP_NAME") not in args.warmups.split(","):
        sys.exit(f"fake sglang: --warmups {args.warmups!r} does not list {env.get('WARMUP_NAME')}")
    if not env.get("TRITON_CACHE_DIR"):
        sys.exit("fake sglang: TRITON_CACHE_DIR is not set")
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    state = Path(env["WARMUP_STATE_DIR"])
    (state / "child.pid").write_text(str(child.pid))
    print(f"fake sglang: model {args.model_path}, child {child.pid}", flush=True)
    if mode == "forget-cache" and env.get("WARMUP_SECOND_PASS") == "1":
        os.environ["TRITON_CACHE_DIR"] = str(Path(env["WARMUP_STATE_DIR"]) / "fresh-triton")
    if mode == "exit" or (mode == "exit-on-restart" and env.get("WARMUP_SECOND_PASS") == "1"):
        print("fake sglang: failing on purpose before listening", flush=True)
        sys.exit(3)

    from warmup.observe import events

    from warmup.coverage import second_pass
    from warmup.plan import facts, loader
    from warmup.serve import hook
    from warmup.serve.driver import Driver
    from warmup.plan.expand import expand

    events.install()
    plan = loader.load(env["WARMUP_PLAN"])
    exp = expand(plan, facts.from_server_info(standin.SERVER_INFO))
    skip, note, warning = hook.quiet_steps(exp)         # WARMUP_STEPS, as the real hook reads it
    if warning:
        exp = dataclasses.replace(exp, warnings=exp.warnings + (warning,))
    t0 = time.perf_counter()
    slow = mode == "slow-first-pass" and env.get("WARMUP_SECOND_PASS") == "1"
    driver = Driver(CompilingTransport(*((0.01, 0.03) if slow else ())), state_dir=str(state),
                    skip_steps=skip, steps_note=note)
    result = asyncio.run(second_pass.run(driver, exp))
    print(f"fake sglang: warm-up {plan.name}: {result.run.requests} requests in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    if mode != "no-report":  # as the hook does: where asked, and in the state directory
        for target in (env["WARMUP_REPORT"], state / "report.json"):
            Path(target).write_text(json.dumps(result.to_dict()))
    opts = standin.build_parser().parse_args(["--host", args.host, "--port", str(args.port)]
                                             + (["--never-healthy"] if mode == "never-ready" else []))
    standin.serve(opts, announce=False)


if __name__ == "__main__":
    main()
