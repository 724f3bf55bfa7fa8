"""The ``sglang-warmup`` command line: the entry point and the one error boundary that turns
every expected failure into ``error:`` + ``hint:`` lines on stderr and an exit status, never a
traceback (unless WARMUP_DEBUG=1).  The typer app is ``warmup.cli.commands`` (one module per
command group, each imported only when its command runs); ``--version`` alone needs no typer.

Exit statuses: 0 ok; 1 an error (a ``HintedError`` without its own status, a failed check);
2 a usage error or a bad plan or facts; 3 an audit above ``--max-misses`` or a bad archive;
4 an archive of another toolchain; 5 the shared cache store failed; 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

#: The exit status after Ctrl-C.
INTERRUPTED = 130


def _interrupted() -> NoReturn:
    """Ctrl-C: one line and status 130, whenever it comes."""
    print("error: interrupted", file=sys.stderr)
    sys.exit(INTERRUPTED)


try:  # Ctrl-C while the CLI's modules load is no traceback either
    from cache_tools.errors import HintedError
    from cache_tools.versions import dist_version
    from warmup import settings
except KeyboardInterrupt:
    _interrupted()

PROG = "sglang-warmup"


def version_line() -> str:
    """What ``--version`` prints: this package's version and the installed SGLang's."""
    sglang = dist_version("sglang")  # metadata only: importing SGLang takes seconds
    return (f"{PROG} {dist_version(PROG) or 'unknown (not installed)'} "
            f"(sglang {sglang or 'not installed'})")


def __getattr__(name: str) -> Any:
    """``warmup.cli.app``: the typer app (``warmup.cli.commands``), imported on first use."""
    if name == "app":
        from warmup.cli.commands import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """The console script ``sglang-warmup`` and ``python -m warmup``: run the app inside the one
    error boundary; exits with the status the module docstring lists (returns on 0)."""
    try:
        if (sys.argv[1:] if argv is None else list(argv)) == ["--version"]:
            print(version_line())       # the one answer that needs no typer (0.1 s of imports)
            return
        code = _run(argv)
    except KeyboardInterrupt:  # outside typer's own catch, which answers 130 itself
        code = INTERRUPTED
    if code == INTERRUPTED:
        _interrupted()
    if code:
        sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """The app's exit status; an expected failure printed as ``error:`` and ``hint:`` lines."""
    try:
        from warmup.cli.commands import app  # typer, and the table of commands

        rc = app(args=argv, prog_name=PROG, standalone_mode=False)
    except HintedError as exc:
        if settings.DEBUG.get():
            raise
        _say(f"error: {exc.message}")
        if exc.hint:
            _say(f"hint: {exc.hint}")
        return exc.exit_code
    except Exception as exc:  # click's by name (not imported at start); anything else raises
        kind = _click_kind(exc)
        if kind is None or settings.DEBUG.get():
            raise  # a bug: the traceback is the report
        return _click_exit(kind, exc)
    # standalone_mode=False returns typer.Exit's code (130 after Ctrl-C) instead of exiting.
    return rc if isinstance(rc, int) else 0


def _click_kind(exc: BaseException) -> str | None:
    """What a command-line-parser exception is: ``help``, ``usage``, ``click``, ``exit`` or
    ``abort``; None for anything else.

    Typer 0.29 raises the exceptions of its own bundled copy of click (``typer._click``), older
    typers those of the ``click`` package; both keep click's class names, so the classes are
    recognised by name along the MRO, from either package."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] not in ("click", "typer"):
            continue
        kind = {"NoArgsIsHelpError": "help", "UsageError": "usage", "ClickException": "click",
                "TyperException": "click", "Exit": "exit", "Abort": "abort"}.get(cls.__name__)
        if kind:
            return kind
    return None


def _click_exit(kind: str, exc: Any) -> int:
    """Print a parser exception the way every error is printed; its exit status."""
    if kind == "exit":
        return int(getattr(exc, "exit_code", 0) or 0)
    if kind == "abort":  # a confirmation answered no, or stdin closed before the answer
        _say("error: aborted")
        return 1
    if kind == "help":  # a group called without a command: its help on stdout (status 2)
        print(exc.format_message())
        return 2
    _say(f"error: {_message(exc)}")
    ctx = getattr(exc, "ctx", None)
    if kind == "usage":
        if ctx is not None:
            usage = " ".join(ctx.get_usage().split())  # "Usage: sglang-warmup plan show [...]"
            _say(f"hint: {usage[0].lower()}{usage[1:]}; see `{ctx.command_path} --help`")
        else:
            _say(f"hint: `{PROG} --help` lists the commands")
    return int(getattr(exc, "exit_code", 2 if kind == "usage" else 1))


def _message(exc: Any) -> str:
    """click's message, made to read like ours: lower-case start, the rejected value named
    (typer 0.29 validates values with pydantic, whose messages omit it), no pydantic prefix."""
    text = exc.format_message()
    errors = getattr(exc.__cause__, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
        except Exception:  # not pydantic's ValidationError after all
            first = {}
        raw = str(first.get("msg", ""))
        if raw and raw in text:
            shown = raw.removeprefix("Value error, ")
            value = repr(first.get("input"))
            if "input" in first and value not in shown:
                shown = f"{value}: {shown[:1].lower()}{shown[1:]}"
            text = text.replace(raw, shown)
    if text[:1].isupper() and text[1:2].islower():
        text = text[:1].lower() + text[1:]
    return text


def _say(line: str) -> None:
    print(line, file=sys.stderr)
