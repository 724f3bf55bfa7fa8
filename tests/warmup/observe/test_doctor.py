"""warmup.observe.doctor: the self-check, run for real (a spawned worker-like process, real compiles)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _interpreter import python

from warmup.observe import doctor
from warmup.errors import WarmupError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("WARMUP_METRICS", "WARMUP_STATE_DIR", "PROMETHEUS_MULTIPROC_DIR",
                 "SGLANG_PLUGINS", "WARMUP_ENABLE"):
        monkeypatch.delenv(name, raising=False)


def test_the_cli_check_passes_on_a_cpu_machine():
    # Exactly what CI runs (scripts/test.sh): the console entry point with --json.
    done = subprocess.run([python(), "-m", "warmup", "doctor", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert all(c["ok"] for c in checks.values()), checks
    assert checks["miss counted in phase warmup"]["detail"] == (
        "compile_events{phase=warmup,outcome=miss} = 1, all Triton events = 2 (expected 1 of 2)")
    assert checks["hit counted in phase serving"]["detail"] == (
        "compile_events{phase=serving,outcome=hit} = 1 (expected 1)")
    assert checks["hooks installed by the plugin"]["detail"] == (
        "listener: chained by sglang.srt.utils.triton_load_watch")
    assert report["plugin"]["registered"] is True
    assert report["plugin"]["loaded_by"] == "sglang.srt.plugins.load_plugins"
    assert report["target"] == ("cuda:90 (compile only: no GPU is visible to Triton here; "
                                "kernels are compiled, not launched)")
    assert "There should only be one" not in done.stdout + done.stderr  # Triton's own words
    import triton

    assert report["triton_version"] == triton.__version__
    assert {h["name"] for h in report["hooks"]} >= {
        "triton.knobs.compilation.listener", "triton.knobs.runtime.jit_cache_hook",
        "triton.knobs.runtime.kernel_load_start_hook"}
    assert "triton" in {c["kind"] for c in report["caches"]}
    assert [(e["event"], e["phase"], e["kernel"]) for e in report["compile_log"]] == [
        ("miss", "warmup", "_doctor_probe"), ("hit", "serving", "_doctor_probe")]


def test_the_plugin_entry_point_is_registered():
    found = doctor.plugin_entry_point()
    assert found == {"registered": True, "name": "sglang_warmup",
                     "distribution": "sglang-warmup", "detail": ""}


def test_compile_only_target_restores_the_previous_driver():
    from triton.runtime import driver

    before = getattr(driver, "_active", None)
    with doctor.compile_only_target(("cuda", 80, 32)) as target:
        assert driver.active.get_current_target() == target
        assert (target.backend, target.arch, target.warp_size) == ("cuda", 80, 32)
    assert getattr(driver, "_active", None) is before


def test_the_text_report_lists_checks_hooks_and_caches():
    report = doctor.DoctorReport(
        ok=False,
        checks=(doctor.Check("check process", False, "boom"),),
        triton_version="3.8.0", sglang_version="0.5.22", target="cuda:90 (compile only: x)",
        plugin={"registered": False}, hooks=({"name": "h", "state": "missing", "detail": "d"},),
        caches=({"kind": "triton", "path": "/c", "source": "TRITON_CACHE_DIR",
                 "active": True, "note": ""},),
        counts={}, compile_log=(), notes=("n1",), duration_s=1.25)
    assert doctor.render_text(report).splitlines() == [
        "sglang-warmup doctor: FAILED (1.2 s)",
        "  triton 3.8.0, sglang 0.5.22, target cuda:90 (compile only: x)",
        "  plugin entry point: NOT registered",
        "",
        "checks:",
        "  [FAIL] check process: boom",
        '  (the checks not shown need what "check process" checks: fix that first)',
        "",
        "hooks (in the check process):",
        "  missing   h (d)",
        "",
        "cache locations:",
        "  triton        /c (TRITON_CACHE_DIR)",
        "",
        "notes:",
        "  - n1",
    ]
    assert json.loads(doctor.render_json(report))["checks"] == [
        {"name": "check process", "ok": False, "detail": "boom"}]


def _gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_present(), reason="needs a GPU")
def test_on_a_gpu_the_check_compiles_for_it_and_counts_the_device_load():
    done = subprocess.run([sys.executable, "-m", "warmup", "doctor", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["target"].endswith("(local GPU)")
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["device load counted"]["ok"] is True


def test_keep_dir_must_be_new_or_empty(tmp_path):
    (tmp_path / "old").write_text("x")
    with pytest.raises(WarmupError) as err:
        doctor.run(keep_dir=str(tmp_path))
    assert err.value.message == f"--keep-dir {tmp_path}: not an empty directory"
    assert err.value.hint == ("give a new or empty directory: the check needs an empty Triton "
                              "cache to see a real compile")
