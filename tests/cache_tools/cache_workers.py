"""Worker functions for the multi-process tests (importable by spawned processes)."""

from __future__ import annotations

import os
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


def _die() -> None:
    import os
    import signal

    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def killed(op: str, point: str, args: dict) -> None:
    """Run ``op`` (pack, pack-zstd, restore, pull, prune) and SIGKILL this process at
    ``point`` (the kill test's step): nothing after it runs, not even ``finally``."""
    from pathlib import Path

    from cache_tools import archive, prune
    from cache_tools.stores import redis as remote
    from cache_tools.locations import Location, kind
    from cache_tools.progress import Progress

    class DieOnAdvance(Progress):
        def __init__(self) -> None:
            super().__init__(enabled=False)
            self.calls = 0

        def advance(self, nbytes: int) -> None:
            self.calls += 1
            if self.calls > 1:
                _die()

    def die_on_commit(outcome) -> None:
        _die()

    progress = DieOnAdvance() if point == "stream" else None
    on_entry = die_on_commit if point == "commit" else None
    if op in ("pack", "pack-zstd"):
        if point == "rename":
            os.replace = lambda *a: _die()  # the archive writer's final rename
        loc = [Location(kind("triton"), Path(args["src"]), "kill-test")]
        archive.pack(args["out"], loc, zstd=op == "pack-zstd", progress=progress)
    elif op == "restore":
        plan = archive.plan_restore(args["archive"], dest=args["dest"])
        plan.execute(progress=progress, on_entry=on_entry)
    elif op == "pull":
        plan = remote.plan_pull(args["url"], dest=args["dest"], namespace=args["ns"])
        plan.execute(progress=progress, on_entry=on_entry)
    elif op == "prune":
        if point == "trash":
            real = prune.os.rename

            def rename_then_die(*a):
                real(*a)
                _die()
            prune.os.rename = rename_then_die
        elif point == "rmtree":
            prune.shutil.rmtree = lambda *a, **k: _die()
        loc = [Location(kind("triton"), Path(args["src"]), "kill-test")]
        prune.plan_prune(loc, older_than=0.0).execute()
    print("finished", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "kill":
        import json

        killed(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        slow_restore(sys.argv[1], sys.argv[2], float(sys.argv[3]))
