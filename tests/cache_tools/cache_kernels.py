"""Small Triton kernels compiled on CPU for sm_90 (real cubins, real cache entries) and a helper
that reports, through Triton's compilation listener, whether each compile hit the disk cache.

Imported lazily by the tests (and by spawned worker processes), never at collection time."""

from __future__ import annotations

import os
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x, out, n, factor, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x + offs, mask=mask) * factor
    if SQUARE:
        v = v * v
    tl.store(out + offs, v, mask=mask)


_ADD = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
_SCALE = {"x": "*fp32", "out": "*fp32", "n": "i32", "factor": "fp32"}

#: (kernel, signature, constexprs): three distinct cache entries
SPECS = (
    (add_kernel, _ADD, {"BLOCK": 64}),
    (add_kernel, _ADD, {"BLOCK": 128}),
    (scale_kernel, _SCALE, {"BLOCK": 256, "SQUARE": True}),
)
#: a fourth entry that only some tests compile
EXTRA = ((scale_kernel, _SCALE, {"BLOCK": 128, "SQUARE": False}),)


def compile_into(cache_dir: str | os.PathLike[str], specs=SPECS) -> list[bool]:
    """Compile ``specs`` with TRITON_CACHE_DIR=cache_dir; ``cache_hit`` of each compile as
    reported by ``triton.knobs.compilation.listener``."""
    hits: list[bool] = []
    previous_listener = triton.knobs.compilation.listener
    previous_dir = os.environ.get("TRITON_CACHE_DIR")

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        hits.append(cache_hit)

    os.environ["TRITON_CACHE_DIR"] = str(Path(cache_dir))
    triton.knobs.compilation.listener = listener
    try:
        for fn, signature, constexprs in specs:
            triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature,
                                                     constexprs=constexprs), target=TARGET)
    finally:
        triton.knobs.compilation.listener = previous_listener
        if previous_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = previous_dir
    return hits
