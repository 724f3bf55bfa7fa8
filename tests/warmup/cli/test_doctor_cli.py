"""``sglang-warmup doctor`` through the real CLI entry point: a failed check exits 1 and says
why (the check itself is tested in tests/warmup/observe/test_doctor.py)."""

from __future__ import annotations

import json

import pytest

from _cli import cli


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("WARMUP_METRICS", "WARMUP_STATE_DIR", "PROMETHEUS_MULTIPROC_DIR",
                 "SGLANG_PLUGINS", "WARMUP_ENABLE"):
        monkeypatch.delenv(name, raising=False)


STEP = "compiling a probe kernel twice in a worker-like process"


def _said(err: str) -> str:
    """stderr without the step lines of the check process (printed off a terminal once it
    passes 2 s: `STEP ...`, then `STEP: done in N s`)."""
    lines = err.splitlines(keepends=True)
    assert all(line.startswith(STEP + ": done in ") for line in lines
               if line.startswith(STEP) and line != STEP + " ...\n"), err
    return "".join(line for line in lines if not line.startswith(STEP))


def test_the_check_fails_when_the_plugin_installs_no_hooks(monkeypatch, capsys,
                                                           spawn_from_zygote):
    # An operator who set WARMUP_METRICS=0 gets no compile events: the doctor must say so.
    monkeypatch.setenv("WARMUP_METRICS", "0")
    code, out, err = cli(capsys, "doctor")
    assert code == 1, out + err
    assert out.startswith("sglang-warmup doctor: FAILED")
    assert ("[FAIL] hooks installed by the plugin: not installed: "
            "triton.knobs.compilation.listener, triton.knobs.runtime.jit_cache_hook, "
            "triton.knobs.runtime.jit_post_compile_hook (the plugin did not install events: "
            "is WARMUP_METRICS=0 or SGLANG_PLUGINS set without sglang_warmup?)") in out
    # one cause, one FAIL line: the counting checks that follow from it are not listed
    assert out.count("[FAIL]") == 1
    assert "miss counted in phase warmup" not in out
    assert '(the checks not shown need what "hooks installed by the plugin" checks' in out
    # the compile itself still happened: only the counting is missing
    assert "[ok] kernel binary in the Triton cache: _doctor_probe.cubin" in out
    assert _said(err) == ""  # for people the table says it all


def test_without_triton_one_line_names_the_cause(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # how Python marks a module unimportable
    code, out, err = cli(capsys, "doctor")
    assert code == 1, out + err
    assert out.count("[FAIL]") == 1
    assert ("[FAIL] check process: Triton is not installed in this environment; install the "
            "version the installed SGLang pins (it comes with torch)") in out
    assert "Traceback" not in out + err


def test_a_failure_in_json_mode_is_also_explained_on_stderr(monkeypatch, capsys,
                                                            spawn_from_zygote):
    # (--json, the hidden alias, runs in test_doctor.py's CI check)
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")  # SGLang would skip our plugin
    code, out, err = cli(capsys, "doctor", "--format", "json")
    assert code == 1
    assert json.loads(out)["ok"] is False
    assert _said(err).startswith("sglang-warmup doctor: FAILED: hooks installed by the plugin: "
                          "not installed: ")
