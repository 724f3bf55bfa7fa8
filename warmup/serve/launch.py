"""``sglang-warmup serve``: run SGLang's own launcher with a plan registered in ``--warmups``,
so the plan runs before the port opens, in every configuration SGLang supports (TP > 1
included: the schedulers get our hooks through the ``sglang.srt.plugins`` entry point).

The launcher only prepares an environment and an argument list, then ``exec``s
``python -m sglang.launch_server``: signals, exit codes and logs are SGLang's own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from cache_tools import compile_log
from warmup.plan import loader
from warmup.errors import WarmupError
from warmup.serve.hook import ensure_listed

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_VALUE = "warmup.serve.plugin:register"


@dataclass(frozen=True)
class Launch:
    """What ``serve`` executes."""

    argv: list[str]
    env: dict[str, str]
    name: str
    state_dir: str


def plugin_entry_point() -> metadata.EntryPoint | None:
    """Our entry point in group ``sglang.srt.plugins``, if the distribution is installed."""
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.value == ENTRY_POINT_VALUE:
            return ep
    return None


def build(plan_path: str, sglang_args: list[str], *, report: str | None = None,
          lenient: bool = False, state_dir: str | None = None, name: str | None = None,
          second_pass: bool = False,
          environ: dict[str, str] | None = None, python: str = sys.executable) -> Launch:
    """Validate the plan and the install, and compute the command and environment."""
    plan = loader.load(plan_path)  # a bad plan fails here, before any GPU is touched
    entry = name or plan.name
    if not sglang_args:
        raise WarmupError("no SGLang launch arguments after `--`",
                          hint="sglang-warmup serve --plan PLAN -- --model-path MODEL [sglang flags]")
    ep = plugin_entry_point()
    if ep is None:
        raise WarmupError("the sglang-warmup plugin entry point is not installed, so SGLang's "
                          "worker processes would not load it",
                          hint="pip install sglang-warmup (not just put it on PYTHONPATH)")
    env = dict(os.environ if environ is None else environ)
    allowed = env.get("SGLANG_PLUGINS", "")
    if allowed and ep.name not in [x.strip() for x in allowed.split(",")]:
        raise WarmupError(f"SGLANG_PLUGINS={allowed!r} does not list '{ep.name}'",
                          hint=f"add it: SGLANG_PLUGINS={allowed},{ep.name}")
    sdir = state_dir or env.get("WARMUP_STATE_DIR") or tempfile.mkdtemp(prefix="sglang-warmup-")
    Path(sdir).mkdir(parents=True, exist_ok=True)
    env.update({
        "WARMUP_ENABLE": "1",
        "WARMUP_PLAN": str(Path(plan_path).resolve()),
        "WARMUP_NAME": entry,
        "WARMUP_STATE_DIR": str(Path(sdir).resolve()),
        "WARMUP_LENIENT": "1" if lenient else "0",
    })
    if second_pass:
        env["WARMUP_SECOND_PASS"] = "1"
    if report:
        env["WARMUP_REPORT"] = str(Path(report).resolve())
    # Compile events from every SGLang process aggregate in one prometheus-client
    # multiprocess directory (SGLang's --enable-metrics uses the same variable).
    own_mp = not env.get("PROMETHEUS_MULTIPROC_DIR")
    mp = env.get("PROMETHEUS_MULTIPROC_DIR") or str(Path(sdir).resolve() / "prometheus")
    Path(mp).mkdir(parents=True, exist_ok=True)
    # A reused state directory starts over: old compile records and (our own) metric files
    # would otherwise be counted as this run's.
    for old in (compile_log.DIR, compile_log.LEGACY_DIR):
        shutil.rmtree(Path(sdir) / old, ignore_errors=True)
    if own_mp:
        for stale in Path(mp).glob("*.db"):
            stale.unlink(missing_ok=True)
    env["PROMETHEUS_MULTIPROC_DIR"] = mp
    args = list(sglang_args)
    ensure_listed(entry, args)
    from warmup.observe import phase

    phase.set_phase("init", state_dir=env["WARMUP_STATE_DIR"])  # a reused state dir starts over
    return Launch(argv=[python, "-m", "sglang.launch_server", *args], env=env, name=entry,
                  state_dir=env["WARMUP_STATE_DIR"])


def exec_launch(launch: Launch) -> None:  # pragma: no cover - replaces the process
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(launch.argv[0], launch.argv, launch.env)
