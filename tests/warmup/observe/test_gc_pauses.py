"""warmup.observe.gc_pauses: a long Python garbage collection of a process with the hooks
installed becomes one compile-log record (event gc), written by the recorder's thread."""

from __future__ import annotations

import gc

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
