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


def test_without_a_plan_serving_begins_when_sglang_reports_itself_up(monkeypatch, tmp_path):
    """SGLang 0.5.17 has no ``mark_serving_started``: the main process watches the tokenizer
    manager's status instead, so that compiles after ready count as serving, not init."""
    import types

    from warmup.observe import phase

    status = types.SimpleNamespace(name="Starting")
    manager = types.SimpleNamespace(server_status=status)
    http = types.ModuleType("sglang.srt.entrypoints.http_server")
    monkeypatch.setitem(sys.modules, http.__name__, http)
    monkeypatch.setenv("WARMUP_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(plugin, "_is_main_process", lambda: True)
    phase.reset()
    plugin._serving_when_sglang_is_up()
    import time

    time.sleep(0.7)
    assert phase.current().phase == "init"  # no tokenizer manager yet
    http._global_state = types.SimpleNamespace(tokenizer_manager=manager)
    time.sleep(0.7)
    assert phase.current().phase == "init"  # SGLang's own warm-up request still runs
    status.name = "Up"
    deadline = time.time() + 5
    while phase.current().phase != "serving" and time.time() < deadline:
        time.sleep(0.05)
    assert phase.current().phase == "serving"
    phase.reset()


def test_a_child_process_does_not_watch_for_serving(monkeypatch):
    import threading

    monkeypatch.setattr(plugin, "_is_main_process", lambda: False)
    before = threading.active_count()
    plugin._serving_when_sglang_is_up()
    assert threading.active_count() == before
