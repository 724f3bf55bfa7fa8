"""forks.py: workers that never outlive the operation that forked them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cache_tools import forks

REPO = Path(__file__).resolve().parents[2]

#: A parent whose two workers write their pid, then wait long; it waits for them.
_PARENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from cache_tools import forks

    def task(i):
        def work(advance):
            with open(os.path.join({out!r}, f"worker-{{i}}"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
            return b""
        return work

    print(forks.run([task(0), task(1)], lambda n: None), flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    code = _PARENT.format(repo=str(REPO), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("worker-*"))) < 2 or \
            not all(p.read_text() for p in tmp_path.glob("worker-*")):
        assert time.monotonic() < deadline and proc.poll() is None, "workers did not start"
        time.sleep(0.02)
    return proc, [int(p.read_text()) for p in sorted(tmp_path.glob("worker-*"))]


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_parent_killed_outright(tmp_path):
    """A supervisor's SIGKILL (or a SIGTERM the parent dies of) leaves no worker behind."""
    proc, workers = _start(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert _gone_within(workers, 10), [p for p in workers if _alive(p)]


def test_a_stop_signal_kills_a_worker_and_the_parent_does_the_work_itself(tmp_path):
    """A worker stopped by SIGINT or SIGTERM dies of it (no Python unwinding of the parent's
    stack in the child): run() reports None, the caller's one-process fallback."""
    proc, workers = _start(tmp_path)
    os.kill(workers[0], signal.SIGINT)
    os.kill(workers[1], signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "None"
    assert proc.returncode == 0
    assert _gone_within(workers, 5)


def test_results_come_back_in_task_order():
    assert forks.run([lambda advance: b"a" * 3, lambda advance: b"", lambda advance: b"bc"],
                     lambda n: None) == [b"aaa", b"", b"bc"]


def test_runs_cover_every_item_once_and_come_back_in_order():
    weights = [5, 1, 1, 9, 2, 2, 2, 7, 1, 1, 3] * 7
    got = forks.map_runs(weights, 3, lambda a, b, advance: bytes(range(a, b)), lambda n: None)
    assert got is not None and len(got) > 3
    assert b"".join(got) == bytes(range(len(weights)))          # contiguous, in order, once
    assert forks.map_runs([], 2, lambda a, b, advance: b"%d-%d" % (a, b),
                          lambda n: None) == [b"0-0"]


def test_a_slow_worker_takes_fewer_runs():
    """Runs are taken one at a time: while one worker is held up by its first run, the other
    takes the rest (a static split would have left half of them to the slow one)."""
    def work(first, end, advance):
        if first == 0:
            time.sleep(1.0)
        return b"%d" % os.getpid()

    got = forks.map_runs([1] * 64, 2, work, lambda n: None)
    assert got is not None and len(got) == 2 * forks.RUNS_PER_JOB
    slow = got[0]
    assert got.count(slow) <= 2 and len(set(got)) == 2, got


def test_a_failing_run_fails_the_whole_map():
    def work(first, end, advance):
        if first > 0:
            raise OSError("disk gone")
        return b""

    assert forks.map_runs([1] * 16, 2, work, lambda n: None) is None


def test_no_descriptor_to_spare_means_no_workers(valid_archive, fp, monkeypatch):
    """A process out of file descriptors gets None from map_runs (as from run), and the
    operation runs in this process instead of failing."""
    import hostile
    from cache_tools import archive

    def no_pipe():
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "pipe", no_pipe)
    assert forks.map_runs([1] * 16, 2, lambda a, b, advance: b"", lambda n: None) is None
    with hostile.forked_workers():
        assert archive.verify(valid_archive, local=fp, jobs=2).manifest.nb_files > 0


def test_a_job_count_is_capped_whatever_is_asked(monkeypatch):
    """``--jobs 100000`` must not fork a hundred thousand workers: at most MAX_JOBS, at least 1;
    None is the usable CPUs (capped the same way)."""
    monkeypatch.setattr(forks, "usable_cpus", lambda: 64)
    assert forks.jobs_for(None) == forks.MAX_JOBS
    assert forks.jobs_for(100_000) == forks.MAX_JOBS
    assert forks.jobs_for(3) == 3
    assert forks.jobs_for(0) == 1


def test_pack_and_restore_fork_at_most_max_jobs(triton_cache, tmp_path, fp, monkeypatch):
    from cache_helpers import triton_location
    from cache_tools import archive

    monkeypatch.setattr(forks, "MIN_FILES", 1)
    monkeypatch.setattr(forks, "MIN_BYTES", 1)
    monkeypatch.setattr(forks, "MIN_ENTRIES", 1)
    monkeypatch.setattr(forks, "MAX_JOBS", 2)
    monkeypatch.setattr(forks, "single_threaded", lambda: True)
    seen = []
    real = forks.run
    monkeypatch.setattr(forks, "run", lambda tasks, advance: seen.append(len(tasks)) or
                        real(tasks, advance))
    out = tmp_path / "c.tar"
    archive.pack(out, [triton_location(triton_cache)], fingerprint=fp, jobs=100_000)
    archive.plan_restore(out, dest=tmp_path / "dest", local=fp).execute(jobs=100_000)
    assert seen and max(seen) <= 2, seen
