"""The CacheError family: every error cache_tools raises on purpose carries a hint (the fix).

cache_tools stays standard-library-only and independent of ``warmup``, so the common base of
both families, ``HintedError``, lives here; ``warmup.errors.WarmupError`` derives from it.
The ``sglang-warmup`` CLI boundary prints ``error: message`` / ``hint: hint`` for any
``HintedError`` and exits with its ``exit_code``.
"""

from __future__ import annotations

from types import TracebackType

_WHITESPACE = {"\n": " ", "\r": " ", "\t": " "}


def printable(text: str) -> str:
    """``text`` safe for one line of a terminal or a log: newlines and tabs as spaces, every
    other character a terminal would act on or that would reorder the line (escapes, C1
    controls, bidirectional overrides, line separators, anything ``str.isprintable`` refuses)
    escaped (``\\x1b``, ``\\u202e``).  For text that comes from data or from a peer (a compile
    log, a request file, a server's or a registry's answer)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in _WHITESPACE:
            out.append(_WHITESPACE[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


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
