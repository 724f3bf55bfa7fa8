"""``sglang-warmup doctor``: the command over :mod:`warmup.observe.doctor`'s check."""

from __future__ import annotations

import typer

from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.observe import doctor


def doctor_command(
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    timeout: float = typer.Option(doctor.DEFAULT_TIMEOUT_S, "--timeout", min=1.0,
                                  callback=options.finite,
                                  help="Seconds the check process may take."),
    keep_dir: str = typer.Option("", "--keep-dir", metavar="DIR",
                                 help="Keep the check's Triton cache, phase file, compile log, "
                                      "metrics files and process log in DIR (default: a "
                                      "temporary directory, removed)."),
    quiet: bool = options.QUIET,
) -> None:
    """Check that compile events are hooked, phased and counted as they will be in SGLang.

    Exits 1 when a check fails."""
    as_json = options.output_format(fmt, json_alias) == "json"
    with output.progress(quiet).ticking("compiling a probe kernel twice in a worker-like "
                                        "process"):
        report = doctor.run(timeout_s=timeout, keep_dir=keep_dir or None)
    output.data(doctor.render_json(report) if as_json else doctor.render_text(report))
    if not report.ok:
        if as_json:  # scripts often drop stdout; say why on stderr as well
            failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.ok]
            output.note("sglang-warmup doctor: FAILED: " + "; ".join(failed))
        raise typer.Exit(1)
