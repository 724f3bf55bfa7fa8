"""Replay: rebuild Triton cache entries on a machine without a GPU from recorded compile logs.

A serving process with sglang-warmup's events installed writes one JSON line per Triton
compile to its compile log (``<state_dir>/compile_log/compiles-<pid>.jsonl``, see
:mod:`cache_tools.compile_log`): the kernel's module and qualified name, the ``ASTSource`` it
was compiled from (signature, constexprs, attributes), every backend option, the target, the
cache-invalidating environment, the cache key (``hash``) the JIT looked up and the sha256 of
the kernel's source.  ``replay()`` imports each kernel from the installed packages only after
checking on disk that the installed source hashes to the recorded value (a record's own text is
never run), rebuilds the same ``ASTSource``, recomputes the cache key exactly as
``triton.compile`` does and compiles only when that key equals the recorded one, so every
entry it writes is one a serving process will look up.  Anything that cannot give the recorded
key is skipped with its reason: a nested function, a kernel that is not installed or whose
source differs, a kernel generated at run time (Inductor), a different
Triton (the key hashes Triton's own files, ``libtriton`` included), different kernel source
(another SGLang release), options or ``ptxas``.

The parts: :mod:`~cache_tools.replay.entries` (the recorded entries and the checks that need
no Triton, the dry run), :mod:`~cache_tools.replay.kernels` (the installed kernel a record
names, checked before import), :mod:`~cache_tools.replay.toolchain` (Triton and ptxas facts, read once per run),
:mod:`~cache_tools.replay.worker` (rebuild one record), :mod:`~cache_tools.replay.pool` (the
compile processes: forked after the imports where that is safe),
:mod:`~cache_tools.replay.run` (``replay()``), :mod:`~cache_tools.replay.report` (the result
types and their text) and ``__main__`` (``python -m cache_tools.replay``, which ``--python``
runs in another interpreter).  Standard library only at import: Triton and the kernels are
imported by the processes that compile.
"""

from cache_tools.replay.entries import (distinct_entries, is_triton_compile, log_files,
                                        parse_target, precheck, read_records, target_str)
from cache_tools.forks import fork_is_safe, usable_cpus
from cache_tools.replay.pool import default_jobs
from cache_tools.replay.report import (COMPILE_ERROR, EXTERN_LIB, FAILED, FORK, IN_PROCESS,
                                       IR_SOURCE, KEY_MISMATCH, MISSING_FIELDS, NESTED,
                                       GENERATED, NOT_A_KERNEL, NOT_INSTALLED, OTHER_TARGET, PLANNED,
                                       PRESENT, PTXAS_VERSION, REBUILT, SKIPPED, SOURCE_MISMATCH,
                                       SPAWN, STATUSES,
                                       TRITON_VERSION, KernelResult, ReplayReport, report_text,
                                       summary_line)
from cache_tools.replay.run import default_cache_dir, replay
from cache_tools.replay.toolchain import Toolchain
from cache_tools.replay.worker import replay_record

__all__ = [
    "COMPILE_ERROR", "EXTERN_LIB", "FAILED", "FORK", "IN_PROCESS", "IR_SOURCE", "KEY_MISMATCH",
    "GENERATED", "MISSING_FIELDS", "NESTED", "NOT_A_KERNEL", "NOT_INSTALLED", "OTHER_TARGET",
    "PLANNED", "SOURCE_MISMATCH",
    "PRESENT", "PTXAS_VERSION", "REBUILT", "SKIPPED", "SPAWN", "STATUSES", "TRITON_VERSION",
    "KernelResult", "ReplayReport", "Toolchain", "default_cache_dir", "default_jobs",
    "distinct_entries", "fork_is_safe", "is_triton_compile", "log_files", "parse_target",
    "precheck", "read_records", "replay", "replay_record", "report_text", "summary_line",
    "target_str", "usable_cpus",
]
