"""Server facts shared by the plan tests (resolved once per session: SGLang imports are slow)."""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

from warmup.plan import facts as F

DATA = Path(__file__).parent / "data"


@functools.lru_cache(maxsize=None)
def pr44627() -> F.ServerFacts:
    """PR #44627's launch command, resolved by SGLang 0.5.22 with the shipped stand-in config."""
    return F.from_launch_flags((DATA / "pr44627.flags").read_text())


@functools.lru_cache(maxsize=None)
def resolve(flags: tuple[str, ...]) -> F.ServerFacts:
    """Any launch flags, resolved by SGLang 0.5.22 (cached per flag tuple)."""
    return F.from_launch_flags(list(flags))


@functools.lru_cache(maxsize=None)
def tiny_model_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tiny-config-"))
    subprocess.run([sys.executable, "scripts/gpu/gen_tiny_model.py", str(d), "--no-weights"],
                   check=True, capture_output=True)
    return d


@functools.lru_cache(maxsize=None)
def small_model() -> F.ServerFacts:
    """A small Qwen3-MoE with SGLang's defaults (no flags but the model path)."""
    return F.from_launch_flags(["--model-path", str(tiny_model_dir())])
