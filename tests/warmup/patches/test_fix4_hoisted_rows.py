"""Fix 4 on SGLang 0.5.22's real ``forward_low_ratio_sources``: inside the late-layer tail
the eager ratio-1/2 break sees 128 live rows while the hoisted rows have the block size
(2,048); the original falls back to expanding the whole extend (8,192 tokens) into 128 rows
and fails (on a CPU: ``allocated size does not match required size``, on a GPU the
repeat_interleave device assert), the patched method uses the leading hoisted rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from warmup.patches import registry

BLOCK, LIVE, EXTEND, REQ = 2048, 128, 8192, 5


def extend_mode():
    return SimpleNamespace(is_idle=lambda: False, is_extend=lambda: True,
                           is_decode=lambda: False, is_target_verify=lambda: False)


def setup(backend, monkeypatch, *, tail=True):
    monkeypatch.setattr(backend, "dsa_use_prefill_cp", lambda forward_batch: False)
    obj = object.__new__(backend.DeepseekV4AttnBackend)
    seen: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    obj._low_ratio_in_prefill_graph = lambda: False
    obj._low_ratio_compress = lambda layer, x, req, pos, fb: seen.append(("compress", req, pos))
    obj._low_ratio_index_topk = (
        lambda layer, x, q_lora, req, pos, fb: seen.append(("index", req, pos)))
    # The tail builder's layout: the real rows first, then padding up to the block size.
    hoisted_req = torch.zeros(BLOCK, dtype=torch.int64)
    hoisted_req[:LIVE] = REQ
    hoisted_pos = torch.zeros(BLOCK, dtype=torch.int64)
    hoisted_pos[:LIVE] = torch.arange(EXTEND - LIVE, EXTEND)
    meta = SimpleNamespace(low_ratio_req_indices=hoisted_req, low_ratio_pos_i64=hoisted_pos,
                           late_layer_tail=object() if tail else None)
    obj.forward_metadata = meta
    forward_batch = SimpleNamespace(
        forward_mode=extend_mode(), encoder_swa_replay=False,
        req_pool_indices=torch.tensor([REQ]), extend_seq_lens=torch.tensor([EXTEND]))
    layer = SimpleNamespace(compressor=object(), indexer=object(), compress_ratio=1)
    kwargs = dict(layer=layer, x=torch.zeros(LIVE, 4), q_lora=torch.zeros(LIVE, 4),
                  positions=torch.arange(EXTEND - LIVE, EXTEND), forward_batch=forward_batch)
    return obj, meta, seen, kwargs


def test_unpatched_tail_break_expands_the_whole_extend(backend, monkeypatch):
    obj, _, seen, kwargs = setup(backend, monkeypatch)
    with pytest.raises(RuntimeError, match="allocated size does not match required size"):
        obj.forward_low_ratio_sources(**kwargs)
    assert seen == []


def test_patched_tail_break_takes_the_leading_hoisted_rows(backend, monkeypatch):
    registry.activate()
    assert {s.number: s for s in registry.status()}[4].verdict == "applied"
    obj, meta, seen, kwargs = setup(backend, monkeypatch)
    obj.forward_low_ratio_sources(**kwargs)
    assert [name for name, _, _ in seen] == ["compress", "index"]
    for _, req, pos in seen:
        assert req.tolist() == [REQ] * LIVE
        assert pos.tolist() == list(range(EXTEND - LIVE, EXTEND))
    assert meta.low_ratio_req_indices.shape[0] == BLOCK
    assert meta.low_ratio_pos_i64.shape[0] == BLOCK


def test_without_the_tail_nothing_changes(backend, monkeypatch):
    registry.activate()
    obj, meta, seen, kwargs = setup(backend, monkeypatch, tail=False)
    # Same fallback as SGLang's own code: outside the tail fix 4 does not intervene.
    with pytest.raises(RuntimeError, match="allocated size does not match required size"):
        obj.forward_low_ratio_sources(**kwargs)
    assert meta.low_ratio_pos_i64.shape[0] == BLOCK
