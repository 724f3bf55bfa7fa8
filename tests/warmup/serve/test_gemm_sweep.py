"""warmup.serve.gemm_sweep: the dense GEMM shapes of a model built from SGLang's real linear
methods, swept on the CPU (the same code the scheduler runs on its GPU), and the wrap of SGLang's
real ``ModelRunner.load_model`` (0.5.22 installed, 0.5.23 under .deps)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch

from warmup.serve import allocator, gemm_shapes, gemm_sweep
from warmup.serve.gemm_sweep import row_counts

ROOT = Path(__file__).resolve().parents[3]
#: what the faked CUDA names its GPU and libraries
BLAS = "NVIDIA H100 80GB HBM3 sm_90, torch 2.11.0, CUDA 12.8, cublas"


@pytest.mark.parametrize("max_rows", [1, 7, 64, 65, 72, 73, 100, 2048, 8192, 8190])
def test_row_counts_are_every_small_count_then_each_kernel_boundary(max_rows):
    rows = list(row_counts(max_rows))
    assert rows == sorted(set(rows))
    assert rows[0] == 1 and rows[-1] <= max_rows
    small = [m for m in rows if m <= gemm_sweep.DENSE_ROWS]
    assert small == list(range(1, min(max_rows, gemm_sweep.DENSE_ROWS) + 1))
    large = [m for m in rows if m > gemm_sweep.DENSE_ROWS]
    assert all(m % 8 in (0, 1) for m in large)
    boundaries = [m for m in range(gemm_sweep.DENSE_ROWS + 1, max_rows + 1) if m % 8 in (0, 1)]
    assert large == boundaries


class _Linear(torch.nn.Module):
    """A layer as SGLang's linear layers hold it: weight [out, in], optional bias, and the
    quantization method that applies it."""

    def __init__(self, method, out_f, in_f, bias=False, dtype=torch.bfloat16):
        super().__init__()
        self.quant_method = method
        self.weight = torch.nn.Parameter(torch.randn(out_f, in_f, dtype=dtype),
                                         requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(out_f, dtype=dtype),
                                       requires_grad=False) if bias else None


class _FP8Method:
    """A quantized method: its kernels are not cuBLAS's; never swept."""


def _model():
    from sglang.srt.layers.quantization.unquant import (UnquantizedEmbeddingMethod,
                                                         UnquantizedLinearMethod)

    lin = UnquantizedLinearMethod()
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    for _ in range(3):                       # three layers of the same shapes: swept once each
        layer = torch.nn.Module()
        layer.qkv_proj = _Linear(lin, 48, 32)
        layer.o_proj = _Linear(lin, 32, 32)
        layer.gate = _Linear(lin, 8, 32, dtype=torch.float32)
        layer.biased = _Linear(lin, 32, 32, bias=True)
        layer.experts = _Linear(_FP8Method(), 64, 32)
        model.layers.append(layer)
    model.embed_tokens = _Linear(UnquantizedEmbeddingMethod(), 100, 32)  # a lookup, not a GEMM
    model.lm_head = _Linear(UnquantizedEmbeddingMethod(), 100, 32)
    return model


def test_the_model_shapes_are_the_distinct_unquantized_gemms_and_the_lm_head():
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    labels = [s.label for s in shapes]
    assert labels == ["layers.0.qkv_proj (48, 32)", "layers.0.o_proj (32, 32)",
                      "layers.0.gate (8, 32)", "layers.0.biased (32, 32)",
                      "lm_head (100, 32)"], labels
    assert gemm_shapes.model_shapes(_model(), device_type="cuda") == []  # weights on the CPU


def test_the_sweep_runs_every_shape_at_every_row_count_through_the_layers_own_method():
    model = _model()
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    seen: dict[str, list[tuple[int, ...]]] = {}
    for s in shapes:
        run = s.run

        def spy(x, run=run, label=s.label):
            assert x.is_contiguous()                # the layout the server's activations have
            out = run(x)
            seen.setdefault(label, []).append(tuple(out.shape))
            return out

        s.run = spy
    result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu")
    rows = list(row_counts(80))
    assert result.rows_reached == 80 and not result.stopped_by_budget
    assert result.calls == len(rows) * len(shapes)
    for s in shapes:
        assert seen[s.label] == [(m, s.out_features) for m in rows]
    assert "5 shapes" in result.summary() and "complete" in result.summary()


def test_the_budget_stops_the_sweep_at_the_call_that_spends_it():
    """The clock is read after every call: here a call takes one second."""
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    calls = [0]
    for s in shapes:
        s.run = lambda x, run=s.run: (calls.__setitem__(0, calls[0] + 1), run(x))[1]
    result = gemm_sweep.sweep(shapes, 8192, budget_s=12.5, device="cpu",
                              clock=lambda: float(calls[0]))
    # rows 1 and 2 ran every shape (10 calls); rows 3 stopped after its third call
    assert result.calls == 13 and result.rows_reached == 2 and result.stopped_by_budget
    assert "stopped by its time budget" in result.summary()
    assert gemm_sweep.sweep(shapes, 8192, budget_s=0, device="cpu").calls == 0


@pytest.mark.parametrize("sync_rows", [1, 16])
def test_the_gpu_is_waited_for_every_sync_rows_row_counts_past_the_dense_ones(sync_rows):
    """The small row counts queue freely; past them the sweep waits for the GPU every
    ``sync_rows`` row counts (the CPU queues the next GEMMs meanwhile), and once at the end."""
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    at: list[int] = []
    calls = [0]
    for s in shapes:
        s.run = lambda x, run=s.run: (calls.__setitem__(0, calls[0] + 1), run(x))[1]
    result = gemm_sweep.sweep(shapes, 1024, budget_s=60.0, device="cpu",
                              synchronize=lambda: at.append(calls[0]), sync_rows=sync_rows)
    past = [m for m in row_counts(1024) if m > gemm_sweep.DENSE_ROWS]
    assert result.rows_reached == 1024
    assert len(at) == len(past) // sync_rows + 1          # and the last one at the end
    assert at[0] == (gemm_sweep.DENSE_ROWS + sync_rows) * len(shapes)
    assert at[-1] == result.calls


def test_the_budget_still_stops_the_sweep_between_two_waits():
    """The clock is read after every call, waits or not: a budget spent between two waits
    stops the sweep at that call, and the GPU is waited for once more before it returns."""
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    calls, waits = [0], []
    for s in shapes:
        s.run = lambda x, run=s.run: (calls.__setitem__(0, calls[0] + 1), run(x))[1]
    budget = (gemm_sweep.DENSE_ROWS + 5) * len(shapes) + 2.5  # inside the 16 rows after 64
    result = gemm_sweep.sweep(shapes, 4096, budget_s=budget, device="cpu",
                              clock=lambda: float(calls[0]), synchronize=lambda: waits.append(1),
                              sync_rows=16)
    assert result.stopped_by_budget and result.calls == int(budget) + 1
    assert len(waits) == 1                                  # no wait came due; the last one


def test_a_shape_too_large_for_the_buffer_limit_stops_at_fewer_rows(monkeypatch):
    monkeypatch.setattr(gemm_sweep, "MAX_BUFFER_BYTES", (48 + 32) * 2 * 20)
    shapes = [s for s in gemm_shapes.model_shapes(_model(), device_type="cpu")
              if s.label.startswith(("layers.0.qkv_proj", "layers.0.o_proj"))]
    result = gemm_sweep.sweep(shapes, 64, budget_s=60.0, device="cpu")
    # qkv (48 x 32) fits 20 rows, o_proj (32 x 32) 25; they share one input buffer
    assert [s.max_rows for s in shapes] == [20, 25]
    assert result.calls == 45 and result.rows_reached == 64


def test_max_rows_is_the_prefill_chunk_as_sglang_resolved_it(tiny_model_dir):
    """SGLang 0.5.22 keeps what was typed in the attributes (no --chunked-prefill-size: None)
    and the resolved value in ``resolved_dict``."""
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", str(tiny_model_dir), "--device", "cuda",
                              "--skip-tokenizer-init"])
    sa.resolve_once()
    resolved = sa.resolved_dict()
    assert resolved["chunked_prefill_size"] > 0
    assert gemm_sweep.max_rows_of(sa) == min(resolved["chunked_prefill_size"],
                                             resolved["max_prefill_tokens"])


def test_max_rows_is_the_largest_prefill_chunk():
    class Args:
        chunked_prefill_size = 8192
        max_prefill_tokens = 16384

    assert gemm_sweep.max_rows_of(Args()) == 8192
    Args.chunked_prefill_size = -1                      # chunking off: the largest prefill
    assert gemm_sweep.max_rows_of(Args()) == 16384
    assert gemm_sweep.max_rows_of(None) == gemm_sweep.DEFAULT_MAX_ROWS


def _runner_module():
    class ModelRunner:
        loads = 0

        def load_model(self):
            type(self).loads += 1
            self.model = _model()
            return "loaded"

    mod = type("M", (), {})()
    mod.ModelRunner = ModelRunner
    return mod


def test_the_wrapped_load_model_sweeps_after_loading_and_never_raises(monkeypatch, caplog):
    mod = _runner_module()
    gemm_sweep._wrap(mod)
    gemm_sweep._wrap(mod)                                # once only: one sweep per load below
    swept = []
    monkeypatch.setattr(gemm_sweep, "after_load", lambda runner: swept.append(runner.model))
    runner = mod.ModelRunner()
    assert runner.load_model() == "loaded" and mod.ModelRunner.loads == 1
    assert swept == [runner.model]

    def broken(runner):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gemm_sweep, "after_load", broken)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.gemm_sweep"):
        assert runner.load_model() == "loaded"
    assert "GEMM sweep skipped: RuntimeError: CUDA error: out of memory" in caplog.text


def test_without_a_gpu_or_with_a_zero_budget_nothing_runs(monkeypatch):
    runner = _runner_module().ModelRunner()
    runner.load_model()                 # imports SGLang's layers before CUDA is faked below
    ran = []
    monkeypatch.setattr(gemm_sweep, "sweep", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gemm_sweep.after_load(runner) is None
    monkeypatch.setenv("WARMUP_GEMM_SWEEP_S", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gemm_sweep.after_load(runner) is None
    assert ran == []


@pytest.fixture
def fake_cuda(monkeypatch):
    """after_load's CUDA calls as no-ops on the CPU machine, the process state reset, and the
    sweep itself recorded: (shape labels, max rows, budget) per call.  SGLang's layers are
    imported first: imported while CUDA reads as available, SGLang would take its CUDA paths
    (and need FlashInfer)."""
    import sglang.srt.layers.quantization.unquant  # noqa: F401

    import warmup.observe.events  # noqa: F401  (what after_load imports, likewise)

    monkeypatch.setattr(gemm_sweep, "_done", set())
    monkeypatch.setattr(gemm_sweep, "_spent_s", 0.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None, raising=False)
    monkeypatch.setattr(gemm_sweep, "blas_id", lambda: BLAS)
    monkeypatch.setattr(gemm_sweep, "model_shapes",
                        lambda model, device_type="cuda", lm_head=True: _real_shapes(
                            model, "cpu", lm_head=lm_head))
    calls = []

    def sweep(shapes, max_rows, budget, **kwargs):
        calls.append(([s.label for s in shapes], max_rows, budget))
        rows.append({s.key_text: (s.rows, s.learned_up_to) for s in shapes})
        return gemm_sweep.SweepResult(shapes=[s.label for s in shapes], seconds=1.5)

    monkeypatch.setattr(gemm_sweep, "sweep", sweep)
    rows: list[dict] = []
    monkeypatch.setattr(gemm_sweep, "_rows_seen", rows, raising=False)
    return calls


_real_shapes = gemm_shapes.model_shapes


def _runner(**server_args):
    runner = _runner_module().ModelRunner()
    runner.load_model()
    runner.server_args = type("ServerArgs", (), server_args)()
    return runner


def test_a_draft_runner_sweeps_only_new_shapes_within_what_the_target_left(fake_cuda):
    target = _runner(chunked_prefill_size=8192)
    gemm_sweep.after_load(target)
    draft = _runner(chunked_prefill_size=8192)
    draft.model.extra = _Linear(target.model.layers[0].o_proj.quant_method, 16, 32)
    gemm_sweep.after_load(draft)
    assert fake_cuda[0] == (["layers.0.qkv_proj (48, 32)", "layers.0.o_proj (32, 32)",
                             "layers.0.gate (8, 32)", "layers.0.biased (32, 32)",
                             "lm_head (100, 32)"], 8192, 4.0)
    assert fake_cuda[1] == (["extra (16, 32)"], 8192, 2.5)
    assert gemm_sweep.after_load(_runner()) is None     # nothing new: no sweep, no record
    assert len(fake_cuda) == 2


def test_the_allocator_is_emptied_when_the_sweep_fails_and_its_error_is_kept(
        fake_cuda, monkeypatch, caplog):
    """The KV cache is sized from free memory after the load: a sweep that raises still gives
    the block and cuBLAS's workspaces back, and a cleanup that fails too is logged without
    replacing the sweep's error (the wrapped ``load_model`` logs that one)."""
    freed: list[str] = []

    def empty_cache():
        freed.append("empty_cache")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: freed.append("workspaces"), raising=False)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(gemm_sweep, "sweep", broken)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.gemm_sweep"), \
            pytest.raises(RuntimeError, match="^boom$"):
        gemm_sweep.after_load(_runner(chunked_prefill_size=64))
    assert freed == ["empty_cache", "workspaces"]
    assert "GEMM sweep: empty_cache failed: CUDA error: an illegal memory access" in caplog.text


def test_deterministic_inference_and_an_fp32_lm_head_are_not_swept(fake_cuda, caplog):
    with caplog.at_level(logging.INFO, logger="sglang_warmup.gemm_sweep"):
        assert gemm_sweep.after_load(_runner(enable_deterministic_inference=True)) is None
    assert fake_cuda == []
    assert "GEMM sweep skipped: deterministic inference" in caplog.text
    gemm_sweep.after_load(_runner(enable_fp32_lm_head=True))
    assert "lm_head (100, 32)" not in fake_cuda[0][0] and len(fake_cuda[0][0]) == 4


def test_the_bias_is_what_the_layers_forward_would_pass():
    """A row-parallel layer adds its bias on rank 0 only; ``skip_bias_add`` hands it to the
    caller; a GEMM with a bias is another kernel, so each is its own shape."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    class RowParallelLinear(_Linear):
        pass

    lin = UnquantizedLinearMethod()
    model = torch.nn.Module()
    model.rank0 = RowParallelLinear(lin, 32, 32, bias=True)
    model.rank0.tp_rank = 0
    model.rank1 = RowParallelLinear(lin, 24, 32, bias=True)
    model.rank1.tp_rank = 1
    model.skipped = _Linear(lin, 16, 32, bias=True)
    model.skipped.skip_bias_add = True
    shapes = {s.label.split()[0]: s for s in gemm_shapes.model_shapes(model, device_type="cpu")}
    assert [shapes[n].key[3] for n in ("rank0", "rank1", "skipped")] == [True, False, False]
    assert tuple(shapes["rank1"].run(torch.zeros(3, 32, dtype=torch.bfloat16)).shape) == (3, 24)


def test_lm_heads_at_any_depth_and_never_a_quantized_one():
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    model = torch.nn.Module()
    model.language_model = torch.nn.Module()             # a multimodal model's text half
    model.language_model.lm_head = _Linear(UnquantizedEmbeddingMethod(), 100, 32)
    model.vision_lm_head = _Linear(_FP8Method(), 50, 32)  # not named lm_head: not one
    model.draft = torch.nn.Module()
    model.draft.lm_head = _Linear(_FP8Method(), 60, 32)   # quantized: not cuBLAS's
    labels = [s.label for s in gemm_shapes.model_shapes(model, device_type="cpu")]
    assert labels == ["language_model.lm_head (100, 32)"]
    assert gemm_shapes.model_shapes(model, device_type="cpu", lm_head=False) == []


@pytest.mark.parametrize("site", [
    ROOT / ".venv/lib/python3.11/site-packages", ROOT / ".deps/sglang-0.5.23"],
    ids=["0.5.22", "0.5.23"])
def test_sglangs_model_runner_loads_the_model_before_it_sizes_memory_and_captures(site):
    """What the wrap relies on, read from SGLang's real source: constructing the runner
    (``__init__`` -> ``initialize``) calls ``self.load_model()`` once; no method of the runner
    calls ``load_model`` again (weight updates do not); and every call that sizes the KV pool
    or captures graphs sits after it in ``initialize``, or in another method (the scheduler
    calls ``alloc_memory_pool`` once the runner exists)."""
    path = site / "sglang/srt/model_executor/model_runner.py"
    if not path.exists():
        pytest.skip(f"{path} not installed")
    tree = ast.parse(path.read_text())
    runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    methods = {n.name: n for n in runner.body if isinstance(n, ast.FunctionDef)}
    assert "load_model" in methods

    def calls(method: str) -> list[tuple[int, str]]:
        return sorted((n.lineno, n.func.attr) for n in ast.walk(methods[method])
                      if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute))

    assert "initialize" in [name for _, name in calls("__init__")]
    init = calls("initialize")
    loads = [line for line, name in init if name == "load_model"]
    assert len(loads) == 1
    sizing = [(line, name) for line, name in init
              if ("memory_pool" in name or "graph" in name) and "saver" not in name]
    assert all(line > loads[0] for line, _ in sizing), sizing
    callers = [m for m in methods if m != "initialize" and "load_model" in
               [name for _, name in calls(m)]]
    assert callers == [], callers


def test_the_sweep_is_a_compile_log_record_that_the_run_report_shows(tmp_path, monkeypatch):
    """``record`` writes through the real compile-event installation into the state directory;
    the driver's ``with_compiles`` over that log puts the sweep in the report and its text."""
    from prometheus_client import CollectorRegistry

    from cache_tools import compile_log
    from warmup.observe import events, phase
    from warmup.serve.report import RunReport
    from warmup.view.text import run_report as render

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0")   # a slow collection on a busy host: no record
    events.uninstall()
    phase.reset()
    try:
        phase.set_phase("init", state_dir=str(tmp_path))
        events.install(registry=CollectorRegistry(), state_dir=tmp_path)
        shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
        gemm_sweep.record(gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu"))
    finally:
        events.uninstall()
        phase.reset()
    records = compile_log.read_dir(tmp_path)
    assert [(r["event"], r["phase"], r["compiler"]) for r in records] == [
        ("gemm_sweep", "init", "cublas")]
    report = RunReport("p", "0" * 64, "d", "in-process", 0.0).with_compiles(records)
    (sweep,) = report.gemm_sweeps
    assert sweep["shapes"] == 5 and sweep["calls"] == len(list(row_counts(80))) * 5
    assert sweep["rows_reached"] == 80 and sweep["stopped_by_budget"] is False
    assert report.compiles_total == 0                       # not a compile
    assert "GEMM sweep before the warm-up: 1 scheduler(s), 5 shapes, rows 1-80 of 80" in \
        render(report)
    assert report.to_dict()["gemm_sweeps"][0]["pid"] == records[0]["pid"]


def test_the_report_keeps_the_sweeps_of_the_latest_start_only():
    from warmup.serve.report import RunReport

    def rec(t, pid, stopped=False):
        return {"event": "gemm_sweep", "time": t, "pid": pid, "shapes": 4, "calls": 10,
                "rows_reached": 64 if stopped else 8192, "max_rows": 8192, "duration_s": 4.0,
                "stopped_by_budget": stopped}

    # an earlier start an hour before, then two tensor-parallel ranks of this one
    records = [rec(1000.0, 1), rec(4600.0, 2), rec(4603.0, 3, stopped=True)]
    report = RunReport("p", "0" * 64, "d", "in-process", 0.0).with_compiles(records)
    assert [s["pid"] for s in report.gemm_sweeps] == [2, 3]
    from warmup.view.text import run_report as render
    assert render(report).splitlines()[-1] == (
        "GEMM sweep before the warm-up: 2 scheduler(s), 4 shapes, rows 1-8192 of 8192, 4.0 s; "
        "1 stopped by WARMUP_GEMM_SWEEP_S")


def test_a_tied_lm_head_is_swept_under_its_own_name():
    """SGLang's Llama and Qwen2 set ``self.lm_head = self.model.embed_tokens`` when the model
    ties them: one module under two names."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = _Linear(UnquantizedEmbeddingMethod(), 100, 32)
    model.lm_head = model.model.embed_tokens
    assert [s.label for s in gemm_shapes.model_shapes(model, device_type="cpu")] == [
        "lm_head (100, 32)"]


def test_a_shape_capped_by_the_buffer_limit_is_named_in_the_summary_and_the_report(monkeypatch):
    from warmup.view.text import sweep_line

    monkeypatch.setattr(gemm_sweep, "MAX_BUFFER_BYTES", (100 + 32) * 2 * 40)
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu")
    assert (result.capped_rows, result.capped_shape) == (40, "lm_head (100, 32)")
    assert "rows 1-80 of 80; lm_head (100, 32) to 40 rows (buffer limit)" in result.summary()
    record = {"pid": 9, "shapes": 5, "rows_reached": 80, "max_rows": 80, "duration_s": 0.2,
              "capped_rows": 40, "capped_shape": "lm_head (100, 32)"}
    draft = {"pid": 9, "shapes": 1, "rows_reached": 80, "max_rows": 80, "duration_s": 0.1}
    assert sweep_line([record, draft]) == ("GEMM sweep before the warm-up: 1 scheduler(s), "
                                           "6 shapes, rows 1-80 of 80 (lm_head to 40), 0.3 s")
    draft["failed"] = ["extra (16, 32): RuntimeError: boom"]
    assert sweep_line([record, draft]).endswith(
        "0.3 s; 1 shape(s) failed (the scheduler log names them)")
    record["learned"] = 4
    assert sweep_line([record]).startswith(
        "GEMM sweep before the warm-up: 1 scheduler(s), 5 shapes (4 at the rows where the "
        "bake's starts loaded a kernel), rows 1-80 of 80")


def test_a_shape_whose_gemm_raises_is_left_out_and_the_others_go_on():
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")

    def broken(x):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    shapes[1].run = broken
    result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu")
    assert result.calls == len(list(row_counts(80))) * 4 and result.rows_reached == 80
    assert result.failed == ["layers.0.o_proj (32, 32): RuntimeError: CUDA out of memory. "
                             "Tried to allocate 2.00 GiB"]
    assert result.summary().endswith("(complete); 1 failed and left out: layers.0.o_proj "
                                     "(32, 32): RuntimeError: CUDA out of memory. Tried to "
                                     "allocate 2.00 GiB")


@pytest.mark.parametrize("value", ["nan", "inf", "four"])
def test_a_budget_that_is_not_a_finite_number_is_refused_with_the_variable(monkeypatch, caplog,
                                                                           value):
    """A NaN budget would never run out; the plugin names the variable and arms nothing."""
    from warmup.observe.importer import finder
    from warmup.serve import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    for name, v in (("WARMUP_ENABLE", "1"), ("WARMUP_METRICS", "0"), ("WARMUP_PATCHES", "0"),
                    ("WARMUP_KEEP_ALLOCATOR", "0"), ("WARMUP_GEMM_SWEEP_S", value)):
        monkeypatch.setenv(name, v)
    monkeypatch.delenv("WARMUP_PLAN", raising=False)
    monkeypatch.delitem(__import__("sys").modules, gemm_sweep.MODEL_RUNNER, raising=False)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.plugin"):
        plugin.register()
    assert gemm_sweep.MODEL_RUNNER not in finder().watched
    assert f"GEMM sweep not activated: environment variable WARMUP_GEMM_SWEEP_S={value!r}: " \
        in caplog.text


def _outputs_and_reserves(monkeypatch, shapes, max_rows=80):
    """The sweep's events in order: ("out", bytes, rows) per GEMM, ("reserve", bytes)."""
    events: list[tuple] = []
    real = allocator.reserve
    monkeypatch.setattr(allocator, "reserve",
                        lambda n, device: (events.append(("reserve", n)), real(n, device)))
    for s in shapes:
        def timed(x, run=s.run):
            out = run(x)
            events.append(("out", out.numel() * out.element_size(), x.shape[0]))
            return out
        s.run = timed
    gemm_sweep.sweep(shapes, max_rows, budget_s=60.0, device="cpu")
    return events


def test_the_largest_output_is_reserved_before_the_first_gemm_and_holds_every_output(
        monkeypatch):
    """Outputs are carved from one block the caching allocator holds, so the calls do not
    wait for ``cudaMalloc`` and the sweep does not take an allocation for a kernel load.  The
    block is asked for once, before any GEMM, at the largest output any shape makes: an fp32
    layer counts four bytes an element."""
    model = _model()
    lin = model.layers[0].o_proj.quant_method
    model.layers[0].wide = _Linear(lin, 200, 32, dtype=torch.float32)
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    events = _outputs_and_reserves(monkeypatch, shapes)
    assert events[0] == ("reserve", 80 * 200 * 4)            # the fp32 layer at 80 rows
    assert [e for e in events if e[0] == "reserve"] == [events[0]]
    assert max(e[1] for e in events if e[0] == "out") == events[0][1]
    monkeypatch.setattr(gemm_sweep, "MAX_BUFFER_BYTES", (100 + 32) * 2 * 40)
    events = _outputs_and_reserves(monkeypatch, gemm_shapes.model_shapes(_model(),
                                                                        device_type="cpu"))
    assert ("reserve", 40 * 100 * 2) in events               # capped by the buffer limit


def test_the_block_is_the_largest_output_of_the_rows_a_learned_sweep_runs(monkeypatch):
    """A shape whose learned rows cover its range runs no row count above the largest of
    them, and the block is no larger than that; a shape learned only part of the way runs
    every row count above, up to its limit."""
    shapes = [s for s in gemm_shapes.model_shapes(_model(), device_type="cpu")
              if s.label.startswith(("layers.0.qkv_proj", "lm_head"))]
    for s in shapes:
        s.rows, s.learned_up_to = frozenset({2, 9, 33}), 80
    events = _outputs_and_reserves(monkeypatch, shapes)
    assert ("reserve", 33 * 100 * 2) in events and max(e[2] for e in events if e[0] == "out") == 33
    for s in shapes:
        s.rows, s.learned_up_to = frozenset({2, 9, 33}), 40
    events = _outputs_and_reserves(monkeypatch, shapes)
    assert ("reserve", 80 * 100 * 2) in events


def test_a_block_that_cannot_be_reserved_leaves_the_sweep_to_allocate_as_it_goes(monkeypatch,
                                                                                   caplog):
    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 504.00 MiB")

    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: no_room() if k.get("dtype") is
                        torch.uint8 else real_empty(*a, **k))
    with caplog.at_level(logging.INFO, logger="sglang_warmup.allocator"):
        result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu")
    assert result.calls == len(list(row_counts(80))) * len(shapes) and not result.failed
    assert ("GEMM sweep: no 0.0153 MiB block reserved for its outputs (CUDA out of memory. "
            "Tried to allocate 504.00 MiB); they are allocated as they come") in caplog.text


def test_the_calls_that_held_the_cpu_are_the_load_rows_of_their_shape():
    """A call that took STALL_MS or more (cuBLAS loading a kernel) names its row count for its
    shape; every shape swept is listed, with no rows where it loaded nothing, and a shape that
    failed is not (its rows are not all known)."""
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    now = [0.0]
    slow = {("layers.0.qkv_proj (48, 32)", 1), ("layers.0.qkv_proj (48, 32)", 72),
            ("lm_head (100, 32)", 9)}
    for s in shapes:
        def timed(x, run=s.run, label=s.label):
            if label == "layers.0.gate (8, 32)" and x.shape[0] == 3:
                raise RuntimeError("no kernel")
            now[0] += 0.003 if (label, x.shape[0]) in slow else 0.0001
            return run(x)
        s.run = timed
    result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu", clock=lambda: now[0])
    keys = {s.label: s.key_text for s in shapes}
    assert result.load_rows == {keys["layers.0.qkv_proj (48, 32)"]: [1, 72],
                                keys["layers.0.o_proj (32, 32)"]: [],
                                keys["layers.0.biased (32, 32)"]: [],
                                keys["lm_head (100, 32)"]: [9]}
    assert keys["lm_head (100, 32)"] == "linear 100x32 torch.bfloat16 False UnquantizedLinearMethod"
    assert result.learned == 0 and "at the rows where" not in result.summary()


def test_a_shape_with_learned_rows_runs_at_those_only_in_the_same_order():
    shapes = gemm_shapes.model_shapes(_model(), device_type="cpu")
    order: list[tuple[str, int]] = []
    for s in shapes:
        s.run = lambda x, run=s.run, label=s.label: (order.append((label, x.shape[0])), run(x))[1]
    shapes[0].rows = frozenset({1, 72, 79, 5000})      # 5,000 is past this sweep's rows
    shapes[4].rows = frozenset()                        # it loaded nothing: not run up to 72
    for s in shapes:
        s.learned_up_to = 72                            # the learning sweep's budget ended there
    result = gemm_sweep.sweep(shapes, 80, budget_s=60.0, device="cpu")
    rows = list(row_counts(80))
    above = [r for r in rows if r > 72]                 # every row count past where it learned
    assert [r for label, r in order if label == shapes[0].label] == [1, 72, *above]
    assert [r for label, r in order if label == shapes[4].label] == above
    assert [r for label, r in order if label == shapes[1].label] == rows
    assert order.index((shapes[0].label, 72)) < order.index((shapes[1].label, 72)) \
        < order.index((shapes[1].label, 73))
    assert result.learned == 2 and result.calls == 2 + 3 * len(rows) + 2 * len(above)
    assert "5 shapes, 2 at the rows where a start from the same caches loaded a kernel" \
        in result.summary()


def _record(tmp_path, gemm):
    """A steps record with ``gemm`` (the rest as a bake writes it)."""
    import json

    doc = {"format": "sglang-warmup-steps", "version": 2, "plan": "p", "plan_sha256": "",
           "expansion_digest": "d", "steps": 1, "keep": [0], "ratio": 1.2, "min_ms": 5.0}
    if gemm is not None:
        doc["gemm"] = gemm
    path = tmp_path / "a.tar.steps.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_launch_with_a_steps_record_sweeps_each_shape_at_its_learned_rows(
        fake_cuda, tmp_path, monkeypatch, caplog):
    """The record's rows apply per shape key on the same GPU and libraries and row limit; a
    shape the record does not name is swept whole; otherwise every shape is, with a line."""
    runner = _runner(chunked_prefill_size=8192)
    shapes = gemm_shapes.model_shapes(runner.model, device_type="cpu")
    qkv, lm = shapes[0].key_text, shapes[4].key_text
    good = {"blas": BLAS, "max_rows": 8192, "reached": 2048,
            "rows": {qkv: [1, 2, 65], lm: [], "gone x": [3]}}
    monkeypatch.setenv("WARMUP_STEPS", str(_record(tmp_path, good)))
    gemm_sweep.after_load(runner)
    seen = gemm_sweep._rows_seen[-1]
    assert seen[qkv] == (frozenset({1, 2, 65}), 2048) and seen[lm] == (frozenset(), 2048)
    assert seen[shapes[1].key_text][0] is None                          # swept whole
    for gemm, why in [
        (dict(good, blas="NVIDIA H200 sm_90, torch 2.11.0, CUDA 12.8, cublas"),
         "GEMM load rows were learned on NVIDIA H200"),
        (dict(good, max_rows=4096, reached=4096), "learned for 4096 rows, this sweep goes to 8192"),
        (None, "holds no GEMM load rows"),
        (dict(good, rows={qkv: [0]}), "the steps record does not read"),
    ]:
        monkeypatch.setattr(gemm_sweep, "_done", set())          # a fresh process each
        monkeypatch.setattr(gemm_sweep, "_spent_s", 0.0)
        monkeypatch.setenv("WARMUP_STEPS", str(_record(tmp_path, gemm)))
        with caplog.at_level(logging.INFO, logger="sglang_warmup.gemm_sweep"):
            gemm_sweep.after_load(runner)
        assert {r for r, _ in gemm_sweep._rows_seen[-1].values()} == {None}, why
        assert "GEMM sweep at every row count: " in caplog.text and why in caplog.text, why
        caplog.clear()


def test_the_blas_id_names_what_picks_cublas_kernels(monkeypatch):
    """The GPU, torch and its CUDA, the BLAS library, the cuBLAS wheel installed here, and a
    workspace setting: load rows learned under other ones do not apply."""
    from importlib import metadata

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    first = gemm_sweep.blas_id()
    assert first.startswith(f"NVIDIA H100 80GB HBM3 sm_90, torch {torch.__version__}, CUDA ")
    wheel = metadata.version("nvidia-cublas")           # the pinned CPU profile installs it
    assert f"nvidia-cublas {wheel}" in first
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert gemm_sweep.blas_id() == first + ", CUBLAS_WORKSPACE_CONFIG=:4096:8"
