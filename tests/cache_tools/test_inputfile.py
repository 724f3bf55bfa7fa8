"""inputfile: a file someone else wrote is read to its byte limit at most, with its real size in
the refusal; a FIFO or a device within the time limit, never a hang; readers that seek take
regular files only."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from cache_tools import compile_log, inputfile


@pytest.fixture
def fifo(tmp_path, monkeypatch):
    """A FIFO nobody writes to, and a time limit of 0.3 s."""
    monkeypatch.setattr(inputfile, "SPECIAL_TIMEOUT_S", 0.3)
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_a_regular_file_within_its_limit_and_one_byte_above(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 10)
    assert inputfile.read(p, 10) == b"x" * 10
    with pytest.raises(inputfile.TooLarge) as err:
        inputfile.read(p, 9)
    assert str(err.value) == "10 bytes (limit 9)"


def test_a_large_file_is_refused_with_its_real_size_before_it_is_read(tmp_path):
    p = tmp_path / "sparse"
    with open(p, "wb") as fh:
        fh.truncate(5_500_000)  # sparse: nothing is allocated, nothing read
    with pytest.raises(inputfile.TooLarge) as err:
        inputfile.read(p, 262_144)
    assert str(err.value) == "5,500,000 bytes (limit 262,144)"


def test_a_device_without_end_is_read_to_one_byte_past_the_limit():
    with pytest.raises(inputfile.TooLarge) as err:
        inputfile.read("/dev/zero", 262_144)
    assert str(err.value) == "at least 262,145 bytes (limit 262,144)"
    assert inputfile.read("/dev/null", 10) == b""


def test_a_fifo_nobody_writes_to_times_out(fifo):
    start = time.monotonic()
    with pytest.raises(inputfile.NotRead) as err:
        inputfile.read(fifo, 100)
    assert time.monotonic() - start < 5
    assert err.value.strerror == "a FIFO that did not end within 0.3 s (0 bytes read)"
    assert err.value.filename == str(fifo)


def test_a_fifo_that_delivers_is_read(fifo, monkeypatch):
    monkeypatch.setattr(inputfile, "SPECIAL_TIMEOUT_S", 10)

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(b"version: 1\n")
            fh.flush()
            time.sleep(0.1)
            fh.write(b"name: x\n")

    writer = threading.Thread(target=write)
    writer.start()
    assert inputfile.read(fifo, 100) == b"version: 1\nname: x\n"
    writer.join()


def test_a_fifo_that_writes_past_the_limit_is_refused(fifo, monkeypatch):
    monkeypatch.setattr(inputfile, "SPECIAL_TIMEOUT_S", 10)
    writer = threading.Thread(target=lambda: fifo.write_bytes(b"x" * 50_000), daemon=True)
    writer.start()
    with pytest.raises(inputfile.TooLarge) as err:
        inputfile.read(fifo, 1000)
    assert str(err.value) == "at least 1,001 bytes (limit 1,000)"


def test_seeking_readers_refuse_what_is_not_a_regular_file(fifo, tmp_path):
    with pytest.raises(inputfile.NotRead) as err:
        inputfile.open_regular(fifo)
    assert err.value.strerror == "not a regular file (a FIFO)"
    with pytest.raises(inputfile.NotRead) as err:
        inputfile.open_regular("/dev/zero")
    assert err.value.strerror == "not a regular file (a character device)"
    (tmp_path / "f").write_bytes(b"abc")
    with inputfile.open_regular(tmp_path / "f") as fh:
        assert fh.read() == b"abc"


def test_a_socket_and_a_directory(tmp_path):
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        for call in (lambda: inputfile.read(path, 10), lambda: inputfile.open_regular(path)):
            with pytest.raises(inputfile.NotRead) as err:
                call()
            assert err.value.strerror == "not a regular file (a socket)"
    with pytest.raises(IsADirectoryError):
        inputfile.read(tmp_path, 10)


def test_compile_log_readers_never_wait_on_a_fifo(fifo, tmp_path, caplog):
    """A FIFO named like a compile log: ``read`` refuses it (an OSError, as for any unreadable
    file), the cursor skips it with a warning."""
    state = tmp_path / "state"
    log_dir = compile_log.directory(state)
    log_dir.mkdir(parents=True)
    os.mkfifo(log_dir / "compiles-1.jsonl")
    with pytest.raises(OSError) as err:
        compile_log.read(compile_log.files(state))
    assert err.value.strerror == "not a regular file (a FIFO)"
    assert compile_log.Cursor(state).read({}) == []
    assert "not a regular file (a FIFO)" in caplog.text


def test_a_link_is_refused_by_the_open_itself_when_links_are_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"secret")
    link = tmp_path / "log"
    link.symlink_to(target)
    assert inputfile.read(link, 100) == b"secret"  # followed by default
    with pytest.raises(OSError):
        inputfile.read(link, 100, follow_links=False)
    assert inputfile.read(target, 100, follow_links=False) == b"secret"
