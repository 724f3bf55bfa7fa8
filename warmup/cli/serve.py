"""``sglang-warmup serve``: the launcher command (see warmup.serve.launch)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import List, Optional

import typer

from warmup import settings
from warmup.cli import options, output
from warmup.serve import launch


def serve_command(
    ctx: typer.Context,
    plan: Path = typer.Option(..., "--plan", help="the plan to warm before the port opens"),
    report: Optional[Path] = typer.Option(None, "--report", help="write the run report (JSON) "
                                          "here; rewritten at every start of the server"),
    lenient: bool = typer.Option(False, "--lenient", help="warn and go on when a warm-up request fails"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir",
                                             help="phase file, compile log and metrics (default: "
                                                  "a new temporary directory)"),
    name: Optional[str] = typer.Option(None, "--name", help="--warmups entry name (default: the plan's name)"),
    second_pass: bool = typer.Option(False, "--second-pass",
                                     help="replay the plan once more and report whether it is closed"),
    skip_family: Optional[List[str]] = typer.Option(
        None, "--skip-family", help="leave a family of classes out (repeat or comma-separate: "
                                    "logprobs, parallel_sampling, stop, stream, long_decode, "
                                    "concurrency, or a kind)"),
    freeze_gc: Optional[bool] = typer.Option(None, "--freeze-gc/--no-freeze-gc",
                                             help="freeze SGLang's Python GC once the warm-up is "
                                                  "done (SGLang's /freeze_gc; default: "
                                                  "WARMUP_FREEZE_GC, on)"),
    let: Optional[List[str]] = options.LET,
    steps: Optional[Path] = typer.Option(None, "--steps", help="a steps record (prebake's "
                                         "ARCHIVE.steps.json): on the cache it was baked with, "
                                         "send only the steps that paid a first-time cost "
                                         "(refused here when it cannot be read; the whole plan "
                                         "where it does not match the launch; WARMUP_STEPS in "
                                         "the environment is read by the server alone)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the command and environment, "
                                 "write nothing, do not start"),
) -> None:
    """Run ``python -m sglang.launch_server`` with the plan registered in ``--warmups``."""
    args = [a for a in ctx.args if a != "--"]
    lets = options.lets(let)
    families = tuple(f.strip() for v in (skip_family or ()) for f in v.split(",") if f.strip())
    spec = launch.plan_launch(str(plan), args, report=str(report) if report else None,
                              lenient=lenient, state_dir=str(state_dir) if state_dir else None,
                              name=name, second_pass=second_pass, skip_families=families,
                              freeze_gc=settings.FREEZE_GC.get() if freeze_gc is None else freeze_gc,
                              lets=lets, steps=str(steps) if steps else None)
    shown = {k: v for k, v in spec.env.items() if k.startswith("WARMUP_") or k == "PROMETHEUS_MULTIPROC_DIR"}
    output.note("sglang-warmup: " + " ".join(f"{k}={_shown_value(k, v)}"
                                             for k, v in sorted(shown.items())))
    output.note("sglang-warmup: exec " + shlex.join(spec.argv))
    if dry_run:
        return
    launch.prepare_state_dir(spec)
    launch.exec_launch(spec)


def _shown_value(name: str, value: str) -> str:
    """A variable's value for the log line; secrets (e.g. WARMUP_API_KEY) are not printed."""
    if any(word in name for word in ("KEY", "TOKEN", "SECRET", "PASSWORD")):
        return "<redacted>"
    return shlex.quote(value)
