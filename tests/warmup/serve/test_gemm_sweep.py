"""warmup.serve.gemm_sweep: the dense GEMM shapes of a model built from SGLang's real linear
methods, swept on the CPU (the same code the scheduler runs on its GPU), and the wrap of SGLang's
real ``ModelRunner.load_model`` (0.5.22 installed, 0.5.23 under .deps)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch

from warmup.serve import gemm_sweep
from warmup.serve.gemm_sweep import row_counts

ROOT = Path(__file__).resolve().parents[3]


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
    shapes = gemm_sweep.model_shapes(_model(), device_type="cpu")
    labels = [s.label for s in shapes]
    assert labels == ["layers.0.qkv_proj (48, 32)", "layers.0.o_proj (32, 32)",
                      "layers.0.gate (8, 32)", "layers.0.biased (32, 32)",
                      "lm_head (100, 32)"], labels
    assert gemm_sweep.model_shapes(_model(), device_type="cuda") == []  # weights on the CPU


def test_the_sweep_runs_every_shape_at_every_row_count_through_the_layers_own_method():
    model = _model()
    shapes = gemm_sweep.model_shapes(model, device_type="cpu")
    seen: dict[str, list[tuple[int, ...]]] = {}
    for s in shapes:
        run = s.run

        def spy(x, run=run, label=s.label):
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
        assert s.buffer is None                                 # freed
    assert "5 shapes" in result.summary() and "complete" in result.summary()


def test_the_budget_stops_the_sweep_after_the_smallest_row_counts():
    shapes = gemm_sweep.model_shapes(_model(), device_type="cpu")
    ticks = iter(range(1000))
    result = gemm_sweep.sweep(shapes, 8192, budget_s=9.5, device="cpu",
                              clock=lambda: float(next(ticks)))
    assert result.stopped_by_budget and result.rows_reached == 10
    assert result.calls == 10 * len(shapes)
    assert "stopped by its time budget" in result.summary()
    assert gemm_sweep.sweep(shapes, 8192, budget_s=0, device="cpu").calls == 0


def test_a_shape_too_large_for_the_buffer_limit_stops_at_fewer_rows(monkeypatch):
    monkeypatch.setattr(gemm_sweep, "MAX_BUFFER_BYTES", (48 + 32) * 2 * 20)
    shapes = [s for s in gemm_sweep.model_shapes(_model(), device_type="cpu")
              if s.label.startswith("layers.0.qkv_proj")]
    result = gemm_sweep.sweep(shapes, 64, budget_s=60.0, device="cpu")
    assert shapes[0].max_rows == 20 and result.calls == 20 and result.rows_reached == 64


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
    gemm_sweep._wrap(mod)                                # once only
    assert mod.ModelRunner.load_model.__wrapped__.__name__ == "load_model"
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
    runner.load_model()
    assert gemm_sweep.after_load(runner) is None         # the CPU machine: no CUDA
    monkeypatch.setenv("WARMUP_GEMM_SWEEP_S", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gemm_sweep.after_load(runner) is None


@pytest.mark.parametrize("site", [
    ROOT / ".venv/lib/python3.11/site-packages", ROOT / ".deps/sglang-0.5.23"],
    ids=["0.5.22", "0.5.23"])
def test_sglangs_model_runner_loads_the_model_before_it_sizes_memory_and_captures(site):
    """What the wrap relies on, read from SGLang's real source: the runner's construction
    (``__init__`` -> ``initialize``) calls ``self.load_model()``, and nothing that sizes the KV
    cache or captures CUDA graphs comes before it."""
    path = site / "sglang/srt/model_executor/model_runner.py"
    if not path.exists():
        pytest.skip(f"{path} not installed")
    tree = ast.parse(path.read_text())
    runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")
    methods = {n.name: n for n in runner.body if isinstance(n, ast.FunctionDef)}
    assert "load_model" in methods

    def calls(method):
        return [n.func.attr for n in ast.walk(methods[method])
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]

    assert "initialize" in calls("__init__")
    init = calls("initialize")
    before = init[:init.index("load_model")]
    assert before and not [c for c in before if "memory" in c and "saver" not in c or
                           "graph" in c], before


def test_the_plugin_arms_the_sweep_through_the_post_import_hook(monkeypatch):
    from warmup.observe.importer import finder
    from warmup.serve import plugin

    monkeypatch.setattr(plugin, "_registered", False)
    for name, value in (("WARMUP_ENABLE", "1"), ("WARMUP_METRICS", "0"),
                        ("WARMUP_PATCHES", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WARMUP_PLAN", raising=False)
    monkeypatch.delitem(__import__("sys").modules, gemm_sweep.MODEL_RUNNER, raising=False)
    try:
        plugin.register()
        assert gemm_sweep.MODEL_RUNNER in finder().watched
    finally:
        finder().unwatch(gemm_sweep.MODEL_RUNNER, gemm_sweep._wrap)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv("WARMUP_GEMM_SWEEP_S", "0")
    plugin.register()
    assert gemm_sweep.MODEL_RUNNER not in finder().watched


def test_the_sweep_is_a_compile_log_record_that_the_run_report_shows(tmp_path, monkeypatch):
    """``record`` writes through the real compile-event installation into the state directory;
    the driver's ``with_compiles`` over that log puts the sweep in the report and its text."""
    from prometheus_client import CollectorRegistry

    from cache_tools import compile_log
    from warmup.observe import events, phase
    from warmup.serve.report import RunReport, render

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    events.uninstall()
    phase.reset()
    try:
        phase.set_phase("init", state_dir=str(tmp_path))
        events.install(registry=CollectorRegistry(), state_dir=tmp_path)
        shapes = gemm_sweep.model_shapes(_model(), device_type="cpu")
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
    from warmup.serve.report import render
    assert render(report).splitlines()[-1] == (
        "GEMM sweep before the warm-up: 2 scheduler(s), 4 shapes, rows 1-8192 of 8192, 4.0 s; "
        "1 stopped by WARMUP_GEMM_SWEEP_S")
