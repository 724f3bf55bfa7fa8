"""``sglang-warmup prebake``: the command over :mod:`warmup.prebake.bake`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cache_tools import render
from cache_tools.stores import oci
from cache_tools.errors import CacheError
from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.prebake import bake as prebake


def prebake_command(
    ctx: typer.Context,
    plan: Path = typer.Option(..., "--plan", help="the plan SGLang runs before it listens"),
    out: Path = typer.Option(..., "--out", help="the archive to write (.tar, or .tar.zst with --zstd)"),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                       help="SGLang's port (default: its --port, else 30000)"),
    deadline: float = typer.Option(1800.0, "--deadline", callback=options.finite,
                                   help="seconds for SGLang to load, warm and answer "
                                        "/health_generate"),
    stop_timeout: float = typer.Option(60.0, "--stop-timeout",
                                       callback=options.finite,
                                       help="seconds between SIGTERM and SIGKILL"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir",
                                            help="empty directory for cache/, state/ and the "
                                                 "server log (default: a temporary one)"),
    keep: bool = typer.Option(False, "--keep", help="keep the temporary work directory"),
    zstd: bool = typer.Option(False, "--zstd", help="compress the archive with zstd"),
    push_to: Optional[str] = typer.Option(None, "--push", metavar="REF",
                                          help="then push the archive to an OCI registry: "
                                               "oci://HOST[:PORT]/REPO[:TAG] (tagged by its "
                                               "fingerprint too; login checked before the bake)"),
    learn_steps: bool = typer.Option(True, "--learn-steps/--no-learn-steps",
                                     help="start SGLang again from the baked caches, run the "
                                          "plan twice there and write the steps that paid a "
                                          "first-time cost beside the archive "
                                          "(ARCHIVE.steps.json, for serve --steps)"),
    fmt: Format = options.FORMAT,
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (directories, "
                                 "environment, command) and stop"),
    yes: bool = options.yes("overwrite an existing --out"),
) -> None:
    """Run SGLang once with a plan against empty caches and pack what it compiled:
    prebake --plan P --out A -- <sglang launch_server args>."""
    output.configure_logging()
    if push_to and dry_run:
        oci.parse(push_to)
    elif push_to:   # a bad reference or a refused login: found before, not after, the bake
        oci.check_access(push_to)
    spec = prebake.prepare(plan, out, list(ctx.args), port=port, deadline_s=deadline,
                           stop_timeout_s=stop_timeout, work_dir=work_dir, zstd=zstd, keep=keep,
                           overwrite=yes, learn_steps=learn_steps)
    if dry_run:
        try:
            if fmt == "json":
                output.data_json({**spec.to_dict(), **({"push": push_to} if push_to else {})})
            else:
                output.data(spec.describe() + (f"\nthen push to: {push_to}" if push_to else ""))
                output.warn(f"warning: {w}" for w in spec.warnings)
        finally:
            spec.discard()
        return
    result = spec.execute(progress=output.progress(), echo=output.note)
    pushed = _push(result.archive, push_to) if push_to else None
    if fmt == "json":
        output.data_json({**result.to_dict(),
                          **({"pushed": render.oci_push_json(pushed)} if pushed else {})})
    else:
        output.data(result.render() + (f"\n{render.oci_push_text(pushed, str(result.archive))}"
                                       if pushed else ""))
        output.warn(f"warning: {w}" for w in result.warnings)


def _push(archive: Path, ref: str) -> oci.OciPushResult:
    """The baked archive to the registry; a failure says that the archive is kept."""
    try:
        return oci.push(archive, ref, progress=output.progress())
    except CacheError as exc:
        exc.hint = (f"the archive {archive} is kept: push it with `sglang-warmup cache push "
                    f"{archive} {ref}`; " + exc.hint)
        raise
