"""Helpers for the cache_tools tests: real Triton compiles, tree snapshots, locations."""

from __future__ import annotations

from pathlib import Path

from cache_tools.locations import Location, kind

HERE = Path(__file__).resolve().parent


def compile_into(path: Path, specs=None) -> list[bool]:
    """Real Triton compiles (CPU, target sm_90) into ``path``; cache_hit of each."""
    import cache_kernels

    return cache_kernels.compile_into(path, specs or cache_kernels.SPECS)


def triton_location(path: Path) -> Location:
    return Location(kind("triton"), path, "test")


def tree(path: Path) -> dict[str, bytes | None]:
    """Every file below ``path`` with its content (and directories as None): a snapshot."""
    out: dict[str, bytes | None] = {}
    if not path.exists():
        return out
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out

