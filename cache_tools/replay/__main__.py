"""``python -m cache_tools.replay``: the replay without typer (what ``--python`` runs in the
interpreter that has the recorded Triton).  Standard library only."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from cache_tools.errors import CacheError
from cache_tools.replay.report import FAILED, KernelResult, report_text
from cache_tools.replay.run import replay


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cache_tools.replay",
        description="Rebuild Triton cache entries from recorded compile logs.")
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="compiles-<pid>.jsonl files, their compile_log/ directory or the "
                             "state directory above it")
    parser.add_argument("--cache-dir")
    parser.add_argument("--target")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    def progress(result: KernelResult, done: int, total: int) -> None:
        print(f"[{done}/{total}] {result.status} {result.kernel} "
              f"{(result.hash or '')[:12]}", file=sys.stderr, flush=True)

    try:
        report = replay(args.logs, cache_dir=args.cache_dir, target=args.target,
                        jobs=args.jobs, dry_run=args.dry_run, on_result=progress)
    except CacheError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=1) if args.json else report_text(report))
    return 1 if report.count(FAILED) else 0


if __name__ == "__main__":
    sys.exit(main())
