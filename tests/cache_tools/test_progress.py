"""progress.py: step lines on a non-terminal, one rewritten line on a terminal."""

from __future__ import annotations

import io

from cache_tools.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_non_tty_prints_a_line_per_step_and_a_summary():
    out = io.StringIO()
    p = Progress(out, interval=0.0)
    p.step("scanning triton")
    p.start("pack", 4096)
    p.advance(2048)
    p.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "scanning triton"
    assert lines[1].startswith("pack:  50.0% 2.0 KiB of 4.0 KiB (")
    assert lines[2].startswith("pack: 2.0 KiB in ") and lines[2].endswith("/s)")
    assert "\r" not in out.getvalue()


def test_tty_rewrites_one_line():
    out = _Tty()
    p = Progress(out)
    p.interval = 0.0
    p.start("restore", 100)
    p.advance(10)
    p.advance(10)
    p.finish()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("/s)\n")


def test_disabled_progress_is_silent():
    out = io.StringIO()
    p = Progress(out, enabled=False, interval=0.0)
    p.step("x")
    p.start("y", 1)
    p.advance(1)
    p.finish()
    assert out.getvalue() == ""
    assert Progress.null().enabled is False
