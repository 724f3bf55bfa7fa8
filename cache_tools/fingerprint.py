"""The toolchain fingerprint a cache was built with, and the one rule that says whether a cache
from one toolchain may be used by another.

Versions are read from package metadata and files (``versions.dist_version``, ``torch/version.py``)
without importing torch, Triton or SGLang; the GPU architecture and driver come from
``nvidia-smi`` when a GPU is visible and are simply absent otherwise.

The rule (``compare``): a *software* difference (Python major.minor, machine, torch, Triton,
CUDA, SGLang, FlashInfer) refuses unless forced, because compiled artifacts embed those
versions and a mismatch is at best dead weight and at worst a wrong binary.  A field that is
unknown on either side cannot be checked and is only noted.  A *hardware* difference (GPU
architecture, driver) is a note: Triton, the SGLang JIT and FlashInfer key their entries by the
compile target, so entries for another architecture are simply not hit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cache_tools.errors import CacheError
from cache_tools.versions import dist_version

#: software fields, in display order, and the distribution each version is read from
SOFTWARE_FIELDS: tuple[str, ...] = ("python", "machine", "torch", "triton", "cuda", "sglang",
                                    "flashinfer")
HARDWARE_FIELDS: tuple[str, ...] = ("gpu_arch", "gpu_name", "driver")
_DISTRIBUTIONS = {"torch": ("torch",), "triton": ("triton",), "sglang": ("sglang",),
                  "flashinfer": ("flashinfer-python", "flashinfer")}


@dataclass(frozen=True)
class Fingerprint:
    """What a cache was compiled with.  ``software`` and ``hardware`` map field -> value;
    a field whose value is unknown (package not installed, no GPU) is absent."""

    software: tuple[tuple[str, str], ...]
    hardware: tuple[tuple[str, str], ...] = ()

    @property
    def software_map(self) -> dict[str, str]:
        return dict(self.software)

    @property
    def hardware_map(self) -> dict[str, str]:
        return dict(self.hardware)

    @property
    def hash(self) -> str:
        """sha256 of the canonical JSON of the software fields: the toolchain identity used
        for compatibility and as the shared-store namespace."""
        return _sha(self.software_map)

    @property
    def full_hash(self) -> str:
        """sha256 of the canonical JSON of every field, hardware included."""
        return _sha({"software": self.software_map, "hardware": self.hardware_map})

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, "full_hash": self.full_hash,
                "software": self.software_map, "hardware": self.hardware_map}

    @classmethod
    def from_dict(cls, data: Any, where: str = "fingerprint") -> "Fingerprint":
        """Parse ``to_dict()`` output; a CacheError naming ``where`` on bad input."""
        if not isinstance(data, Mapping):
            raise CacheError(f"{where}: expected an object", hint="the archive is malformed")
        parts = []
        for section in ("software", "hardware"):
            value = data.get(section, {})
            if not isinstance(value, Mapping) or not all(
                    _text(k) and _text(v) for k, v in value.items()):
                raise CacheError(f"{where}.{section}: expected an object of strings",
                                 hint="the archive is malformed")
            parts.append(tuple(sorted(value.items())))
        fp = cls(parts[0], parts[1])
        if "hash" in data and data["hash"] != fp.hash:
            raise CacheError(f"{where}.hash does not match its fields",
                             hint="the manifest was edited or corrupted")
        return fp


def _text(value: Any) -> bool:
    """A string that UTF-8 spells: JSON's ``\\ud800`` escapes read as lone surrogates, which the
    canonical spelling the hash is taken over cannot encode."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _sha(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """The one JSON spelling that is hashed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def current(*, probe_gpu: bool = True) -> Fingerprint:
    """This machine's fingerprint."""
    soft: dict[str, str] = {
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }
    for name, dists in _DISTRIBUTIONS.items():
        version = _version(dists)
        if version:
            soft[name] = version
    cuda = _torch_cuda()
    if cuda:
        soft["cuda"] = cuda
    hard = _gpu() if probe_gpu else {}
    return Fingerprint(tuple(sorted(soft.items())), tuple(sorted(hard.items())))


def _version(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        version = dist_version(dist)
        if version is not None:
            return version
    return None


def _torch_cuda() -> str | None:
    """torch.version.cuda read from torch/version.py (importing torch takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.M)
    if not m:
        return None
    return m.group(1) or m.group(2) or None


def _gpu() -> dict[str, str]:
    """GPU architecture(s), name(s) and driver from nvidia-smi; empty without a GPU."""
    out: dict[str, str] = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run(
                [smi, "--query-gpu=compute_cap,name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            proc = None
        if proc is not None and proc.returncode == 0:
            rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines()
                    if line.count(",") >= 2]
            if rows:
                out["gpu_arch"] = ",".join(sorted({"sm" + r[0].replace(".", "") for r in rows}))
                out["gpu_name"] = ",".join(sorted({r[1] for r in rows}))
                out["driver"] = rows[0][2]
    if "driver" not in out:
        try:
            text = Path("/proc/driver/nvidia/version").read_text()
        except OSError:
            text = ""
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
        if m:
            out["driver"] = m.group(1)
    return out


@dataclass(frozen=True)
class Compatibility:
    """The verdict of ``compare``: ``ok`` unless a software field differs."""

    mismatches: tuple[tuple[str, str, str], ...]   # (field, theirs, ours)
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def describe(self) -> str:
        return "; ".join(f"{f} {a} (cache) vs {b} (here)" for f, a, b in self.mismatches)


def compare(theirs: Fingerprint, ours: Fingerprint) -> Compatibility:
    """Apply the compatibility rule to a cache made with ``theirs`` used on ``ours``."""
    a, b = theirs.software_map, ours.software_map
    mismatches = []
    notes = []
    for name in SOFTWARE_FIELDS:
        if name in a and name in b:
            if a[name] != b[name]:
                mismatches.append((name, a[name], b[name]))
        elif name in a:
            notes.append(f"{name} {a[name]} cannot be checked here (not installed)")
        elif name in b:
            notes.append(f"the cache does not record {name} (here: {b[name]})")
    ha, hb = theirs.hardware_map, ours.hardware_map
    for name in HARDWARE_FIELDS:
        if ha.get(name) != hb.get(name) and (name in ha or name in hb):
            notes.append(f"{name} differs: {ha.get(name, 'none')} (cache) vs "
                         f"{hb.get(name, 'none')} (here); entries for another target are "
                         "kept but not hit")
    return Compatibility(tuple(mismatches), tuple(notes))


def require_compatible(theirs: Fingerprint, ours: Fingerprint, *, force: bool, what: str
                       ) -> Compatibility:
    """``compare`` and raise IncompatibleError on a software mismatch unless ``force``."""
    from cache_tools.errors import IncompatibleError

    verdict = compare(theirs, ours)
    if not verdict.ok and not force:
        raise IncompatibleError(
            f"{what} was built by another toolchain: {verdict.describe()}",
            hint="rebuild the cache with this toolchain, or pass --force to use it anyway "
                 "(mismatched entries are dead weight at best)")
    return verdict
