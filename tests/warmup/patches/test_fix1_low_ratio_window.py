"""Fix 1 on SGLang 0.5.22's real backend: the property that sends ratio-1/2 sources into the
captured indexer stays True for graphs wider than the candidate window (the bug), and the
patched property keeps them eager there."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from warmup.patches import registry
from warmup.patches.source import MARK

WIDTHS = (None, 16_384, 262_144)


def bare_backend(backend, **extra):
    """A DeepseekV4AttnBackend without __init__ (no GPU): the attributes the property reads."""
    obj = object.__new__(backend.DeepseekV4AttnBackend)
    obj.low_ratios = (1, 2)
    config = SimpleNamespace(candidate_topk_blocks=2048, candidate_block_size=8)
    obj.model_runner = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=config))
    obj.enable_decoder_swa_bounded_replay = False
    for name, value in extra.items():
        setattr(obj, name, value)
    return obj


@pytest.fixture
def sm100(backend, monkeypatch):
    """What an SM100 GPU with the fp4 indexer and no attention-CP answers."""
    monkeypatch.setattr(backend, "has_dense_fp4_indexer", lambda: True)
    monkeypatch.setattr(backend, "is_sm100_or_newer", lambda: True)
    monkeypatch.setattr(backend, "get_parallel", lambda: SimpleNamespace(attn_cp_size=1))

    def at(width):
        monkeypatch.setattr(backend, "_prefill_graph_max_seq_len", lambda: width)

    return at


def answers(backend, sm100, obj) -> list[bool]:
    result = []
    for width in WIDTHS:
        sm100(width)
        result.append(obj.low_ratio_prefill_graph)
    return result


def test_unpatched_property_captures_wide_graphs(backend, sm100):
    assert answers(backend, sm100, bare_backend(backend)) == [True, True, True]


def test_original_capture_asserts_on_a_wide_graph(backend):
    # The failure fix 1 avoids: SGLang's captured indexer at the PR recipe's 262,144 width.
    obj = bare_backend(backend)
    indexer = SimpleNamespace(uses_candidates=True, is_candidate_source=False,
                              candidate_topk_blocks=2048, candidate_block_size=8)
    obj.forward_metadata = SimpleNamespace(
        core_metadata=None, c1_indexer_metadata=SimpleNamespace(max_compressed_seq_len=262_144))
    layer = SimpleNamespace(compress_ratio=1, indexer=indexer, layer_id=0)
    with pytest.raises(AssertionError,
                       match="prefill graph indexer width 262144 exceeds the candidate window"):
        obj._low_ratio_index_topk_captured(layer, None, None)


def test_patched_property_keeps_wide_graphs_eager(backend, sm100):
    registry.activate()
    status = {s.number: s for s in registry.status()}[1]
    assert (status.verdict, status.detected) == ("applied", "needed/exact")
    fget = vars(backend.DeepseekV4AttnBackend)["low_ratio_prefill_graph"].fget
    assert getattr(fget, MARK) == 1
    assert answers(backend, sm100, bare_backend(backend)) == [True, True, False]
    # Inherited by the multi-step backend (class-level patch).
    assert backend.DeepseekV4MultiStepBackend.low_ratio_prefill_graph.fget is fget


def test_lifted_cap_uses_the_capture_width(backend, sm100):
    # With fix 5 the cap is unset: the captured metadata spans req_to_token's width.
    registry.activate()
    sm100(None)
    assert bare_backend(backend, MAX_SEQ_LEN_FOR_CAPTURE=1_048_576).low_ratio_prefill_graph is False
    assert bare_backend(backend, MAX_SEQ_LEN_FOR_CAPTURE=16_384).low_ratio_prefill_graph is True
    assert bare_backend(backend, MAX_SEQ_LEN_FOR_CAPTURE=32_768,
                        low_ratios=(2,)).low_ratio_prefill_graph is True


def test_decoder_replay_without_fix4_stands_aside(backend, sm100, monkeypatch, caplog):
    monkeypatch.setenv("WARMUP_FIX_4", "off")
    registry.activate()
    sm100(262_144)
    obj = bare_backend(backend, enable_decoder_swa_bounded_replay=True)
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.patches"):
        assert obj.low_ratio_prefill_graph is True
        assert obj.low_ratio_prefill_graph is True
    warnings = [r.getMessage() for r in caplog.records if "stands aside" in r.getMessage()]
    assert warnings == [
        "sglang-warmup: fix 1 stands aside: --enable-decoder-swa-bounded-replay needs fix 4, "
        "which is not active; a prefill graph wider than the candidate window will fail at "
        "capture"
    ]


def test_decoder_replay_with_fix4_keeps_wide_graphs_eager(backend, sm100):
    registry.activate()
    sm100(262_144)
    assert bare_backend(backend, enable_decoder_swa_bounded_replay=True).low_ratio_prefill_graph is False


def test_not_sm100_is_unchanged(backend, sm100, monkeypatch):
    registry.activate()
    monkeypatch.setattr(backend, "is_sm100_or_newer", lambda: False)
    assert answers(backend, sm100, bare_backend(backend)) == [False, False, False]
