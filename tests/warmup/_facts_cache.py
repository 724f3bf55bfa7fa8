"""Server facts shared by the plan tests (resolved once per session: SGLang imports are slow)."""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from warmup.plan import facts as F

DATA = Path(__file__).parent / "data"


def _resolve(flags) -> F.ServerFacts:
    """``from_launch_flags``, with the root logger left as it was: SGLang's resolution adds a
    handler on the sys.stderr of the moment, a test's capture that is closed after that test
    (a later test's log lines then print "--- Logging error ---" into its own stderr)."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        return F.from_launch_flags(flags)
    finally:
        root.handlers[:] = handlers


@functools.lru_cache(maxsize=None)
def pr44627() -> F.ServerFacts:
    """PR #44627's launch command, resolved by SGLang 0.5.22 with the shipped stand-in config."""
    return _resolve((DATA / "pr44627.flags").read_text())


@functools.lru_cache(maxsize=None)
def resolve(flags: tuple[str, ...]) -> F.ServerFacts:
    """Any launch flags, resolved by SGLang 0.5.22 (cached per flag tuple)."""
    return F.from_launch_flags(list(flags))


#: The temporary directories made here, removed at the end of the session (conftest.py).
CREATED: list[Path] = []


def cleanup() -> None:
    """Remove what this module wrote under the temporary directory."""
    for d in CREATED:
        shutil.rmtree(d, ignore_errors=True)
    CREATED.clear()
    tiny_model_dir.cache_clear()


@functools.lru_cache(maxsize=None)
def tiny_model_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tiny-config-"))
    CREATED.append(d)
    subprocess.run([sys.executable, "scripts/gpu/gen_tiny_model.py", str(d), "--no-weights"],
                   check=True, capture_output=True)
    return d


@functools.lru_cache(maxsize=None)
def small_model() -> F.ServerFacts:
    """A small Qwen3-MoE with SGLang's defaults (no flags but the model path)."""
    return _resolve(["--model-path", str(tiny_model_dir())])
