"""How commands talk: data on stdout (text for people or JSON for scripts), warnings, progress
and log lines on stderr, and the rule that no command overwrites a file without ``-y``."""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import typer

from cache_tools.progress import Progress
from warmup import settings
from warmup.errors import WarmupError


def data(text: str, *, nl: bool = True) -> None:
    """The command's result, on stdout."""
    typer.echo(text, nl=nl)


def data_json(value: Any, *, indent: int = 2, sort_keys: bool = False) -> None:
    """The command's result as JSON, on stdout."""
    typer.echo(json.dumps(value, indent=indent, sort_keys=sort_keys, default=str))


def width() -> int | None:
    """The terminal's columns when stdout is one (tables are fitted to them), else None: a
    file or a pipe gets every column."""
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):  # a replaced or closed stdout
        return None
    return shutil.get_terminal_size().columns


def note(line: str) -> None:
    """A line for the person at the terminal (progress, what was written), on stderr."""
    typer.echo(line, err=True)


def warn(lines: Iterable[str]) -> None:
    """``warning:`` lines (already prefixed by the renderer), on stderr."""
    for line in lines:
        typer.echo(line, err=True)


def confirm(question: str) -> bool:
    """Ask on stderr and read the answer from stdin; only y/yes is a yes (EOF is a no).
    Not typer.confirm: click's prompt writes its last character to stdout."""
    sys.stderr.write(f"{question} [y/N]: ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():  # a piped answer is not echoed: end the question's line
        sys.stderr.write("\n")
    return answer.strip().lower() in ("y", "yes")


def progress(quiet: bool = False) -> Progress:
    """Byte counts and step lines of a long operation, on stderr (none with ``--quiet``)."""
    return Progress.null() if quiet else Progress()


@contextmanager
def sglang_step(label: str, *, quiet: bool = False, verbose: bool = False) -> Iterator[None]:
    """A step that imports or runs the installed SGLang inside this command (10-20 s): its
    elapsed time on a terminal once it passes 2 s (none with ``--quiet``), and SGLang's own log
    lines and import-time warnings kept off our output unless ``--verbose``."""
    import logging  # here: the cache commands never log (its import is start-up time)

    root, sglang_log = logging.getLogger(), logging.getLogger("sglang")
    handlers, root_level, sglang_level = list(root.handlers), root.level, sglang_log.level
    if not verbose:
        sglang_log.setLevel(logging.ERROR)  # its modules log under sglang.*; errors still show
    try:
        with warnings.catch_warnings(), progress(quiet).ticking(label):
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:  # SGLang configures the root logger as it resolves; that ends with the step
        root.handlers[:] = handlers
        root.setLevel(root_level)
        sglang_log.setLevel(sglang_level)


def refuse_overwrite(path: str | os.PathLike[str] | None, yes: bool, name: str) -> None:
    """Refuse, before any work starts, a directory where a file is written, and an existing
    file without ``-y``.  ``name`` is how the command line names the path (``--out``,
    ``--write``, ``OUT``)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise WarmupError(f"{name} {path} is a directory",
                          hint=f"{name} names the file to write, e.g. {p / 'NAME'}")
    if p.exists() and not yes:
        raise WarmupError(f"{name} {path} exists",
                          hint=f"pass -y to overwrite it, or choose another {name}")


def configure_logging() -> None:
    """Our log lines on stderr with a timestamp (SGLang's managed sidecar process and a bare
    container have no logging configured)."""
    import logging

    root = logging.getLogger("sglang_warmup")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(logging.DEBUG if settings.DEBUG.get() else logging.INFO)
