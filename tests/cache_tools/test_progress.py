"""progress.py: step lines on a non-terminal, one rewritten line on a terminal."""

from __future__ import annotations

import io
import time

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


def test_ticking_on_a_terminal_shows_seconds_and_detail_then_the_total():
    stream = _Tty()
    with Progress(stream).ticking("starting SGLang", after_s=0.0, every_s=0.01,
                                  detail=lambda: "Load weight end.\n"):
        time.sleep(0.05)
    out = stream.getvalue()
    assert "\rstarting SGLang (0 s): Load weight end.\x1b[K" in out  # one line, whitespace folded
    assert out.endswith("\x1b[K\n") and "\rstarting SGLang: done in " in out


def test_ticking_says_failed_when_the_step_raises_and_survives_a_broken_detail():
    stream = _Tty()

    def broken() -> str:
        raise OSError("log gone")

    try:
        with Progress(stream).ticking("waiting", after_s=0.0, every_s=0.01, detail=broken):
            time.sleep(0.03)
            raise KeyError("x")
    except KeyError:
        pass
    out = stream.getvalue()
    assert "\rwaiting (0 s)\x1b[K" in out and "\rwaiting: failed after " in out


def test_ticking_is_silent_for_short_steps_off_a_terminal_and_when_disabled():
    quick = _Tty()
    with Progress(quick).ticking("quick", after_s=5.0):
        pass
    assert quick.getvalue() == ""  # under after_s: no line at all
    log = io.StringIO()  # CI logs and docker build: no tick lines, and a short step is silent
    with Progress(log).ticking("short", after_s=5.0, every_s=0.01):
        time.sleep(0.03)
    assert log.getvalue() == ""
    off = _Tty()
    with Progress(off, enabled=False).ticking("slow", after_s=0.0, every_s=0.01):
        time.sleep(0.03)
    assert off.getvalue() == ""


def test_ticking_off_a_terminal_prints_step_lines_for_a_long_step():
    """CI logs and docker build: the step line once it passes after_s, and its end (no \\r, no
    line per tick)."""
    log = io.StringIO()
    with Progress(log).ticking("resolving the launch flags with SGLang", after_s=0.0,
                               every_s=0.01):
        time.sleep(0.05)
    lines = log.getvalue().splitlines()
    assert lines[0] == "resolving the launch flags with SGLang ..."
    assert len(lines) == 2 and lines[1].startswith("resolving the launch flags with SGLang: "
                                                   "done in ")
    assert "\r" not in log.getvalue() and "\x1b" not in log.getvalue()
    failed = io.StringIO()
    try:
        with Progress(failed).ticking("waiting", after_s=0.0):
            time.sleep(0.03)
            raise KeyError("x")
    except KeyError:
        pass
    assert failed.getvalue().splitlines()[1].startswith("waiting: failed after ")
