"""warmup.observe.metrics: our Prometheus metrics, a fresh registry per test, multiprocess aggregation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry

from warmup.observe import metrics
from warmup.errors import WarmupError


@pytest.fixture
def registry(monkeypatch):
    # Single-process mode in this interpreter; multiprocess mode is tested in child processes.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    return CollectorRegistry()


@pytest.fixture
def m(registry):
    return metrics.for_registry(registry)


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_compile_events_and_durations_are_counted_per_phase(registry, m):
    m.compile_event("warmup", "triton", "miss", 1.5)
    m.compile_event("warmup", "triton", "miss", 0.02)
    m.compile_event("serving", "triton", "hit")
    assert value(registry, "sglang_warmup_compile_events_total",
                 phase="warmup", compiler="triton", outcome="miss") == 2
    assert value(registry, "sglang_warmup_compile_events_total",
                 phase="serving", compiler="triton", outcome="hit") == 1
    assert value(registry, "sglang_warmup_compile_seconds_count",
                 phase="warmup", compiler="triton") == 2
    assert value(registry, "sglang_warmup_compile_seconds_sum",
                 phase="warmup", compiler="triton") == pytest.approx(1.52)
    # hits carry no compile duration
    assert value(registry, "sglang_warmup_compile_seconds_count",
                 phase="serving", compiler="triton") is None


def test_compile_seconds_buckets_span_10_ms_to_120_s(registry, m):
    m.compile_event("init", "triton", "miss", 0.005)
    les = [s.labels["le"] for fam in registry.collect() if fam.name == "sglang_warmup_compile_seconds"
           for s in fam.samples if s.name.endswith("_bucket")]
    assert les == ["0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0",
                   "20.0", "30.0", "60.0", "120.0", "+Inf"]


def test_jit_builds_also_count_as_compile_events(registry, m):
    m.jit_build("init", "built", 12.0)
    m.jit_build("init", "hit")
    m.jit_build("serving", "failed", 3.0)
    assert value(registry, "sglang_warmup_jit_builds_total", phase="init", outcome="built") == 1
    assert value(registry, "sglang_warmup_jit_builds_total", phase="init", outcome="hit") == 1
    assert value(registry, "sglang_warmup_jit_builds_total",
                 phase="serving", outcome="failed") == 1
    assert value(registry, "sglang_warmup_compile_events_total",
                 phase="init", compiler="sglang_jit", outcome="miss") == 1
    assert value(registry, "sglang_warmup_compile_events_total",
                 phase="init", compiler="sglang_jit", outcome="hit") == 1
    assert value(registry, "sglang_warmup_compile_seconds_sum",
                 phase="init", compiler="sglang_jit") == 12.0
    # a failed build is not a compile event
    assert value(registry, "sglang_warmup_compile_events_total",
                 phase="serving", compiler="sglang_jit", outcome="miss") is None


def test_kernel_loads_keep_the_lowest_free_memory(registry, m):
    m.kernel_load("serving", 8e9)
    m.kernel_load("serving", 2e9)
    m.kernel_load("serving", 5e9)
    m.kernel_load("serving")  # CUDA not initialised: counted, no memory reading
    assert value(registry, "sglang_warmup_kernel_loads_total", phase="serving") == 4
    assert value(registry, "sglang_warmup_kernel_load_min_free_bytes", phase="serving") == 2e9


def test_plan_coverage_ready_and_hook_errors(registry, m):
    m.plan_request("ok", 5)
    m.plan_request("failed")
    m.plan_coverage(done=4, skipped=1, failed=1)
    m.ready(1_800_000_000.0)
    m.hook_error("compile_log")
    m.specialization("warmup")
    assert value(registry, "sglang_warmup_plan_requests_total", outcome="ok") == 5
    assert value(registry, "sglang_warmup_plan_requests_total", outcome="failed") == 1
    assert [value(registry, "sglang_warmup_plan_classes", state=s)
            for s in ("done", "skipped", "failed")] == [4, 1, 1]
    assert value(registry, "sglang_warmup_ready_timestamp_seconds") == 1_800_000_000.0
    assert value(registry, "sglang_warmup_hook_errors_total", hook="compile_log") == 1
    assert value(registry, "sglang_warmup_specializations_total", phase="warmup") == 1


@pytest.mark.parametrize("call, message", [
    (lambda m: m.compile_event("startup", "triton", "miss"),
     "label phase='startup' is not one of init, warmup, serving"),
    (lambda m: m.compile_event("init", "nvcc", "miss"),
     "label compiler='nvcc' is not one of " + ", ".join(metrics.COMPILERS)),
    (lambda m: m.compile_event("init", "triton", "load"),
     "label outcome='load' is not one of miss, hit"),
    (lambda m: m.jit_build("init", "cached"),
     "label outcome='cached' is not one of built, hit, failed"),
    (lambda m: m.plan_request("timeout"),
     "label outcome='timeout' is not one of ok, failed, skipped"),
    (lambda m: m.hook_error("my_hook"),
     "label hook='my_hook' is not one of compilation_listener, jit_cache_hook, "
     "jit_post_compile_hook, kernel_load_start_hook, kernel_load_end_hook, compile_log, "
     "metrics, cache_watch, " + ", ".join(metrics.COMPILERS)),
])
def test_labels_are_closed_sets(m, call, message):
    with pytest.raises(ValueError) as err:
        call(m)
    assert str(err.value) == message


def test_the_sidecars_metrics_come_from_its_sample(registry):
    sample = metrics.SidecarSample(state="warming", runs_ok=1, runs_failed=2, requests_ok=7,
                                   requests_failed=1, health_wait_s=3.5,
                                   projected_remaining_s=12.0)
    registry.register(metrics.SidecarCollector(lambda: sample))
    assert value(registry, "sglang_warmup_sidecar_ready") == 0.0
    assert [value(registry, "sglang_warmup_sidecar_state", state=s)
            for s in metrics.SIDECAR_STATES] == [0, 0, 1, 0, 0, 0, 0]
    assert value(registry, "sglang_warmup_sidecar_runs_total", outcome="ok") == 1
    assert value(registry, "sglang_warmup_sidecar_runs_total", outcome="failed") == 2
    assert value(registry, "sglang_warmup_sidecar_requests_total", outcome="ok") == 7
    assert value(registry, "sglang_warmup_sidecar_requests_total", outcome="failed") == 1
    assert value(registry, "sglang_warmup_sidecar_health_wait_seconds") == 3.5
    assert value(registry, "sglang_warmup_sidecar_projected_remaining_seconds") == 12.0
    # gauges without a value yet are left out, not exported as 0
    for name in ("warmup_seconds", "ready_timestamp_seconds", "second_pass_misses"):
        assert value(registry, f"sglang_warmup_sidecar_{name}") is None
    every = {fam.name for fam in registry.collect()}
    assert all(name.startswith(metrics.PREFIX) for name in every)


def test_the_sidecars_states_are_a_closed_set(registry):
    registry.register(metrics.SidecarCollector(lambda: metrics.SidecarSample(state="sleeping")))
    with pytest.raises(ValueError) as err:
        list(registry.collect())
    assert str(err.value) == ("label state='sleeping' is not one of starting, waiting, warming, "
                              "verifying, ready, failed, stopped")


def test_sidecar_exposition_without_a_shared_directory(tmp_path):
    text = metrics.sidecar_exposition(lambda: metrics.SidecarSample(state="ready", ready_at=5.0),
                                      str(tmp_path / "none")).decode()
    assert "sglang_warmup_sidecar_ready 1.0" in text
    assert "sglang_warmup_sidecar_ready_timestamp_seconds 5.0" in text
    assert "sglang_warmup_compile_events" not in text
    assert metrics.compile_misses(str(tmp_path)) is None  # no *.db files: nothing counted yet
    assert metrics.compile_misses(None) is None


def test_collect_needs_a_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(WarmupError) as err:
        metrics.collect()
    assert err.value.message == "no Prometheus multiprocess directory to read"
    missing = tmp_path / "nope"
    with pytest.raises(WarmupError) as err:
        metrics.collect(missing)
    assert err.value.message == f"Prometheus multiprocess directory {missing} does not exist"


_WORKER = textwrap.dedent("""
    import sys
    from warmup.observe import metrics
    index = int(sys.argv[1])
    m = metrics.default()
    m.compile_event("warmup", "triton", "miss", 0.5 * (index + 1))
    m.compile_event("serving", "triton", "hit")
    m.kernel_load("serving", 1e9 * (index + 1))
    m.ready(1_000.0 + index)
    if index == 0:
        m.plan_coverage(done=3, skipped=1, failed=0)
    # a metric of SGLang's own in the same directory
    from prometheus_client import Counter
    Counter("sglang:num_requests", "stand-in for SGLang's own counter").inc()
    import prometheus_client.values as values
    print(type(values.ValueClass).__name__ if not isinstance(values.ValueClass, type)
          else values.ValueClass.__name__)
""")


def test_counts_from_several_processes_are_aggregated(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    outs = []
    for index in range(3):
        done = subprocess.run([sys.executable, "-c", _WORKER, str(index)], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout.strip())
    assert outs == ["MmapedValue"] * 3  # multiprocess mode was on in every process
    assert len(list(tmp_path.glob("*.db"))) >= 3

    collected = metrics.collect(tmp_path)
    assert metrics.total(collected, "sglang_warmup_compile_events_total",
                         phase="warmup", outcome="miss") == 3
    assert metrics.total(collected, "sglang_warmup_compile_events_total",
                         phase="serving", outcome="hit") == 3
    assert metrics.total(collected, "sglang_warmup_compile_seconds_sum",
                         phase="warmup") == pytest.approx(3.0)
    assert metrics.total(collected, "sglang_warmup_kernel_loads_total") == 3
    # gauges aggregate by their mode: max for readiness, min for free memory
    assert metrics.total(collected, "sglang_warmup_ready_timestamp_seconds") == 1002.0
    assert metrics.total(collected, "sglang_warmup_kernel_load_min_free_bytes") == 1e9
    assert metrics.total(collected, "sglang_warmup_plan_classes", state="done") == 3
    assert not any(name.startswith("sglang:") for name in collected)

    assert metrics.compile_misses(str(tmp_path)) == 3
    text = metrics.render(tmp_path).decode()
    assert ('sglang_warmup_compile_events_total{compiler="triton",outcome="miss",'
            'phase="warmup"} 3.0') in text
    side = metrics.sidecar_exposition(lambda: metrics.SidecarSample(state="ready"),
                                      str(tmp_path)).decode()
    assert side.startswith("# HELP sglang_warmup_sidecar_ready ")
    assert ('sglang_warmup_compile_events_total{compiler="triton",outcome="miss",'
            'phase="warmup"} 3.0') in side and "sglang:num_requests" not in side
    assert "sglang:num_requests" not in text
    assert "sglang:num_requests_total 3.0" in metrics.render(tmp_path, prefix=None).decode()


def test_importing_and_installing_does_not_import_prometheus_client(tmp_path):
    # SGLang sets PROMETHEUS_MULTIPROC_DIR after plugins load; importing prometheus_client
    # before that would freeze its single-process mode for SGLang's own metrics.
    code = textwrap.dedent("""
        import sys
        from warmup.observe import events, metrics, phase
        report = events.install()
        assert report.hooks, report
        print("prometheus_client" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["WARMUP_STATE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_per_class_latency_first_hit_and_build_info(registry, m):
    from cache_tools.versions import dist_version

    m.class_time("extend_int_classes", 1.25)
    m.class_first_hit_ratio("extend_int_classes", 1.04)
    assert value(registry, "sglang_warmup_class_seconds", shape_class="extend_int_classes") == 1.25
    assert value(registry, "sglang_warmup_class_first_hit_ratio",
                 shape_class="extend_int_classes") == 1.04
    assert value(registry, "sglang_warmup_build_info", version=dist_version("sglang-warmup"),
                 sglang=dist_version("sglang")) == 1


def test_no_ready_time_is_exposed_before_it_is_known(registry, m):
    names = {fam.name for fam in registry.collect()}
    assert "sglang_warmup_ready_timestamp_seconds" not in names
    m.ready(1_700_000_000.0)
    assert value(registry, "sglang_warmup_ready_timestamp_seconds") == 1_700_000_000.0
