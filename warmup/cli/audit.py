"""``sglang-warmup audit | learn | coverage | traffic``: thin commands over warmup.coverage.audit,
warmup.coverage.learn, warmup.coverage.classes and warmup.coverage.traffic."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from warmup.errors import AuditMissesError

traffic_app = typer.Typer(no_args_is_help=True, add_completion=False)


def audit_command(
    url: str = typer.Option(..., "--url", help="a ready SGLang server"),
    traffic_file: Path = typer.Option(..., "--traffic", help="traffic sample (JSON lines; "
                                      "`sglang-warmup traffic synth|convert` writes one)"),
    state_dir: Optional[Path] = typer.Option(
        None, "--state-dir", help="the server's state directory (WARMUP_STATE_DIR): attribute "
        "each compile to its step from the compile manifest; without it, count /metrics deltas"),
    max_misses: int = typer.Option(0, "--max-misses", min=0,
                                   help="exit 3 when more post-ready compile events than this"),
    json_output: bool = typer.Option(False, "--json", help="print the audit as JSON"),
    out: Optional[Path] = typer.Option(
        None, "--out", help="where audit-<time>.json goes: a directory or a .json path "
        "(default: the state directory, else the current directory)"),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="seconds one step may take"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="the server's --api-key "
                                          "(default: WARMUP_API_KEY)"),
) -> None:
    """Replay traffic twice on a ready server; name the step behind every post-ready compile.

    Each step's first-pass latency is compared with its second pass (fresh tokens, cache
    flushed between).  Writes audit-<time>.json for `learn`; exits 3 above --max-misses."""
    from warmup.coverage import audit, traffic
    from warmup import settings

    steps = traffic.load(traffic_file)
    report = audit.run(url, steps, state_dir=state_dir, max_misses=max_misses,
                       traffic_name=str(traffic_file), timeout_s=timeout,
                       api_key=api_key or settings.API_KEY.get() or None,
                       progress=lambda line: typer.echo(line, err=True))
    report = audit.write(report, out if out is not None else state_dir)
    typer.echo(json.dumps(report.to_json(), indent=1) if json_output else report.render())
    if not report.ok:
        raise AuditMissesError(f"{report.misses} post-ready compile event(s) during the audit, "
                               f"above --max-misses {max_misses}",
                               hint=f"sglang-warmup learn --manifest {report.file} --plan PLAN "
                                    "turns them into plan classes")


def learn_command(
    manifest: Path = typer.Option(..., "--manifest", help="an audit-*.json, or the state "
                                  "directory holding them"),
    plan: Path = typer.Option(..., "--plan", help="the plan to extend"),
    diff: bool = typer.Option(False, "--diff", help="print a unified diff against the plan"),
    write: Optional[Path] = typer.Option(None, "--write", help="write the merged plan here"),
    phase: str = typer.Option("learned", "--phase", help="name of the phase of learned classes"),
    json_output: bool = typer.Option(False, "--json", help="print what was learned as JSON"),
) -> None:
    """Turn audited post-ready misses into plan classes (YAML, --diff or --write).

    The merged plan is loaded and expanded against the audited server's facts before anything
    is printed or written."""
    from warmup.coverage import learn

    result = learn.learn(manifest, plan, phase=phase)
    if write is not None and not result.empty:
        learn.write_plan(result.merged_text, write)
    if json_output:
        data = result.to_json()
        data["written"] = str(write) if write is not None and not result.empty else None
        typer.echo(json.dumps(data, indent=1))
        return
    typer.echo(result.summary(), err=True)
    if diff:
        typer.echo(result.diff() or "# no change to the plan\n", nl=False)
    elif write is None:
        typer.echo(result.snippet(), nl=False)
    if write is not None:
        typer.echo(f"wrote {write} ({len(result.shapes)} learned class(es))" if not result.empty
                   else f"{write} not written: nothing to learn", err=True)


def coverage_command(
    path: Path = typer.Argument(..., help="coverage.json, a run report, or the state directory"),
    json_output: bool = typer.Option(False, "--json", help="print as JSON"),
) -> None:
    """Show the compile keys per plan class and whether a second replay compiled anything.

    Recorded by a warm-up run with WARMUP_SECOND_PASS=1 (coverage.json in the state
    directory)."""
    from warmup.coverage import classes as coverage

    cov = coverage.load(path)
    typer.echo(json.dumps(cov.to_json(), indent=1) if json_output else cov.render())


@traffic_app.command("synth")
def synth_command(
    kind: str = typer.Option(..., "--kind", help="chat | rag | agent | batch"),
    steps: int = typer.Option(24, "--steps", min=1, help="number of steps"),
    seed: int = typer.Option(0, "--seed", help="same seed, same sample"),
    max_prompt: int = typer.Option(12000, "--max-prompt",
                                   help="longest prompt in tokens (keep it below the server's)"),
) -> None:
    """Write a synthetic traffic sample (JSON lines) to stdout."""
    from warmup.coverage import traffic

    typer.echo(traffic.dump(traffic.synth(kind, seed=seed, steps=steps, max_prompt=max_prompt)),
               nl=False)


@traffic_app.command("convert")
def convert_command(
    fmt: str = typer.Option(..., "--from", help="openai | sglang-log"),
    path: Path = typer.Argument(..., help="the request log"),
    burst_window_ms: float = typer.Option(
        10.0, "--burst-window-ms", min=0.0,
        help="sglang-log: requests arriving within this many ms are one concurrent burst"),
) -> None:
    """Convert a request log into a traffic sample (JSON lines on stdout; lengths only)."""
    from warmup.coverage import traffic

    conv = traffic.convert(fmt, path, burst_window_ms=burst_window_ms)
    sys.stdout.write(traffic.dump(conv.steps))
    typer.echo(conv.summary(), err=True)
