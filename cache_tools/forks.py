"""Forked workers: a few tasks run in child processes of this one at once, each reporting its
progress and one result back through a pipe.

Per-file work in Python (hashing, header bytes, the write) holds the interpreter lock, so
threads do not spread it over CPUs; forked processes do, and they start in milliseconds with
everything the parent has already read.  Callers (restore and pack) use them only where
:func:`usable` says so, and treat ``None`` from :func:`run` (a task failed, a fork failed) as
"do the work in this process": that path then says what is wrong, with its own messages, so the
workers can make an operation faster, never different.
"""

from __future__ import annotations

import marshal
import math
import os
import selectors
import signal
import struct
import sys
import threading
from typing import Callable, Iterable, Sequence

#: at most this many workers (more gain nothing on the file systems measured)
MAX_JOBS = 8
#: below this many files and bytes an operation stays in one process (a fork costs more than it
#: saves)
MIN_FILES = 2048
MIN_BYTES = 256 << 20
#: a scan of fewer entries than this stays in one process
MIN_ENTRIES = 512
#: a worker reports its progress every this many bytes
_REPORT_BYTES = 8 << 20
_FRAME = struct.Struct("<cQ")     # b"P" + bytes done, or b"R" + length of the result after it
_RUN = struct.Struct("<I")        # the number of a run, in map_runs' pipe
#: runs per job in map_runs: small enough that the last ones even out the workers' ends, few
#: enough that a run's own cost (a seek, a new buffer) stays negligible
RUNS_PER_JOB = 8
#: the signals that stop an operation; a worker dies of them at once
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1

#: A task: gets ``advance(nbytes)`` for its progress, returns its result.
Task = Callable[[Callable[[int], None]], bytes]


def default_jobs() -> int:
    """The CPUs this process may use, at most MAX_JOBS."""
    return min(usable_cpus(), MAX_JOBS)


def jobs_for(asked: int | None) -> int:
    """The workers to use when ``asked`` for (None: ``default_jobs``): at least 1, at most
    MAX_JOBS whatever was asked (a --jobs of thousands must not fork thousands)."""
    return default_jobs() if asked is None else max(1, min(int(asked), MAX_JOBS))


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may run on: its affinity mask, capped by the cgroup v2 CPU quota in
    ``cpu_max`` (a container limited to 2 CPUs on a 64-core node gets 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open(cpu_max, encoding="ascii") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota readable: the affinity mask is the limit
    return max(1, cpus)


def fork_is_safe() -> bool:
    """Whether worker processes may be forked from this one: on Linux, with no other Python
    thread (one holding a lock at the fork would leave it held forever in the child) and no
    initialised CUDA context (which a child cannot use)."""
    # Linux always forks (multiprocessing's start methods say so too; importing it to ask
    # took 8 ms of every pack and restore)
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if not single_threaded():
        return False
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return False
    except Exception:  # a torch without CUDA support: nothing to inherit
        pass
    return True


def single_threaded() -> bool:
    """No other thread runs in this process (a forked child would miss it and any lock it
    holds)."""
    return threading.active_count() == 1


def usable(jobs: int) -> bool:
    """Whether forked workers may run here: more than one job, and :func:`fork_is_safe`."""
    return jobs > 1 and fork_is_safe()


def worth(files: int, nbytes: int) -> bool:
    """Whether an operation on ``files`` files of ``nbytes`` in all is worth workers."""
    return files >= MIN_FILES or nbytes >= MIN_BYTES


def weight(nbytes: int, files: int) -> int:
    """A worker's share of ``files`` files of ``nbytes`` in all, in bytes: a file costs about
    what 16 KiB of data does (its system calls and Python work)."""
    return nbytes + files * (16 << 10)


def split(weights: Sequence[int], jobs: int) -> list[tuple[int, int]]:
    """Up to ``jobs`` contiguous runs ``(first, end)`` of items of about equal total weight."""
    total = sum(weights)
    runs: list[tuple[int, int]] = []
    first = done = 0
    for i, w in enumerate(weights):
        done += w
        if len(runs) < jobs - 1 and done >= total * (len(runs) + 1) / jobs and i + 1 < len(weights):
            runs.append((first, i + 1))
            first = i + 1
    runs.append((first, len(weights)))
    return runs


def map_runs(weights: Sequence[int], jobs: int,
             work: Callable[[int, int, Callable[[int], None]], bytes],
             advance: Callable[[int], None]) -> list[bytes] | None:
    """The items of ``weights`` in contiguous runs of about equal weight (``RUNS_PER_JOB`` per
    job), handed out one at a time to ``jobs`` forked workers: each takes the next run when it
    is done with its last, so a worker slowed down (a busy neighbour, files costlier than their
    weight) takes fewer.  ``work(first, end, advance)`` does one run; its results, in run
    order, or None as :func:`run` says.  The runs are numbered into a pipe before the fork; a
    worker takes one by reading its number (reads of a pipe are atomic)."""
    runs = split(weights, min(jobs, MAX_JOBS) * RUNS_PER_JOB)
    tokens = b"".join(_RUN.pack(i) for i in range(len(runs)))
    assert len(tokens) <= 4096, "the run numbers must fit one pipe buffer, written at once"
    try:
        r, w = os.pipe()
    except OSError:                                         # no descriptor to spare
        return None
    try:
        os.write(w, tokens)
    except OSError:
        os.close(r)
        return None
    finally:
        os.close(w)

    def task(progress: Callable[[int], None]) -> bytes:
        done: list[tuple[int, bytes]] = []
        while True:
            token = os.read(r, _RUN.size)
            if not token:
                return marshal.dumps(done)
            (i,) = _RUN.unpack(token)
            first, end = runs[i]
            done.append((i, work(first, end, progress)))

    try:
        results = run([task] * min(jobs, len(runs)), advance)
    finally:
        os.close(r)
    if results is None:
        return None
    by_run = dict(pair for blob in results for pair in marshal.loads(blob))
    if sorted(by_run) != list(range(len(runs))):
        return None
    return [by_run[i] for i in range(len(runs))]


def run(tasks: Sequence[Task], advance: Callable[[int], None]) -> list[bytes] | None:
    """Run every task in a forked child at once; their results in order, or None when any task
    failed or could not start (the workers already started are stopped and reaped first)."""
    pids: list[int] = []
    pipes: list[int] = []
    results: dict[int, bytes] = {}
    parent = os.getpid()
    die_with = _parent_death_signal()
    try:
        for task in tasks:
            try:
                r, w = os.pipe()
            except OSError:                                 # no descriptor to spare
                return None
            pipes.append(r)
            # Stop signals wait while forking, so that none reaches a child still running the
            # parent's code (it would unwind the parent's stack, its cleanups included).
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
            try:
                pid = os.fork()
            except OSError:                                 # no process to spare
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(w)
                return None
            if pid == 0:                                    # the worker
                os._exit(_worker(task, r, w, parent, mask, die_with))
            pids.append(pid)                # known (to stop) before a signal can interrupt
            os.close(w)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _collect(pipes, advance, results)
        codes = []
        while pids:
            try:
                status = os.waitpid(pids[0], 0)[1]
            except ChildProcessError:                       # SIGCHLD ignored: no exit status
                return None
            pids.pop(0)
            codes.append(os.waitstatus_to_exitcode(status))
    finally:
        for fd in pipes:
            os.close(fd)
        for pid in pids:                                    # interrupted: stop and reap them
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
    if any(codes) or len(results) != len(tasks):
        return None
    return [results[fd] for fd in pipes]


def _parent_death_signal() -> Callable[[], None]:
    """What makes a worker die with its parent (Linux's PR_SET_PDEATHSIG: a parent killed by
    a supervisor leaves no worker writing on), resolved before forking."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return lambda: None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _worker(task: Task, r: int, w: int, parent: int, mask: Iterable[int],
            die_with: Callable[[], None]) -> int:
    """The forked child until its task ends: stop signals kill it outright (no Python
    unwinding of the parent's stack), and so does its parent's death."""
    try:
        for signum in _STOPS:
            signal.signal(signum, signal.SIG_DFL)
        die_with()
        if os.getppid() != parent:                          # the parent died before that
            return 1
        os.close(r)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except BaseException:                                   # noqa: BLE001 - exit, never return
        return 1
    return _child(task, w)


def _child(task: Task, fd: int) -> int:
    """One worker: 0 when its task returned (its result sent), 1 on anything at all."""
    try:
        import gc

        gc.disable()                                        # a short life: no cycles to find
        pending = [0]

        def advance(n: int) -> None:
            pending[0] += n
            if pending[0] >= _REPORT_BYTES:
                _send(fd, _FRAME.pack(b"P", pending[0]))
                pending[0] = 0

        result = task(advance)
        if pending[0]:
            _send(fd, _FRAME.pack(b"P", pending[0]))
        _send(fd, _FRAME.pack(b"R", len(result)) + result)
        return 0
    except BaseException:                                   # noqa: BLE001 - the parent decides
        return 1
    finally:
        os.close(fd)


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _collect(pipes: list[int], advance: Callable[[int], None], results: dict[int, bytes]) -> None:
    """Read every worker's frames until every worker has closed its pipe: progress as it comes,
    the result at the end."""
    buffers = {fd: bytearray() for fd in pipes}
    with selectors.DefaultSelector() as sel:          # any descriptor number (not select())
        for fd in pipes:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                fd = key.fd
                data = os.read(fd, 1 << 16)
                if not data:
                    sel.unregister(fd)
                    continue
                _frames(buffers[fd], data, fd, advance, results)


def _frames(buf: bytearray, data: bytes, fd: int, advance: Callable[[int], None],
            results: dict[int, bytes]) -> None:
    """Take every whole frame out of ``buf`` once ``data`` is added to it."""
    buf += data
    while len(buf) >= _FRAME.size:
        kind, n = _FRAME.unpack_from(buf)
        if kind == b"P":
            del buf[:_FRAME.size]
            advance(n)
        elif len(buf) >= _FRAME.size + n:
            results[fd] = bytes(buf[_FRAME.size:_FRAME.size + n])
            del buf[:_FRAME.size + n]
        else:
            break
