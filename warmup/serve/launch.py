"""``sglang-warmup serve``: run SGLang's own launcher with a plan registered in ``--warmups``,
so the plan runs before the port opens, in every configuration SGLang supports (TP > 1
included: the schedulers get our hooks through the ``sglang.srt.plugins`` entry point).

The launcher only prepares an environment and an argument list (:func:`plan_launch`, pure),
creates the state directory (:func:`prepare_state_dir`), then ``exec``s
``python -m sglang.launch_server``: signals, exit codes and logs are SGLang's own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from cache_tools import compile_log
from warmup import settings
from warmup.errors import WarmupError
from warmup.observe import phase
from warmup.plan import loader, step_record
from warmup.plan.lets import with_lets
from warmup.serve.hook import ensure_listed


@dataclass(frozen=True)
class Launch:
    """What ``serve`` executes: the command, its environment, the ``--warmups`` entry and the
    state directory (created by :func:`prepare_state_dir`, not before)."""

    argv: list[str]
    env: dict[str, str]
    name: str
    state_dir: str
    #: True when the Prometheus multiprocess directory is ours (inside the state directory), so
    #: stale files there may be removed; False when the operator's own.
    own_multiprocess_dir: bool = True


def plan_launch(plan_path: str, sglang_args: list[str], *, report: str | None = None,
                lenient: bool = False, state_dir: str | None = None, name: str | None = None,
                second_pass: bool = False, skip_families: tuple[str, ...] = (),
                freeze_gc: bool = True, environ: dict[str, str] | None = None,
                python: str = sys.executable, lets: tuple[tuple[str, str], ...] = (),
                steps: str | None = None) -> Launch:
    """Validate the plan and the install and compute the command and environment.  Writes
    nothing (``serve --dry-run`` prints exactly this).  ``lets``: overrides of the plan's
    ``let`` values (``--let NAME=EXPR``), checked here; ``steps``: a steps record (read and
    checked here; whether it matches the launch is known once the server runs)."""
    plan = loader.load(plan_path)  # a bad plan fails here, before any GPU is touched
    with_lets(plan, lets, source="--let")
    if steps:
        step_record.read(steps)
    entry = name or plan.name
    if not sglang_args:
        raise WarmupError("no SGLang launch arguments after `--`",
                          hint="sglang-warmup serve --plan PLAN -- --model-path MODEL [sglang flags]")
    ep = settings.plugin_entry_point()
    if ep is None:
        raise WarmupError("the sglang-warmup plugin entry point is not installed, so SGLang's "
                          "worker processes would not load it",
                          hint="pip install sglang-warmup (not just put it on PYTHONPATH)")
    env = dict(os.environ if environ is None else environ)
    allowed = env.get("SGLANG_PLUGINS", "")
    if allowed and ep.name not in [x.strip() for x in allowed.split(",")]:
        raise WarmupError(f"SGLANG_PLUGINS={allowed!r} does not list '{ep.name}'",
                          hint=f"add it: SGLANG_PLUGINS={allowed},{ep.name}")
    sdir = Path(state_dir or env.get(settings.STATE_DIR.name) or
                Path(tempfile.gettempdir()) / f"sglang-warmup-{uuid.uuid4().hex[:12]}").resolve()
    # Compile events from every SGLang process aggregate in one prometheus-client
    # multiprocess directory (SGLang's --enable-metrics uses the same variable).
    theirs = env.get(settings.PROMETHEUS_MULTIPROC_DIR.name)
    env.update(settings.activation_env(
        state_dir=str(sdir), multiprocess_dir=theirs or str(sdir / "prometheus"),
        plan=str(Path(plan.file).resolve()), name=entry, lenient=lenient,
        second_pass=second_pass, report=str(Path(report).resolve()) if report else None,
        skip_families=skip_families, freeze_gc=freeze_gc, lets=lets,
        steps=str(Path(steps).resolve()) if steps else None))
    args = list(sglang_args)
    ensure_listed(entry, args)
    return Launch(argv=[python, "-m", "sglang.launch_server", *args], env=env, name=entry,
                  state_dir=str(sdir), own_multiprocess_dir=not theirs)


def prepare_state_dir(launch: Launch) -> None:
    """Create the state directory and start it over: a reused one would otherwise count old
    compile records and (our own) metric files as this run's, and keep its old phase."""
    sdir = Path(launch.state_dir)
    mp = Path(launch.env[settings.PROMETHEUS_MULTIPROC_DIR.name])
    sdir.mkdir(parents=True, exist_ok=True)
    mp.mkdir(parents=True, exist_ok=True)
    for old in (compile_log.DIR, compile_log.LEGACY_DIR):
        shutil.rmtree(sdir / old, ignore_errors=True)
    if launch.own_multiprocess_dir:
        for stale in mp.glob("*.db"):
            stale.unlink(missing_ok=True)
    phase.set_phase("init", state_dir=str(sdir))


def exec_launch(launch: Launch) -> None:  # pragma: no cover - replaces the process
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(launch.argv[0], launch.argv, launch.env)
