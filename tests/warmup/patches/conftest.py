"""Fixtures for the prefill-graph fix tests: SGLang's real modules (imported once per
session: the DeepSeek-V4 backend takes about 7 s on a CPU) and a clean patch state around
every test, so no patch leaks into another test."""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import pytest
from _interpreter import python

from warmup.patches import registry

ROOT = Path(__file__).resolve().parents[3]
SGLANG_0523 = ROOT / ".deps" / "sglang-0.5.23"
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
SPARSE = "sglang.srt.layers.attention.dsv4.sparse_prefill_utils"
HOOK = "sglang.srt.arg_groups.deepseek_v4_hook"


@pytest.fixture(scope="session")
def backend():
    return importlib.import_module(BACKEND)


@pytest.fixture(scope="session")
def sparse_utils():
    return importlib.import_module(SPARSE)


@pytest.fixture(scope="session")
def hook():
    return importlib.import_module(HOOK)


@pytest.fixture(autouse=True)
def clean_patches(monkeypatch):
    """No WARMUP_FIX_* from the caller's shell, and no patch before or after the test."""
    for number in registry.BY_NUMBER:
        monkeypatch.delenv(f"WARMUP_FIX_{number}", raising=False)
    registry.revert()
    yield
    registry.revert()


def run_with_sglang_0523(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (``_interpreter``) with SGLang 0.5.23 first on the
    path."""
    if not (SGLANG_0523 / "sglang").is_dir():
        pytest.fail(f"{SGLANG_0523} is missing: run scripts/setup.sh")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SGLANG_0523), str(ROOT)])
    for number in registry.BY_NUMBER:
        env.pop(f"WARMUP_FIX_{number}", None)
    return subprocess.run([python(), "-c", code], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
