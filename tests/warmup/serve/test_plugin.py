"""warmup.serve.plugin: each scheduler-side step is armed through the post-import hook when
its setting is on, and not at all when it is off."""

from __future__ import annotations

import sys

import pytest

from warmup.observe.importer import finder
from warmup.serve import allocator, gemm_sweep, plugin

pytestmark = pytest.mark.usefixtures("warmup_isolated")


STEPS = {"GEMM sweep": (gemm_sweep.MODEL_RUNNER, gemm_sweep._wrap, ("WARMUP_GEMM_SWEEP_S", "0")),
         "allocator": (allocator.FLUSH_WRAPPER, allocator._wrap, ("WARMUP_KEEP_ALLOCATOR", "0"))}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_plugin_arms_a_step_unless_its_setting_is_off(monkeypatch, step):
    module, wrap, off = STEPS[step]
    for name, value in (("WARMUP_ENABLE", "1"), ("WARMUP_METRICS", "0"),
                        ("WARMUP_PATCHES", "0")):
        monkeypatch.setenv(name, value)
    for other, (_, _, other_off) in STEPS.items():   # only this step watches
        if other != step:
            monkeypatch.setenv(*other_off)
    monkeypatch.delenv("WARMUP_PLAN", raising=False)
    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(plugin, "_registered", False)
    try:
        plugin.register()
        assert module in finder().watched
    finally:
        finder().unwatch(module, wrap)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv(*off)
    plugin.register()
    assert module not in finder().watched
