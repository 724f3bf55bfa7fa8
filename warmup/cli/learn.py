"""``sglang-warmup learn``: the command over :mod:`warmup.coverage.learn`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from warmup.cli import options, output
from warmup.coverage import learn


def learn_command(
    ctx: typer.Context,
    audits: Optional[Path] = typer.Option(None, "--audits", help="an audit-*.json, or the "
                                          "directory holding them (the state directory)"),
    manifest: Optional[Path] = typer.Option(None, "--manifest", hidden=True,
                                            help="deprecated name of --audits"),
    plan: Path = typer.Option(..., "--plan", help="the plan to extend"),
    diff: bool = typer.Option(False, "--diff", help="print a unified diff against the plan"),
    write: Optional[Path] = typer.Option(None, "--write", help="write the merged plan here"),
    yes: bool = options.yes("overwrite --write if it exists (the plan itself, for one)"),
    phase: str = typer.Option("learned", "--phase", help="name of the phase of learned classes"),
    fmt: Literal["yaml", "json"] = typer.Option("yaml", "--format", help="yaml (the learned "
                                                "classes, or --diff) | json (for scripts)"),
    json_alias: bool = options.JSON_ALIAS,
) -> None:
    """Turn audited post-ready misses into plan classes (YAML, --diff or --write).

    The merged plan is loaded and expanded against the audited server's facts before anything
    is printed or written."""
    if manifest is not None:
        output.note("note: --manifest is deprecated: it is spelled --audits now")
    source = audits if audits is not None else manifest
    if source is None:
        ctx.fail("Missing option '--audits'.")
    output.refuse_overwrite(write, yes, "--write")
    result = learn.learn(source, plan, phase=phase)
    if write is not None and not result.empty:
        learn.write_plan(result.merged_text, write)
    if options.output_format(fmt, json_alias) == "json":
        data = result.to_json()
        data["written"] = str(write) if write is not None and not result.empty else None
        output.data_json(data, indent=1)
        return
    output.note(result.summary())
    if diff:
        output.data(result.diff() or "# no change to the plan\n", nl=False)
    elif write is None:
        output.data(result.snippet(), nl=False)
    if write is not None:
        output.note(f"wrote {write} ({len(result.shapes)} learned class(es))" if not result.empty
                    else f"{write} not written: nothing to learn")
