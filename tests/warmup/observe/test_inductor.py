"""Inductor's own compile workers (real torch SubprocPool) load our compile hooks, and a Triton
compile there is recorded with the server's phase."""

from __future__ import annotations

import os

import pytest

from cache_tools import compile_log
from warmup.observe import inductor, phase


@pytest.fixture()
def enabled(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMUP_ENABLE", "1")
    monkeypatch.setenv("WARMUP_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    (tmp_path / "state").mkdir()
    return tmp_path / "state"


def test_pickler_is_found_by_name_as_inductors_worker_does():
    from torch._inductor.compile_worker.__main__ import _lookup_and_create_type
    from torch._inductor.compile_worker.subproc_pool import SubprocPickler

    obj = _lookup_and_create_type(SubprocPickler, "warmup.observe.inductor.HookedPickler")
    assert isinstance(obj, SubprocPickler) and obj.loads(obj.dumps({"a": 1})) == {"a": 1}


def test_arm_is_idempotent_and_keeps_an_explicit_pickler():
    from torch._inductor.compile_worker import subproc_pool

    inductor.arm()
    first = subproc_pool.SubprocPool.__init__
    inductor.arm()
    assert subproc_pool.SubprocPool.__init__ is first
    assert first.__wrapped__.__name__ == "__init__"


def test_inductor_worker_records_compiles_with_the_phase(enabled):
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    import _inductor_job

    inductor.arm()
    phase.set_phase("serving", state_dir=enabled)
    pool = SubprocPool(1)
    try:
        assert type(pool.pickler).__name__ == "HookedPickler"
        got = pool.submit(_inductor_job.hooks_in_worker).result(timeout=240)
    finally:
        pool.shutdown()
    assert got["installed"] is True and got["pid"] != os.getpid()
    misses = [r for r in compile_log.read_dir(enabled) if r.get("event") == "miss"]
    assert [(r["kernel"]["name"], r["phase"], r["pid"]) for r in misses] == [("add_one", "serving", got["pid"])]
