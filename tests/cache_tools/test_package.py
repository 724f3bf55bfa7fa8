"""cache_tools/__init__.py: the package imports with the standard library only (it runs in slim
image stages); heavy packages are imported lazily by the functions that need them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARY = ["cache_tools", "cache_tools.errors", "cache_tools.locations",
           "cache_tools.fingerprint", "cache_tools.scan", "cache_tools.archive.manifest",
           "cache_tools.progress", "cache_tools.archive.staging", "cache_tools.archive.tarfmt",
           "cache_tools.archive.groups", "cache_tools.archive.reader", "cache_tools.archive.writer",
           "cache_tools.archive.restore", "cache_tools.archive", "cache_tools.prune",
           "cache_tools.stores.redis", "cache_tools.render", "cache_tools.versions",
           "cache_tools.compile_log"]


def test_library_modules_import_only_the_standard_library():
    code = ("import importlib, json, sys\n"
            f"for m in {LIBRARY!r}: importlib.import_module(m)\n"
            "foreign = sorted({n.split('.')[0] for n in sys.modules} - set(sys.stdlib_module_names)"
            " - {'cache_tools', '__main__'})\n"
            "print(json.dumps(foreign))\n")
    # -S: no site packages at all, so anything non-stdlib would fail to import.
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
