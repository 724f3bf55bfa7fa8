"""Installed distribution versions, read from package metadata without importing the package.

``import sglang`` redirects cache variables and imports torch, and importing Triton loads
``libtriton``: asking the metadata costs neither.  Standard library only.

The common layout (a ``<name>-<version>.dist-info`` directory in a directory of ``sys.path``) is
read here directly, the way ``importlib.metadata`` finds it: importing ``importlib.metadata``
(its e-mail parser, ``zipfile``) took 20-30 ms of every command's start, a restore in an init
container included.  Anything else (an archive on ``sys.path``, an ``.egg-info``, two
candidates in one directory, another finder of distributions) is asked of
``importlib.metadata`` itself; a test holds the two to the same answer for every installed
distribution.
"""

from __future__ import annotations

import enum
import os
import re
import sys

_SEPARATORS = re.compile(r"[-_.]+")


class _Unsure(enum.Enum):
    """The fast lookup cannot say: ask importlib.metadata."""

    UNSURE = enum.auto()


_UNSURE = _Unsure.UNSURE

#: a directory of sys.path -> (its mtime, its metadata directories by normalized name)
_listings: dict[str, tuple[int, dict[str, list[str]]]] = {}


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (``triton``, ``sglang``,
    ``apache-tvm-ffi``), or None when it is not installed or its metadata is unreadable."""
    found = _dist_info_version(name)
    if found is not _UNSURE:
        return found
    from importlib import metadata  # here: its import (20-30 ms) is on every command's start

    try:
        return metadata.version(name)
    except Exception:  # not installed, or broken metadata: both mean "no version known"
        return None


def _normalized(name: str) -> str:
    """``importlib.metadata``'s normalization of a distribution name (``Prepared.normalize``)."""
    return _SEPARATORS.sub("-", name).lower().replace("-", "_")


def _dist_info_version(name: str) -> str | _Unsure | None:
    """The version from the first ``sys.path`` directory that holds ``name``'s dist-info, None
    when no directory does; ``_UNSURE`` where ``importlib.metadata`` might see it otherwise."""
    from importlib.machinery import PathFinder

    if any(finder is not PathFinder and hasattr(finder, "find_distributions")
           for finder in sys.meta_path):
        return _UNSURE
    wanted = _normalized(name)
    for entry in sys.path:
        infos = _dist_infos(entry or ".")
        if infos is None:
            return _UNSURE
        found = infos.get(wanted)
        if found:
            if len(found) > 1:
                return _UNSURE
            return _version_field(os.path.join(entry or ".", found[0]))
    return None


def _dist_infos(entry: str) -> dict[str, list[str]] | None:
    """The metadata directories of one ``sys.path`` entry by normalized name (``{}`` for an
    entry that is no directory and no file: importlib.metadata finds nothing there either),
    None for a file (a zip archive: importlib.metadata reads those).  Kept while the
    directory's mtime stays what it was, as importlib.metadata keeps its own listing."""
    try:
        st = os.stat(entry)
    except OSError:
        return {}
    if not os.path.isdir(entry) or entry.lower().endswith(".egg"):
        return None                     # a zip archive, an egg: importlib.metadata reads those
    kept = _listings.get(entry)
    if kept is not None and kept[0] == st.st_mtime_ns:
        return kept[1]
    try:
        names = os.listdir(entry)
    except OSError:
        return {}
    infos: dict[str, list[str]] = {}
    for child in names:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            key = _normalized(low.rpartition(".")[0].partition("-")[0])
            infos.setdefault(key, []).append(child)
    _listings[entry] = (st.st_mtime_ns, infos)
    return infos


def _version_field(info: str) -> str | _Unsure:
    """The ``Version:`` header of a metadata directory's METADATA (else PKG-INFO), as
    ``importlib.metadata`` reads it; ``_UNSURE`` for anything but one plain ``Version: X``
    line among the headers of one of them."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info, name), "rb") as fh:
                head = fh.read(1 << 16)
            break
        except FileNotFoundError:
            continue
        except OSError:
            return _UNSURE
    else:
        return _UNSURE
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return _UNSURE
    headers, blank, _ = text.replace("\r\n", "\n").partition("\n\n")
    if not blank and len(head) == 1 << 16:
        return _UNSURE
    lines = headers.split("\n")
    at = [i for i, line in enumerate(lines) if line[:8].lower() == "version:"]
    if len(at) != 1 or (at[0] + 1 < len(lines) and lines[at[0] + 1][:1] in (" ", "\t")):
        return _UNSURE                  # none, several, or folded over lines
    return lines[at[0]][8:].strip() or _UNSURE
