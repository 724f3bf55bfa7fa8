"""``sglang-warmup report``: a saved run report, audit report or coverage record, as a terminal
summary or (``--html``) one self-contained page."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cache_tools.atomic import write_text
from warmup.cli import options, output
from warmup.cli.options import Format
from warmup.view import documents, html, text


def report_command(
    path: Path = typer.Argument(..., help="a run report (serve --report, <state dir>/report.json), "
                                          "an audit-*.json, a coverage.json, a state directory, "
                                          "or another JSON document (docs/data/*.json)"),
    html_out: Optional[Path] = typer.Option(None, "--html", help="also write one self-contained "
                                            "HTML page (charts, no network at view time)"),
    yes: bool = options.yes("overwrite the --html file if it exists"),
    fmt: Format = options.FORMAT,
) -> None:
    """Render a saved report: a run report, an audit, a coverage record, or any other JSON
    document sglang-warmup wrote (docs/data/*.json: its fields and the reports it holds).

    A run report shows per-class latency, first hit against repeat, compiles and disk hits,
    compiles by phase and after ready, the warm-up's timeline, what was skipped and why."""
    output.refuse_overwrite(html_out, yes, "--html")
    doc = documents.load(path)
    if fmt == "json":
        output.data_json({"kind": doc.kind, "path": doc.path, "document": doc.data})
    else:
        output.data(text.render(doc, width=output.width()))
    if html_out is not None:
        write_text(html_out, html.render(doc))
        output.note(f"sglang-warmup report: wrote {html_out}")
