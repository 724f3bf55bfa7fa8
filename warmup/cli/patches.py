"""``sglang-warmup patches``: report what the prefill-graph fixes do with the installed SGLang."""

from __future__ import annotations

import json
from dataclasses import dataclass

import typer

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
    """Human-readable rows: fix, verdict, detection, and why."""
    how = ("applied and verified in this process, as a server process does"
           if report.applied_in_process else "detection only; nothing was patched")
    lines = [f"SGLang {report.sglang_version} ({report.sglang_path}): {how}", ""]
    header = ("FIX", "NAME", "MODE", "VERDICT", "DETECTED")
    rows = [(str(r.number), r.name, r.mode, r.verdict, r.detected or "-") for r in report.fixes]
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    for row, status in zip(rows, report.fixes):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        lines.append(f"    {status.reason}")
    return "\n".join(lines)


@app.command("status")
def status_command(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    detect_only: bool = typer.Option(
        False, "--detect-only", help="Only detect; do not apply the fixes in this process."),
) -> None:
    """One row per fix for the installed SGLang: needed / applied / upstream / refused / off.

    Imports SGLang's DeepSeek-V4 backend (about 7 s on a CPU).  By default the fixes are
    applied and verified inside this short-lived process, exactly as in a server process.
    """
    report = build_report(apply=not detect_only)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        typer.echo(render_table(report))


if __name__ == "__main__":  # pragma: no cover - ``python -m warmup.cli.patches``
    app()
