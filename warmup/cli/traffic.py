"""``sglang-warmup traffic synth | convert``: the commands over :mod:`warmup.coverage.traffic`.
Both print a traffic sample (JSON lines, the format ``audit --traffic`` reads) on stdout."""

from __future__ import annotations

from pathlib import Path

import typer

from warmup.cli import options, output
from warmup.coverage import request_logs, traffic

app = typer.Typer(no_args_is_help=True, add_completion=False)


@app.command("synth")
def synth_command(
    kind: str = typer.Option(..., "--kind", callback=options.one_of(traffic.KINDS),
                             help=" | ".join(traffic.KINDS)),
    steps: int = typer.Option(24, "--steps", min=1, max=traffic.MAX_STEPS,
                              help="number of steps"),
    seed: int = typer.Option(0, "--seed", help="same seed, same sample"),
    max_prompt: int = typer.Option(12000, "--max-prompt", min=traffic.MIN_SYNTH_PROMPT,
                                   max=traffic.MAX_PROMPT_TOKENS,
                                   help="longest prompt in tokens (keep it below the server's)"),
) -> None:
    """Write a synthetic traffic sample (JSON lines) to stdout."""
    output.data(traffic.dump(traffic.synth(kind, seed=seed, steps=steps, max_prompt=max_prompt)),
                nl=False)


@app.command("convert")
def convert_command(
    fmt: str = typer.Option(..., "--from", callback=options.one_of(request_logs.CONVERT_FORMATS),
                            help=" | ".join(request_logs.CONVERT_FORMATS)),
    path: Path = typer.Argument(..., help="the request log"),
    burst_window_ms: float = typer.Option(
        10.0, "--burst-window-ms", min=0.0, callback=options.finite,
        help="sglang-log: requests arriving within this many ms are one concurrent burst"),
) -> None:
    """Convert a request log into a traffic sample (JSON lines on stdout; lengths only)."""
    conv = request_logs.convert(fmt, path, burst_window_ms=burst_window_ms)
    output.data(traffic.dump(conv.steps), nl=False)
    output.note(conv.summary())
