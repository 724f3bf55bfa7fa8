"""``sglang-warmup audit``: the command over :mod:`warmup.coverage.audit`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.coverage import audit, traffic
from warmup.errors import AuditMissesError
from warmup.view import text


def audit_command(
    url: str = typer.Option(..., "--url", help="a ready SGLang server"),
    traffic_file: Path = typer.Option(..., "--traffic", help="traffic sample (JSON lines; "
                                      "`sglang-warmup traffic synth|convert` writes one)"),
    state_dir: Optional[Path] = typer.Option(
        None, "--state-dir", help="the server's state directory (WARMUP_STATE_DIR): attribute "
        "each compile to its step from the compile log; without it, count /metrics deltas"),
    max_misses: int = typer.Option(0, "--max-misses", min=0,
                                   help="exit 3 when more post-ready compile events than this"),
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    out: Optional[Path] = typer.Option(
        None, "--out", help="where audit-<time>.json goes: a directory or a .json path "
        "(default: the state directory, else the current directory)"),
    yes: bool = options.yes("overwrite --out when it is an existing .json file"),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, callback=options.finite,
                                  help="seconds one HTTP call to the server may take"),
    api_key: Optional[str] = options.API_KEY,
) -> None:
    """Replay traffic twice on a ready server; name the step behind every post-ready compile.

    Each step's first-pass latency is compared with its second pass (fresh tokens, cache
    flushed between).  Writes audit-<time>.json for `learn`; exits 3 above --max-misses."""
    if out is not None and out.suffix == ".json" and not out.is_dir():  # a file, not a folder
        output.refuse_overwrite(out, yes, "--out")  # before the audit, which takes minutes
    steps = traffic.load(traffic_file)
    report = audit.run(url, steps, state_dir=state_dir, max_misses=max_misses,
                       traffic_name=str(traffic_file), timeout_s=timeout,
                       api_key=options.api_key(api_key), progress=output.note)
    report = audit.write(report, out if out is not None else state_dir)
    if options.output_format(fmt, json_alias) == "json":
        output.data_json(report.to_json(), indent=1)
    else:
        output.data(text.audit(report, width=output.width()))
    if not report.ok:
        raise AuditMissesError(f"{report.misses} post-ready compile event(s) during the audit, "
                               f"above --max-misses {max_misses}",
                               hint=f"sglang-warmup learn --audits {report.file} --plan PLAN "
                                    "turns them into plan classes")
