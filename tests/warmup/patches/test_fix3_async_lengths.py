"""Fix 3 on SGLang 0.5.22's real ``SparsePrefillChunkCache.ensure_compressed``: the original
uploads the per-request lengths with a pageable ``torch.tensor(list, device=...)``; the
rewritten method uploads them with ``async_h2d`` and computes the identical gather.

The host-blocking itself (the pageable copy waiting for queued graph work) needs a GPU; on a
CPU the test proves which upload each version makes and that the results are identical.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from warmup.patches import registry
from warmup.patches.source import MARK

SEQ_LENS = [300, 40]
RATIO, C_PAGE = 4, 64
EXPECTED_LENGTHS = [75, 10]


def chunk_cache(module):
    seq = torch.tensor(SEQ_LENS, dtype=torch.int32)
    return module.SparsePrefillChunkCache(
        num_reqs=2, num_qo_tokens=3, max_seq_len=max(SEQ_LENS), swa_window_size=128,
        swa_page_size=256, seq_lens=seq,
        query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
        query_pos=torch.tensor([298, 299, 39], dtype=torch.int32),
        swa_token_ids=torch.zeros(168, dtype=torch.int32),
        swa_first_pos=torch.tensor([172, 0], dtype=torch.int32),
        swa_gather_lens=torch.tensor([128, 40], dtype=torch.int32),
        swa_offsets=torch.tensor([0, 128, 168], dtype=torch.int32),
        seq_lens_cpu=list(SEQ_LENS),
    )


PAGE_TABLE = torch.tensor([[7, 9], [7, 9], [3, 0]], dtype=torch.int32)


@pytest.fixture
def uploads(sparse_utils, monkeypatch):
    """Record ``torch.tensor(list, device=...)`` calls made by the module's code."""
    seen: list[list[int]] = []

    class TorchSpy:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def tensor(data, *args, **kwargs):
            if isinstance(data, list) and "device" in kwargs:
                seen.append(list(data))
            return torch.tensor(data, *args, **kwargs)

    monkeypatch.setattr(sparse_utils, "torch", TorchSpy())
    return seen


def test_original_uploads_lengths_with_a_pageable_copy(sparse_utils, uploads):
    chunk_cache(sparse_utils).ensure_compressed(RATIO, PAGE_TABLE, C_PAGE)
    assert uploads == [EXPECTED_LENGTHS]


def test_rewritten_method_uses_async_h2d_and_gathers_the_same(sparse_utils, uploads,
                                                             monkeypatch):
    expected = chunk_cache(sparse_utils).ensure_compressed(RATIO, PAGE_TABLE, C_PAGE)
    uploads.clear()
    registry.activate()
    status = {s.number: s for s in registry.status()}[3]
    assert (status.verdict, status.detected) == ("applied", "needed/exact")
    method = sparse_utils.SparsePrefillChunkCache.ensure_compressed
    assert getattr(method, MARK) == 3

    helper_calls: list[tuple] = []
    real = sparse_utils.__sglang_warmup_async_h2d__

    def spy(args, *, dtype, device):
        helper_calls.append((list(args), dtype, device))
        return real(args, dtype=dtype, device=device)

    monkeypatch.setattr(sparse_utils, "__sglang_warmup_async_h2d__", spy)
    got = chunk_cache(sparse_utils).ensure_compressed(RATIO, PAGE_TABLE, C_PAGE)
    assert uploads == []
    assert helper_calls == [(EXPECTED_LENGTHS, torch.int32, torch.device("cpu"))]
    for name in ("flat_token_ids", "compressed_base", "swa_base"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_injected_helper_is_sglang_async_h2d(sparse_utils):
    from sglang.srt.utils.common import async_h2d

    registry.activate()
    assert sparse_utils.__sglang_warmup_async_h2d__ is async_h2d


def test_rewritten_source_is_what_runs(sparse_utils):
    registry.activate()
    method = sparse_utils.SparsePrefillChunkCache.ensure_compressed
    text = inspect.getsource(method)
    assert "lengths = __sglang_warmup_async_h2d__(lengths_cpu, dtype=torch.int32, " \
           "device=device)" in text
    assert "torch.tensor(lengths_cpu" not in text
    original = method.__sglang_warmup_original__
    # Line numbers stay aligned with SGLang's file, so tracebacks point at the right line.
    assert method.__code__.co_firstlineno == original.__code__.co_firstlineno
    assert method.__code__.co_filename.startswith("<sglang-warmup fix 3: ")
    registry.revert()
    assert sparse_utils.SparsePrefillChunkCache.ensure_compressed is original
