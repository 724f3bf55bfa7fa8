"""Installed distribution versions, read from package metadata without importing the package
(importing SGLang or Triton to ask its version takes seconds)."""

from __future__ import annotations

from importlib import metadata


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``; None when it is not installed or its
    metadata is unreadable."""
    try:
        return metadata.version(name)
    except Exception:  # PackageNotFoundError, or metadata broken by a half-removed install
        return None
