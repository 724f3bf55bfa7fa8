"""``sglang-warmup prebake``: the command over :mod:`warmup.sidecar.prebake`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.sidecar import prebake


def prebake_command(
    ctx: typer.Context,
    plan: Path = typer.Option(..., "--plan", help="the plan SGLang runs before it listens"),
    out: Path = typer.Option(..., "--out", help="the archive to write (.tar, or .tar.zst with --zstd)"),
    port: Optional[int] = typer.Option(None, "--port", help="SGLang's port (default: its --port, "
                                       "else 30000)"),
    deadline: float = typer.Option(1800.0, "--deadline",
                                   help="seconds for SGLang to load, warm and answer "
                                        "/health_generate"),
    stop_timeout: float = typer.Option(60.0, "--stop-timeout",
                                       help="seconds between SIGTERM and SIGKILL"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir",
                                            help="empty directory for cache/, state/ and the "
                                                 "server log (default: a temporary one)"),
    keep: bool = typer.Option(False, "--keep", help="keep the temporary work directory"),
    zstd: bool = typer.Option(False, "--zstd", help="compress the archive with zstd"),
    fmt: Format = options.FORMAT,
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (directories, "
                                 "environment, command) and stop"),
    yes: bool = options.yes("overwrite an existing --out"),
) -> None:
    """Run SGLang once with a plan against empty caches and pack what it compiled:
    prebake --plan P --out A -- <sglang launch_server args>."""
    output.configure_logging()
    spec = prebake.prepare(plan, out, list(ctx.args), port=port, deadline_s=deadline,
                           stop_timeout_s=stop_timeout, work_dir=work_dir, zstd=zstd, keep=keep,
                           overwrite=yes)
    if dry_run:
        try:
            if fmt == "json":
                output.data_json(spec.to_dict())
            else:
                output.data(spec.describe())
                output.warn(f"warning: {w}" for w in spec.warnings)
        finally:
            spec.discard()
        return
    result = spec.execute(progress=output.progress(), echo=output.note)
    if fmt == "json":
        output.data_json(result.to_dict())
    else:
        output.data(result.render())
        output.warn(f"warning: {w}" for w in result.warnings)
