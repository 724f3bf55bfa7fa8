"""Plain-text tables and sizes for the CLI (deterministic, no terminal needed)."""

from __future__ import annotations

from typing import Any, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str = "") -> str:
    """A fixed-width table.  ``align`` holds one of ``l``/``r`` per column (default: numbers
    right, text left)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def just(i: int, text: str, raw: Any) -> str:
        a = align[i] if i < len(align) else ("r" if isinstance(raw, (int, float)) else "l")
        return text.rjust(widths[i]) if a == "r" else text.ljust(widths[i])

    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for raw, row in zip(rows, cells):
        lines.append("  ".join(just(i, c, raw[i]) for i, c in enumerate(row)).rstrip())
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def bar(value: float, maximum: float, width: int = 24) -> str:
    """A horizontal bar for a value out of ``maximum`` (for per-class timings)."""
    if maximum <= 0:
        return ""
    n = int(round(width * min(value, maximum) / maximum))
    return "█" * n
