"""The options several commands share, spelled and explained once: ``--format`` (and its hidden
``--json`` alias), ``--kinds``, ``--root``, ``-y/--yes``, ``--api-key``, ``-q/--quiet``,
``-v/--verbose``, ``--let``."""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, Optional, Sequence

import typer

from cache_tools.errors import CacheError
from cache_tools.locations import KIND_NAMES, parse_kinds
from warmup import settings

#: ``--format`` of every command that prints data: a table (or sentences) for people, JSON
#: for scripts.  A bad value is a usage error (exit 2) that lists these.
Format = Literal["table", "json"]

FORMAT: Any = typer.Option("table", "--format", help="table (for people) | json (for scripts)")

#: The ``--json`` flag that eight commands had before ``--format``; kept for scripts, hidden.
JSON_ALIAS: Any = typer.Option(False, "--json", hidden=True, help="same as --format json")


def one_of(choices: Sequence[str]) -> Callable[[Optional[str]], Optional[str]]:
    """A callback: the option's value is one of ``choices``, else a usage error (exit 2)."""
    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
        return value
    return check


def finite(value: Optional[float]) -> Optional[float]:
    """A callback: a number option is finite (``inf`` passes a minimum), else a usage error."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value!r} is not a finite number")
    return value


def _known_kinds(values: Optional[list[str]]) -> Optional[list[str]]:
    """A callback: every ``--kinds`` value names a cache kind, else a usage error (exit 2)."""
    try:
        parse_kinds(values)
    except CacheError as exc:
        raise typer.BadParameter(f"{exc.message}; known: {', '.join(KIND_NAMES)}") from None
    return values


KINDS: Any = typer.Option(None, "--kinds", callback=_known_kinds,
                          help="cache kinds (repeat or comma-separate): " + ", ".join(KIND_NAMES))

QUIET: Any = typer.Option(False, "-q", "--quiet", help="no progress lines on stderr")

VERBOSE: Any = typer.Option(False, "-v", "--verbose",
                            help="let SGLang's own log lines and warnings through")

API_KEY: Any = typer.Option(None, "--api-key", help="the server's --api-key (default: "
                            "WARMUP_API_KEY, which keeps it out of process listings)")


LET: Any = typer.Option(None, "--let", metavar="NAME=EXPR",
                        help="override one of the plan's let values (repeat), e.g. "
                             "--let long_cap=65536 (default: WARMUP_LET)")


def lets(values: Optional[list[str]]) -> tuple[tuple[str, str], ...]:
    """``--let NAME=EXPR`` values as pairs; a value without ``=`` is a usage error."""
    out = []
    for value in values or ():
        name, eq, expr = value.partition("=")
        if not eq or not name.strip() or not expr.strip():
            raise typer.BadParameter(f"{value!r}: expected NAME=EXPRESSION", param_hint="--let")
        out.append((name.strip(), expr.strip()))
    return tuple(out)


def root(help: str) -> Any:
    """``--root DIR``: the ``--root`` layout (every kind under one directory); ``help`` says
    what the command does there."""
    return typer.Option(None, "--root", help=help)


def yes(help: str = "overwrite the output file if it exists") -> Any:
    """``-y/--yes``: overwrite an existing output file, or skip a confirmation."""
    return typer.Option(False, "-y", "--yes", help=help)


def output_format(fmt: str, json_alias: bool) -> str:
    """The format asked for: ``--json`` wins over ``--format`` (old scripts pass only it)."""
    return "json" if json_alias else fmt


def api_key(value: Optional[str]) -> Optional[str]:
    """``--api-key``, else WARMUP_API_KEY, else None (no Authorization header)."""
    return value or settings.API_KEY.get() or None
