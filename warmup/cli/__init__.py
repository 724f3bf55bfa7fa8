"""The ``sglang-warmup`` command line: thin commands over library calls, and the one error
boundary that turns a WarmupError or CacheError (both HintedErrors) into ``error: message``
+ ``hint: fix`` and an exit code."""

from __future__ import annotations

import sys

import typer

from cache_tools.errors import HintedError
from warmup import settings

app = typer.Typer(
    name="sglang-warmup",
    help="Warm SGLang's JIT kernels before the server listens; persist and audit the caches.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# --- sub-applications (each module owns its commands) ---------------------------------------
# MOUNTS: one line per sub-app; keep this block sorted.
from warmup.cli.cache import app as _cache_app  # noqa: E402
from warmup.cli import audit as _audit_cli  # noqa: E402
from warmup.observe.doctor import doctor_command as _doctor_command  # noqa: E402
from warmup.cli.patches import app as _patches_app  # noqa: E402
from warmup.cli.plan import app as _plan_app  # noqa: E402
from warmup.cli.serve import serve as _serve_command  # noqa: E402
from warmup.cli.sidecar import prebake_command as _prebake_command  # noqa: E402
from warmup.cli.sidecar import sidecar_command as _sidecar_command  # noqa: E402

app.command("audit")(_audit_cli.audit_command)
app.command("coverage")(_audit_cli.coverage_command)
app.command("learn")(_audit_cli.learn_command)
app.add_typer(_audit_cli.traffic_app, name="traffic",
              help="Traffic samples to audit with: synth (synthetic), convert (from request logs).")
app.command("doctor")(_doctor_command)
app.command("sidecar", help="Warm a server started by someone else over HTTP and gate "
                            "readiness: /ready /live /metrics /report")(_sidecar_command)

app.add_typer(_cache_app, name="cache",
              help="Persist, verify, relocate and share the JIT caches (pack, restore, push, ...).")

app.add_typer(_patches_app, name="patches",
              help="Report the prefill-graph fixes for the installed SGLang.")
app.add_typer(_plan_app, name="plan", help="Check and expand shape plans.")
app.command("prebake", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
            help="Run SGLang once with a plan against empty caches and pack what it compiled: "
                 "prebake --plan P --out A -- <sglang args>")(_prebake_command)
app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
            help="Run SGLang with a plan warmed before the port opens: serve --plan P -- <sglang args>"
            )(_serve_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and of ``python -m warmup``."""
    try:
        rc = app(args=argv, prog_name="sglang-warmup", standalone_mode=False)
        # standalone_mode=False returns typer.Exit's code instead of exiting with it.
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except HintedError as exc:
        if settings.DEBUG.get():
            raise
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            print("aborted", file=sys.stderr)
            sys.exit(130)
        raise
