"""The recorded cache entries a replay works on: compile-log lines read, grouped by cache key,
and checked for what can be known without Triton (missing fields, nested kernels, target,
Triton version).

A damaged line is a skipped entry with its reason, never an error and never run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from cache_tools import compile_log
from cache_tools.archive import groups
from cache_tools.errors import CacheError
from cache_tools.replay import kernels
from cache_tools.replay.report import (GENERATED, IR_SOURCE, MISSING_FIELDS, NESTED,
                                       NOT_INSTALLED, OTHER_TARGET, PLANNED, PRESENT, SKIPPED,
                                       TRITON_VERSION, KernelResult)

# The fields without which no record rebuilds (besides kernel.module/qualname), and the JSON
# type each must have.
REQUIRED = ("signature", "constexprs", "attrs", "options", "target", "triton_version")
_TYPES = {"signature": dict, "constexprs": list, "attrs": list, "options": dict, "target": dict,
          "triton_version": str}
# Fields a record may lack (or hold null), and the JSON type each must have when present.
_OPTIONAL_TYPES = {"hash": str, "env": dict, "toolchain": dict}
#: a ``--target``: (backend, arch, warp size or None), as :func:`parse_target` reads it
Target = tuple[str, int | str, int | None]


def log_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The compile-log files named by ``paths``: a ``compiles-<pid>.jsonl`` file, a directory
    holding such files, or a state directory above its ``compile_log/``."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CacheError(f"{path}: no such file or directory",
                             hint="pass a compiles-<pid>.jsonl file, the compile_log/ directory "
                                  "or the WARMUP_STATE_DIR above it")
        found = compile_log.find(path)
        if not found:
            raise CacheError(f"{path}: no {compile_log.GLOB} files here or in "
                             f"{compile_log.directory(path)}",
                             hint="record one with WARMUP_ENABLE=1 and WARMUP_STATE_DIR set on "
                                  "the serving machine")
        out.extend(found)
    return out


def read_records(files: Sequence[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record of ``files`` (in file, then line order) and a warning per line skipped
    (the torn last line of a killed process)."""
    warnings: list[str] = []
    try:
        records = compile_log.read(files, warnings=warnings, by_time=False)
    except OSError as exc:
        raise CacheError(f"{exc.filename}: cannot read: {exc.strerror or exc}",
                         hint="check the path and its permissions") from None
    return records, warnings


def is_triton_compile(record: dict[str, Any]) -> bool:
    """A Triton compile line (a miss, or a disk hit that names the same kind of entry)."""
    return record.get("compiler") == "triton" and \
        record.get("event") in (compile_log.MISS, compile_log.HIT)


def parse_target(text: str) -> Target:
    """``cuda:90`` / ``cuda:90:32`` / ``hip:gfx942:64`` -> (backend, arch, warp_size or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise CacheError(f"--target {text!r}: expected BACKEND:ARCH[:WARP_SIZE]",
                         hint="for example --target cuda:90 (H100/H200) or cuda:100 (B200)")
    arch: int | str = int(parts[1]) if parts[1].isdigit() else parts[1]
    warp: int | None = None
    if len(parts) == 3:
        if not parts[2].isdigit():
            raise CacheError(f"--target {text!r}: warp size {parts[2]!r} is not a number",
                             hint="for example --target cuda:90:32")
        warp = int(parts[2])
    return parts[0], arch, warp


def target_str(target: Any) -> str:
    """``cuda:90`` for a recorded target; ``?`` when there is none."""
    if not isinstance(target, dict):
        return "?"
    return f"{target.get('backend')}:{target.get('arch')}"


def _kernel(record: dict[str, Any]) -> dict[str, Any]:
    kernel = record.get("kernel")
    return kernel if isinstance(kernel, dict) else {}


def kernel_label(record: dict[str, Any]) -> str:
    """``module:qualname`` of the recorded kernel (``?`` for what is missing)."""
    kernel = _kernel(record)
    module = kernel.get("module") or "?"
    qualname = kernel.get("qualname") or kernel.get("name") or "?"
    return f"{module}:{qualname}"


def summary(record: dict[str, Any]) -> str:
    """``BLOCK=128, EVEN=True; w4 s3`` for a table cell."""
    parts = []
    constexprs = record.get("constexprs")
    for c in constexprs if isinstance(constexprs, list) else ():
        if not isinstance(c, dict):
            continue
        label = c.get("name") or ".".join(str(p) for p in c.get("path") or ())
        value = c.get("value")
        if isinstance(value, dict) and "constexpr" in value:
            value = value["constexpr"]
        text = json.dumps(value) if not isinstance(value, str) else value
        parts.append(f"{label}={text if len(text) <= 24 else text[:21] + '...'}")
    options = record.get("options")
    options = options if isinstance(options, dict) else {}
    tail = f"w{options.get('num_warps', '?')} s{options.get('num_stages', '?')}"
    return (", ".join(parts) + "; " if parts else "") + tail


def _dedup_key(record: dict[str, Any]) -> str:
    if record.get("hash"):
        return str(record["hash"])
    blob = json.dumps([kernel_label(record)] + [record.get(k) for k in REQUIRED],
                      sort_keys=True, default=str)
    return "unhashed:" + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One distinct recorded cache entry: the compile-log line replayed for it (a miss when
    there is one), how many lines named it and the phases they were recorded in."""

    record: dict[str, Any] = field(compare=False)
    records: int
    phases: tuple[str, ...]

    def result(self, **values: Any) -> KernelResult:
        """This entry's :class:`KernelResult` with ``values`` (status, reason, ...)."""
        rec = self.record
        recorded = rec.get("hash")
        return KernelResult(kernel=kernel_label(rec), name=str(_kernel(rec).get("name") or "?"),
                            specialization=summary(rec),
                            hash=None if recorded is None else str(recorded),
                            target=target_str(rec.get("target")), records=self.records,
                            phases=self.phases, **values)


def distinct_entries(records: Iterable[dict[str, Any]]) -> list[Entry]:
    """Triton compile lines grouped by recorded cache key, first occurrence first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if is_triton_compile(record):
            groups.setdefault(_dedup_key(record), []).append(record)
    entries = []
    for lines in groups.values():
        # Prefer a miss: it carries the jit_cache_hook data too.
        best = next((r for r in lines if r.get("event") == compile_log.MISS), lines[0])
        phases = tuple(sorted({str(r.get("phase")) for r in lines if r.get("phase")}))
        entries.append(Entry(best, len(lines), phases))
    return entries


def precheck(record: dict[str, Any], *, target: Target | None,
             triton_version: str | None) -> tuple[str, str] | None:
    """(reason, detail) when ``record`` cannot be replayed here, found without importing
    Triton or the kernel; None when it is worth a try."""
    kernel = _kernel(record)
    if kernel.get("path") and not kernel.get("module"):
        return IR_SOURCE, (f"compiled from the IR file {kernel['path']}, not from a Python "
                           "kernel: nothing to re-import")
    missing = [f"kernel.{k}" for k in ("module", "qualname") if not kernel.get(k)]
    if not missing and (kernel.get("generated") or kernel.get("source") is not None):
        return GENERATED, (f"{kernel_label(record)} was generated at run time (Inductor): "
                           "replay never runs code from a compile log; the Inductor and Triton "
                           "cache entries travel in a cache archive (cache pack / restore)")
    missing += [k for k in REQUIRED if record.get(k) in (None, "", {})
                and not (k in ("constexprs", "attrs") and record.get(k) == [])]
    t = record.get("target")
    if isinstance(t, dict) and not all(t.get(k) is not None for k in ("backend", "arch",
                                                                     "warp_size")):
        missing.append("target.backend/arch/warp_size")
    if not _SHA256.fullmatch(str(kernel.get("source_sha256") or "")):
        missing.append("kernel.source_sha256 (older compile logs lack it: re-record)")
    missing += [f"constexprs: {v['jit_function']}.source_sha256"
                for v in _jit_function_constants(record)
                if not _SHA256.fullmatch(str(v.get("source_sha256") or ""))]
    if missing:
        return MISSING_FIELDS, f"the record lacks {', '.join(missing)}"
    wrong = [f"kernel.{k}" for k in ("module", "qualname") if not isinstance(kernel[k], str)]
    wrong += [k for k, kind in _TYPES.items() if not isinstance(record[k], kind)]
    wrong += [k for k, kind in _OPTIONAL_TYPES.items()
              if record.get(k) is not None and not isinstance(record[k], kind)]
    if wrong:
        return MISSING_FIELDS, (f"the record's {', '.join(wrong)} "
                                f"{'has' if len(wrong) == 1 else 'have'} the wrong JSON type")
    module, qualname = kernel["module"], kernel["qualname"]
    if "<locals>" in qualname.split("."):
        return NESTED, (f"{qualname} is defined inside a function (a closure or nested "
                        "kernel): it cannot be imported by name")
    if module == "__main__":
        return NOT_INSTALLED, (f"{qualname} was defined in a script run as __main__: move "
                                "it into an importable module")
    if target is not None:
        backend, arch, warp = target
        rec = record["target"]
        if rec.get("backend") != backend or str(rec.get("arch")) != str(arch) or (
                warp is not None and rec.get("warp_size") != warp):
            wanted = f"{backend}:{arch}" + (f":{warp}" if warp is not None else "")
            return OTHER_TARGET, f"recorded for {target_str(rec)}, replaying {wanted} only"
    if triton_version is not None and record["triton_version"] != triton_version:
        return TRITON_VERSION, (f"recorded with Triton {record['triton_version']}, this "
                                f"interpreter has Triton {triton_version}: the cache key "
                                "hashes Triton itself; replay with an interpreter that has "
                                f"Triton {record['triton_version']} (--python)")
    return None


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _jit_function_constants(record: dict[str, Any]) -> list[dict[str, Any]]:
    constexprs = record.get("constexprs")
    out = []
    for constant in constexprs if isinstance(constexprs, list) else ():
        value = constant.get("value") if isinstance(constant, dict) else None
        if isinstance(value, dict) and isinstance(value.get("jit_function"), str):
            out.append(value)
    return out


def dry_run(record: dict[str, Any], cache_dir: Path) -> tuple[str, str, str]:
    """(status, reason, detail) of a dry run for a record that passed :func:`precheck`,
    found without running anything: the installed kernel checked on disk (never imported),
    and the entry looked up in ``cache_dir`` by its recorded key."""
    kernel = record["kernel"]
    try:
        kernels.find(kernel["module"], kernel["qualname"], kernel["source_sha256"])
        for value in _jit_function_constants(record):
            module, _, qualname = value["jit_function"].partition(":")
            kernels.find(module, qualname, value["source_sha256"])
    except kernels.Unresolved as exc:
        return SKIPPED, exc.reason, exc.detail
    recorded = record.get("hash")
    if not (isinstance(recorded, str) and _SHA256.fullmatch(recorded)):
        return PLANNED, "", "no key was recorded: a dry run cannot look the entry up"
    if _present_on_disk(cache_dir, recorded, str(kernel.get("name") or "")):
        return PRESENT, "", ""
    return PLANNED, "", ""


def _present_on_disk(cache_dir: Path, key: str, name: str) -> bool:
    """Triton's own lookup, read only: the entry's group file lists files that all exist."""
    entry = base64.b32encode(bytes.fromhex(key)).decode("ascii").rstrip("=")
    group = cache_dir / entry / f"__grp__{name[:150]}.json"
    try:
        if group.stat().st_size > groups.MAX_GROUP_BYTES:
            return False
        with open(group, "rb") as f:
            children = json.loads(f.read(groups.MAX_GROUP_BYTES)).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(children, dict) or f"{name[:150]}.json" not in children:
        return False
    return all(isinstance(p, str) and os.path.isfile(p) for p in children.values())
