"""cli.py: the `sglang-warmup cache` commands end to end, and the CLI error boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cache_helpers import compile_into
from warmup.cli.cache import app
from cache_tools.errors import CacheError

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


def test_bad_choices_are_cache_errors():
    result = runner.invoke(app, ["env", "--format", "yaml"])
    assert isinstance(result.exception, CacheError)
    assert result.exception.message == "--format 'yaml': expected one of sh, dockerfile, k8s"
    result = runner.invoke(app, ["prune", "--fingerprint", "mine", "-y"])
    assert result.exception.message == "--fingerprint 'mine': expected one of other"


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
    assert "Will delete 3 entries" in dry.stdout
    refused = runner.invoke(app, ["prune", "--root", root, "--max-size", "0"], input="n\n")
    assert refused.exit_code == 1 and len(list(triton_cache.iterdir())) == 3
    done = _ok("prune", "--root", root, "--max-size", "0", "-y")
    assert done.stdout.splitlines()[-1].startswith("Deleted 3 entries, freed ")
    assert list(triton_cache.iterdir()) == []


def test_merge_command(triton_cache, tmp_path):
    root = str(triton_cache.parent)
    _ok("pack", str(tmp_path / "a.tar"), "--root", root)
    _ok("pack", str(tmp_path / "b.tar"), "--root", root)
    merged = _ok("merge", str(tmp_path / "m.tar"), str(tmp_path / "a.tar"),
                 str(tmp_path / "b.tar"))
    assert merged.stdout.startswith(f"Merged into {tmp_path / 'm.tar'}: 3 entries")
    assert "3 duplicates kept once" in merged.stdout


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
