"""Fix 5 on SGLang 0.5.22's real server-argument validation: ``ServerArgs`` parsed from the
PR's recipe flags, SGLang's own ``parse_cuda_graph_config``, and the real
``validate_deepseek_v41_features`` as ``model_hook`` calls it.  Only the model config (no
checkpoint here) and, where the test says so, the platform are stand-ins."""

from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace

import pytest

from warmup.patches import registry
from warmup.patches.source import MARK

CUDA = SimpleNamespace(is_cuda=True, is_hip=False)
HIP = SimpleNamespace(is_cuda=False, is_hip=True)
RECIPE = ("--model-path dummy --cuda-graph-backend-prefill breakable "
          "--cuda-graph-bs-prefill 128 256 512 1024 2048 3072 4096 6144 8192 "
          "--cuda-graph-prefill-max-context 262144")


@pytest.fixture(scope="module")
def sglang_args():
    from sglang.srt.arg_groups import cuda_graph_hook
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)

    def make(extra: str = ""):
        args = ServerArgs.from_cli_args(parser.parse_args(f"{RECIPE} {extra}".split()))
        cuda_graph_hook.parse_cuda_graph_config(args)
        # The checkpoint's config is all validation reads from the model: V4.1.
        args._model_config = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v41"))
        return args

    def max_seq_len(args):
        return resolving_view(args).cuda_graph_config.prefill.max_seq_len

    return SimpleNamespace(make=make, max_seq_len=max_seq_len)


def validate(hook, sglang_args, extra: str = ""):
    args = sglang_args.make(extra)
    hook.validate_deepseek_v41_features(args)  # looked up on the module, like model_hook
    return sglang_args.max_seq_len(args)


def fix5_status():
    return {s.number: s for s in registry.status()}[5]


def test_unpatched_hook_caps_at_16k(hook, sglang_args, monkeypatch):
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    assert validate(hook, sglang_args) == 16_384


def test_patched_hook_lifts_the_cap_on_cuda(hook, sglang_args, monkeypatch, caplog):
    registry.activate()
    assert getattr(hook.validate_deepseek_v41_features, MARK) == 5
    assert (fix5_status().verdict, fix5_status().detected) == ("applied", "needed/exact")
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.patches"):
        assert validate(hook, sglang_args) is None
    assert [r.getMessage() for r in caplog.records if "fix 5 lifted" in r.getMessage()
            or "fix 5 kept" in r.getMessage()] == [
        "sglang-warmup: fix 5 lifted the 16,384-token prefill-graph context cap for "
        "DeepSeek-V4.1: fixes 1 and 2 are active on CUDA"
    ]
    assert fix5_status().reason.endswith(
        "last validation lifted the cap: fixes 1 and 2 are active on CUDA")


@pytest.mark.parametrize("context, cap, captured", [("262144", None, False),
                                                    ("16384", 16_384, True)])
def test_lifted_cap_and_fix1_agree(hook, backend, sglang_args, monkeypatch, context, cap, captured):
    # End to end on the real functions: the hook resolves the prefill config with the cap
    # lifted, the backend reads it through its own _prefill_graph_max_seq_len, and the
    # patched property keeps the sources eager exactly when the graph is wider than the window.
    import sglang.srt.runtime_context as runtime_context

    from .test_fix1_low_ratio_window import bare_backend

    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    args = sglang_args.make(f"--cuda-graph-prefill-max-context {context}")
    hook.validate_deepseek_v41_features(args)
    from sglang.srt.arg_groups.model_override_base import resolving_view

    resolved = resolving_view(args).cuda_graph_config
    assert (resolved.prefill.max_seq_len, resolved.prefill.max_context_size) == (cap, int(context))
    monkeypatch.setattr(runtime_context, "get_exec",
                        lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=resolved)))
    monkeypatch.setattr(backend, "has_dense_fp4_indexer", lambda: True)
    monkeypatch.setattr(backend, "is_sm100_or_newer", lambda: True)
    monkeypatch.setattr(backend, "get_parallel", lambda: SimpleNamespace(attn_cp_size=1))
    assert backend._prefill_graph_max_seq_len() == cap
    obj = bare_backend(backend, MAX_SEQ_LEN_FOR_CAPTURE=1_048_576)
    assert obj.low_ratio_prefill_graph is captured


@pytest.mark.parametrize("platform", [HIP, SimpleNamespace(is_cuda=False, is_hip=False)])
def test_cap_stays_off_cuda(hook, sglang_args, monkeypatch, platform):
    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: platform)
    assert validate(hook, sglang_args) == 16_384
    assert fix5_status().reason.endswith(
        "last validation kept the cap: the platform is not CUDA (the ROCm radix backend "
        "sizes its graph metadata by the cap)")


def test_decoder_replay_keeps_the_cap_unless_forced(hook, sglang_args, monkeypatch):
    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    assert validate(hook, sglang_args, "--enable-decoder-swa-bounded-replay") == 16_384
    assert "set WARMUP_FIX_5=on to lift the cap anyway" in fix5_status().reason
    monkeypatch.setenv("WARMUP_FIX_5", "on")
    assert validate(hook, sglang_args, "--enable-decoder-swa-bounded-replay") is None
    assert fix5_status().reason.endswith(
        "last validation lifted the cap: fixes 1, 2 and 4 are active and WARMUP_FIX_5=on")


def test_forced_decoder_replay_still_needs_fix4(hook, sglang_args, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_4", "off")
    monkeypatch.setenv("WARMUP_FIX_5", "on")
    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    assert validate(hook, sglang_args, "--enable-decoder-swa-bounded-replay") == 16_384
    assert fix5_status().reason.endswith(
        "last validation kept the cap: --enable-decoder-swa-bounded-replay needs fix 4, "
        "which is off (WARMUP_FIX_4=off)")


def test_explicit_max_seq_len_is_untouched(hook, sglang_args, monkeypatch, caplog):
    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    with caplog.at_level(logging.INFO, logger="sglang_warmup.patches"):
        assert validate(hook, sglang_args, "--cuda-graph-max-seq-len-prefill 65536") == 65_536
    assert not [r for r in caplog.records if "fix 5 lifted" in r.getMessage()
                or "fix 5 kept" in r.getMessage()]


@pytest.mark.parametrize("off, expected", [
    ("1", "fix 1 (low-ratio window) is off (WARMUP_FIX_1=off); the 16,384 cap stays"),
    ("2", "fix 2 (fused compressor rows) is off (WARMUP_FIX_2=off); the 16,384 cap stays"),
])
def test_cap_stays_without_fixes_1_and_2(hook, sglang_args, monkeypatch, off, expected):
    monkeypatch.setenv(f"WARMUP_FIX_{off}", "off")
    registry.activate()
    assert (fix5_status().verdict, fix5_status().reason) == ("refused", expected)
    assert not hasattr(hook.validate_deepseek_v41_features, MARK)
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    assert validate(hook, sglang_args) == 16_384


def test_fix5_off(hook, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_5", "off")
    registry.activate()
    assert (fix5_status().verdict, fix5_status().reason) == ("off", "WARMUP_FIX_5=off")
    assert not hasattr(hook.validate_deepseek_v41_features, MARK)


@pytest.mark.parametrize("context", [None, "8192", "16384"])
def test_a_launch_asking_for_no_wide_context_captures_as_before(hook, sglang_args, monkeypatch,
                                                                 caplog, context):
    """The warm-up being on changes nothing for a launch that never asked for a context above
    16K: SGLang's cap stands (PR #44627: configurations that captured before are unchanged)."""
    registry.activate()
    monkeypatch.setattr(hook, "get_platform", lambda: CUDA)
    from sglang.srt.arg_groups import cuda_graph_hook

    parser = argparse.ArgumentParser()
    from sglang.srt.server_args import ServerArgs

    ServerArgs.add_cli_args(parser)
    recipe = RECIPE.replace("--cuda-graph-prefill-max-context 262144", "")
    if context:
        recipe += f" --cuda-graph-prefill-max-context {context}"
    args = ServerArgs.from_cli_args(parser.parse_args(recipe.split()))
    cuda_graph_hook.parse_cuda_graph_config(args)
    args._model_config = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v41"))
    with caplog.at_level(logging.INFO, logger="sglang_warmup.patches"):
        hook.validate_deepseek_v41_features(args)
    assert sglang_args.max_seq_len(args) == 16_384
    shown = ("no --cuda-graph-prefill-max-context" if context is None
             else f"--cuda-graph-prefill-max-context {context}")
    assert fix5_status().reason.endswith(
        f"last validation kept the cap: the launch asks for no prefill-graph context above "
        f"16,384 ({shown}); SGLang's cap stands")
