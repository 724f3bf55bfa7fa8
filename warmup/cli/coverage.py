"""``sglang-warmup coverage``: the command over :mod:`warmup.coverage.classes`."""

from __future__ import annotations

from pathlib import Path

import typer

from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.coverage import classes
from warmup.view import text


def coverage_command(
    path: Path = typer.Argument(..., help="coverage.json, a run report, or the state directory"),
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
) -> None:
    """Show the compile keys per plan class and whether a second replay compiled anything.

    Recorded by a warm-up run with WARMUP_SECOND_PASS=1 (coverage.json in the state
    directory)."""
    cov = classes.load(path)
    if options.output_format(fmt, json_alias) == "json":
        output.data_json(cov.to_json(), indent=1)
    else:
        output.data(text.coverage(cov, width=output.width()))
