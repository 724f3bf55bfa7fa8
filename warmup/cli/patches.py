"""``sglang-warmup patches``: report what the prefill-graph fixes do with the installed SGLang."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from cache_tools.render import table
from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.errors import PatchError
from warmup.patches.status import FixStatus

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Report SGLang 0.5.22's prefill-graph fixes (PR #44627).")


@dataclass(frozen=True)
class PatchReport:
    """``status``'s result: the SGLang it inspected, how, and one row per fix."""

    sglang_version: str
    sglang_path: str
    applied_in_process: bool
    fixes: tuple[FixStatus, ...]

    def to_json(self) -> dict:
        return {
            "sglang": {"version": self.sglang_version, "path": self.sglang_path},
            "applied_in_process": self.applied_in_process,
            "fixes": [row.to_json() for row in self.fixes],
        }


def build_report(*, apply: bool) -> PatchReport:
    """Import the target modules of the installed SGLang and decide every fix.

    ``apply=True`` installs and verifies the fixes in this (short-lived) process exactly as a
    server process would, so ``applied`` means the real code path succeeded here.
    ``apply=False`` only detects; fixes that would apply read ``needed``.
    """
    try:
        import sglang
    except ImportError as exc:
        raise PatchError(f"SGLang is not importable: {exc}",
                         hint="run this command in the environment the server runs in") from None
    from warmup.patches import registry

    try:
        rows = registry.inspect_installed(apply=apply)
    except Exception as exc:  # an import of SGLang's own modules failed
        raise PatchError(
            f"could not import the DeepSeek-V4 modules of SGLang {sglang.__version__}: "
            f"{type(exc).__name__}: {exc}",
            hint="install SGLang's runtime dependencies (the same as for serving)") from None
    return PatchReport(
        sglang_version=getattr(sglang, "__version__", "unknown"),
        sglang_path=str(getattr(sglang, "__file__", "") or ""),
        applied_in_process=apply,
        fixes=tuple(rows),
    )


def render_table(report: PatchReport) -> str:
    """Human-readable rows: fix, verdict, detection, and under each row why."""
    how = ("applied and verified in this process, as a server process does"
           if report.applied_in_process else "detection only; nothing was patched")
    rows = [(str(r.number), r.name, r.mode, r.verdict, r.detected or "-") for r in report.fixes]
    header, rule, *lines = table(("FIX", "NAME", "MODE", "VERDICT", "DETECTED"),
                                 rows).splitlines()
    out = [f"SGLang {report.sglang_version} ({report.sglang_path}): {how}", "", header, rule]
    for line, status in zip(lines, report.fixes):
        out += [line, f"    {status.reason}"]
    return "\n".join(out)


@app.command("status")
def status_command(
    fmt: Format = options.FORMAT,
    json_alias: bool = options.JSON_ALIAS,
    detect_only: bool = typer.Option(
        False, "--detect-only", help="Only detect; do not apply the fixes in this process."),
    quiet: bool = options.QUIET,
    verbose: bool = options.VERBOSE,
) -> None:
    """One row per fix for the installed SGLang: needed / applied / upstream / absent / refused / off.

    Imports SGLang's DeepSeek-V4 backend (10-20 s on a CPU).  By default the fixes are
    applied and verified inside this short-lived process, exactly as in a server process.
    """
    with output.sglang_step("importing SGLang's DeepSeek-V4 backend", quiet=quiet,
                            verbose=verbose):
        report = build_report(apply=not detect_only)
    if options.output_format(fmt, json_alias) == "json":
        output.data_json(report.to_json())
    else:
        output.data(render_table(report))
