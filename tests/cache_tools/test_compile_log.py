"""compile_log: the one writer, the readers, the cursor and the shared counting rules."""

from __future__ import annotations

import json
import logging
import os
import threading

from cache_tools import compile_log


def _write(path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))


def test_records_carry_the_base_fields_and_the_format_version():
    rec = compile_log.record("miss", phase="warmup", shape_class="c", request="r1",
                             compiler="triton")
    assert tuple(rec) == compile_log.BASE_FIELDS
    assert rec["v"] == compile_log.VERSION and rec["pid"] == os.getpid()


def test_the_writer_appends_whole_lines_from_many_threads(tmp_path):
    writer = compile_log.Writer(compile_log.directory(tmp_path), default=str)
    threads = [threading.Thread(target=lambda i=i: [writer.write({"event": "hit", "i": i, "x": {1}})
                                                    for _ in range(50)]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    (path,) = compile_log.files(tmp_path)
    assert path.name == f"compiles-{os.getpid()}.jsonl"
    records = compile_log.read([path], by_time=False)
    assert len(records) == 400 and all(r["x"] == "{1}" for r in records)


def test_reading_orders_by_time_and_skips_torn_and_newer_lines(tmp_path, caplog):
    d = compile_log.directory(tmp_path)
    _write(d / "compiles-11.jsonl", json.dumps({"event": "miss", "time": 2.0}) + "\n",
           '{"event": "mi')
    _write(d / "compiles-12.jsonl", json.dumps({"event": "hit", "time": 1.0}) + "\n",
           json.dumps({"v": 99, "event": "hit", "time": 3.0}) + "\n", "[1, 2]\n")
    with caplog.at_level(logging.WARNING, logger="sglang_warmup.compile_log"):
        records = compile_log.read_dir(tmp_path)
    assert records == [{"event": "hit", "time": 1.0}, {"event": "miss", "time": 2.0}]
    assert f"{d / 'compiles-11.jsonl'}:2: not a JSON object, skipped" in caplog.text
    assert (f"{d / 'compiles-12.jsonl'}:2: compile-log format 99 is newer than this "
            f"sglang-warmup reads ({compile_log.VERSION}), skipped") in caplog.text
    assert f"{d / 'compiles-12.jsonl'}:3: not a JSON object, skipped" in caplog.text


def test_a_deeply_nested_line_is_skipped_not_raised(tmp_path):
    d = compile_log.directory(tmp_path)
    _write(d / "compiles-1.jsonl", "[" * 100_000 + "\n", json.dumps({"event": "hit"}) + "\n")
    warnings: list[str] = []
    assert compile_log.read(compile_log.files(tmp_path), warnings=warnings) == [{"event": "hit"}]
    assert warnings == [f"{d / 'compiles-1.jsonl'}:1: not a JSON object, skipped"]


def test_state_dirs_of_the_old_name_are_still_read(tmp_path):
    _write(tmp_path / "manifest" / "compiles-3.jsonl", json.dumps({"event": "hit"}) + "\n")
    assert compile_log.read_dir(tmp_path) == [{"event": "hit"}]
    assert compile_log.find(tmp_path) == [tmp_path / "manifest" / "compiles-3.jsonl"]
    assert compile_log.find(tmp_path / "manifest") == compile_log.find(tmp_path)
    assert compile_log.find(tmp_path / "nothing") == []


def test_the_cursor_reads_exactly_the_bytes_between_marks(tmp_path):
    writer = compile_log.Writer(compile_log.directory(tmp_path))
    cursor = compile_log.Cursor(tmp_path)
    before = cursor.mark()
    assert before == {}
    writer.write({"event": "miss", "time": 5.0})
    middle = cursor.mark()
    writer.write({"event": "hit", "time": 1.0})  # an earlier clock: bytes decide, not time
    assert cursor.read(before, middle) == [{"event": "miss", "time": 5.0}]
    assert cursor.read(middle) == [{"event": "hit", "time": 1.0}]
    assert cursor.read(cursor.mark()) == []


def test_what_counts_as_compiled_now_and_which_kernel():
    miss = {"event": "miss", "kernel": {"name": "k", "qualname": "q"}}
    built = {"event": "jit_build", "outcome": "built", "module_name": "m"}
    cached = {"event": "jit_build", "outcome": "cached", "module_name": "m"}
    hit = {"event": "hit", "kernel": {"qualname": "q"}}
    assert [compile_log.is_miss(r) for r in (miss, built, cached, hit)] == [True, True, False, False]
    assert [compile_log.is_compile_event(r) for r in (miss, cached, hit, {"event": "load"})] == [
        True, True, True, False]
    assert [compile_log.kernel_name(r) for r in (miss, built, hit, {})] == ["k", "m", "q", "?"]


def test_a_huge_line_is_skipped_without_being_held(tmp_path, monkeypatch):
    """A compile log that is one line of many megabytes: read past in pieces, the records
    around it kept, memory bounded by the line limit (was read whole: 2 GB for a 1 GiB line)."""
    import tracemalloc

    monkeypatch.setattr(compile_log, "MAX_LINE_BYTES", 64 * 1024)
    path = tmp_path / compile_log.DIR / "compiles-1.jsonl"
    path.parent.mkdir()
    good = json.dumps(compile_log.record("miss", phase="init", shape_class=None, request=None,
                                         compiler="triton"))
    with open(path, "wb") as f:
        f.write(good.encode() + b"\n")
        f.write(b'{"x": "' + b"a" * (8 * 1024 * 1024) + b'"}\n')
        f.write(good.encode() + b"\n")
        f.write(b"b" * (3 * 1024 * 1024))  # a torn, endless last line
    warnings: list[str] = []
    tracemalloc.start()
    try:
        records = compile_log.read([path], warnings=warnings)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(records) == 2
    assert warnings == [f"{path}:2: longer than 65536 bytes, skipped",
                        f"{path}:4: longer than 65536 bytes, skipped"]
    assert peak < 4 * 1024 * 1024
    # The cursor reads the same way between marks.
    cursor = compile_log.Cursor(tmp_path)
    assert len(cursor.read({})) == 2


def test_hostile_times_order_as_zero(tmp_path):
    """A time that is no finite number (10**400 fits no float, NaN, text) sorts as 0, never a
    traceback of the reader."""
    log = compile_log.directory(tmp_path) / "compiles-1.jsonl"
    _write(log, '{"event": "hit", "time": 5}\n', '{"event": "miss", "time": 1%s}\n' % ("0" * 400),
           '{"event": "load", "time": NaN}\n', '{"event": "gc", "time": "soon"}\n')
    assert [r["event"] for r in compile_log.read_dir(tmp_path)] == ["miss", "load", "gc", "hit"]


def test_the_documented_schema_is_the_record_types():
    """docs/metrics.md ("The compile log") names, under each event, every field of that
    event's record type, and no event the types lack."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    section = text.split("## The compile log", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- \*\*", section)
    base = bullets[0].split("Every record has", 1)[1].split("Then,", 1)[0]
    assert set(re.findall(r"`(\w+)`", base)) == set(compile_log.BASE_FIELDS)
    documented: dict[str, str] = {}
    for bullet in bullets[1:]:
        events = re.findall(r"^`(\w+)`\*\*|\*\*`(\w+)`\*\*", bullet)
        for first, second in events:
            documented[first or second] = bullet
    assert set(documented) == set(compile_log.EVENTS)
    for event, bullet in documented.items():
        named = set(re.findall(r"`(\w+)[`:]", bullet))
        missing = set(compile_log.fields(event)) - named
        assert not missing, f"{event}: docs/metrics.md does not name {sorted(missing)}"
