"""``sglang-warmup sidecar``: the command over :mod:`warmup.sidecar.machine`; :func:`main` is
SGLang's managed-sidecar entry (``--sidecar warmup.cli.sidecar``)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from warmup import settings
from warmup.cli import options, output
from warmup.sidecar.config import DEFAULT_HOST, DEFAULT_PORT


def sidecar_command(
    plan: Path = typer.Option(..., "--plan", help="the plan to warm"),
    url: str = typer.Option(..., "--url", help="the SGLang server, e.g. http://127.0.0.1:30000"),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535,
                             help="port of /ready /live /metrics /report (0: any free one)"),
    host: str = typer.Option(DEFAULT_HOST, "--host", "--bind",
                             help="address to listen on (0.0.0.0: every interface)"),
    deadline: float = typer.Option(1800.0, "--deadline", callback=options.finite,
                                   help="seconds to wait for the server's /health_generate"),
    second_pass: bool = typer.Option(False, "--second-pass",
                                     help="ready only once a second pass of the plan compiles "
                                          "nothing (needs a state directory shared with SGLang)"),
    freeze_gc: Optional[bool] = typer.Option(None, "--freeze-gc/--no-freeze-gc",
                                             help="before /ready turns 200, freeze SGLang's "
                                                  "Python GC (POST /freeze_gc; default: "
                                                  "WARMUP_FREEZE_GC)"),
    exit_on_failure: bool = typer.Option(False, "--exit-on-failure/--stay",
                                         help="after a failed warm-up: exit with status 1, or "
                                              "stay with /ready at 503 (default)"),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir",
                                             help="the WARMUP_STATE_DIR SGLang writes to "
                                                  "(default: WARMUP_STATE_DIR)"),
    startup_budget: Optional[float] = typer.Option(None, "--startup-budget",
                                                   callback=options.finite,
                                                   help="seconds the orchestrator allows for the "
                                                        "start; the projected finish is logged "
                                                        "against it"),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout",
                                                    callback=options.finite,
                                                    help="seconds one warm-up request may take "
                                                         "(default: WARMUP_REQUEST_TIMEOUT_S)"),
    flush_timeout: Optional[float] = typer.Option(None, "--flush-timeout",
                                                  callback=options.finite,
                                                  help="seconds SGLang may wait for idle before "
                                                       "the flush (default: WARMUP_FLUSH_TIMEOUT_S)"),
    watch_interval: float = typer.Option(10.0, "--watch-interval", callback=options.finite,
                                         help="seconds between /health probes once ready "
                                              "(0: do not watch)"),
) -> None:
    """Warm a server started by someone else over HTTP; serve /ready /live /metrics /report."""
    from warmup.sidecar.config import SidecarConfig
    from warmup.sidecar.machine import Sidecar

    output.configure_logging()
    sdir = str(state_dir) if state_dir else (settings.STATE_DIR.get() or None)
    mp_dir = settings.PROMETHEUS_MULTIPROC_DIR.get() or (
        str(Path(sdir) / "prometheus") if sdir else None)
    config = SidecarConfig(
        plan=str(plan), url=url, port=port, host=host, deadline_s=deadline,
        second_pass=second_pass, exit_on_failure=exit_on_failure, state_dir=sdir, mp_dir=mp_dir,
        freeze_gc=settings.FREEZE_GC.get() if freeze_gc is None else freeze_gc,
        startup_budget_s=startup_budget,
        request_timeout_s=request_timeout if request_timeout is not None
        else settings.REQUEST_TIMEOUT_S.get(),
        flush_timeout_s=flush_timeout if flush_timeout is not None
        else settings.FLUSH_TIMEOUT_S.get(),
        watch_interval_s=watch_interval, seed=settings.SEED.get(),
        api_key=settings.API_KEY.get() or None)
    sidecar = Sidecar(config)
    code = sidecar.run()
    if sidecar.busy:
        # A request is still in flight (bounded by --request-timeout); do not wait for it.
        logging.getLogger("sglang_warmup.sidecar").info(
            "sglang-warmup sidecar: a request was still in flight; exiting without it")
        if code:
            status = sidecar.status()
            print(f"error: the warm-up failed and --exit-on-failure is set: "
                  f"{status['reason'] or 'see the log'}", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        from warmup.errors import SidecarError

        status = sidecar.status()
        raise SidecarError(f"the warm-up failed and --exit-on-failure is set: "
                           f"{status['reason'] or 'see the log'}",
                           hint=status["hint"] or "see the log above; --stay keeps the sidecar "
                                                  "up with /ready at 503 instead")


def main(argv: list[str] | None = None) -> None:
    """SGLang's managed-sidecar entry: ``--sidecar warmup.cli.sidecar --sidecar-args
    '["--plan", "P", "--url", "http://127.0.0.1:30000", ...]'`` (SGLang imports this module and
    calls ``main(argv)``).  The same options as ``sglang-warmup sidecar``; exits with its
    status (0 after SIGTERM)."""
    from warmup.cli import main as cli_main

    cli_main(["sidecar", *(sys.argv[1:] if argv is None else list(argv))])
