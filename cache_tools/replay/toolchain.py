"""The toolchain a replay compiles with, read once per run: Triton's version and directory, and
the ``--version`` output of every ptxas a record may need.

A Triton cache key hashes the backend, which for CUDA is the ptxas ``--version`` output; the
recording process may have used another ptxas than Triton's own (Inductor's compile workers use
the one shipped in torch).  :meth:`Toolchain.choose_ptxas` finds, for one record, the ptxas here
that prints the recorded version.  The versions are read in the replaying process before any
worker starts and travel with the toolchain, so no worker runs ``ptxas --version`` again, and
:func:`ptxas_version_scope` makes Triton's own ``get_ptxas_version`` answer from the same table
during a compile.  Standard library only (Triton is imported only inside the scope).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import site
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from cache_tools.versions import dist_version


@dataclass
class Toolchain:
    """``triton_version``: the Triton this interpreter imports (None: none); ``triton_dir``:
    its package directory (its bundled ptxas lives below); ``ptxas_versions``: ptxas path ->
    its ``--version`` output as Triton decodes it (None: it does not run)."""

    triton_version: str | None
    triton_dir: str | None
    ptxas_versions: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def here(cls) -> "Toolchain":
        """This interpreter's toolchain, found without importing Triton."""
        try:
            spec = importlib.util.find_spec("triton")
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        return cls(triton_version=dist_version("triton"),
                   triton_dir=locations[0] if locations else None)

    def ptxas_version(self, path: str) -> str | None:
        """``ptxas --version`` as Triton's ``get_ptxas_version`` reads it (stdout, decoded);
        run once per path and toolchain."""
        if path not in self.ptxas_versions:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, timeout=60,
                                     check=True).stdout.decode("utf-8")
            except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
                out = None
            self.ptxas_versions[path] = out
        return self.ptxas_versions[path]

    def choose_ptxas(self, record: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
        """(variable, path, problem): the ptxas whose ``--version`` equals the recorded one.

        Tried in order: the variable already set here, the recorded path, the recorded path's
        part below ``site-packages/`` under this interpreter's site-packages, Triton's bundled
        ptxas.  (None, None, None) when the record names no ptxas (older compile logs, other
        backends)."""
        toolchain = _object(record, "toolchain")
        wanted, recorded = toolchain.get("ptxas_version"), toolchain.get("ptxas")
        target = _object(record, "target")
        if not isinstance(wanted, str) or not wanted or target.get("backend") != "cuda":
            return None, None, None
        try:
            blackwell = int(target.get("arch", -1)) >= 100       # absent: not Blackwell
        except (TypeError, ValueError):
            blackwell = False
        variable = "TRITON_PTXAS_BLACKWELL_PATH" if blackwell else "TRITON_PTXAS_PATH"
        binary = "ptxas-blackwell" if blackwell else "ptxas"
        candidates = [os.environ.get(variable)]
        if isinstance(recorded, str):
            candidates.append(recorded)
            if "/site-packages/" in recorded:
                below = recorded.split("/site-packages/", 1)[1]
                roots = list(getattr(site, "getsitepackages", lambda: [])())
                roots += [p for p in sys.path if p.endswith("site-packages")]
                candidates += [os.path.join(root, below) for root in roots]
        if self.triton_dir is not None:
            candidates.append(os.path.join(self.triton_dir, "backends", "nvidia", "bin", binary))
        tried = []
        for path in dict.fromkeys(c for c in candidates if c):
            if not os.path.isfile(path):
                continue
            tried.append(path)
            if self.ptxas_version(path) == wanted:
                return variable, path, None
        here = ", ".join(f"{p} ({_release(self.ptxas_version(p))})" for p in tried) or "none"
        return variable, None, (f"recorded with the ptxas at {recorded} ({_release(wanted)}); "
                                f"none here reports that version (tried: {here}): set "
                                f"{variable} to a ptxas of that release")

    def read(self, records: Iterable[dict[str, Any]]) -> None:
        """Read, now, the version of every ptxas that choosing one for ``records`` needs."""
        for record in records:
            self.choose_ptxas(record)


def _object(record: dict[str, Any], name: str) -> dict[str, Any]:
    """The JSON object ``record[name]``; empty when it is absent or not an object."""
    value = record.get(name)
    return value if isinstance(value, dict) else {}


def _release(version: str | None) -> str:
    match = re.search(r"release (\d+\.\d+), (V[\d.]+)", version or "")
    return f"CUDA {match.group(1)} ({match.group(2)})" if match else "an unknown version"


@contextlib.contextmanager
def ptxas_version_scope(toolchain: Toolchain) -> Iterator[None]:
    """Make Triton's ``get_ptxas_version(arch)`` answer from ``toolchain``, for the ptxas that
    ``TRITON_PTXAS_PATH`` (or the Blackwell variable) names right now.

    Triton caches that version per architecture, not per ptxas: records compiled with
    different ptxas binaries must each get their own, and a subprocess per record would read
    what the toolchain already knows.  Triton's own function (and its cache) is put back on
    exit.  Outside CUDA backends, or without Triton's NVIDIA backend, this does nothing."""
    try:
        from triton.backends.nvidia import compiler as nvidia
        from triton import knobs
    except (ImportError, AttributeError):
        yield
        return
    original = nvidia.get_ptxas_version
    uncached = getattr(original, "__wrapped__", original)

    def get_ptxas_version(arch: int = 80) -> str:
        mock: str | None = getattr(knobs.nvidia, "mock_ptx_version", None)
        if mock is not None:
            return mock
        version = toolchain.ptxas_version(nvidia.get_ptxas(arch).path)
        # A ptxas that does not run: Triton's own call raises what it raises.
        return version if version is not None else uncached(arch)

    nvidia.get_ptxas_version = get_ptxas_version
    try:
        yield
    finally:
        nvidia.get_ptxas_version = original
