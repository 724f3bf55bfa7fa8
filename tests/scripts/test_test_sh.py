"""scripts/test.sh: what it says when a Debian package the tests use is missing (installing one
needs root; the tests that need it are then skipped, not failed)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "scripts" / "test.sh").read_text()


def _install_deb(tmp_path: Path, *args: str, uid: int) -> subprocess.CompletedProcess:
    """The script's install_deb function alone, with `id -u` answering ``uid``, no sudo that
    works, and an apt-get that only records its calls."""
    body = re.search(r"^apt_updated=\n(install_deb\(\) \{.*?^\})", SCRIPT, re.S | re.M).group(1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("id", f"echo {uid}"), ("sudo", "exit 1"),
                       ("apt-get", f'echo "apt-get $*" >> {tmp_path}/apt.log')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    return subprocess.run(["bash", "-c", f"set -euo pipefail\napt_updated=\n{body}\n"
                           f'install_deb {" ".join(args)}'], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)


def test_without_root_it_says_root_is_needed_and_what_is_skipped(tmp_path):
    r = _install_deb(tmp_path, "redis-server", "no-such-command-here", "'the Redis tests'",
                     uid=1000)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "test: redis-server is not installed, and installing it needs root (apt-get install "
        "redis-server); the Redis tests will be skipped"]
    assert not (tmp_path / "apt.log").exists()


def test_as_root_it_installs_once_updating_the_lists_once(tmp_path):
    r = _install_deb(tmp_path, "chromium", "no-such-command-here", "'the browser tests'",
                     uid=0)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["test: installing chromium (Debian package, apt-get as root)"]
    assert (tmp_path / "apt.log").read_text().splitlines() == [
        "apt-get update -qq", "apt-get install -y -qq chromium"]


def test_an_installed_command_is_left_alone(tmp_path):
    r = _install_deb(tmp_path, "bash", "bash", "'nothing'", uid=1000)
    assert (r.returncode, r.stdout) == (0, "")


def test_no_message_says_a_skipped_test_fails():
    assert "will fail" not in SCRIPT


def test_pytest_temporary_directories_go_with_the_run():
    """pytest's tmp_path root is a directory the script's exit trap removes (pytest's default
    keeps the last three runs in /tmp)."""
    assert re.search(r'^pytest_tmp=\$\(mktemp -d\)$', SCRIPT, re.M)
    assert '--basetemp "$pytest_tmp/pytest"' in SCRIPT
    trap = re.search(r"^cleanup\(\) \{.*?^\}", SCRIPT, re.S | re.M).group(0)
    assert 'rm -rf "$pytest_tmp"' in trap and "trap cleanup EXIT" in SCRIPT
