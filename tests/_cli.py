"""Run the real `sglang-warmup` entry point in-process and capture what it printed."""

from __future__ import annotations

from warmup.cli import main


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``sglang-warmup ARGV``."""
    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err
