"""``sglang-warmup patches status`` through the real CLI entry point, on SGLang 0.5.22 (the
0.5.23 run is in test_registry.py, in a subprocess)."""

from __future__ import annotations

import json
import sys

import pytest

from warmup.cli import main

from .test_registry import TARGETS, marks


def run(capsys, *argv: str) -> tuple[str, str]:
    main(["patches", "status", *argv])
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_status_json_applies_every_fix(backend, sparse_utils, hook, capsys):
    out, _ = run(capsys, "--json")
    report = json.loads(out)
    assert report["sglang"]["version"] == "0.5.22"
    assert report["applied_in_process"] is True
    assert [(r["number"], r["mode"], r["verdict"], r["detected"], r["predicted"])
            for r in report["fixes"]] == [
        (n, "auto", "applied", "needed/exact", False) for n in TARGETS]
    assert all("verified" in r["reason"] for r in report["fixes"])
    assert marks() == {n: n for n in TARGETS}


def test_status_detect_only_reports_needed(backend, sparse_utils, hook, capsys):
    out, _ = run(capsys, "--json", "--detect-only")
    report = json.loads(out)
    assert report["applied_in_process"] is False
    assert [(r["number"], r["verdict"], r["detected"]) for r in report["fixes"]] == [
        (n, "needed", "needed/exact") for n in TARGETS]
    assert marks() == {n: None for n in TARGETS}


def test_status_table(backend, sparse_utils, hook, capsys, monkeypatch):
    monkeypatch.setenv("WARMUP_FIX_3", "off")
    out, _ = run(capsys)
    lines = out.splitlines()
    assert lines[0].startswith("SGLang 0.5.22 (") and lines[0].endswith(
        "): applied and verified in this process, as a server process does")
    assert lines[2].split() == ["FIX", "NAME", "MODE", "VERDICT", "DETECTED"]
    assert set(lines[3]) == {"-", " "}
    assert lines[8].split() == ["3", "async-lengths-upload", "off", "off", "-"]
    assert lines[9] == "    WARMUP_FIX_3=off"
    assert [line.split()[3] for line in lines[4::2]] == [
        "applied", "applied", "off", "applied", "applied"]


def test_status_without_sglang(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(SystemExit) as info:
        main(["patches", "status"])
    assert info.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: SGLang is not importable: import of sglang halted; None in sys.modules",
        "hint: run this command in the environment the server runs in",
    ]
