"""Installed distribution versions, read from package metadata without importing the package.

``import sglang`` redirects cache variables and imports torch, and importing Triton loads
``libtriton``: asking the metadata costs neither.  Standard library only.
"""

from __future__ import annotations

from importlib import metadata


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (``triton``, ``sglang``,
    ``apache-tvm-ffi``), or None when it is not installed or its metadata is unreadable."""
    try:
        return metadata.version(name)
    except Exception:  # not installed, or broken metadata: both mean "no version known"
        return None
