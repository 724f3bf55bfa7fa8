"""The one face of every command: a usage error is one ``error:`` line and one ``hint: usage:``
line on stderr with exit status 2, never a traceback; ``--version``; the hidden aliases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import cli

REPO = Path(__file__).resolve().parents[3]


def hint(command: str, usage: str) -> str:
    return f"hint: usage: {command} {usage}; see `{command} --help`"


def test_unknown_command_suggests_the_near_one(capsys):
    code, out, err = cli(capsys, "cahce", "ls")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: no such command 'cahce'. Did you mean 'cache'?",
                                hint("sglang-warmup", "[OPTIONS] COMMAND [ARGS]...")]


def test_unknown_command_in_a_group(capsys):
    code, out, err = cli(capsys, "cache", "lst")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: no such command 'lst'. Did you mean 'ls'?",
                                hint("sglang-warmup cache", "[OPTIONS] COMMAND [ARGS]...")]


def test_unknown_option_lists_the_near_ones(capsys):
    code, out, err = cli(capsys, "plan", "show", "default", "--fromat", "json")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: no such option: --fromat (Possible options: --facts, "
                                "--format)",
                                hint("sglang-warmup plan show", "[OPTIONS] {plan}")]


def test_missing_option(capsys):
    code, out, err = cli(capsys, "serve")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: missing option '--plan'.",
                                hint("sglang-warmup serve", "[OPTIONS]")]


def test_bad_value_names_the_value(capsys):
    code, out, err = cli(capsys, "traffic", "synth", "--kind", "chat", "--steps", "abc")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["error: invalid value for '--steps': 'abc': input should be a "
                                "valid integer, unable to parse string as an integer",
                                hint("sglang-warmup traffic synth", "[OPTIONS]")]
    code, _, err = cli(capsys, "traffic", "synth", "--kind", "chat", "--steps", "0")
    assert code == 2
    assert err.splitlines()[0] == ("error: invalid value for '--steps': '0': input should be "
                                   "greater than or equal to 1")


def test_bad_format_is_a_usage_error(capsys):
    code, out, err = cli(capsys, "plan", "show", "default", "--format", "yaml")
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == ("error: invalid value for '--format': 'yaml' is not one of "
                                   "'table', 'json'.")


def test_version_names_this_package_and_sglang(capsys):
    from importlib.metadata import version

    code, out, err = cli(capsys, "--version")
    assert (code, err) == (0, "")
    assert out == f"sglang-warmup {version('sglang-warmup')} (sglang {version('sglang')})\n"


def test_version_without_sglang_installed(capsys, monkeypatch):
    import warmup.cli as cli_mod

    monkeypatch.setattr(cli_mod, "dist_version",
                        lambda name: None if name == "sglang" else "9.9.9")
    code, out, _ = cli(capsys, "--version")
    assert (code, out) == (0, "sglang-warmup 9.9.9 (sglang not installed)\n")


def test_no_command_prints_the_help_with_status_2(capsys):
    code, out, _ = cli(capsys)
    assert code == 2
    assert "Usage: sglang-warmup [OPTIONS] COMMAND [ARGS]..." in out
    for command in ("audit", "cache", "coverage", "doctor", "learn", "patches", "plan",
                    "prebake", "serve", "sidecar", "traffic"):
        assert f" {command} " in out


def test_help_exits_0(capsys):
    code, out, err = cli(capsys, "cache", "pack", "--help")
    assert (code, err) == (0, "")
    assert "--yes" in out and "--quiet" in out and "--format" in out


def test_hidden_aliases_stay_out_of_the_help(capsys):
    _, out, _ = cli(capsys, "learn", "--help")
    assert "--audits" in out and "--manifest" not in out
    _, out, _ = cli(capsys, "coverage", "--help")
    assert "--format" in out and "--json" not in out


def _console(*args: str, path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The installed console script (``sglang-warmup``) running this tree's code (``path``:
    directories searched before it)."""
    script = Path(sys.executable).parent / "sglang-warmup"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "warmup"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, str(REPO)]))
    return subprocess.run([*argv, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv", [
    ("cahce", "ls"), ("--versoin",), ("serve",), ("traffic", "synth", "--kind", "chat",
                                                 "--steps", "abc"),
    ("cache", "env", "--format", "yaml"), ("plan", "check"), ("learn", "--plan", "p.yaml"),
])
def test_no_traceback_from_the_console_script(argv):
    done = _console(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith(
        "hint: usage: sglang-warmup"), done.stderr
    assert "Traceback" not in done.stderr


def test_the_console_script_prints_the_version():
    done = _console("--version")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("sglang-warmup ")


def test_ctrl_c_while_the_cli_starts_is_one_line_and_status_130(tmp_path):
    """SIGINT while the command-line modules are imported (here: typer's import, by a stand-in
    that signals its own process) is one line and 130, as it is later; never a traceback.
    (``--version`` alone imports no typer: ``--help`` does.)"""
    (tmp_path / "typer.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    done = _console("--help", path=(str(tmp_path),))
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "error: interrupted\n")


def test_ctrl_c_in_a_command_is_one_line_and_status_130(capsys, monkeypatch):
    from warmup.coverage import traffic

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(traffic, "synth", interrupted)
    assert cli(capsys, "traffic", "synth", "--kind", "chat") == (130, "", "error: interrupted\n")


@pytest.mark.parametrize("argv, message", [
    (("traffic", "synth", "--kind", "bogus"),
     "invalid value for '--kind': 'bogus' is not one of chat, rag, agent, batch, features"),
    (("traffic", "convert", "--from", "csv", "log.txt"),
     "invalid value for '--from': 'csv' is not one of openai, sglang-log"),
    (("cache", "ls", "--kinds", "triton,bogus"),
     "invalid value for '--kinds': unknown cache kind 'bogus'; known: triton, inductor, "
     "sglang_jit, tvm_ffi, flashinfer, deep_gemm, tilelang, cuda_ptx, cute_aot, cute_dsl, "
     "flash_attn_4"),
    (("cache", "pack", "out.tar", "--kinds", "nvcc"), "invalid value for '--kinds': unknown "
                                                       "cache kind 'nvcc'; known: triton, "
                                                       "inductor, sglang_jit, tvm_ffi, "
                                                       "flashinfer, deep_gemm, tilelang, "
                                                       "cuda_ptx, cute_aot, cute_dsl, "
                                                       "flash_attn_4"),
    (("traffic", "synth", "--kind", "chat", "--steps", "200001"),
     "invalid value for '--steps': '200001': input should be less than or equal to 200000"),
    (("traffic", "synth", "--kind", "chat", "--max-prompt", "1599"),
     "invalid value for '--max-prompt': '1599': input should be greater than or equal to 1600"),
    (("traffic", "convert", "--from", "openai", "log.txt", "--burst-window-ms", "inf"),
     "invalid value for '--burst-window-ms': inf is not a finite number"),
    (("audit", "--url", "http://127.0.0.1:9", "--traffic", "t.jsonl", "--timeout", "inf"),
     "invalid value for '--timeout': inf is not a finite number"),
    (("sidecar", "--plan", "default", "--url", "http://127.0.0.1:9", "--watch-interval", "nan"),
     "invalid value for '--watch-interval': nan is not a finite number"),
    (("sidecar", "--plan", "default", "--url", "http://127.0.0.1:9", "--port", "65536"),
     "invalid value for '--port': '65536': input should be less than or equal to 65535"),
    (("prebake", "--plan", "default", "--out", "a.tar", "--deadline", "inf"),
     "invalid value for '--deadline': inf is not a finite number"),
])
def test_a_bad_value_is_a_usage_error(capsys, argv, message):
    """Issue "hostile input round three" item 11: a bad --kind or --kinds value, or a number
    out of its range, is a usage error (exit 2, the usage line), as documented; --kind and
    --kinds exited 1."""
    code, out, err = cli(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == f"error: {message}"
    assert err.splitlines()[1].startswith("hint: usage: sglang-warmup ")


@pytest.mark.parametrize("argv", [("cache", "pack", "{d}", "-y"), ("cache", "merge", "{d}", "{d}/a.tar"),
                                  ("report", "{d}/r.json", "--html", "{d}")])
def test_an_output_that_is_a_directory_is_named(capsys, tmp_path, argv):
    """`cache pack DIR -y` failed on its temporary file's path; the directory is named, before
    any work starts."""
    code, _, err = cli(capsys, *(a.format(d=tmp_path) for a in argv))
    name = {"pack": "OUT", "merge": "OUT", "report": "--html"}[argv[0] if argv[0] == "report" else argv[1]]
    assert code == 1
    assert err.splitlines() == [f"error: {name} {tmp_path} is a directory",
                                f"hint: {name} names the file to write, e.g. {tmp_path / 'NAME'}"]
