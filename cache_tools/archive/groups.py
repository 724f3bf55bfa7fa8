"""Triton group files in their archive form: made relative on pack, checked on read, made
absolute again on restore.

Triton's ``__grp__<kernel>.json`` lists the entry's files by absolute path
(``{"child_paths": {name: path}}``) and ``FileCacheManager.get_group`` only hits when every path
exists.  In an archive (and a shared-store blob) each path is the child's own name, so archives
from different cache paths are identical; a restore writes the absolute paths of the new place.
The check below is the one rule every reader applies (verify, restore and pull alike).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Collection, Iterable

from cache_tools.errors import ArchiveError

#: a group file above this size is refused before it is read (real ones are under 4 KiB)
MAX_GROUP_BYTES = 1 << 20


def is_group(path: str) -> bool:
    """Whether a file of a Triton entry is a group file (by name)."""
    return path.startswith("__grp__") and path.endswith(".json")


def archive_form(children: Iterable[str]) -> bytes:
    """The group file an archive holds for a group that lists ``children`` (each child's
    path is its own name; scan has checked each is a file of the entry)."""
    return json.dumps({"child_paths": {c: c for c in children}}).encode()


def archive_size(children: Iterable[str]) -> int:
    """``len(archive_form(children))``, counted without building it where every name is
    printable ASCII without quotes or backslashes (JSON spells those as they are)."""
    names = list(dict.fromkeys(children))         # a name once, as the dict holds it
    if not all(c.isascii() and c.isprintable() and '"' not in c and "\\" not in c
               for c in names):
        return len(archive_form(names))
    # {"child_paths": {"a": "a", "b": "b"}}: 17 + 2 per name (': ' and ', ') ... + 2
    return 17 + sum(2 * len(c) + 6 for c in names) + 2 * max(len(names) - 1, 0) + 2


def check(data: bytes | memoryview, group: str, files: Collection[str], entry: str
          ) -> list[str]:
    """The children of an archive-form group file of ``entry`` whose files are ``files``;
    an ArchiveError when it is unreadable or names anything but a file of the same entry."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
        children = doc["child_paths"] if isinstance(doc, dict) else None
    except (UnicodeDecodeError, ValueError, KeyError, RecursionError):
        children = None
    if not isinstance(children, dict):
        raise ArchiveError(f"entry {entry}: unreadable group file {group}", hint=_HINT)
    for child, rel in children.items():
        if not isinstance(rel, str) or rel != child or "/" in child or \
                child in ("", ".", ".."):
            raise ArchiveError(f"entry {entry}: group file {group} names {child!r} outside its "
                               "entry", hint=_HINT)
        if child not in files:
            raise ArchiveError(f"entry {entry}: group file {group} references missing file "
                               f"{child}", hint=_HINT)
    return list(children)


def relocate(children: list[str], target: Path) -> bytes:
    """The group file Triton expects at ``target``: every child by its absolute path there."""
    base = str(target)
    return json.dumps({"child_paths": {c: f"{base}/{c}" for c in children}}).encode()


_HINT = "the archive holds an incomplete or hostile Triton entry; nothing was written"
