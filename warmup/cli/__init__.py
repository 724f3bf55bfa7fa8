"""The ``sglang-warmup`` command line: the typer app, one module per command group, and the one
error boundary that turns every expected failure into ``error:`` + ``hint:`` lines on stderr
and an exit status, never a traceback (unless WARMUP_DEBUG=1).

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


try:  # Ctrl-C while the commands' modules load (a third of a second) is no traceback either
    import typer

    from cache_tools.errors import HintedError
    from cache_tools.versions import dist_version
    from warmup import settings
    from warmup.cli import (audit, cache, coverage, doctor, learn, patches, plan, prebake, report,
                            serve, sidecar, traffic)
except KeyboardInterrupt:
    _interrupted()

PROG = "sglang-warmup"

app = typer.Typer(
    name=PROG,
    help="Warm SGLang's JIT kernels before the server listens; persist and audit the caches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: ``serve`` and ``prebake`` pass everything after ``--`` to SGLang unparsed.
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _version(value: bool) -> None:
    if value:
        sglang = dist_version("sglang")  # metadata only: importing SGLang takes seconds
        typer.echo(f"{PROG} {dist_version(PROG) or 'unknown (not installed)'} "
                   f"(sglang {sglang or 'not installed'})")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="print the version of sglang-warmup and of the "
                                            "installed SGLang, and exit")) -> None:
    """Warm SGLang's JIT kernels before the server listens; persist and audit the caches."""


# One line per command or group, sorted; each module owns its commands' options.
app.command("audit")(audit.audit_command)
app.add_typer(cache.app, name="cache",
              help="Persist, verify, relocate and share the JIT caches (pack, restore, push, ...).")
app.command("coverage")(coverage.coverage_command)
app.command("doctor")(doctor.doctor_command)
app.command("learn")(learn.learn_command)
app.add_typer(patches.app, name="patches",
              help="Report the prefill-graph fixes for the installed SGLang.")
app.add_typer(plan.app, name="plan", help="Check and expand shape plans.")
app.command("prebake", context_settings=_PASS_THROUGH,
            help="Run SGLang once with a plan against empty caches and pack what it compiled: "
                 "prebake --plan P --out A -- <sglang args>")(prebake.prebake_command)
app.command("report")(report.report_command)
app.command("serve", context_settings=_PASS_THROUGH,
            help="Run SGLang with a plan warmed before the port opens: "
                 "serve --plan P -- <sglang args>")(serve.serve_command)
app.command("sidecar", help="Warm a server started by someone else over HTTP and gate "
                            "readiness: /ready /live /metrics /report")(sidecar.sidecar_command)
app.add_typer(traffic.app, name="traffic",
              help="Traffic samples to audit with: synth (synthetic), convert (from request logs).")


def main(argv: list[str] | None = None) -> None:
    """The console script ``sglang-warmup`` and ``python -m warmup``: run the app inside the one
    error boundary; exits with the status the module docstring lists (returns on 0)."""
    try:
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
        rc = app(args=argv, prog_name=PROG, standalone_mode=False)
    except HintedError as exc:
        if settings.DEBUG.get():
            raise
        _say(f"error: {exc.message}")
        if exc.hint:
            _say(f"hint: {exc.hint}")
        return exc.exit_code
    except Exception as exc:
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
    if kind == "help":  # a group called without a command: its help (click's status 2)
        exc.show()
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
