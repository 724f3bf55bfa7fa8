"""The compile processes of a replay: how many, how they start, and the loop that feeds them.

Importing a kernel's module can cost more than compiling it: SGLang's package imports torch
and transformers (about 6 s on a 2-core machine) before any kernel module, and the first
compile in a process hashes Triton itself (about a second).  Spawned workers would each pay
both, so two of them were slower than one process on two cores.  Here the replaying process
pays them once (:func:`cache_tools.replay.worker.prepare`) and then forks its workers, which
inherit the imported modules, the Triton hash and the ptxas versions: N workers cost the CPU
time of one process plus the compiles, spread over N cores.

Forking is used where it is safe: on Linux, from a process with no other Python thread (a
thread holding a lock at the fork would leave that lock held forever in the child) and
without an initialised CUDA context (which a child cannot use).  Elsewhere workers are spawned,
and the default job count is 1.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from typing import Any, Iterator, Sequence

from cache_tools import locations
from cache_tools.forks import fork_is_safe, usable_cpus
from cache_tools.replay.report import COMPILE_ERROR, FAILED, FORK, IN_PROCESS, SPAWN
from cache_tools.replay.toolchain import Toolchain
from cache_tools.replay.worker import cache_environment, prepare, replay_record


def default_jobs(todo: int, *, fork: bool) -> int:
    """The job count when none is given: one process per usable CPU (never more than there
    are records to compile) when workers can be forked after the imports, else 1.

    Forked workers cost no import of their own, so more of them never cost more CPU time than
    one process; spawned ones each import the kernels' packages again, which on a 2-core
    machine made two jobs 1.39x slower than one."""
    if not fork:
        return 1
    return max(1, min(usable_cpus(), todo))


def pool_kind(workers: int, todo: int) -> str:
    """IN_PROCESS, FORK or SPAWN: how ``todo`` records are compiled by ``workers`` jobs."""
    if workers <= 1 or todo <= 1:
        return IN_PROCESS
    return FORK if fork_is_safe() else SPAWN


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Keep every object made so far (the imported torch, SGLang and Triton: hundreds of MB)
    out of the garbage collector while compiling.  Collections during a compile then no
    longer walk them, and forked workers do not copy the pages such a walk would write to
    (``gc.freeze`` exists for this).  Left alone when someone else froze objects already."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Pool:
    """The compile processes of one replay: ``workers`` jobs, started as ``kind`` says
    (:func:`pool_kind`; a fork planned before the imports becomes a spawn when an import
    started a thread)."""

    def __init__(self, workers: int, todo: int) -> None:
        self.workers = workers
        self.kind = pool_kind(workers, todo)

    def run(self, records: Sequence[dict[str, Any]], *, cache_dir: str,
            toolchain: Toolchain) -> Iterator[tuple[int, dict[str, Any]]]:
        """Replay ``records``; yields (index into ``records``, outcome of ``replay_record``)
        as each finishes."""
        if self.kind in (IN_PROCESS, FORK):
            # The imports happen under the cache environment, as they would record by record
            # in this process: a package that sets cache variables on import (SGLang does)
            # finds ours set.
            with locations.environment(cache_environment(cache_dir)):
                prepare(records, toolchain)
        if self.kind == FORK and not fork_is_safe():  # an import started a thread: no fork
            self.kind = SPAWN
        if self.kind == SPAWN:
            toolchain.read(records)  # spawned workers get the versions with their arguments
        if self.kind == IN_PROCESS:
            with locations.environment(cache_environment(cache_dir)), _frozen_heap():
                for index, record in enumerate(records):
                    yield index, _worker(record, cache_dir, toolchain)
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context(self.kind)
        with _frozen_heap() if self.kind == FORK else contextlib.nullcontext(), \
                ProcessPoolExecutor(max_workers=min(self.workers, len(records)),
                                    mp_context=context, initializer=_worker_init,
                                    initargs=(cache_dir, toolchain)) as pool:
            with warnings.catch_warnings():
                # Python 3.12+ warns on any fork of a process with threads; native threads
                # that torch starts at import hold no lock a compile needs (torch's own
                # DataLoader forks the same way).  fork_is_safe() refused Python threads.
                warnings.simplefilter("ignore", DeprecationWarning)
                futures = {pool.submit(_worker, record, cache_dir): index
                           for index, record in enumerate(records)}
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as exc:  # a worker died (killed, out of memory)
                    outcome = {"status": FAILED, "reason": COMPILE_ERROR,
                               "detail": f"worker process failed: {type(exc).__name__}: {exc}"}
                yield futures[future], outcome


# --------------------------------------------------------------------------------------------
# in the worker processes
# --------------------------------------------------------------------------------------------

_toolchain: Toolchain | None = None


def _worker_init(cache_dir: str, toolchain: Toolchain) -> None:
    """A worker's setup: the cache directory and the run's toolchain for its whole life."""
    global _toolchain
    _toolchain = toolchain
    locations.apply(cache_environment(cache_dir))


def _worker(record: dict[str, Any], cache_dir: str, toolchain: Toolchain | None = None) -> dict[str, Any]:
    try:
        return replay_record(record, cache_dir=cache_dir, toolchain=toolchain or _toolchain)
    except Exception as exc:  # a bug of ours must not lose the other results
        return {"status": FAILED, "reason": COMPILE_ERROR,
                "detail": f"replay error: {type(exc).__name__}: {exc}", "seconds": 0.0}
