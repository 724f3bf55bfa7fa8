"""warmup.prebake.process_group: stopping a server's process group (SIGTERM, a bounded wait
until no process of the group runs, SIGKILL), with real process groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sidecar_support"))

from harness import gone  # noqa: E402

from warmup.prebake import process_group  # noqa: E402

PY = sys.executable


def _group(script: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    return proc, child


def test_stop_process_group_terminates_the_whole_group():
    proc, child = _group("sleep 300 & echo $!; wait")
    assert process_group.stop_process_group(proc, 5.0) == "SIGTERM"
    assert proc.poll() is not None and gone(child)


def test_stop_process_group_escalates_to_sigkill():
    proc, child = _group("trap '' TERM; sh -c \"trap '' TERM; sleep 300\" & echo $!; wait")
    t0 = time.monotonic()
    assert process_group.stop_process_group(proc, 0.5) == "SIGKILL"
    assert time.monotonic() - t0 < 5
    assert proc.poll() == -signal.SIGKILL and gone(child)


# The group leader starts P in a group of its own (same session) and P starts Z, which joins
# the leader's group and exits at once: a zombie in the group whose parent lives on outside it
# and never collects it (as when the reaping init of a container is late, or never reaps).
_UNREAPED_ZOMBIE = """
import os, sys, time
group = os.getpgid(0)
p = os.fork()
if p == 0:
    os.setpgid(0, 0)
    z = os.fork()
    if z == 0:
        os.setpgid(0, group)
        os._exit(0)
    print(os.getpid(), z, flush=True)
    time.sleep(300)
    os._exit(0)
time.sleep(300)
"""


def test_a_zombie_left_in_the_group_does_not_keep_it_alive():
    proc = subprocess.Popen([PY, "-c", _UNREAPED_ZOMBIE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    parent, zombie = map(int, proc.stdout.readline().split())
    try:
        for _ in range(100):
            with open(f"/proc/{zombie}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                break
            time.sleep(0.05)
        assert fields[0] == b"Z" and int(fields[2]) == proc.pid    # a zombie of the group
        t0 = time.monotonic()
        assert process_group.stop_process_group(proc, 5.0) == "SIGTERM"
        assert time.monotonic() - t0 < 2                            # not the 5 s timeout
        assert proc.poll() == -signal.SIGTERM
    finally:
        os.kill(parent, signal.SIGKILL)


# A process whose main thread has exited while another thread runs on: /proc shows it as a
# zombie ('Z') until its last thread ends.
_MAIN_THREAD_GONE = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(300,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_whose_main_thread_exited_is_still_alive():
    proc = subprocess.Popen([PY, "-c", _MAIN_THREAD_GONE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(100):
            with open(f"/proc/{proc.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.05)
        assert process_group._group_alive(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not process_group._group_alive(proc.pid)


def test_stop_process_group_of_an_exited_process():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    assert process_group.stop_process_group(proc, 1.0) == "exited"


def test_a_group_procfs_does_not_show_is_taken_as_alive(monkeypatch):
    """Where /proc is another PID namespace's, the group the signal reaches is not in it: the
    signal's answer stands (the group was not seen to be gone), so the stop waits and escalates
    rather than packing caches under a server still writing them."""
    proc, child = _group("sleep 300 & echo $!; wait")
    try:
        listdir = os.listdir
        monkeypatch.setattr(process_group.os, "listdir",
                            lambda path: [] if path == "/proc" else listdir(path))
        assert process_group._group_alive(proc.pid)
    finally:
        monkeypatch.undo()
        assert process_group.stop_process_group(proc, 5.0) == "SIGTERM"
    assert gone(child)
