"""warmup/cli/cache.py: the `sglang-warmup cache` commands end to end (data on stdout, progress
and warnings on stderr, no overwrite without -y), and the CLI error boundary."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cache_helpers import compile_into
from warmup.cli import main
from warmup.cli.cache import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def _ok(*args: str):
    result = runner.invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_env_formats():
    out = _ok("env", "--root", "/cache", "--format", "k8s").stdout.splitlines()
    assert out[1:6] == ["env:", "  - name: SGLANG_CACHE_DIR", '    value: "/cache"',
                        "  - name: TRITON_CACHE_DIR", '    value: "/cache/triton"']
    out = _ok("env", "--root", "/cache", "--format", "dockerfile").stdout.splitlines()
    assert out[1] == 'ENV SGLANG_CACHE_DIR="/cache"'
    out = _ok("env", "--root", "/cache").stdout.splitlines()
    assert out[-1] == "export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/cache/flash_attn_4"


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``sglang-warmup cache ARGS`` in this process."""
    code = 0
    try:
        main(["cache", *args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bad_choices_are_usage_errors(capsys):
    code, out, err = _main(capsys, "env", "--format", "yaml")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: invalid value for '--format': 'yaml' is not one of 'sh', 'dockerfile', 'k8s'.",
        "hint: usage: sglang-warmup cache env [OPTIONS]; see `sglang-warmup cache env --help`"]
    code, out, err = _main(capsys, "prune", "--fingerprint", "mine", "-y")
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == ("error: invalid value for '--fingerprint': 'mine' is not one "
                                   "of 'other'.")
    code, _, err = _main(capsys, "ls", "--format", "yaml")
    assert code == 2
    assert err.splitlines()[0] == ("error: invalid value for '--format': 'yaml' is not one of "
                                   "'table', 'json'.")


def test_ls_pack_verify_restore_round_trip(triton_cache, tmp_path):
    root = str(triton_cache.parent)
    data = json.loads(_ok("ls", "--root", root, "--kinds", "triton", "--format", "json").stdout)
    assert [(k["kind"], k["entries"]) for k in data["kinds"]] == [("triton", 3)]
    out = tmp_path / "c.tar.zst"
    packed = _ok("pack", str(out), "--root", root, "--kinds", "triton", "--zstd")
    assert packed.stdout.startswith("Packed 3 entries (")
    assert "scanning triton\n" in packed.stderr and "\npack: " in packed.stderr
    report = json.loads(_ok("verify", str(out), "--json").stdout)
    assert report["ok"] and report["entries"] == 3 and report["compatible"]
    dest = tmp_path / "dest"
    dry = _ok("restore", str(out), "--dest", str(dest), "--dry-run")
    assert dry.stdout.splitlines()[1].startswith("  add      3 entries (")
    assert not dest.exists()
    done = _ok("restore", str(out), "--dest", str(dest))
    assert done.stdout.splitlines()[-1].startswith("Restored 3 entries (")
    again = _ok("restore", str(out), "--dest", str(dest))
    assert again.stdout.splitlines()[-1] == "Nothing to do: every entry is already in place."
    assert compile_into(dest / "triton") == [True, True, True]
    plan = json.loads(_ok("restore", str(out), "--dest", str(dest), "--json",
                          "--dry-run").stdout)
    assert [e["action"] for e in plan["plan"]["entries"]] == ["skip"] * 3
    other = tmp_path / "other"
    done = json.loads(_ok("restore", str(out), "--dest", str(other), "--json").stdout)
    assert [o["status"] for o in done["outcomes"]] == ["added"] * 3


def test_prune_asks_unless_yes(triton_cache):
    root = str(triton_cache.parent)
    dry = _ok("prune", "--root", root, "--older-than", "0s", "--dry-run")
    assert dry.stdout.splitlines()[-1].startswith("Would delete 3 entries, freeing ")
    assert dry.stdout.splitlines()[-1].endswith("; --dry-run: nothing deleted.")
    assert len(list(triton_cache.iterdir())) == 3
    refused = runner.invoke(app, ["prune", "--root", root, "--max-size", "0"], input="n\n")
    assert refused.exit_code == 1 and len(list(triton_cache.iterdir())) == 3
    done = _ok("prune", "--root", root, "--max-size", "0", "-y")
    assert done.stdout.splitlines()[-1].startswith("Deleted 3 entries, freed ")
    assert list(triton_cache.iterdir()) == []


def test_prune_json_and_a_refusal_through_the_boundary(triton_cache, capsys, monkeypatch):
    root = str(triton_cache.parent)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, out, err = _main(capsys, "prune", "--root", root, "--max-size", "0", "--format", "json")
    assert (code, out) == (1, "")  # the question went to stderr: stdout stays data
    assert err.splitlines() == ["Delete these entries? [y/N]: ",
                                "error: aborted"]
    assert len(list(triton_cache.iterdir())) == 3
    dry = json.loads(_ok("prune", "--root", root, "--max-size", "0", "--format", "json",
                         "--dry-run").stdout)
    assert len(dry["plan"]["candidates"]) == 3 and dry["result"] is None
    assert dry["plan"]["size_after"] == 0
    done = json.loads(_ok("prune", "--root", root, "--max-size", "0", "--format", "json",
                          "-y").stdout)
    assert done["result"] == {"removed": 3, "freed": dry["plan"]["expected_freed_size"],
                              "failed": []}
    assert list(triton_cache.iterdir()) == []


def test_merge_command(triton_cache, tmp_path):
    root = str(triton_cache.parent)
    _ok("pack", str(tmp_path / "a.tar"), "--root", root)
    _ok("pack", str(tmp_path / "b.tar"), "--root", root, "--jobs", "1")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    merged = _ok("merge", str(tmp_path / "m.tar"), str(tmp_path / "a.tar"),
                 str(tmp_path / "b.tar"))
    assert merged.stdout.startswith(f"Merged into {tmp_path / 'm.tar'}: 3 entries")
    assert "3 duplicates kept once" in merged.stdout
    again = json.loads(_ok("merge", str(tmp_path / "m.tar"), str(tmp_path / "a.tar"),
                           "--format", "json", "-y", "-q").stdout)
    assert (again["entries"], again["duplicates"]) == (3, 0)


def test_pack_and_merge_refuse_to_overwrite_without_yes(triton_cache, tmp_path, capsys):
    root = str(triton_cache.parent)
    out = tmp_path / "c.tar"
    out.write_bytes(b"precious")
    for args in (("pack", str(out), "--root", root), ("merge", str(out), str(out))):
        code, stdout, err = _main(capsys, *args)
        assert (code, stdout) == (1, "")
        assert err.splitlines() == [f"error: OUT {out} exists",
                                    "hint: pass -y to overwrite it, or choose another OUT"]
        assert out.read_bytes() == b"precious"
    code, stdout, err = _main(capsys, "pack", str(out), "--root", root, "-y", "--format", "json",
                              "--quiet")
    assert (code, err) == (0, "")
    packed = json.loads(stdout)
    assert (packed["path"], packed["entries"], packed["warnings"]) == (str(out), 3, [])
    assert packed["archive_bytes"] == out.stat().st_size


def test_warnings_go_to_stderr_and_data_to_stdout(triton_cache, tmp_path, capsys):
    root = str(triton_cache.parent)
    (triton_cache / "half").mkdir()  # an entry without its group file: a compile in flight
    (triton_cache / "half" / "k.cubin").write_bytes(b"x")
    code, out, err = _main(capsys, "ls", "--root", root, "--kinds", "triton")
    assert code == 0
    assert "warning:" not in out and out.splitlines()[-1].startswith("3 complete entries, ")
    assert err.splitlines() == [f"warning: triton: {triton_cache / 'half'}: incomplete: no "
                                "__grp__*.json group file (compile in flight or interrupted)"]
    code, out, err = _main(capsys, "pack", str(tmp_path / "c.tar"), "--root", root, "-q")
    assert code == 0 and out.startswith("Packed 3 entries (") and len(out.splitlines()) == 1
    assert err.splitlines() == [f"warning: triton: {triton_cache / 'half'}: incomplete: no "
                                "__grp__*.json group file (compile in flight or interrupted)"]


@pytest.mark.skipif(not os.environ.get("WARMUP_TEST_REDIS_URL"),
                    reason="WARMUP_TEST_REDIS_URL is unset: no Redis to test against")
def test_push_pull_commands(triton_cache, tmp_path):
    url, ns = os.environ["WARMUP_TEST_REDIS_URL"], f"sgw-cli-{uuid.uuid4().hex[:8]}"
    pushed = _ok("push", "--url", url, "--root", str(triton_cache.parent), "--namespace", ns)
    assert pushed.stdout.startswith("Pushed 3 entries")
    dest = tmp_path / "dest"
    pulled = _ok("pull", "--url", url, "--dest", str(dest), "--namespace", ns)
    assert pulled.stdout.splitlines()[-1].startswith("Pulled 3 entries")
    assert compile_into(dest / "triton") == [True, True, True]
    again = json.loads(_ok("push", "--url", url, "--root", str(triton_cache.parent),
                           "--namespace", ns, "--format", "json").stdout)
    assert (again["pushed"], again["present"], again["conflicts"]) == (0, 3, [])
    plan = json.loads(_ok("pull", "--url", url, "--dest", str(dest), "--namespace", ns,
                          "--format", "json").stdout)
    assert [e["action"] for e in plan["plan"]["entries"]] == ["skip"] * 3
    assert plan["outcomes"] == []
    import redis

    client = redis.Redis.from_url(url)
    client.delete(*client.scan_iter(f"{ns}:*"))


def _sglang_warmup(*args: str, cwd: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "warmup", "cache", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_error_boundary_prints_error_and_hint(tmp_path):
    proc = _sglang_warmup("verify", "missing.tar", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: missing.tar: no such archive",
        "hint: check the path (`sglang-warmup cache pack OUT` writes one)"]
    (tmp_path / "junk.tar").write_bytes(b"\0" * 1024)
    proc = _sglang_warmup("verify", "junk.tar", cwd=tmp_path)
    assert proc.returncode == 3
    assert proc.stderr.splitlines()[0] == "error: junk.tar: empty archive (no manifest.json)"
