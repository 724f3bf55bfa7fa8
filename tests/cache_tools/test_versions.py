"""cache_tools.versions: installed versions from package metadata, without importing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cache_tools.versions import dist_version


def test_installed_and_missing_distributions():
    import triton

    assert dist_version("triton") == triton.__version__
    assert dist_version("no-such-distribution-sglang-warmup") is None


def test_asking_imports_nothing():
    code = ("import sys\nfrom cache_tools.versions import dist_version\n"
            "assert dist_version('sglang')\nprint('sglang' in sys.modules, 'triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          check=True)
    assert done.stdout.split() == ["False", "False"]
