"""The CacheError family: every error cache_tools raises on purpose carries a hint (the fix).

cache_tools stays standard-library-only and independent of ``warmup``, so the common base of
both families, ``HintedError``, lives here; ``warmup.errors.WarmupError`` derives from it.
The ``sglang-warmup`` CLI boundary prints ``error: message`` / ``hint: hint`` for any
``HintedError`` and exits with its ``exit_code``.
"""

from __future__ import annotations

from types import TracebackType


class HintedError(Exception):
    """An expected failure with a one-line message and a hint that says how to fix it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class CacheError(HintedError):
    """A cache tool failed on purpose (bad input, unusable directory, unreachable store)."""


class ArchiveError(CacheError):
    """An archive is malformed, corrupt, truncated or hostile; nothing was written."""

    exit_code = 3


class IncompatibleError(CacheError):
    """An archive or remote store was made by a different toolchain (see fingerprint.py)."""

    exit_code = 4


class RemoteError(CacheError):
    """The shared store could not be reached or returned data that fails verification."""

    exit_code = 5


class _OSErrors:
    """Context manager: an OSError inside becomes a CacheError naming the file."""

    def __init__(self, action: str, hint: str) -> None:
        self.action = action
        self.hint = hint

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, OSError) and not isinstance(exc, CacheError):
            where = f"{exc.filename}: " if exc.filename else ""
            raise CacheError(f"{self.action} failed: {where}{exc.strerror or exc}",
                             hint=self.hint) from exc


def os_errors(action: str, hint: str = "check free space and permissions") -> _OSErrors:
    """``with os_errors("restore"):`` turns OSError into CacheError("restore failed: ...")."""
    return _OSErrors(action, hint)
