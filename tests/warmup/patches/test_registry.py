"""The registry on SGLang 0.5.22: activation, idempotency, modes, dependencies, failure
handling, activation through the plugin in a spawned process, and SGLang 0.5.23 (where every
detector must say upstream and nothing may be patched)."""

from __future__ import annotations

import json
import multiprocessing
import sys

import pytest

from warmup.patches import fix2_live_rows, fix4_hoisted_rows, registry
from warmup.patches.source import mark_of

from .conftest import BACKEND, HOOK, SPARSE, run_with_sglang_0523

TARGETS = {
    1: (BACKEND, "DeepseekV4AttnBackend", "low_ratio_prefill_graph"),
    2: (BACKEND, "DeepseekV4AttnBackend", "_low_ratio_compress_fused"),
    3: (SPARSE, "SparsePrefillChunkCache", "ensure_compressed"),
    4: (BACKEND, "DeepseekV4AttnBackend", "forward_low_ratio_sources"),
    5: (HOOK, None, "validate_deepseek_v41_features"),
}


def installed() -> dict[int, object]:
    """The current class/module attribute behind each fix's target."""
    result = {}
    for number, (module, klass, attr) in TARGETS.items():
        owner = sys.modules[module]
        owner = getattr(owner, klass) if klass else owner
        result[number] = vars(owner)[attr]
    return result


def marks() -> dict[int, int | None]:
    return {number: mark_of(obj) for number, obj in installed().items()}


def rows() -> dict[int, tuple[str, str | None, str]]:
    return {s.number: (s.verdict, s.detected, s.reason) for s in registry.status()}


@pytest.fixture
def modules(backend, sparse_utils, hook):
    return backend, sparse_utils, hook


def test_status_before_activation_is_pending(modules):
    assert {n: (v, r) for n, (v, _, r) in rows().items()} == {
        n: ("pending", "patches are not activated in this process") for n in TARGETS}


def test_every_fix_applies_on_0522(modules):
    originals = installed()
    registry.activate()
    assert {n: (v, d) for n, (v, d, _) in rows().items()} == {
        n: ("applied", "needed/exact") for n in TARGETS}
    assert marks() == {n: n for n in TARGETS}
    registry.revert()
    assert installed() == originals
    assert marks() == {n: None for n in TARGETS}


def test_detect_only_patches_nothing(modules):
    result = registry.inspect_installed(apply=False)
    assert [(s.number, s.verdict, s.detected) for s in result] == [
        (n, "needed", "needed/exact") for n in TARGETS]
    assert marks() == {n: None for n in TARGETS}


def test_activation_is_idempotent(modules):
    backend, sparse_utils, hook = modules
    registry.activate()
    first = installed()
    registry.activate()
    # A second import callback (e.g. a reload) must not wrap a wrapper.
    for module in modules:
        registry.on_import(module)
    assert installed() == first
    assert {n: (v, r) for n, (v, _, r) in rows().items()} == {
        n: ("applied", "already applied in this process") for n in TARGETS}


def test_forced_off_leaves_the_target_alone(modules, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_3", "off")
    registry.activate()
    assert rows()[3] == ("off", None, "WARMUP_FIX_3=off")
    assert marks() == {1: 1, 2: 2, 3: None, 4: 4, 5: 5}


def test_fix1_is_refused_without_fix2(modules, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_2", "off")
    registry.activate()
    assert rows()[1] == (
        "refused", "needed/exact",
        "fix 2 (fused compressor rows) is off (WARMUP_FIX_2=off); fix 1 without it fails at "
        "the first prefill instead of at capture")
    assert marks() == {1: None, 2: None, 3: 3, 4: 4, 5: None}


def test_forced_on_where_the_target_is_missing(modules, monkeypatch):
    backend = modules[0]
    monkeypatch.delattr(backend.DeepseekV4AttnBackend, "_low_ratio_compress_fused")
    monkeypatch.setenv("WARMUP_FIX_2", "on")
    registry.activate()
    assert rows()[2] == (
        "refused", None,
        "forced on, but the target is missing: sglang.srt.layers.attention.deepseek_v4_backend "
        "has no DeepseekV4AttnBackend._low_ratio_compress_fused")
    assert rows()[1][0] == "refused"


def test_missing_target_in_auto_mode_is_absent(modules, monkeypatch):
    """SGLang 0.5.17 (seen on the GPU): none of the fixes' functions exist; each says so."""
    backend = modules[0]
    monkeypatch.delattr(backend.DeepseekV4AttnBackend, "forward_low_ratio_sources")
    registry.activate()
    assert rows()[4] == (
        "absent", None,
        "nothing to fix: sglang.srt.layers.attention.deepseek_v4_backend has no "
        "DeepseekV4AttnBackend.forward_low_ratio_sources (this release predates the code the "
        "fix targets, or has another design)")


def test_invalid_mode_is_refused_with_the_variable(modules, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_4", "maybe")
    registry.activate()
    status = {s.number: s for s in registry.status()}[4]
    assert (status.mode, status.verdict, status.reason) == (
        "invalid", "refused",
        "environment variable WARMUP_FIX_4='maybe': expected auto, on or off "
        "(WARMUP_FIX_4: auto (apply where needed), on (force) or off for fix 4)")
    assert marks()[4] is None


def test_failed_verification_removes_the_patch(modules, monkeypatch):
    def broken(module, installed_, original):
        raise AssertionError("probe disagrees")

    monkeypatch.setattr(fix4_hoisted_rows, "verify", broken)
    original = installed()[4]
    registry.activate()
    assert rows()[4] == ("refused", "needed/exact",
                         "verification failed, patch removed: AssertionError: probe disagrees")
    assert installed()[4] is original


def test_failed_build_is_refused(modules, monkeypatch):
    def broken(module, original, ctx):
        raise KeyError("layout")

    monkeypatch.setattr(fix2_live_rows, "build", broken)
    registry.activate()
    assert rows()[2] == ("refused", "needed/exact",
                         "could not build the patch: KeyError: 'layout'")
    assert rows()[1][0] == "refused"  # fix 1 never applies without fix 2


def test_unreadable_source_is_refused_not_upstream(modules, monkeypatch):
    import inspect

    real = inspect.getsource

    def no_source(obj):
        if getattr(obj, "__name__", "") == "ensure_compressed":
            raise OSError("could not get source code")
        return real(obj)

    monkeypatch.setattr(inspect, "getsource", no_source)
    registry.activate()
    assert rows()[3] == (
        "refused", None,
        "detection failed: SourceUnavailable: no source for "
        "sglang.srt.layers.attention.dsv4.sparse_prefill_utils."
        "SparsePrefillChunkCache.ensure_compressed: could not get source code")
    assert marks()[3] is None


def test_predictions_match_the_live_decisions(modules):
    predicted = {n: registry.predict(n) for n in TARGETS}
    assert all(s.predicted for s in predicted.values())
    live = {s.number: s for s in registry.inspect_installed(apply=False)}
    assert {n: (s.verdict, s.detected) for n, s in predicted.items()} == {
        n: (s.verdict, s.detected) for n, s in live.items()}


# --- activation through the plugin, in a spawned process (how SGLang starts its workers) ----

def _plugin_child(queue) -> None:
    """A fresh interpreter: the plugin, then the launcher's validation, then the backend."""
    import argparse
    import importlib
    from types import SimpleNamespace

    result: dict = {}
    try:
        from warmup.serve import plugin
        from warmup.patches import status

        plugin.register()
        result["after_register"] = sorted(m for m in (BACKEND, SPARSE, HOOK) if m in sys.modules)
        from sglang.srt.arg_groups import cuda_graph_hook
        from sglang.srt.arg_groups import deepseek_v4_hook as hook
        from sglang.srt.arg_groups.model_override_base import resolving_view
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        args = ServerArgs.from_cli_args(parser.parse_args(
            ["--model-path", "dummy", "--cuda-graph-backend-prefill", "breakable",
             "--cuda-graph-prefill-max-context", "262144"]))
        cuda_graph_hook.parse_cuda_graph_config(args)
        args._model_config = SimpleNamespace(hf_config=SimpleNamespace(model_type="deepseek_v41"))
        hook.get_platform = lambda: SimpleNamespace(is_cuda=True, is_hip=False)
        hook.validate_deepseek_v41_features(args)
        result["max_seq_len"] = resolving_view(args).cuda_graph_config.prefill.max_seq_len
        result["after_validate"] = sorted(m for m in (BACKEND, SPARSE) if m in sys.modules)
        result["status_before_backend"] = {s.number: s.verdict for s in status()}
        importlib.import_module(BACKEND)
        result["marks"] = marks()
        result["status"] = {s.number: s.verdict for s in status()}
    except BaseException as exc:  # report, do not hang the parent
        result["error"] = f"{type(exc).__name__}: {exc}"
    queue.put(result)


def test_plugin_applies_the_fixes_in_a_spawned_process(monkeypatch, spawn_from_zygote):
    monkeypatch.setenv("WARMUP_ENABLE", "1")
    monkeypatch.setenv("WARMUP_METRICS", "0")
    monkeypatch.delenv("WARMUP_PLAN", raising=False)
    monkeypatch.delenv("WARMUP_PATCHES", raising=False)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_plugin_child, args=(queue,))
    child.start()
    try:
        result = queue.get(timeout=180)
    finally:
        child.join(timeout=30)
    assert "error" not in result, result.get("error")
    assert result["after_register"] == []  # register() imports none of the targets
    assert result["max_seq_len"] is None  # the launcher lifted the cap...
    assert result["after_validate"] == []  # ...without importing the backend
    assert result["status_before_backend"] == {
        1: "pending", 2: "pending", 3: "pending", 4: "pending", 5: "applied"}
    assert result["marks"] == {1: 1, 2: 2, 3: 3, 4: 4, 5: 5}
    assert result["status"] == {n: "applied" for n in TARGETS}


# --- SGLang 0.5.23 ----------------------------------------------------------------------------

_0523 = r"""
import contextlib, io, json, os, sys
from warmup.cli import main
from warmup.patches import registry
from warmup.patches.source import mark_of
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["patches", "status", "--json"])
report = json.loads(out.getvalue())
import sglang.srt.layers.attention.deepseek_v4_backend as b
import sglang.srt.layers.attention.dsv4.sparse_prefill_utils as s
import sglang.srt.arg_groups.deepseek_v4_hook as h
C = b.DeepseekV4AttnBackend
targets = [vars(C)["low_ratio_prefill_graph"], vars(C)["_low_ratio_compress_fused"],
           vars(s.SparsePrefillChunkCache)["ensure_compressed"],
           vars(C)["forward_low_ratio_sources"], vars(h)["validate_deepseek_v41_features"]]
marks = [mark_of(t) for t in targets]
registry.revert()
for n in (1, 2, 3, 4, 5):
    os.environ[f"WARMUP_FIX_{n}"] = "on"
forced = {r.number: [r.verdict, r.reason] for r in registry.inspect_installed(apply=True)}
registry.revert()
print(json.dumps({"report": report, "marks": marks, "forced": forced}))
"""


def test_sglang_0523_is_upstream_and_untouched():
    proc = run_with_sglang_0523(_0523)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    report = result["report"]
    assert report["sglang"]["version"] == "0.5.23"
    assert [(r["number"], r["verdict"], r["detected"]) for r in report["fixes"]] == [
        (n, "upstream", "clean/exact") for n in TARGETS]
    assert result["marks"] == [None] * 5
    forced = {int(k): v for k, v in result["forced"].items()}
    # Forced on where the bug-shaped code is absent: the guarded rewrites refuse.
    assert forced[3] == ["refused", "SparsePrefillChunkCache.ensure_compressed has no pageable "
                                    "torch.tensor(lengths_cpu, ...) upload to rewrite"]
    assert forced[5] == ["refused", "the installed validate_deepseek_v41_features sets no "
                                    "16,384-token cap: nothing to lift"]
    # The wrappers have a target and are harmless where sizes already match: forced, applied.
    assert [forced[n][0] for n in (1, 2, 4)] == ["applied", "applied", "applied"]
