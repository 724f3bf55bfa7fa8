"""warmup.observe.gc_pauses: a long Python garbage collection of a process with the hooks
installed becomes one compile-log record (event gc), written by the recorder's thread."""

from __future__ import annotations

import gc
import os
import threading

import pytest
from prometheus_client import CollectorRegistry

from cache_tools import compile_log
from warmup.observe import events, phase


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    events.uninstall()
    phase.reset()
    yield
    events.uninstall()
    phase.reset()


def _collect_a_lot() -> None:
    junk = [[i, {"i": i}] for i in range(300_000)]
    junk.append(junk)           # a cycle: the collection has something to find
    del junk
    gc.collect()


def test_a_long_collection_is_written_with_its_phase(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0.001")
    phase.set_phase("serving", state_dir=str(tmp_path))
    report = events.install(registry=CollectorRegistry(), state_dir=tmp_path)
    assert ("gc.callbacks", "installed") in [(h.name, h.state) for h in report.hooks]
    _collect_a_lot()
    events.uninstall()          # stops the writer thread after a last write
    pauses = [r for r in compile_log.read_dir(tmp_path) if r["event"] == "gc"]
    full = [r for r in pauses if r["generation"] == 2]
    assert full, pauses
    r = full[-1]
    assert r["phase"] == "serving" and r["compiler"] == "python"
    assert r["duration_s"] > 0 and r["collected"] >= 1
    assert not compile_log.is_compile_event(r) and not compile_log.is_miss(r)


def test_collections_are_not_recorded_when_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMUP_GC_PAUSE_MS", "0")
    before = list(gc.callbacks)
    report = events.install(registry=CollectorRegistry(), state_dir=tmp_path)
    assert ("gc.callbacks", "missing") in [(h.name, h.state) for h in report.hooks]
    assert gc.callbacks == before
    _collect_a_lot()
    events.uninstall()
    assert [r for r in compile_log.read_dir(tmp_path) if r["event"] == "gc"] == []


def test_uninstall_takes_the_callback_off(tmp_path):
    before = list(gc.callbacks)
    events.install(registry=CollectorRegistry(), state_dir=tmp_path)
    assert len(gc.callbacks) == len(before) + 1
    events.uninstall()
    assert gc.callbacks == before


def _in_child(check) -> int:
    """Run ``check()`` in a forked child; its exit status (0: it held)."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if check() else 1)
        except BaseException:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_child_takes_the_callback_off_and_gets_new_locks(tmp_path):
    from warmup.observe import gc_pauses

    events.install(registry=CollectorRegistry(), state_dir=tmp_path)
    recorder = next(iter(gc_pauses._RECORDERS))
    assert recorder._callback in gc.callbacks
    # the writer thread does not survive the fork: the child must not queue for nobody
    assert _in_child(lambda: recorder._callback not in gc.callbacks) == 0
    assert recorder._callback in gc.callbacks                   # the parent keeps it
    # a lock held by another thread of the parent at the fork is a new, free lock in the child
    writer = recorder.inst.log
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with writer._lock, phase._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        status = _in_child(lambda: writer._lock.acquire(timeout=5) and phase._lock.acquire(timeout=5))
    finally:
        release.set()
        holder.join()
    assert status == 0
