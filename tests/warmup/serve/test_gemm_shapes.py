"""warmup.serve.gemm_shapes: the GEMMs SGLang's model code runs on a layer's weight itself
(DeepSeek-V4's compressor scores and grouped ``wo_a``), found on SGLang's real classes and run
through their real code on the CPU; what the call sites rely on, read from the source of both
releases (0.5.22 installed, 0.5.23 under .deps)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from warmup.serve import gemm_shapes, gemm_sweep

ROOT = Path(__file__).resolve().parents[3]
SITES = [ROOT / ".venv/lib/python3.11/site-packages", ROOT / ".deps/sglang-0.5.23"]


class _Linear(torch.nn.Module):
    def __init__(self, method, out_f, in_f, dtype=torch.bfloat16):
        super().__init__()
        self.quant_method = method
        self.weight = torch.nn.Parameter(torch.randn(out_f, in_f, dtype=dtype),
                                         requires_grad=False)
        self.bias = None


class _FP8Method:
    """A quantized method: never swept."""


def _unquantized():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    return UnquantizedLinearMethod()


def _bare(cls):
    """An instance of SGLang's real class without its constructor (which needs a whole model
    config and a process group): the attributes the call site reads are set by the test."""
    owner = cls.__new__(cls)
    torch.nn.Module.__init__(owner)
    return owner


def _compressor(out_f=16, in_f=32):
    from sglang.srt.layers.attention.dsv4.compressor import Compressor

    owner = _bare(Compressor)
    owner.wkv_gate = _Linear(_unquantized(), out_f, in_f)
    return owner


def _attention(groups=2, rank=4, width=16, method=None):
    from sglang.srt.models.deepseek_v4 import MQALayer

    owner = _bare(MQALayer)
    owner.n_local_groups, owner.o_lora_rank = groups, rank
    owner.wo_a = _Linear(method or _unquantized(), groups * rank, width)
    return owner


def _by_what(model):
    return {s.key[0]: s for s in gemm_shapes.model_shapes(model, device_type="cpu")}


def test_the_compressors_scores_run_through_sglangs_own_method_with_an_fp32_output():
    model = torch.nn.Module()
    model.compressor = _compressor()
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    assert [s.key_text for s in shapes] == ["kv_score 16x32 torch.bfloat16 False Compressor"]
    (s,) = shapes
    assert s.label == "compressor.wkv_gate (16, 32)"
    assert (s.in_features, s.out_features, s.out_itemsize) == (32, 16, 4)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    out = s.run(x)
    w = model.compressor.wkv_gate.weight
    assert out.dtype == torch.float32 and tuple(out.shape) == (3, 16)
    assert torch.allclose(out, model.compressor._compute_wkv_gate(x))
    assert torch.allclose(out, x.float() @ w.float().T)


def test_an_older_compressor_runs_its_modules_linear_bf16_fp32(monkeypatch):
    """SGLang 0.5.17's compressor has no ``_compute_wkv_gate``: its ``compute_kv_score`` calls
    the ``linear_bf16_fp32`` its module imported, and so does the sweep."""
    from sglang.kernels.ops.gemm.bf16_fp32 import linear_bf16_fp32

    class Compressor(torch.nn.Module):
        def compute_kv_score(self, x, forward_batch):
            return linear_bf16_fp32(x, self.wkv_gate.weight)

    called = []
    monkeypatch.setattr(sys.modules[__name__], "linear_bf16_fp32",
                        lambda x, w: called.append(tuple(x.shape)) or linear_bf16_fp32(x, w),
                        raising=False)
    model = torch.nn.Module()
    model.compressor = Compressor()
    model.compressor.wkv_gate = _Linear(_unquantized(), 16, 32)
    s = _by_what(model)["kv_score"]
    assert s.run(torch.zeros(5, 32, dtype=torch.bfloat16)).dtype == torch.float32
    assert called == [(5, 32)]


def test_a_compressor_whose_module_has_no_gemm_keeps_its_layer_as_a_linear_one():
    class Compressor(torch.nn.Module):
        def compute_kv_score(self, x, forward_batch):
            raise AssertionError("not called")

    model = torch.nn.Module()
    model.compressor = Compressor()
    model.compressor.wkv_gate = _Linear(_unquantized(), 16, 32)
    assert [s.key_text for s in gemm_shapes.model_shapes(model, device_type="cpu")] == [
        "linear 16x32 torch.bfloat16 False UnquantizedLinearMethod"]


def test_wo_a_runs_as_the_attentions_grouped_einsum():
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([_attention(), _attention()])   # one shape, swept once
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    assert [s.key_text for s in shapes] == ["grouped_einsum 8x16 torch.bfloat16 False MQALayer"]
    (s,) = shapes
    # the input is the tokens' groups side by side: 2 groups of 16; the output 2 x 4 per token
    assert (s.in_features, s.out_features, s.out_itemsize) == (32, 8, 2)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    w = model.layers[0].wo_a.weight
    expected = torch.einsum("tgd,grd->tgr", x.view(3, 2, 16), w.view(2, 4, 16))
    assert torch.equal(s.run(x), expected)


@pytest.mark.parametrize("change", ["rank", "quantized", "missing"])
def test_an_attention_the_einsum_does_not_fit_is_not_a_call_site(change):
    """A ``wo_a`` that is not ``groups x rank`` rows stays a linear layer; an FP8 one
    (DeepGEMM's ``fp8_einsum``) and one without its owner's group count are not the site."""
    owner = _attention(method=_FP8Method() if change == "quantized" else None)
    if change == "rank":
        owner.o_lora_rank = 3
    elif change == "missing":
        del owner.n_local_groups
    model = torch.nn.Module()
    model.attn = owner
    keys = [s.key_text for s in gemm_shapes.model_shapes(model, device_type="cpu")]
    assert keys == ([] if change == "quantized" else
                    ["linear 8x16 torch.bfloat16 False UnquantizedLinearMethod"])


def test_the_sweep_sizes_an_fp32_output_by_its_own_bytes(monkeypatch):
    """The compressor's output is fp32: a row takes 32 x 2 + 16 x 4 bytes, and the block the
    sweep reserves is its largest output in fp32."""
    model = torch.nn.Module()
    model.compressor = _compressor()
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    monkeypatch.setattr(gemm_sweep, "MAX_BUFFER_BYTES", (32 * 2 + 16 * 4) * 10)
    reserved = []
    monkeypatch.setattr(gemm_sweep.allocator, "reserve", lambda n, device: reserved.append(n))
    result = gemm_sweep.sweep(shapes, 64, budget_s=60.0, device="cpu")
    assert shapes[0].max_rows == 10 and result.calls == 10
    assert reserved == [10 * 16 * 4]
    assert set(result.load_rows) == {"kv_score 16x32 torch.bfloat16 False Compressor"}


_FILES = ("sglang/srt/layers/attention/dsv4/compressor.py", "sglang/srt/models/deepseek_v4.py",
          "sglang/srt/models/deepseek_v2.py")


def _read(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


#: the SGLang sources the call sites rely on, per release: (text, syntax tree), read and parsed
#: once at collection (CPython 3.11's ``ast.parse`` can fail spuriously while a thread another
#: test left behind parses too: tests/test_architecture.py)
SOURCES = {site: {f: _read(site / f) for f in _FILES} for site in SITES}


def _classes(site: Path, file: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.walk(SOURCES[site][file][1]) if isinstance(n, ast.ClassDef)}


def _assigned(cls: ast.ClassDef) -> set[str]:
    return {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


@pytest.mark.parametrize("site", SITES, ids=["0.5.22", "0.5.23"])
def test_what_the_call_sites_read_is_in_sglangs_source(site):
    """The compressor class holds ``wkv_gate`` and ``compute_kv_score``, and the scores come
    from ``linear_bf16_fp32``; the attention holding ``wo_a`` holds its group count and rank, and
    its module multiplies ``wo_a`` with the einsum the sweep runs."""
    cls = _classes(site, _FILES[0])["Compressor"]
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "compute_kv_score" in methods and "wkv_gate" in _assigned(cls)
    assert "linear_bf16_fp32(x, " in SOURCES[site][_FILES[0]][0]
    owners = [c for c in _classes(site, _FILES[1]).values()
              if {"wo_a", "n_local_groups", "o_lora_rank"} <= _assigned(c)]
    assert owners, "no class holds wo_a with its group count and rank"
    assert 'torch.einsum("tgd,grd->tgr", o, wo_a)' in SOURCES[site][_FILES[1]][0]


@pytest.fixture
def published(monkeypatch, tiny_model_dir):
    """SGLang's runtime context as the scheduler has it once the model is loaded (a router
    gate's forward reads it)."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", str(tiny_model_dir), "--device", "cuda",
                              "--skip-tokenizer-init"])
    sa.resolve_once()
    monkeypatch.setattr(runtime_context.get_context(), "_config_bags",
                        runtime_context._build_config_bags(sa))


def _gate(experts=16, hidden=32, dtype=torch.bfloat16):
    from sglang.srt.models.deepseek_v2 import MoEGate

    gate = _bare(MoEGate)
    gate.weight = torch.nn.Parameter(torch.randn(experts, hidden, dtype=dtype),
                                     requires_grad=False)
    gate.tiny_router_gemm_max_tokens = 0
    return gate


def test_a_router_gate_runs_through_its_own_forward(published):
    """DeepSeek's ``MoEGate`` owns its weight (no linear layer, no quantization method): its
    forward is the GEMM (on the GPU cuBLAS's bf16 x bf16 -> fp32 above its small-batch rows),
    and the sweep calls that forward."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
    for layer in model.layers:
        layer.gate = _gate()
    shapes = gemm_shapes.model_shapes(model, device_type="cpu")
    assert [s.key_text for s in shapes] == ["router_gate 16x32 torch.bfloat16 False MoEGate"]
    (s,) = shapes
    assert s.label == "layers.0.gate (16, 32)" and s.out_itemsize == 4
    x = torch.randn(7, 32, dtype=torch.bfloat16)
    assert torch.equal(s.run(x), model.layers[0].gate(x))


def test_a_gate_of_another_name_or_a_forward_that_needs_more_is_not_one():
    class Router(torch.nn.Module):                  # not a gate SGLang's MoE layers hold
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)

        def forward(self, x):
            return x @ self.weight.T

    class MoEGate(Router):                          # its forward needs the batch as well
        def forward(self, x, forward_batch):
            return x @ self.weight.T

    model = torch.nn.Module()
    model.router, model.gate = Router(), MoEGate()
    assert gemm_shapes.model_shapes(model, device_type="cpu") == []


@pytest.mark.parametrize("site", SITES, ids=["0.5.22", "0.5.23"])
def test_deepseeks_router_gate_is_a_gemm_on_its_own_weight_in_sglangs_source(site):
    gate = _classes(site, _FILES[2])["MoEGate"]
    forward = next(n for n in gate.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    args = forward.args
    assert [a.arg for a in args.args[:2]] == ["self", "hidden_states"]
    assert len(args.defaults) == len(args.args) - 2          # the rest have defaults
    assert "weight" in _assigned(gate) and "linear_bf16_fp32(hidden_states, self.weight)" in \
        ast.get_source_segment(SOURCES[site][_FILES[2]][0], forward)
