"""Builds of libraries without a hook (their cache directories watched) and in-memory
``torch.compile`` compiles (Dynamo's callbacks): both recorded, phase-stamped, in the compile
log and Prometheus, as the first hits they cause after ready are found on the GPU
(docs/first-hits.md: DeepGEMM's nvcc builds, the penalties' Dynamo graphs)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from cache_tools import compile_log, locations
from warmup.observe import cache_watch, dynamo_hooks, events, metrics, phase


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Our recorders in this process, with a state directory; taken off after."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0")
    phase.reset()
    events.uninstall()
    registry = CollectorRegistry()
    state = tmp_path / "state"
    events.install(registry=registry, state_dir=state)
    yield state, registry
    events.uninstall()
    phase.reset()


def builds(state: Path) -> list[dict]:
    return [r for r in compile_log.read_dir(state) if r.get("event") == "jit_build"]


def counted(registry, compiler: str, phase_name: str) -> float:
    return registry.get_sample_value("sglang_warmup_compile_events_total",
                                     {"phase": phase_name, "compiler": compiler,
                                      "outcome": "miss"}) or 0.0


def deep_gemm_watch(root: Path) -> cache_watch.KindWatch:
    return cache_watch.KindWatch(locations.kind("deep_gemm"), root)


def write(path: Path, text: str = "x", mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_new_cache_entries_are_builds_with_their_span(tmp_path):
    root = tmp_path / "deep_gemm"
    write(root / "cache" / "kernel.old.aaaa" / "kernel.cubin")
    watch = deep_gemm_watch(root)
    assert watch.poll() == []  # what is there at the start is the baseline
    now = time.time()
    # DeepGEMM compiles in tmp/ (never an entry) and renames the kernel directory into cache/
    write(root / "tmp" / "814-x" / "kernel.cu")
    write(root / "cache" / "kernel.sm90_fp8_gemm_1d2d.bbbb" / "kernel.cu", mtime=now - 2.5)
    write(root / "cache" / "kernel.sm90_fp8_gemm_1d2d.bbbb" / "kernel.cubin", mtime=now)
    write(root / "locks" / "x.lock")
    assert [b[:2] for b in watch.poll()] == [("cache/kernel.sm90_fp8_gemm_1d2d.bbbb",
                                            pytest.approx(2.5, abs=0.01))]
    assert watch.poll() == []


def test_a_directory_being_filled_is_one_build_once_it_holds_a_file(tmp_path):
    root = tmp_path / "deep_gemm"
    (root / "cache").mkdir(parents=True)
    watch = deep_gemm_watch(root)
    watch.poll()
    (root / "cache" / "kernel.k.cccc").mkdir()
    assert watch.poll() == []
    write(root / "cache" / "kernel.k.cccc" / "kernel.cubin")
    assert [e for e, *_ in watch.poll()] == ["cache/kernel.k.cccc"]
    assert watch.poll() == []


def test_a_cache_directory_made_after_the_start_is_watched(tmp_path):
    root = tmp_path / "deep_gemm"
    watch = deep_gemm_watch(root)
    assert watch.poll() == []
    write(root / "cache" / "kernel.k.dddd" / "kernel.cubin")
    write(root / "cache" / "kernel.k.eeee" / "kernel.cubin")
    (root / "cache" / "kernel.k.ffff").mkdir()     # being filled: seen once it holds a file
    # cache/ itself is above the entries: each kernel in it is a build of its own
    assert sorted(e for e, *_ in watch.poll()) == ["cache/kernel.k.dddd", "cache/kernel.k.eeee"]
    write(root / "cache" / "kernel.k.ffff" / "kernel.cubin")
    assert [e for e, *_ in watch.poll()] == ["cache/kernel.k.ffff"]
    assert watch.poll() == []


def test_an_entry_gone_while_it_is_walked_costs_no_other_build(tmp_path, monkeypatch):
    """A kernel directory removed between the listing and its walk: the pass goes on, the
    kernel beside it is one build, and the one gone is no build (nor one of time 0)."""
    root = tmp_path / "deep_gemm"
    (root / "cache").mkdir(parents=True)
    watch = deep_gemm_watch(root)
    watch.poll()
    write(root / "cache" / "kernel.b" / "kernel.cubin")
    write(root / "cache" / "kernel.c" / "kernel.cubin")
    walk = watch._visit_new_tree
    removed = []

    def vanishing(path, parts, found, entry):
        if path.name == "kernel.c" and not removed:
            shutil.rmtree(path)
            removed.append(path)
        walk(path, parts, found, entry)

    monkeypatch.setattr(watch, "_visit_new_tree", vanishing)
    assert [e for e, *_ in watch.poll()] == ["cache/kernel.b"]
    write(root / "cache" / "kernel.c" / "kernel.cubin")      # made again: seen then
    assert [e for e, *_ in watch.poll()] == ["cache/kernel.c"]


def test_a_fresh_flashinfer_cache_is_one_build_per_op_once_its_so_is_there(tmp_path):
    """The first op of a FlashInfer cache made after the start: the version directory appears
    with the op's build inside it; one build of the op, held until its .so is there, never
    one named after the version directory.  Ninja's log in the JIT directory (FlashInfer
    before 0.6 ran ninja there) is no build."""
    root = tmp_path / "flashinfer"
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    assert watch.poll() == []
    jit = root / "0.5.3" / "90a" / "cached_ops"
    write(jit / "norm" / "build.ninja")
    write(jit / ".ninja_log")
    write(jit / ".ninja_deps")
    assert watch.poll() == []                   # held: no norm.so yet
    write(jit / "norm" / "norm.so")
    assert [e for e, *_ in watch.poll()] == ["0.5.3/90a/cached_ops/norm"]
    write(jit / "rope" / "rope.so")
    os.utime(jit / ".ninja_log", (time.time() + 1, time.time() + 1))
    assert [e for e, *_ in watch.poll()] == ["0.5.3/90a/cached_ops/rope"]


def test_a_new_directory_is_one_build_and_a_new_file_in_a_known_one_is_one(tmp_path):
    root = tmp_path / "inductor"
    write(root / "fxgraph" / "2d" / "old" / "graph")
    watch = cache_watch.KindWatch(locations.kind("inductor"), root)
    watch.poll()
    write(root / "fxgraph" / "2d" / "newkey" / "graph")
    write(root / "as" / "cas.py")
    write(root / "fxgraph" / "2d" / "old" / "second")
    assert sorted(e for e, *_ in watch.poll()) == ["as/cas.py", "fxgraph/2d/newkey",
                                                  "fxgraph/2d/old/second"]


def test_an_op_rebuilt_in_place_is_one_build_of_the_op(tmp_path):
    """What a restored FlashInfer op left on the GPU when ninja rebuilt it: its lock and two
    depfiles beside the objects and .so it rewrote (names already there).  One build of the
    op, not three of its files; a new op is one build too."""
    root = tmp_path / "flashinfer"
    op = root / "0.6.15.post1" / "90a" / "cached_ops" / "norm"
    for name in ("build.ninja", "csrc_norm.cuda.o", "csrc_flashinfer_norm_binding.cuda.o", "norm.so"):
        write(op / name)
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    assert watch.poll() == []
    write(op / ".ninja_lock")
    write(op / "csrc_norm.cuda.o.d", mtime=time.time() - 2)
    write(op / "csrc_flashinfer_norm_binding.cuda.o.d")
    [(entry, span, _, _)] = watch.poll()
    assert entry == "0.6.15.post1/90a/cached_ops/norm" and span >= 1.5
    write(root / "0.6.15.post1" / "90a" / "cached_ops" / "rope" / "rope.so")
    assert [e for e, *_ in watch.poll()] == ["0.6.15.post1/90a/cached_ops/rope"]


def test_an_op_built_over_several_polls_is_one_build(tmp_path):
    """A first build: build.ninja, then an object, then the .so, one poll apart: held until
    the .so is there, then one build with the whole span."""
    root = tmp_path / "flashinfer"
    jit = root / "0.6.15.post1" / "90a" / "cached_ops"
    jit.mkdir(parents=True)
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    assert watch.poll() == []
    t = time.time()
    write(jit / "rope" / "build.ninja", mtime=t - 30)
    assert watch.poll() == []
    write(jit / "rope" / "rope.cuda.o", mtime=t - 10)
    assert watch.poll() == []
    assert watch.poll() == []                  # a long compile: nothing new, no .so yet
    write(jit / "rope" / "rope.so", mtime=t)
    [(entry, span, _, _)] = watch.poll()
    assert entry == "0.6.15.post1/90a/cached_ops/rope" and span == pytest.approx(30, abs=0.1)
    assert watch.poll() == []


def test_a_first_build_cut_short_is_recorded_when_the_watch_stops(tmp_path):
    root = tmp_path / "flashinfer"
    jit = root / "0.6.15.post1" / "90a" / "cached_ops"
    jit.mkdir(parents=True)
    recorded = []
    watch = cache_watch.CacheWatch(lambda *a, **k: recorded.append((a, k)), 60,
                                   kinds=[cache_watch.KindWatch(locations.kind("flashinfer"), root)])
    watch.poll_once()
    write(jit / "rope" / "build.ninja")
    assert watch.poll_once() == 0              # no .so yet: held
    watch.stop()
    [(args, kwargs)] = recorded
    assert args[:2] == ("failed", "0.6.15.post1/90a/cached_ops/rope")
    assert kwargs["compiler"] == "flashinfer"


def test_a_build_held_across_polls_keeps_what_its_first_poll_saw(tmp_path):
    """A build first seen while warming and finished after the phase turned: stamped with
    the first poll's phase, not counted as a compile after ready."""
    root = tmp_path / "flashinfer"
    jit = root / "0.6.15.post1" / "90a" / "cached_ops"
    jit.mkdir(parents=True)
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    assert watch.poll("init") == []
    write(jit / "rope" / "build.ninja")
    assert watch.poll("warmup") == []
    write(jit / "rope" / "rope.so")
    [build] = watch.poll("serving")
    assert (build.entry, build.seen, build.failed) == \
        ("0.6.15.post1/90a/cached_ops/rope", "warmup", False)


@pytest.mark.parametrize("end", ["removed", "quiet"])
def test_a_build_that_never_gets_its_marker_is_a_failed_build(tmp_path, monkeypatch, end):
    """Its directory removed (a cleanup after the failure), or nothing new in it for long:
    one failed build, no longer held."""
    root = tmp_path / "flashinfer"
    jit = root / "0.6.15.post1" / "90a" / "cached_ops"
    jit.mkdir(parents=True)
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    watch.poll()
    write(jit / "rope" / "build.ninja")
    assert watch.poll("warmup") == []
    assert watch.poll() == []                   # quiet, but not for long
    if end == "removed":
        shutil.rmtree(jit / "rope")
    else:
        monkeypatch.setattr(cache_watch, "HELD_FAILED_AFTER_S", 0.0)
    [build] = watch.poll("serving")
    assert (build.entry, build.seen, build.failed) == \
        ("0.6.15.post1/90a/cached_ops/rope", "warmup", True)
    assert watch.held == {} and watch.poll() == []


def test_the_watch_records_a_held_build_in_the_phase_it_began(installed, tmp_path):
    state, _ = installed
    root = tmp_path / "flashinfer"
    jit = root / "0.6.15.post1" / "90a" / "cached_ops"
    jit.mkdir(parents=True)
    phase.set_phase("warmup", state_dir=state)
    watch = cache_watch.CacheWatch(events.record_build, 60,
                                   kinds=[cache_watch.KindWatch(locations.kind("flashinfer"), root)])
    watch.poll_once()
    write(jit / "rope" / "build.ninja")
    assert watch.poll_once() == 0
    phase.set_phase("serving", state_dir=state)
    write(jit / "rope" / "rope.so")
    assert watch.poll_once() == 1
    [rec] = builds(state)
    assert (rec["compiler"], rec["phase"], rec["outcome"]) == ("flashinfer", "warmup", "built")


def test_an_op_rebuilt_in_place_over_several_polls_is_one_build(tmp_path):
    """After a restore: ninja's depfiles appear beside a .so older than them, then nothing new
    (ninja rewrites the objects and the .so): one build, once the directory is quiet."""
    root = tmp_path / "flashinfer"
    op = root / "0.6.15.post1" / "90a" / "cached_ops" / "norm"
    t = time.time()
    write(op / "norm.so", mtime=t - 100)
    write(op / "csrc_norm.cuda.o", mtime=t - 100)
    watch = cache_watch.KindWatch(locations.kind("flashinfer"), root)
    assert watch.poll() == []
    write(op / "csrc_norm.cuda.o.d", mtime=t)
    assert watch.poll() == []                  # building: the .so is older than the depfile
    [(entry, *_)] = watch.poll()
    assert entry == "0.6.15.post1/90a/cached_ops/norm"
    os.utime(op / "norm.so", (t + 5, t + 5))   # ninja's link, later: nothing new to report
    assert watch.poll() == []


def test_the_watch_records_builds_in_the_current_phase(installed, tmp_path):
    state, registry = installed
    root = tmp_path / "deep_gemm"
    (root / "cache").mkdir(parents=True)
    watch = cache_watch.CacheWatch(events.record_build, 0.05, kinds=[deep_gemm_watch(root)])
    watch.start()
    try:
        phase.set_phase("serving", state_dir=state)
        write(root / "cache" / "kernel.k.eeee" / "kernel.cubin")
        deadline = time.time() + 10
        while not builds(state) and time.time() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    [rec] = builds(state)
    assert (rec["compiler"], rec["phase"], rec["outcome"], rec["module_name"]) == \
        ("deep_gemm", "serving", "built", "cache/kernel.k.eeee")
    assert rec["path"] == str(root / "cache" / "kernel.k.eeee")
    assert compile_log.is_miss(rec)  # coverage, audit and the report count it as compiled now
    assert counted(registry, "deep_gemm", "serving") == 1


def test_every_watched_kind_is_a_metrics_compiler():
    assert set(cache_watch.WATCHED) <= set(metrics.COMPILERS)
    assert "dynamo" in metrics.COMPILERS


def test_torch_compile_graphs_are_recorded_with_their_function(installed):
    """A real ``torch.compile`` (Dynamo traces; the eager backend keeps it fast): a batch of
    one and then of several compile two graphs, each one build of compiler ``dynamo``."""
    import torch

    state, registry = installed

    def apply_scaling_penalties(logits, penalties):
        return torch.where(logits < 0, logits * penalties, logits / penalties)

    compiled = torch.compile(apply_scaling_penalties, backend="eager", dynamic=True)
    phase.set_phase("serving", state_dir=state)
    compiled(torch.randn(1, 8), torch.full((1, 8), 1.1))
    compiled(torch.randn(4, 8), torch.full((4, 8), 1.1))
    compiled(torch.randn(5, 8), torch.full((5, 8), 1.1))  # the same graph: no compile
    recs = [r for r in builds(state) if r["compiler"] == "dynamo"]
    assert len(recs) == 2
    assert all(r["phase"] == "serving" and r["duration_s"] > 0 for r in recs)
    assert all("apply_scaling_penalties" in r["module_name"] for r in recs)
    assert counted(registry, "dynamo", "serving") == 2
    # the first graph is no recompile; the second names the guard of the first that failed
    assert "reason" not in recs[0]
    assert "logits" in recs[1]["reason"] and len(recs[1]["reason"]) <= compile_log.MAX_REASON


def test_a_recompile_reason_is_read_without_torch_logs(installed):
    """A dtype change fails the first graph's tensor guard: the reason names the argument, and
    Dynamo's recompile logging stayed off."""
    import torch

    state, _ = installed
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=True)
    compiled(torch.ones(3, dtype=torch.float32))
    compiled(torch.ones(3, dtype=torch.float64))
    recs = [r for r in builds(state) if r["compiler"] == "dynamo"]
    assert [("reason" in r) for r in recs] == [False, True]
    assert "float" in recs[1]["reason"] or "dtype" in recs[1]["reason"]
    assert not torch._logging._internal.log_state.is_artifact_enabled("recompiles")


def test_a_callback_outside_a_dynamo_compile_carries_no_stale_reason(installed):
    """Dynamo's metrics context keeps the last recompile's values after it; a CUDA graph
    recorded later on the same thread (another trigger of the same callbacks) is no
    recompile and must not carry them."""
    import torch
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    state, _ = installed
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=True)
    compiled(torch.ones(3, dtype=torch.float32))
    compiled(torch.ones(3, dtype=torch.float64))
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/1"):
        pass
    recs = [r for r in builds(state) if r["compiler"] == "dynamo"]
    assert len(recs) == 3
    assert "reason" in recs[1] and "reason" not in recs[2]
    assert recs[2]["module_name"] == "torch.compile [0/1] (cudagraph_recording)"
    # and without a trigger to go by, outside a compile the context's old values are not read
    assert dynamo_hooks._recompile_reason(()) is None


def test_the_main_process_alone_watches(monkeypatch):
    from warmup.serve import plugin

    started = []
    monkeypatch.setattr(cache_watch.CacheWatch, "start", lambda self: started.append(self))
    monkeypatch.setattr(plugin, "_is_main_process", lambda: False)
    plugin._start_cache_watch()
    assert started == []
    monkeypatch.setattr(plugin, "_is_main_process", lambda: True)
    monkeypatch.setenv("WARMUP_CACHE_WATCH_S", "0")
    plugin._start_cache_watch()
    assert started == []
    monkeypatch.setenv("WARMUP_CACHE_WATCH_S", "0.5")
    plugin._start_cache_watch()
    assert len(started) == 1
