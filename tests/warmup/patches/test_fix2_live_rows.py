"""Fix 2 on SGLang 0.5.22's real ``_low_ratio_compress_fused``: with live rows (219) against
bucket-sized metadata (256) the c1/c2 kernels get mismatched row counts (the bug), and the
patched method hands them the live rows and restores the metadata afterwards.

The JIT kernels need a GPU, so spies stand in for them at the three call sites; each spy
applies the kernels' own check (``TensorMatcher({N})`` in c1.cuh:285 / c2.cuh:476: every
``[N]`` argument has the same N) and records the row counts it saw.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from warmup.patches import registry

LIVE, BUCKET = 219, 256
COMPRESS = "sglang.kernels.ops.attention.dsv4.low_ratio_compress"
INDEX_K = "sglang.kernels.ops.attention.dsv4.fp4_indexer_rope"


@pytest.fixture
def kernels(monkeypatch):
    """Spies for the three kernels; ``calls`` gets (kernel, rows, loc_rows)."""
    import importlib

    calls: list[tuple[str, int, int]] = []

    def spy(name, loc_index):
        def kernel(*args, **kwargs):
            rows, loc_rows = args[0].shape[0], args[loc_index].shape[0]
            calls.append((name, rows, loc_rows))
            if rows != loc_rows:
                raise RuntimeError(
                    f"Tensor match failed for {name}: expected {rows} but got {loc_rows}")
            return torch.zeros(rows, 8)
        return kernel

    compress, index_k = importlib.import_module(COMPRESS), importlib.import_module(INDEX_K)
    # c1(kv, weight, pos, raw_out_loc, ...); c2(kv_score_in, state, weight, pos, req,
    # raw_out_loc, ...); index_k(k, weight, eps, freqs, pos, out_loc, buffer, ratio=)
    monkeypatch.setattr(compress, "c1_decode_norm_rope_store", spy("c1", 3))
    monkeypatch.setattr(compress, "c2_prefill_norm_rope_store", spy("c2", 5))
    monkeypatch.setattr(index_k, "index_k_norm_rope_pack_store", spy("index_k", 5))
    return calls


def setup(backend, ratio):
    obj = object.__new__(backend.DeepseekV4AttnBackend)
    loc = lambda: torch.arange(BUCKET, dtype=torch.int64)  # noqa: E731
    core = SimpleNamespace(raw_out_loc=loc(), c1_out_loc=loc(), c2_out_loc=loc())
    obj.forward_metadata = SimpleNamespace(core_metadata=core)
    obj.token_to_kv_pool = SimpleNamespace(
        get_extra_key_buffer=lambda layer_id: torch.zeros(4, 8),
        get_extra_key_page_size=lambda layer_id: 64,
        uniform_fp8=True,
        low_ratio_index_k_is_split=lambda layer_id: False,
        get_index_k_with_scale_buffer=lambda layer_id: torch.zeros(4, 8),
        get_attention_compress_states=lambda layer_id: SimpleNamespace(
            kv_score_buffer=SimpleNamespace(kv_score=torch.zeros(4, 8)), ring_size=8),
    )
    norm = SimpleNamespace(weight=SimpleNamespace(data=torch.ones(8)), eps=1e-6)
    layer = SimpleNamespace(
        layer_id=3,
        compress_ratio=ratio,
        freqs_cis=torch.ones(LIVE, 4, dtype=torch.complex64),
        compressor=SimpleNamespace(wkv=lambda x: x, project_fused=lambda x: x, norm=norm),
        indexer=SimpleNamespace(owns_k=True, forward_wk=lambda latent: latent, k_norm=norm),
    )
    x = torch.zeros(LIVE, 8)
    req = torch.zeros(LIVE, dtype=torch.int64)
    pos = torch.arange(LIVE, dtype=torch.int64)
    offsets = (torch.tensor([0], dtype=torch.int32), torch.tensor([LIVE], dtype=torch.int32))
    return obj, core, (layer, x, req, pos), {"extend_offsets": offsets}


@pytest.mark.parametrize("ratio", [1, 2])
def test_unpatched_fused_compressor_rejects_live_rows(backend, kernels, ratio):
    obj, _, args, kwargs = setup(backend, ratio)
    with pytest.raises(RuntimeError, match=f"expected {LIVE} but got {BUCKET}"):
        obj._low_ratio_compress_fused(*args, **kwargs)


@pytest.mark.parametrize("ratio", [1, 2])
def test_patched_fused_compressor_uses_live_rows(backend, kernels, ratio):
    registry.activate()
    assert {s.number: s for s in registry.status()}[2].verdict == "applied"
    obj, core, args, kwargs = setup(backend, ratio)
    obj._low_ratio_compress_fused(*args, **kwargs)
    first = "c1" if ratio == 1 else "c2"
    assert kernels == [(first, LIVE, LIVE), ("index_k", LIVE, LIVE)]
    assert [getattr(core, n).shape[0] for n in ("raw_out_loc", "c1_out_loc", "c2_out_loc")] \
        == [BUCKET] * 3


def test_patched_fused_compressor_restores_metadata_on_error(backend, monkeypatch):
    registry.activate()
    obj, core, args, kwargs = setup(backend, 1)
    import importlib

    def failing(*a, **k):
        raise ValueError("kernel failed")

    monkeypatch.setattr(importlib.import_module(COMPRESS), "c1_decode_norm_rope_store", failing)
    with pytest.raises(ValueError, match="kernel failed"):
        obj._low_ratio_compress_fused(*args, **kwargs)
    assert core.raw_out_loc.shape[0] == BUCKET and core.c1_out_loc.shape[0] == BUCKET


def test_equal_lengths_are_untouched(backend, kernels):
    registry.activate()
    obj, core, (layer, x, req, pos), kwargs = setup(backend, 2)
    before = core.raw_out_loc
    full = torch.arange(BUCKET, dtype=torch.int64)
    layer.freqs_cis = torch.ones(BUCKET, 4, dtype=torch.complex64)
    obj._low_ratio_compress_fused(layer, torch.zeros(BUCKET, 8), full, full, **kwargs)
    assert kernels == [("c2", BUCKET, BUCKET), ("index_k", BUCKET, BUCKET)]
    assert core.raw_out_loc is before
