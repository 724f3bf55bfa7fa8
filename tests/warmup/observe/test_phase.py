"""warmup.observe.phase: the phase file shared by SGLang's processes."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os

import pytest

from warmup.observe import phase
from warmup.errors import WarmupError


@pytest.fixture(autouse=True)
def fresh_phase(monkeypatch):
    monkeypatch.delenv("WARMUP_STATE_DIR", raising=False)
    phase.reset()
    yield
    phase.reset()


def test_default_is_init_without_a_state_dir():
    state = phase.current()
    assert state == phase.PhaseState("init", None, None, 0.0)


def test_set_phase_without_a_state_dir_updates_the_process_value_only(tmp_path):
    new = phase.set_phase("warmup", shape_class="decode-bs8", request=2)
    assert (new.phase, new.shape_class, new.request) == ("warmup", "decode-bs8", 2)
    assert new.since > 0
    assert phase.current() == new
    assert list(tmp_path.iterdir()) == []


def test_unknown_phase_is_rejected_with_the_closed_set():
    with pytest.raises(WarmupError) as err:
        phase.set_phase("ready")
    assert err.value.message == "unknown phase 'ready': expected one of init, warmup, serving"
    assert err.value.hint == "phases are a closed set so that metric labels stay bounded"


def test_request_must_be_an_integer():
    with pytest.raises(WarmupError) as err:
        phase.set_phase("warmup", request="3")
    assert err.value.message == "phase request must be an integer or None, got '3'"


def test_the_state_file_is_written_atomically_with_every_field(tmp_path):
    state = phase.set_phase("warmup", shape_class="prefill-8k", request=7, state_dir=tmp_path)
    data = json.loads((tmp_path / "phase.json").read_text())
    assert data == {"phase": "warmup", "shape_class": "prefill-8k", "request": 7,
                    "since": state.since}
    # nothing but the file itself is left behind (the temporary name was replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phase.json"]


def test_the_environment_variable_selects_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMUP_STATE_DIR", str(tmp_path))
    phase.set_phase("serving")
    assert json.loads((tmp_path / "phase.json").read_text())["phase"] == "serving"
    phase.reset()  # forget the in-process value: current() must come from the file
    assert phase.current().phase == "serving"


def test_current_costs_one_stat_while_the_file_is_unchanged(tmp_path):
    phase.set_phase("warmup", shape_class="aaaa", state_dir=tmp_path)
    path = tmp_path / "phase.json"
    assert phase.current(state_dir=tmp_path).shape_class == "aaaa"
    before = os.stat(path)
    # Rewrite the content in place with the same size, inode and mtime: a reader that only
    # stats cannot see the change, which proves it did not re-read the file.
    raw = path.read_bytes().replace(b'"aaaa"', b'"bbbb"')
    with open(path, "r+b") as fh:
        fh.write(raw)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert phase.current(state_dir=tmp_path).shape_class == "aaaa"
    # A new mtime makes it read again.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert phase.current(state_dir=tmp_path).shape_class == "bbbb"


@pytest.mark.parametrize("content", [b"{not json", b'{"phase": "ready"}', b"[1, 2]",
                                     b'{"phase": "serving", "request": "x"}'])
def test_an_unreadable_file_yields_the_last_good_value(tmp_path, content):
    phase.set_phase("warmup", shape_class="c1", state_dir=tmp_path)
    good = phase.current(state_dir=tmp_path)
    (tmp_path / "phase.json").write_bytes(content)
    assert phase.current(state_dir=tmp_path) == good


def test_a_removed_file_yields_the_last_good_value(tmp_path):
    phase.set_phase("serving", state_dir=tmp_path)
    good = phase.current(state_dir=tmp_path)
    (tmp_path / "phase.json").unlink()
    assert phase.current(state_dir=tmp_path) == good


def test_a_file_never_written_falls_back_to_the_process_value(tmp_path):
    phase.set_phase("warmup")  # in-process only
    assert phase.current(state_dir=tmp_path).phase == "warmup"


def test_an_unwritable_state_dir_is_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.phase"):
        state = phase.set_phase("serving", state_dir=blocker)
    assert state.phase == "serving"
    assert phase.current().phase == "serving"  # the in-process value still moved
    assert f"cannot write the phase file in {blocker}" in caplog.text


def _writer(state_dir: str, conn) -> None:
    """Another process: set phases on request, one message per step."""
    from warmup.observe import phase as child_phase

    for step in iter(conn.recv, "stop"):
        kind, shape_class, request = step
        child_phase.set_phase(kind, shape_class=shape_class, request=request,
                              state_dir=state_dir)
        conn.send("done")


def test_phase_switches_written_by_another_process_are_seen(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_writer, args=(str(tmp_path), child))
    proc.start()
    try:
        assert phase.current(state_dir=tmp_path).phase == "init"
        seen = []
        for step in (("warmup", "prefill-2k", 0), ("warmup", "prefill-8k", 1),
                     ("serving", None, None)):
            parent.send(step)
            assert parent.recv() == "done"
            state = phase.current(state_dir=tmp_path)
            seen.append((state.phase, state.shape_class, state.request))
        parent.send("stop")
    finally:
        proc.join(30)
    assert proc.exitcode == 0
    assert seen == [("warmup", "prefill-2k", 0), ("warmup", "prefill-8k", 1),
                    ("serving", None, None)]
