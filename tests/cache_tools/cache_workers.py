"""Worker functions for the multi-process tests (importable by spawned processes)."""

from __future__ import annotations

import sys
import time


def restore_worker(archive_path: str, dest: str, go, rounds: int) -> None:
    """Restore the same archive ``rounds`` times into ``dest`` once ``go`` is set."""
    from cache_tools import archive

    go.wait(60)
    for _ in range(rounds):
        archive.plan_restore(archive_path, dest=dest).execute()


def compile_worker(cache_dir: str, go, results) -> None:
    """Compile every test kernel into ``cache_dir`` (TRITON_CACHE_DIR) once ``go`` is set."""
    import cache_kernels

    go.wait(60)
    results.put(cache_kernels.compile_into(cache_dir, cache_kernels.SPECS + cache_kernels.EXTRA))


def slow_restore(archive_path: str, dest: str, pause_s: float) -> None:
    """Restore, printing each committed entry and pausing after it (the SIGKILL test)."""
    from cache_tools import archive

    def on_entry(outcome) -> None:
        print(f"committed {outcome.entry.name} {outcome.status}", flush=True)
        time.sleep(pause_s)

    archive.plan_restore(archive_path, dest=dest).execute(on_entry=on_entry)
    print("done", flush=True)


if __name__ == "__main__":
    slow_restore(sys.argv[1], sys.argv[2], float(sys.argv[3]))
