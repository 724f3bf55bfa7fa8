"""Stopping a server's process group: SIGTERM to the group, a bounded wait until no process of
it runs, then SIGKILL; the prebake stops SGLang this way on every path (SGLang's launcher, its
scheduler and detokenizer processes, and whatever they started, share the group)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

logger = logging.getLogger("sglang_warmup.prebake")


def stop_process_group(proc: subprocess.Popen, timeout_s: float) -> str:
    """Stop a process started with ``start_new_session=True`` and everything in its process
    group: SIGTERM, wait up to ``timeout_s`` for the group to be gone, then SIGKILL.  Returns
    ``exited`` (it had already ended), ``SIGTERM`` or ``SIGKILL``.  Never raises."""
    pgid = proc.pid  # a session leader's group id is its pid
    if proc.poll() is not None and not _group_alive(pgid):
        return "exited"
    how = "SIGTERM"
    _killpg(pgid, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        _reap(proc, pgid)
        if proc.poll() is not None and not _group_alive(pgid):
            return how
        time.sleep(0.1)
    how = "SIGKILL"
    logger.warning("sglang-warmup: the server did not stop within %g s of SIGTERM; SIGKILL",
                   timeout_s)
    _killpg(pgid, signal.SIGKILL)
    end = time.monotonic() + 10.0  # SIGKILL cannot be refused; this only covers the reaping
    while time.monotonic() < end:
        _reap(proc, pgid)
        if proc.poll() is not None and not _group_alive(pgid):
            break
        time.sleep(0.05)
    return how


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs.  A zombie does not count: it has exited
    and holds nothing (memory, GPU, sockets, files), it only waits for its parent, or for init
    once orphaned, to collect its status; an init that collects late (or never) must not
    make a stopped server look alive until SIGKILL.  A group the signal reaches but that has
    no process in ``/proc`` (a procfs of another PID namespace) is taken as alive: the
    signal's answer stands where procfs cannot contradict it."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:                     # no procfs: the signal's answer is all there is
        return True
    seen = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:                 # gone meanwhile
            continue
        fields = _stat_fields(stat)
        if len(fields) > 2 and fields[2] == b"%d" % pgid:
            seen = True
            if fields[0] not in (b"Z", b"X") or _threads_run(pid):
                return True
    return not seen


def _stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` after ``pid (comm)``: state, ppid, pgrp, ...
    (comm may hold spaces and parentheses: the last ')' ends it)."""
    return stat[stat.rfind(b")") + 2:].split()


def _threads_run(pid: str) -> bool:
    """Whether a thread of a process whose main thread has exited still runs (the process
    then shows as a zombie until its last thread ends)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = _stat_fields(f.read())[:1]
        except OSError:
            continue
        if state and state[0] not in (b"Z", b"X"):
            return True
    return False


def _reap(proc: subprocess.Popen, pgid: int) -> None:
    """Reap exited children of this group that became ours (when we run as PID 1 in a
    container, orphaned SGLang workers are re-parented to us); the leader through ``proc`` so
    that its exit status is kept."""
    for _ in range(1000):
        try:
            info = os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        if info.si_pid == proc.pid:
            if proc.poll() is None:
                return
        else:
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return
