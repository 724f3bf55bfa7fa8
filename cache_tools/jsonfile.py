"""Reading a JSON document someone else wrote (a saved report, an audit): read by
:func:`cache_tools.inputfile.read` (size and time bounded), its nesting bounded while it is
parsed, and one short reason when it is not JSON.  The caller names the file and adds its
hint."""

from __future__ import annotations

import json
import os
from typing import Any

from cache_tools import inputfile


class JsonFileError(ValueError):
    """Why a file is not a JSON document we can read (``str()`` is one line, without the path)."""


def load(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """The JSON value of ``path``, a file of at most ``max_bytes``."""
    try:
        raw = inputfile.read(path, max_bytes)
    except inputfile.TooLarge as exc:
        raise JsonFileError(f"file is {exc}") from None
    except OSError as exc:
        raise JsonFileError(f"cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        raise JsonFileError(f"not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    except RecursionError:
        raise JsonFileError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise JsonFileError(f"not JSON: {str(exc).splitlines()[0][:120]}") from None
