"""A job for Inductor's compile-worker pool: what the worker process sees."""

from __future__ import annotations

import os


def hooks_in_worker() -> dict:
    """Compile a real Triton kernel for cuda:90 in the worker and report what was recorded."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from warmup.observe import events

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    triton.compile(ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                             constexprs={"BLOCK": 64}),
                   target=GPUTarget("cuda", 90, 32))
    return {"pid": os.getpid(), "installed": events.installed()}
