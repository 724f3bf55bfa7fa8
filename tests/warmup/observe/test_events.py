"""warmup.observe.events: real Triton compiles (for cuda:90, on CPU) and SGLang's real hooks."""

from __future__ import annotations

import json
import logging
import multiprocessing
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton
import triton.language as tl
from _interpreter import python
from prometheus_client import CollectorRegistry
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import MockTensor

from cache_tools import compile_log
from warmup.observe import events, metrics, phase, triton_hooks
from warmup.observe.doctor import compile_only_target

REPO = Path(__file__).resolve().parents[3]
TARGET = GPUTarget("cuda", 90, 32)
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3.0, mask=mask)


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def isolated_hooks(monkeypatch, tmp_path):
    """Triton's hook slots, SGLang's watch state, the phase and our installation, all restored."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("WARMUP_STATE_DIR", raising=False)
    # Collections are not recorded here (test_gc_pauses.py records them): on a busy host a slow
    # one would add a record to the exact lists these tests read back.
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    saved = (knobs.compilation.listener, knobs.runtime.jit_cache_hook,
             knobs.runtime.jit_post_compile_hook,
             list(knobs.runtime.kernel_load_start_hook.calls),
             list(knobs.runtime.kernel_load_end_hook.calls))
    watch = sys.modules.get("sglang.srt.utils.triton_load_watch")
    watch_state = (watch._installed, watch._prev_compile_listener, watch._serving_started) \
        if watch is not None else None
    scale_kernel.device_caches.clear()
    phase.reset()
    yield
    events.uninstall()
    phase.reset()
    scale_kernel.device_caches.clear()
    knobs.compilation.listener, knobs.runtime.jit_cache_hook, \
        knobs.runtime.jit_post_compile_hook = saved[:3]
    knobs.runtime.kernel_load_start_hook.calls[:] = saved[3]
    knobs.runtime.kernel_load_end_hook.calls[:] = saved[4]
    watch = sys.modules.get("sglang.srt.utils.triton_load_watch")
    if watch is not None:
        watch._installed, watch._prev_compile_listener, watch._serving_started = \
            watch_state or (False, None, False)


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def watch(monkeypatch):
    """SGLang's real triton_load_watch, in a clean state."""
    from sglang.srt.utils import triton_load_watch

    monkeypatch.setattr(triton_load_watch, "_installed", False)
    monkeypatch.setattr(triton_load_watch, "_prev_compile_listener", None)
    monkeypatch.setattr(triton_load_watch, "_serving_started", False)
    return triton_load_watch


def compile_direct(block: int = 128):
    """A real compile through triton.compile (no jit hooks involved)."""
    return triton.compile(ASTSource(fn=scale_kernel, signature=SIGNATURE,
                                    constexprs={"BLOCK": block}), target=TARGET)


def compile_jit(block: int = 128):
    """A real compile through the @triton.jit path (jit_cache_hook, listener, post hook)."""
    with compile_only_target():
        return scale_kernel.warmup(MockTensor(tl.float32), MockTensor(tl.float32), 4096,
                                   BLOCK=block, grid=(1,))


def count(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def triton_events(state_dir):
    return [r for r in compile_log.read_dir(state_dir) if r["compiler"] == "triton"]


# --- installation ----------------------------------------------------------------------------

def test_install_reports_every_hook_and_is_idempotent(registry, state_dir):
    report = events.install(registry=registry, state_dir=state_dir)
    states = {h.name: h.state for h in report.hooks}
    assert states["triton.knobs.compilation.listener"] == "installed"
    assert states["triton.knobs.runtime.jit_cache_hook"] == "installed"
    assert states["triton.knobs.runtime.jit_post_compile_hook"] == "installed"
    assert states["triton.knobs.runtime.kernel_load_start_hook"] == "installed"
    assert states["triton.knobs.runtime.kernel_load_end_hook"] == "installed"
    assert report.sglang_jit_layout == "package"
    assert states["sglang.kernels.jit.utils.compile.ninja.build"] in ("armed", "installed")
    assert report.triton_version == triton.__version__
    assert report.state_dir == str(state_dir)
    assert "triton.knobs.compilation.listener" in report.installed
    listener = knobs.compilation.listener

    again = events.install(registry=CollectorRegistry(), state_dir=state_dir)
    assert again.already_installed is True
    assert knobs.compilation.listener is listener  # not wrapped twice
    ours = [c for c in knobs.runtime.kernel_load_start_hook.calls
            if c.__name__.startswith("sglang_warmup")]
    assert len(ours) == 1


def test_uninstall_puts_back_what_was_there(registry, state_dir):
    seen = []

    def theirs(**kw):
        seen.append(kw["cache_hit"])

    knobs.compilation.listener = theirs
    report = events.install(registry=registry, state_dir=state_dir)
    assert {h.name: h.state for h in report.hooks}["triton.knobs.compilation.listener"] \
        == "chained"
    assert knobs.compilation.listener is not theirs
    events.uninstall()
    assert knobs.compilation.listener is theirs
    assert not any(c.__name__.startswith("sglang_warmup")
                   for c in knobs.runtime.kernel_load_start_hook.calls)
    compile_direct()
    assert seen == [False]
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 0


# --- Triton compiles -------------------------------------------------------------------------

def test_a_miss_then_a_disk_hit_are_counted_in_their_phase(registry, state_dir):
    events.install(registry=registry, state_dir=state_dir)
    phase.set_phase("warmup", shape_class="prefill-4k", request=3, state_dir=state_dir)
    first = compile_direct()
    phase.set_phase("serving", state_dir=state_dir)
    second = compile_direct()
    assert first.hash == second.hash
    assert count(registry, "sglang_warmup_compile_events_total", phase="warmup",
                 compiler="triton", outcome="miss") == 1
    assert count(registry, "sglang_warmup_compile_events_total", phase="serving",
                 compiler="triton", outcome="hit") == 1
    assert count(registry, "sglang_warmup_compile_events_total", phase="warmup",
                 compiler="triton", outcome="hit") == 0
    assert count(registry, "sglang_warmup_compile_seconds_count", phase="warmup",
                 compiler="triton") == 1

    miss, hit = triton_events(state_dir)
    assert (miss["event"], miss["phase"], miss["shape_class"], miss["request"]) == \
        ("miss", "warmup", "prefill-4k", 3)
    assert (hit["event"], hit["phase"], hit["cache_hit"]) == ("hit", "serving", True)
    assert miss["cache_hit"] is False
    assert miss["pid"] == os.getpid()
    assert miss["kernel"] == {"module": __name__, "name": "scale_kernel",
                              "qualname": "scale_kernel",
                              "source_sha256": hashlib.sha256(
                                  scale_kernel.src.encode()).hexdigest()}
    assert miss["hash"] == first.hash
    assert miss["signature"] == SIGNATURE
    assert miss["constexprs"] == [{"path": [3], "name": "BLOCK", "value": 128}]
    assert miss["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert miss["options"]["num_warps"] == 4 and miss["options"]["arch"] == "sm90"
    assert miss["duration_s"] > 0
    assert set(miss["stages"]["lowering_s"]) >= {"ttir", "ttgir", "llir", "ptx", "cubin"}
    assert "scale_kernel.cubin" in miss["artifacts"]
    assert miss["specialization"] is None  # triton.compile called directly: no jit hook
    # The ptxas whose version the key hashed (Triton's own here).
    from triton.backends.nvidia import compiler as nvidia

    assert miss["toolchain"] == {"ptxas": nvidia.get_ptxas(90).path,
                                 "ptxas_version": nvidia.get_ptxas_version(90)}
    assert "generated" not in miss["kernel"]  # an importable module: replay imports it
    assert sorted(miss) == sorted([
        "v", "event", "time", "pid", "phase", "shape_class", "request", "compiler", "kernel", "key",
        "hash", "signature", "constexprs", "attrs", "options", "env", "target", "toolchain",
        "triton_version", "duration_s", "stages", "cache_hit", "artifacts", "cache_entry",
        "specialization"])
    log = state_dir / "compile_log" / f"compiles-{os.getpid()}.jsonl"
    assert len(log.read_text().splitlines()) == 2


def test_the_jit_path_joins_the_jit_cache_hook_record(registry, state_dir):
    events.install(registry=registry, state_dir=state_dir)
    phase.set_phase("warmup", shape_class="decode", state_dir=state_dir)
    kernel = compile_jit()
    scale_kernel.device_caches.clear()  # fresh in-process state
    phase.set_phase("serving", state_dir=state_dir)
    compile_jit()
    assert count(registry, "sglang_warmup_specializations_total", phase="warmup") == 1
    assert count(registry, "sglang_warmup_specializations_total", phase="serving") == 1
    miss, hit = triton_events(state_dir)
    assert (miss["event"], hit["event"]) == ("miss", "hit")
    assert miss["hash"] == kernel.hash == hit["hash"]
    spec = miss["specialization"]
    assert spec["num_warps"] == 4 and spec["num_stages"] == 3 and spec["num_ctas"] == 1
    assert spec["is_warmup"] is True
    data = json.loads(spec["specialization_data"])
    assert data["name"] == f"{__name__}.scale_kernel"
    assert data["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert spec["constants"] == [{"path": [3], "name": "BLOCK", "value": 128}]
    assert miss["key"] is not None and "constexpr" in miss["key"]
    assert miss["attrs"][0] == {"path": [0], "name": "x_ptr", "attrs": [["tt.divisibility", 16]]}


def test_the_compile_log_line_is_enough_to_recompile_the_kernel(registry, state_dir, tmp_path,
                                                        monkeypatch):
    events.install(registry=registry, state_dir=state_dir)
    original = compile_jit(block=64)
    (record,) = [r for r in triton_events(state_dir) if r["event"] == "miss"]
    events.uninstall()

    # Rebuild from the record alone into an empty cache, as a CPU replay would.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "replay-cache"))
    module = sys.modules[record["kernel"]["module"]]
    fn = getattr(module, record["kernel"]["qualname"])
    src = ASTSource(fn=fn, signature=record["signature"],
                    constexprs={tuple(c["path"]): c["value"] for c in record["constexprs"]},
                    attrs={tuple(a["path"]): a["attrs"] for a in record["attrs"]})
    # JSON turned tuples into lists; undo that one level deep, as JITFunction.preload does.
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in record["options"].items()}
    rebuilt = triton.compile(src, target=GPUTarget(**record["target"]), options=options)
    assert rebuilt.hash == original.hash == record["hash"]

    # Triton's own route from the jit_cache_hook record: JITFunction.preload.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "preload-cache"))
    scale_kernel.device_caches.clear()
    with compile_only_target((record["target"]["backend"], record["target"]["arch"],
                              record["target"]["warp_size"])):
        preloaded = fn.preload(record["specialization"]["specialization_data"])
    assert preloaded.hash == record["hash"]


# --- jit hooks: never change the host's decision ---------------------------------------------

def test_jit_cache_hook_returns_the_previous_result_and_never_true_itself(registry, state_dir):
    calls = []

    def skip_everything(**kw):
        calls.append(kw["fn"].name)
        return True  # a truthy result makes Triton skip the compile

    knobs.runtime.jit_cache_hook = skip_everything
    events.install(registry=registry, state_dir=state_dir)
    ours = knobs.runtime.jit_cache_hook
    assert ours is not skip_everything
    with compile_only_target():
        result = scale_kernel.warmup(MockTensor(tl.float32), MockTensor(tl.float32), 16,
                                     BLOCK=32, grid=(1,))
    assert result is None  # skipped, as the previous hook asked
    assert calls == ["scale_kernel"]
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 0

    # With no previous hook ours returns None: the compile happens.
    events.uninstall()
    knobs.runtime.jit_cache_hook = None
    events.install(registry=registry, state_dir=state_dir)
    assert knobs.runtime.jit_cache_hook(key="k", repr="r", fn=None, compile={},
                                        is_manual_warmup=False, already_compiled=False) is None
    kernel = compile_jit(block=32)
    assert kernel is not None
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 1


def test_the_post_compile_hook_chains_too(registry, state_dir):
    seen = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["key"]) or "theirs"
    events.install(registry=registry, state_dir=state_dir)
    compile_jit()
    assert len(seen) == 1
    assert knobs.runtime.jit_post_compile_hook(key="k", repr="", fn=None, compile={},
                                               is_manual_warmup=False,
                                               already_compiled=False) == "theirs"


# --- chaining with SGLang's triton_load_watch --------------------------------------------------

def test_sglang_watch_installed_after_ours_chains_us(registry, state_dir, watch, monkeypatch,
                                                     caplog):
    events.install(registry=registry, state_dir=state_dir)
    watch.install()  # what the scheduler does in run_event_loop, after the plugins
    watch.mark_serving_started()
    assert knobs.compilation.listener is watch._on_compilation
    assert events.status().hooks[0].detail == "chained by sglang.srt.utils.triton_load_watch"

    monkeypatch.setenv("SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS", "0")
    phase.set_phase("serving", state_dir=state_dir)
    with caplog.at_level(logging.WARNING, logger=watch.__name__):
        compile_direct()
    assert "Triton kernel 'scale_kernel' took" in caplog.text  # SGLang's listener ran
    assert count(registry, "sglang_warmup_compile_events_total", phase="serving",
                 compiler="triton", outcome="miss") == 1  # and so did ours

    # Device loads: ours was added first, SGLang's crash mode raises after it.
    monkeypatch.setenv("SGLANG_CRASH_ON_TRITON_LOAD_AFTER_READY", "1")
    with pytest.raises(RuntimeError, match="device-loaded after serving started"):
        knobs.runtime.kernel_load_start_hook(None, None, "scale_kernel", {}, "abc")
    assert count(registry, "sglang_warmup_kernel_loads_total", phase="serving") == 1

    # Once uninstalled, our wrapper inside SGLang's chain only passes through.
    events.uninstall()
    caplog.clear()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(state_dir.parent / "other-cache"))
    with caplog.at_level(logging.WARNING, logger=watch.__name__):
        compile_direct()
    assert "Triton kernel 'scale_kernel' took" in caplog.text
    assert count(registry, "sglang_warmup_compile_events_total", phase="serving",
                 compiler="triton", outcome="miss") == 1


def test_sglang_watch_installed_before_ours_is_chained_by_us(registry, state_dir, watch,
                                                             monkeypatch, caplog):
    watch.install()
    watch.mark_serving_started()
    theirs = knobs.compilation.listener
    report = events.install(registry=registry, state_dir=state_dir)
    hooks = {h.name: h for h in report.hooks}
    assert hooks["triton.knobs.compilation.listener"].state == "chained"
    assert "triton_load_watch" in hooks["triton.knobs.compilation.listener"].detail
    assert hooks["triton.knobs.runtime.kernel_load_start_hook"].state == "chained"

    monkeypatch.setenv("SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS", "0")
    with caplog.at_level(logging.WARNING, logger=watch.__name__):
        compile_direct()
    assert "Triton kernel 'scale_kernel' took" in caplog.text
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 1

    events.uninstall()
    assert knobs.compilation.listener is theirs


# --- device loads ----------------------------------------------------------------------------

def test_kernel_loads_are_counted_and_recorded(registry, state_dir):
    events.install(registry=registry, state_dir=state_dir)
    phase.set_phase("warmup", state_dir=state_dir)
    # The calls CompiledKernel._init_handles makes around cuModuleLoadData (no GPU here).
    knobs.runtime.kernel_load_start_hook(None, None, "scale_kernel", {}, "h1")
    knobs.runtime.kernel_load_end_hook(object(), object(), "scale_kernel", {}, "h1")
    assert count(registry, "sglang_warmup_kernel_loads_total", phase="warmup") == 1
    (load,) = compile_log.read_dir(state_dir)
    assert (load["event"], load["phase"], load["hash"]) == ("load", "warmup", "h1")
    assert load["kernel"]["name"] == "scale_kernel"
    assert load["duration_s"] >= 0
    assert load["free_bytes"] is None  # CUDA is not initialised in this process


# --- a guest never raises ----------------------------------------------------------------------

def test_a_failing_compile_log_is_counted_and_the_compile_goes_on(registry, tmp_path):
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    events.install(registry=registry, state_dir=blocker)
    kernel = compile_jit()
    assert kernel is not None
    assert count(registry, "sglang_warmup_hook_errors_total", hook="compile_log") == 1
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 1


def test_failing_metrics_and_hooks_never_raise_into_triton(registry, state_dir, monkeypatch):
    events.install(registry=registry, state_dir=state_dir)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(metrics.Metrics, "compile_event", broken)
    monkeypatch.setattr(metrics.Metrics, "kernel_load", broken)
    monkeypatch.setattr(triton_hooks.TritonHooks, "on_jit_hook", broken)
    kernel = compile_jit()
    assert kernel is not None
    knobs.runtime.kernel_load_start_hook(None, None, "scale_kernel", {}, "h2")
    assert count(registry, "sglang_warmup_hook_errors_total", hook="metrics") == 2
    assert count(registry, "sglang_warmup_hook_errors_total", hook="jit_cache_hook") == 1
    assert count(registry, "sglang_warmup_hook_errors_total", hook="jit_post_compile_hook") == 1
    # the compile log still got the miss
    assert [r["event"] for r in triton_events(state_dir)] == ["miss"]


def test_unexpected_hook_arguments_are_counted_not_raised(registry, state_dir):
    events.install(registry=registry, state_dir=state_dir)
    knobs.compilation.listener(unexpected=1)
    ours = [c for c in knobs.runtime.kernel_load_start_hook.calls
            if c.__name__.startswith("sglang_warmup")]
    ours[0]()
    assert count(registry, "sglang_warmup_hook_errors_total", hook="compilation_listener") == 1
    assert count(registry, "sglang_warmup_hook_errors_total", hook="kernel_load_start_hook") == 1
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 0
    assert compile_log.read_dir(state_dir) == []


def test_a_previous_listener_that_raises_still_raises_and_we_still_record(registry, state_dir):
    def theirs(**kw):
        raise RuntimeError("theirs")

    knobs.compilation.listener = theirs
    events.install(registry=registry, state_dir=state_dir)
    with pytest.raises(RuntimeError, match="theirs"):
        compile_direct()
    assert count(registry, "sglang_warmup_compile_events_total", phase="init",
                 compiler="triton", outcome="miss") == 1


# --- several processes: shared phase file, one multiprocess directory ------------------------

def _compile_in_worker(conn) -> None:
    """A spawned worker: install like the plugin does, compile when told, report back."""
    from triton.runtime.jit import MockTensor as Mock

    from tests.warmup.observe import test_events as this
    from warmup.observe import events as worker_events
    from warmup.observe.doctor import compile_only_target as target

    worker_events.install()
    for message in iter(conn.recv, "stop"):
        this.scale_kernel.device_caches.clear()
        with target():
            kernel = this.scale_kernel.warmup(Mock(this.tl.float32), Mock(this.tl.float32),
                                              4096, BLOCK=message, grid=(1,))
        conn.send(kernel.hash)


def test_counts_from_spawned_workers_aggregate_by_the_phase_the_parent_set(tmp_path,
                                                                          monkeypatch):
    state = tmp_path / "state"
    prom = tmp_path / "prometheus"
    prom.mkdir()
    # Inherited by the workers, as SGLang's schedulers inherit the launcher's environment
    # (prometheus-client must see its variable before it is first imported).
    monkeypatch.setenv("WARMUP_STATE_DIR", str(state))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "shared-cache"))
    ctx = multiprocessing.get_context("spawn")
    workers = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_compile_in_worker, args=(child,))
        proc.start()
        workers.append((proc, parent))
    try:
        phase.set_phase("warmup", shape_class="bs-64", state_dir=state)
        workers[0][1].send(64)     # worker 0 compiles: a miss, in warmup
        h0 = workers[0][1].recv()
        workers[1][1].send(64)     # worker 1 finds it on disk: a hit, in warmup
        assert workers[1][1].recv() == h0
        phase.set_phase("serving", state_dir=state)
        workers[1][1].send(32)     # a new specialization during serving: a miss
        workers[1][1].recv()
        workers[0][1].send(32)     # and its disk hit in the other worker
        workers[0][1].recv()
        for _, conn in workers:
            conn.send("stop")
    finally:
        for proc, _ in workers:
            proc.join(60)
    assert [proc.exitcode for proc, _ in workers] == [0, 0]

    collected = metrics.collect(prom)

    def n(**labels):
        return metrics.total(collected, "sglang_warmup_compile_events_total", compiler="triton",
                             **labels)

    assert (n(phase="warmup", outcome="miss"), n(phase="warmup", outcome="hit")) == (1, 1)
    assert (n(phase="serving", outcome="miss"), n(phase="serving", outcome="hit")) == (1, 1)
    assert metrics.total(collected, "sglang_warmup_specializations_total") == 4
    records = triton_events(state)
    assert len({r["pid"] for r in records}) == 2
    assert [(r["event"], r["phase"], r["shape_class"]) for r in records] == [
        ("miss", "warmup", "bs-64"), ("hit", "warmup", "bs-64"),
        ("miss", "serving", None), ("hit", "serving", None)]


# --- SGLang's nvcc JIT (real load_jit builds with the host compiler) --------------------------

_JIT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.append(os.environ["TEST_TVM_FFI_PATH"])   # apache-tvm-ffi 0.1.11, SGLang's pin
    mode, probe, broken = sys.argv[1:4]
    from warmup.observe import events, phase
    if mode == "eager":
        import sglang.kernels.jit.utils.compile.loader  # imported before us: patched at install
    report = events.install()
    phase.set_phase("warmup")
    from sglang.kernels.jit.utils.compile import load_jit
    import sglang
    first = load_jit("sgw_probe", cpp_files=[probe], cpp_wrappers=[("add_one", "add_one")])
    phase.set_phase("serving")
    second = load_jit("sgw_probe", cpp_files=[probe], cpp_wrappers=[("add_one", "add_one")])
    try:
        load_jit("sgw_broken", cpp_files=[broken], cpp_wrappers=[("f", "f")])
        failed = "no error"
    except RuntimeError as exc:
        failed = str(exc).splitlines()[0]
    print(json.dumps({"version": sglang.__version__, "values": [first.add_one(1), second.add_one(2)],
                      "failed": failed,
                      "hooks": {h.name: h.state for h in report.hooks}}))
""")


def _tvm_ffi_path() -> Path:
    path = REPO / ".deps" / "sglang-0.5.23"
    assert (path / "tvm_ffi").is_dir(), "scripts/setup.sh installs apache-tvm-ffi into " + str(path)
    return path


@pytest.mark.parametrize("mode, version", [("lazy", "0.5.22"), ("eager", "0.5.22"),
                                           ("lazy", "0.5.23")])
def test_sglang_jit_builds_hits_and_failures_are_counted(tmp_path, mode, version):
    probe = tmp_path / "probe.cpp"
    probe.write_text("#include <cstdint>\ninline int64_t add_one(int64_t x) { return x + 1; }\n")
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    prom = tmp_path / "prometheus"
    prom.mkdir()
    env = {**os.environ, "WARMUP_STATE_DIR": str(tmp_path / "state"),
           "PROMETHEUS_MULTIPROC_DIR": str(prom),
           "SGLANG_JIT_CACHE_DIR": str(tmp_path / "jit-cache"),
           "TEST_TVM_FFI_PATH": str(_tvm_ffi_path())}
    if version == "0.5.23":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_tvm_ffi_path()),
                                                          env.get("PYTHONPATH")]))
    done = subprocess.run([python(), "-c", _JIT_SCRIPT, mode, str(probe), str(broken)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["version"] == version
    assert out["values"] == [2, 3]
    assert out["failed"].startswith("Failed to build JIT module sgl_kernel_jit_sgw_broken")
    expected_state = "installed" if mode == "eager" else "armed"
    assert out["hooks"]["sglang.kernels.jit.utils.compile.ninja.build"] == expected_state
    assert out["hooks"]["sglang.kernels.jit.utils.compile.cache.find_prebuilt"] == expected_state

    collected = metrics.collect(prom)

    def builds(**labels):
        return metrics.total(collected, "sglang_warmup_jit_builds_total", **labels)

    assert builds(phase="warmup", outcome="built") == 1
    assert builds(phase="serving", outcome="hit") == 1
    assert builds(phase="serving", outcome="failed") == 1
    assert builds() == 3
    assert metrics.total(collected, "sglang_warmup_compile_events_total", phase="warmup",
                         compiler="sglang_jit", outcome="miss") == 1
    records = [r for r in compile_log.read_dir(tmp_path / "state") if r["event"] == "jit_build"]
    assert [(r["outcome"], r["module_name"], r["phase"]) for r in records] == [
        ("built", "sgl_kernel_jit_sgw_probe", "warmup"),
        ("hit", "sgl_kernel_jit_sgw_probe", "serving"),
        ("failed", "sgl_kernel_jit_sgw_broken", "serving")]
    assert records[0]["duration_s"] > 0
    assert records[1]["path"].endswith("sgl_kernel_jit_sgw_probe.so")
    assert "Failed to build JIT module" in records[2]["error"]
