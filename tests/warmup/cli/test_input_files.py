"""Every command that reads a file someone else wrote, given a FIFO nobody writes to or an endless
device: one ``error:`` line naming the file, within the time limit, never a hang; the size in
the refusal is the real one, or ``at least N`` where no size is known."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from _cli import cli
from cache_tools import inputfile
from warmup.plan.facts import from_settings

#: How long a FIFO is waited for in these tests.
_TIMEOUT_S = 0.3


@pytest.fixture(autouse=True)
def our_logger_as_it_was():
    """``sidecar`` and ``prebake`` give our logger a handler on this test's captured stderr:
    it goes with the test (a later test of this worker would log to a closed stream)."""
    logger = logging.getLogger("sglang_warmup")
    kept = (list(logger.handlers), logger.propagate, logger.level)
    yield
    logger.handlers[:], logger.propagate, logger.level = kept[0], kept[1], kept[2]


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """A FIFO nobody writes to, a plan and an audit file, in tmp_path."""
    monkeypatch.setattr(inputfile, "SPECIAL_TIMEOUT_S", _TIMEOUT_S)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "plan.yaml").write_text(
        "version: 1\nname: x\nphases:\n  - name: p\n    shapes:\n"
        "      - {class: c, kind: extend, lengths: [8]}\n")
    (tmp_path / "audit-1.json").write_text(json.dumps({
        "format": "sglang-warmup-audit", "version": 1, "steps": [],
        "facts": from_settings({}, source="file").to_dict()}))
    return tmp_path


#: Command lines that read ``{f}`` (the special file), with the start of the error line after it.
_READERS = [
    (("plan", "check", "{f}"), "cannot read plan: "),
    (("plan", "show", "default", "--facts", "{f}"), "cannot read facts file: "),
    (("serve", "--plan", "{f}", "--dry-run", "--", "--model-path", "m"), "cannot read plan: "),
    (("sidecar", "--plan", "{f}", "--url", "http://127.0.0.1:9"), "cannot read plan: "),
    (("traffic", "convert", "--from", "openai", "{f}"), "cannot read request log: "),
    (("traffic", "convert", "--from", "sglang-log", "{f}"), "cannot read request log: "),
    (("audit", "--url", "http://127.0.0.1:9", "--traffic", "{f}"), "cannot read traffic file: "),
    (("report", "{f}"), "cannot read: "),
    (("coverage", "{f}"), "cannot read: "),
    (("learn", "--audits", "{f}", "--plan", "{d}/plan.yaml"), "cannot read: "),
    (("learn", "--audits", "{d}/audit-1.json", "--plan", "{f}"), "cannot read plan: "),
]


@pytest.mark.parametrize("argv, error", _READERS, ids=lambda v: " ".join(v[:2]) if
                         isinstance(v, tuple) else None)
def test_a_fifo_nobody_writes_to_is_one_line_within_the_time_limit(inputs, capsys, argv, error):
    fifo = inputs / "fifo"
    start = time.monotonic()
    code, out, err = cli(capsys, *(a.format(f=fifo, d=inputs) for a in argv))
    assert time.monotonic() - start < _TIMEOUT_S + 5
    assert code in (1, 2) and out == ""
    assert err.splitlines()[0] == (f"error: {fifo}: {error}a FIFO that did not end within "
                                   f"{_TIMEOUT_S:g} s (0 bytes read)")
    assert len(err.splitlines()) == 2 and err.splitlines()[1].startswith("hint: ")


@pytest.mark.parametrize("command", [("cache", "verify"), ("cache", "restore", "--dest", "{d}/dest"),
                                     ("cache", "merge", "{d}/merged.tar")])
def test_an_archive_that_is_a_fifo_is_refused_at_once(inputs, capsys, command):
    fifo = inputs / "fifo"
    code, _, err = cli(capsys, *(a.format(d=inputs) for a in command), str(fifo))
    assert code == 1
    assert err.splitlines()[0] == f"error: {fifo}: cannot open: not a regular file (a FIFO)"
    assert not (inputs / "dest").exists() and not (inputs / "merged.tar").exists()


@pytest.mark.parametrize("argv, error", [
    (("plan", "check", "/dev/zero"), "/dev/zero:1: <top>: file is at least 262,145 bytes (limit 262,144)"),
    (("report", "/dev/zero"), "/dev/zero: file is at least 67,108,865 bytes (limit 67,108,864)"),
    (("learn", "--audits", "/dev/zero", "--plan", "default"),
     "/dev/zero: file is at least 67,108,865 bytes (limit 67,108,864)"),
    (("plan", "show", "default", "--facts", "/dev/zero"),
     "/dev/zero: facts file is at least 16,777,217 bytes (limit 16,777,216)"),
])
def test_an_endless_device_is_at_least_one_byte_past_the_limit(capsys, argv, error):
    code, _, err = cli(capsys, *argv)
    assert code in (1, 2) and err.splitlines()[0] == f"error: {error}"


def test_a_large_plan_is_refused_with_its_real_size(tmp_path, capsys):
    plan = tmp_path / "big.yaml"
    with open(plan, "wb") as fh:
        fh.truncate(5_500_000)
    code, _, err = cli(capsys, "plan", "check", str(plan))
    assert code == 2
    assert err.splitlines()[0] == f"error: {plan}:1: <top>: file is 5,500,000 bytes (limit 262,144)"
