"""Archives of JIT caches: pack, verify, restore and merge, and the format they share.

An archive is a tar (optionally zstd-compressed) whose first member is ``manifest.json``; the
payload members follow in manifest order, one per file, named ``<kind>/<entry>/<file>``, with
normalized metadata (mtime 0, uid/gid 0, mode 0644/0755) so the same cache packs to the same
bytes.  Triton group files are stored with child paths relative to their entry and rewritten to
absolute paths on restore, so a relocated cache still hits.

The modules: ``tarfmt`` (the tar format), ``manifest`` (the archive's ``manifest.json``),
``groups`` (Triton group files in their archive form), ``writer`` and ``reader``,
``packer`` (pack), ``restore`` (plan, then execute) and ``staging`` (the staged, atomic
installation restore and the stores' pulls share), ``read_workers`` (forked readers of a large
archive), ``check`` (verify, merge).  The public names below are imported on first use, so
importing one part (the reader, for ``cache verify``) does not import the others.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module that defines it.
_NAMES = {
    "ArchiveReader": "reader", "CHUNK": "reader", "Limits": "reader", "Member": "reader",
    "ZSTD_MAGIC": "reader", "zstd_structure_problem": "reader",
    "ArchiveWriter": "writer", "Source": "writer", "write_archive": "writer",
    "PackResult": "packer", "pack": "packer", "read_entry": "packer",
    "EntryPlanView": "restore", "PlannedEntry": "restore", "RestorePlan": "restore",
    "RestoreResult": "restore", "plan_entry": "restore", "plan_restore": "restore",
    "restore_roots": "restore",
    "MergeResult": "check", "VerifyReport": "check", "merge": "check", "verify": "check",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
