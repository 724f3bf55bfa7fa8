"""What a command imports before it runs: the cache commands (an init container's start-up waits
for every import) import their own modules and no other command's, ``--help`` no command's
module, ``--version`` not even typer; none of them pydantic or rich.

Each command runs in a fresh interpreter (not the test zygote, which has imported torch) and
reports ``sys.modules`` as it exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warmup.cli import commands

REPO = Path(__file__).resolve().parents[3]

_REPORT = """import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules))))
from warmup.cli import main
main(sys.argv[2:])
"""

#: third-party and standard modules no cache command, ``--help`` or ``--version`` may import:
#: pydantic (typer's coercion, 0.1-0.2 s), rich (typer's help, 0.1 s), and what other commands
#: need (YAML plans, asyncio servers, TLS and HTTP clients, the e-mail parser of metadata)
HEAVY = ("pydantic", "rich", "yaml", "asyncio", "ssl", "http.client", "email", "logging",
         "importlib.metadata", "prometheus_client")

#: every module of ours a cache restore, pack or verify may import (the archive package imports
#: its parts on first use: ``--help`` loads fewer; the Redis and OCI stores only for push and
#: pull)
CACHE = {"cache_tools", "cache_tools.archive", "cache_tools.errors", "cache_tools.fingerprint",
         "cache_tools.forks", "cache_tools.archive.groups", "cache_tools.inputfile",
         "cache_tools.locations", "cache_tools.archive.manifest", "cache_tools.archive.packer",
         "cache_tools.progress", "cache_tools.archive.read_workers", "cache_tools.archive.reader",
         "cache_tools.stores", "cache_tools.render",
         "cache_tools.archive.restore", "cache_tools.scan", "cache_tools.archive.staging",
         "cache_tools.archive.tarfmt", "cache_tools.versions", "cache_tools.archive.check",
         "cache_tools.archive.writer", "warmup", "warmup.cli", "warmup.cli.cache",
         "warmup.cli.commands", "warmup.cli.options", "warmup.cli.output", "warmup.cli.values",
         "warmup.errors", "warmup.settings"}


def _imported(tmp_path: Path, *argv: str) -> set[str]:
    report = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _REPORT, str(report), *argv], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(report.read_text()))


def _ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("warmup", "cache_tools")}


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


def test_version_imports_no_typer(tmp_path):
    modules = _imported(tmp_path, "--version")
    assert not {"typer", "click"} & modules
    assert not _heavy(modules)
    assert _ours(modules) == {"cache_tools", "cache_tools.errors", "cache_tools.versions",
                              "warmup", "warmup.cli", "warmup.settings"}


def test_help_imports_no_command(tmp_path):
    modules = _imported(tmp_path, "--help")
    assert not _heavy(modules)
    assert _ours(modules) == {"cache_tools", "cache_tools.errors", "cache_tools.versions",
                              "warmup", "warmup.cli", "warmup.cli.commands",
                              "warmup.cli.values", "warmup.settings"}


@pytest.fixture
def cache_root(tmp_path: Path) -> Path:
    """One complete Triton entry: a kernel file and its group file."""
    entry = tmp_path / "root" / "triton" / "AAAAENTRY"
    entry.mkdir(parents=True)
    (entry / "k.cubin").write_bytes(b"\x7fELF" + bytes(100))
    (entry / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": str(entry / "k.cubin")}}))
    return tmp_path / "root"


def test_the_cache_commands_import_only_their_own_modules(tmp_path, cache_root):
    runs = {
        "help": _imported(tmp_path, "cache", "restore", "--help"),
        "pack": _imported(tmp_path, "cache", "pack", "a.tar", "--root", str(cache_root), "-q"),
        "verify": _imported(tmp_path, "cache", "verify", "a.tar", "-q"),
        "restore": _imported(tmp_path, "cache", "restore", "a.tar", "--dest", "d", "-q"),
    }
    assert (tmp_path / "d" / "triton" / "AAAAENTRY" / "k.cubin").is_file()
    for name, modules in runs.items():
        assert not _heavy(modules), (name, _heavy(modules))
        assert _ours(modules) <= CACHE, (name, sorted(_ours(modules) - CACHE))


def test_the_table_says_what_each_command_says():
    """The root's ``--help`` lists the commands from the table without importing them: each
    entry's help is the first paragraph of the help its command shows."""
    for name, spec in commands.COMMANDS.items():
        command = commands.load(name)
        assert command.name == name
        assert spec.help == command.help.split("\n\n")[0], name
