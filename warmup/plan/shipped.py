"""Shipped plans: the plan files that come with sglang-warmup (package data), found by name.

``--plan default``, ``WARMUP_PLAN=deepseek_v4_serving_shapes`` and ``--warmups
deepseek_v4_serving_shapes`` name a shipped plan; anything that is an existing file is read as
a path.  A name that is neither gets one line listing the shipped plans.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from warmup.errors import PlanError

def _directory() -> Path:
    """Where the shipped plans are: ``warmup/plans/`` of an installed wheel (the package data
    ``warmup.plans``), else ``plans/`` at the top of a checkout."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "plans"
    return installed if installed.is_dir() else package.parent / "plans"


#: The directory of the shipped plans and of their JSON Schema.
DIR = _directory()
SCHEMA = DIR / "schema.json"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # use fullmatch: $ also matches before "\n"


def names() -> list[str]:
    """The shipped plans' names, sorted."""
    return sorted(p.stem for p in DIR.glob("*.yaml"))


def path(name: str) -> Path | None:
    """The file of the shipped plan ``name``, or None."""
    if not _NAME.fullmatch(name):
        return None
    candidate = DIR / f"{name}.yaml"
    return candidate if candidate.is_file() else None


def resolve(ref: str | os.PathLike[str]) -> Path:
    """The plan file ``ref`` means: an existing file, else a shipped plan of that name."""
    p = Path(ref)
    if p.is_file():
        return p
    shipped = path(os.fspath(ref))
    if shipped is not None:
        return shipped
    if p.suffix in (".yaml", ".yml") or "/" in os.fspath(ref) or p.exists():
        return p  # a path: the loader says why it cannot be read
    raise PlanError(f"{ref}: no plan file, and no shipped plan of that name",
                    hint="shipped plans: " + ", ".join(names()) + " (sglang-warmup plan list); "
                         "or pass the path of a plan file")
