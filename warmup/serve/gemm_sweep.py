"""The GEMM sweep: run every dense GEMM shape of the loaded model once per cuBLAS kernel, in the
scheduler process, before the server is ready.

cuBLAS loads each GEMM kernel the first time the process uses it, 2-4 ms on an H200, also under
``CUDA_MODULE_LOADING=EAGER`` (cuBLAS loads its own kernels).  Which kernel a GEMM uses depends
on its row count, so with eager prefill (no prefill CUDA graph padding the token count to a few
buckets) a prompt of a length the process has not run, or an input-logprob request over a new
number of rows, pays a load for each dense layer shape it meets first.  On the H200 the kernels
changed only at row counts ``8k`` and ``8k + 1`` (63 kernels for the LM head and 80 for a
1,024-square layer over 1-2,048 rows; docs/first-hits.md): after a sweep no later row count paid
a load.  No warm-up request can send every row count, but the process can run each shape's
GEMM at those row counts directly.

What runs: after ``ModelRunner.load_model`` (before the KV cache is sized and before CUDA-graph
capture), every distinct dense GEMM of the model, each through the call its forward makes
(:mod:`warmup.serve.gemm_shapes`: a linear layer's ``quant_method.apply``, an ``lm_head``'s
``torch.matmul``, the GEMMs SGLang's model code runs on a layer's weight itself), at row
counts 1-64 and then ``8k``, ``8k + 1`` in increasing order up to the server's largest prefill
chunk, all shapes at one row count before the next row count.  A
time budget (``WARMUP_GEMM_SWEEP_S``, per process: a speculative-decoding draft runner gets what
the target left, and skips the shapes already swept) stops it; the small row counts come first
because a load costs most, relatively, on a small GEMM.  Layers are not called through
``forward``, so no collective runs and every tensor-parallel rank sweeps its own shards.
Buffers are bounded (``MAX_BUFFER_BYTES``: one input buffer per dtype, one output at a time,
carved from one block of the largest that the caching allocator holds from the start, with
cuBLAS's workspace allocated before it, so that the calls do not wait for ``cudaMalloc``) and
freed; the caching allocator and cuBLAS's workspaces are emptied afterwards, so the KV cache is
sized as without the sweep but for the loaded kernels' code.
Not swept: quantized layers (FP8, DeepGEMM: their kernels are not cuBLAS's), an fp32 LM head
(``torch.mm`` with an fp32 output), and nothing at all under deterministic inference
(batch-invariant kernels replace cuBLAS's).

It never raises into SGLang: a failure is logged and the server starts as without it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from warmup import settings
from warmup.errors import WarmupError
from warmup.serve import allocator
from warmup.serve.gemm_shapes import Shape, model_shapes

logger = logging.getLogger("sglang_warmup.gemm_sweep")

MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
#: row counts swept one by one before the ``8k`` / ``8k + 1`` steps
DENSE_ROWS = 64
#: a shape's input plus output at its largest row count; fewer rows where a shape needs more
#: (the buffers live for the sweep's seconds, while a neighbour server on the same GPU may be
#: measuring its free memory)
MAX_BUFFER_BYTES = 512 << 20
#: the row limit when the server's settings name none
DEFAULT_MAX_ROWS = 8192
#: row counts past DENSE_ROWS between two waits for the GPU: the CPU queues the next GEMMs
#: while the GPU runs these, and the budget still counts the GPU's time within that many rows
SYNC_ROWS = 16
#: a call that held the CPU this long (ms) loaded a kernel: cuBLAS's set-up of a new kernel
#: takes 2-4 ms on an H100 or H200, a launch tens of microseconds; its row count is a *load
#: row* of its shape (a false one, a pause of the process or an allocation, only costs a call
#: later; :func:`warmup.serve.allocator.reserve` keeps the allocations of its outputs out)
STALL_MS = 0.5


def row_counts(max_rows: int) -> Iterator[int]:
    """1..DENSE_ROWS, then ``8k`` and ``8k + 1`` up to ``max_rows``, increasing."""
    for m in range(1, min(DENSE_ROWS, max_rows) + 1):
        yield m
    k = DENSE_ROWS // 8
    while 8 * k + 1 <= max_rows:
        if 8 * k > DENSE_ROWS:
            yield 8 * k
        yield 8 * k + 1
        k += 1
    if 8 * k == max_rows and max_rows > DENSE_ROWS:
        yield max_rows


@dataclass
class SweepResult:
    shapes: list[str] = field(default_factory=list)
    calls: int = 0
    rows_reached: int = 0
    max_rows: int = 0
    seconds: float = 0.0
    stopped_by_budget: bool = False
    #: the fewest rows a shape could take within MAX_BUFFER_BYTES, and which shape (a large LM
    #: head: row counts above it still load their kernels while serving)
    capped_rows: int = 0
    capped_shape: str = ""
    #: shapes left out after their GEMM raised (``label: error``)
    failed: list[str] = field(default_factory=list)
    #: per shape (``key_text``), the row counts whose call held the CPU STALL_MS or more
    load_rows: dict[str, list[int]] = field(default_factory=dict)
    #: shapes run only at the load rows a steps record named
    learned: int = 0

    def summary(self) -> str:
        how = "stopped by its time budget" if self.stopped_by_budget else "complete"
        cap = (f"; {self.capped_shape} to {self.capped_rows} rows (buffer limit)"
               if self.capped_shape and self.capped_rows < self.rows_reached else "")
        failed = f"; {len(self.failed)} failed and left out: {self.failed[0]}" if self.failed \
            else ""
        learned = (f", {self.learned} at the rows where a start from the same caches loaded "
                   f"a kernel" if self.learned else "")
        return (f"GEMM sweep: {len(self.shapes)} shapes{learned}, {self.calls} calls, rows 1-"
                f"{self.rows_reached} of {self.max_rows}{cap}, {self.seconds:.2f} s ({how})"
                f"{failed}")


def sweep(shapes: list[Shape], max_rows: int, budget_s: float, *,
          device: Any = "cuda", clock: Callable[[], float] = time.monotonic,
          synchronize: Callable[[], None] | None = None,
          sync_rows: int = SYNC_ROWS) -> SweepResult:
    """Run every shape at every row count of :func:`row_counts` (a shape with ``rows`` at those
    only) until ``budget_s`` is spent, noting the calls that held the CPU ``STALL_MS``.

    One input buffer per dtype serves every shape (a contiguous view of its first
    ``rows * in_features`` elements), so the memory held is the largest shape's input plus one
    GEMM's output, each within ``MAX_BUFFER_BYTES``.  The clock is read after every call and,
    with ``synchronize``, the GPU is waited for after every ``sync_rows`` row counts past
    ``DENSE_ROWS``, so the budget counts the GPU's time too."""
    import torch

    result = SweepResult(shapes=[s.label for s in shapes], max_rows=max_rows,
                         learned=sum(1 for s in shapes if s.rows is not None))
    started = clock()
    if not shapes or max_rows < 1 or budget_s <= 0:
        return result
    elements: dict[Any, int] = {}
    for s in shapes:
        s.max_rows = max(1, min(max_rows, MAX_BUFFER_BYTES // s.row_bytes()))
        elements[s.dtype] = max(elements.get(s.dtype, 0), s.max_rows * s.in_features)
    smallest = min(shapes, key=lambda s: s.max_rows)
    if smallest.max_rows < max_rows:
        result.capped_rows, result.capped_shape = smallest.max_rows, smallest.label
    result.load_rows = {s.key_text: [] for s in shapes}
    buffers: dict[Any, Any] = {}
    try:
        with torch.inference_mode():
            for dtype, n in elements.items():
                buffers[dtype] = torch.zeros(n, dtype=dtype, device=device)
            if torch.device(device).type == "cuda":  # its workspace: not carved from the block
                torch.cuda.current_blas_handle()
            allocator.reserve(largest_output(shapes), device)
            active = list(shapes)
            past = 0  # row counts past DENSE_ROWS since the last wait
            for rows in row_counts(max_rows):
                over = False
                for s in list(active):
                    if rows > s.max_rows or (s.rows is not None and rows <= s.learned_up_to
                                             and rows not in s.rows):
                        continue
                    before = clock()
                    try:
                        s.run(buffers[s.dtype][:rows * s.in_features].view(rows, s.in_features))
                    except Exception as exc:  # noqa: BLE001 - that shape only, not the rest
                        active.remove(s)
                        result.load_rows.pop(s.key_text, None)  # its rows are not all known
                        result.failed.append(f"{s.label}: {type(exc).__name__}: {exc}"[:300])
                        continue
                    now = clock()
                    result.calls += 1
                    if (now - before) * 1e3 >= STALL_MS:
                        result.load_rows.setdefault(s.key_text, []).append(rows)
                    if now - started > budget_s:
                        over = True
                        break
                past += rows > DENSE_ROWS
                if synchronize is not None and past >= max(1, sync_rows):
                    synchronize()
                    past = 0
                if over or clock() - started > budget_s:
                    result.stopped_by_budget = rows < max_rows or over
                    result.rows_reached = rows - 1 if over else rows
                    break
                result.rows_reached = rows
            if synchronize is not None:
                synchronize()
    finally:
        buffers.clear()
    result.seconds = clock() - started
    return result


def largest_output(shapes: list[Shape]) -> int:
    """The bytes of the largest output the sweep makes: each shape's at the most rows it runs
    (its ``max_rows``, or its largest learned row where the learned rows cover its range)."""
    top = 0
    for s in shapes:
        rows = s.max_rows
        if s.rows is not None and s.learned_up_to >= s.max_rows:
            rows = max((r for r in s.rows if r <= s.max_rows), default=0)
        top = max(top, rows * s.out_features * s.out_itemsize)
    return top


#: the server settings the sweep reads
_SETTINGS = ("chunked_prefill_size", "max_prefill_tokens", "enable_deterministic_inference",
             "enable_fp32_lm_head")


def _values(server_args: Any) -> dict:
    """The settings the sweep reads, as SGLang resolved them (``resolved_dict``, SGLang >=
    0.5.22, whose attributes hold what was typed), else as the attributes hold them."""
    resolved = getattr(server_args, "resolved_dict", None)
    try:
        if callable(resolved):
            found = resolved()
            return {name: found.get(name) for name in _SETTINGS}
    except Exception:  # noqa: BLE001 - an unresolvable ServerArgs: the attributes as they are
        pass
    return {name: getattr(server_args, name, None) for name in _SETTINGS}


def max_rows_of(server_args: Any) -> int:
    """The largest number of tokens one prefill forward can hold: the smaller of the
    chunked-prefill size and the largest prefill, else DEFAULT_MAX_ROWS."""
    values = _values(server_args)
    given = [values.get(name) for name in ("chunked_prefill_size", "max_prefill_tokens")]
    sizes = [s for s in given if isinstance(s, int) and not isinstance(s, bool) and s > 0]
    return min(sizes) if sizes else DEFAULT_MAX_ROWS


#: what this process swept already (a speculative-decoding draft runner shares shapes with the
#: target, and every runner of the process shares one budget)
_done: set[tuple] = set()
_spent_s = 0.0


def _skip_reason(values: dict) -> str | None:
    """Why the sweep would warm kernels the server does not use, if it would."""
    if values.get("enable_deterministic_inference") is True:
        return "deterministic inference runs batch-invariant kernels, not cuBLAS's"
    return None


def after_load(runner: Any) -> SweepResult | None:
    """What the wrapped ``load_model`` runs: the sweep of ``runner.model`` on its device, for
    the shapes this process has not swept, within what is left of the process's budget."""
    global _spent_s
    import torch

    budget = settings.GEMM_SWEEP_S.get() - _spent_s
    if budget <= 0 or not torch.cuda.is_available():
        return None
    server_args = getattr(runner, "server_args", None)
    values = _values(server_args)
    why = _skip_reason(values)
    if why is not None:
        logger.info("sglang-warmup: GEMM sweep skipped: %s", why)
        return None
    # an fp32 LM head runs torch.mm(..., out_dtype=float32): another kernel, not swept
    shapes = [s for s in model_shapes(runner.model, lm_head=values.get("enable_fp32_lm_head")
                                      is not True) if s.key not in _done]
    if not shapes:                  # a quantized model, or a draft of the target's shapes
        return None
    device = next((p.device for p in runner.model.parameters() if p.is_cuda),
                  torch.device("cuda", torch.cuda.current_device()))
    max_rows = max_rows_of(server_args)
    blas = blas_id()
    rows, reached, why = learned_rows(max_rows, blas)
    for s in shapes:
        s.rows, s.learned_up_to = rows.get(s.key_text), reached
    if why:
        logger.info("sglang-warmup: GEMM sweep at every row count: %s", why)
    try:
        result = sweep(shapes, max_rows, budget, device=device,
                       synchronize=torch.cuda.synchronize, sync_rows=SYNC_ROWS)
    finally:                    # the KV cache is sized from free memory after the load
        _give_back(torch)
    _done.update(s.key for s in shapes)
    _spent_s += result.seconds
    (logger.warning if result.failed else logger.info)("sglang-warmup: %s", result.summary())
    record(result, blas)
    return result


def _give_back(torch: Any) -> None:
    """Empty the caching allocator and free cuBLAS's workspaces, each on its own: a failure of
    one is logged and never hides the sweep's own error."""
    for owner, what in ((torch.cuda, "empty_cache"), (torch._C, "_cuda_clearCublasWorkspaces")):
        free = getattr(owner, what, None)
        try:
            if free is not None:
                free()
        except Exception as exc:  # noqa: BLE001 - cleanup must not replace the sweep's error
            logger.warning("sglang-warmup: GEMM sweep: %s failed: %s", what, exc)


#: the wheels a pip-installed torch takes cuBLAS from (one of them, whichever is installed)
_CUBLAS_WHEELS = ("nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cublas-cu13")


def blas_id() -> str:
    """What picks cuBLAS's kernels besides the shape: the GPU, torch and its CUDA, the BLAS
    library torch prefers, the cuBLAS wheel and its workspace setting (load rows learned under
    another of them do not apply)."""
    import os
    from importlib import metadata

    import torch

    major, minor = torch.cuda.get_device_capability()
    try:
        lib = str(torch.backends.cuda.preferred_blas_library())
    except Exception:  # noqa: BLE001 - a torch without the choice: cuBLAS
        lib = "cublas"
    wheels = []
    for name in _CUBLAS_WHEELS:
        try:
            wheels.append(f"{name} {metadata.version(name)}")
            break  # one is installed: the one torch loads
        except metadata.PackageNotFoundError:
            continue
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return ", ".join([f"{torch.cuda.get_device_name()} sm_{major}{minor}",
                      f"torch {torch.__version__}", f"CUDA {torch.version.cuda}", lib, *wheels,
                      *([f"CUBLAS_WORKSPACE_CONFIG={workspace}"] if workspace else [])])


def learned_rows(max_rows: int, blas: str) -> tuple[dict[str, frozenset[int]], int, str]:
    """The load rows per shape that WARMUP_STEPS's record learned in a start from the same
    caches and the row count they go up to, where they apply to this sweep (the same GPU and
    libraries, ``blas``, the same row limit); else none, and why (empty without a record)."""
    from warmup.plan import step_record

    path = settings.STEPS.get()
    if not path:
        return {}, 0, ""
    try:
        gemm = step_record.read(path).gemm
    except WarmupError as exc:  # the warm-up's hook says what is wrong with the record
        return {}, 0, f"the steps record does not read ({exc.message})"
    if gemm is None:
        return {}, 0, f"{path} holds no GEMM load rows"
    if gemm.blas != blas:
        return {}, 0, f"{path}'s GEMM load rows were learned on {gemm.blas}, this is {blas}"
    if gemm.max_rows != max_rows:
        return {}, 0, (f"{path}'s GEMM load rows were learned for {gemm.max_rows} rows, this "
                       f"sweep goes to {max_rows}")
    return {k: frozenset(v) for k, v in gemm.rows.items()}, gemm.reached, ""


def record(result: SweepResult, blas: str = "") -> None:
    """The sweep as a ``gemm_sweep`` record in this process's compile log (the run report
    shows it)."""
    from cache_tools import compile_log
    from warmup.observe import events

    events.note(compile_log.GEMM_SWEEP, "cublas", shapes=len(result.shapes), calls=result.calls,
                rows_reached=result.rows_reached, max_rows=result.max_rows,
                duration_s=round(result.seconds, 3), stopped_by_budget=result.stopped_by_budget,
                capped_rows=result.capped_rows or None, capped_shape=result.capped_shape or None,
                failed=result.failed[:8], learned=result.learned, blas=blas,
                load_rows=result.load_rows)


def _wrap(module: Any) -> None:
    cls = getattr(module, "ModelRunner", None)
    original = getattr(cls, "load_model", None)
    if cls is None or original is None or getattr(original, "__sglang_warmup__", False):
        return

    def load_model(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        try:
            after_load(self)
        except Exception as exc:  # noqa: BLE001 - a guest never raises into its host
            logger.warning("sglang-warmup: GEMM sweep skipped: %s: %s", type(exc).__name__, exc)
        return out

    load_model.__sglang_warmup__ = True  # type: ignore[attr-defined]
    load_model.__wrapped__ = original  # type: ignore[attr-defined]
    cls.load_model = load_model


def arm() -> None:
    """Wrap ``ModelRunner.load_model`` now or when SGLang imports it."""
    import sys

    from warmup.observe.importer import finder

    module = sys.modules.get(MODEL_RUNNER)
    if module is not None:
        _wrap(module)
    else:
        finder().watch(MODEL_RUNNER, _wrap)
