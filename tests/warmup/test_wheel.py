"""The wheel as a user gets it: built from this tree, installed into a clean virtual environment
with no source tree around, and used by name (shipped plans are package data)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import _facts_cache
import pytest

from warmup.plan import facts as F

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment holding the wheel and its three dependencies only."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    # Built from a copy of the tracked sources: pip builds a local directory in place, and a
    # build/ left in the checkout would put modules that no longer exist into the wheel.
    src = root / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True,
                             capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(src)], check=True, cwd=root)
    (wheel,) = dist.glob("sglang_warmup-*.whl")
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], check=True,
                           capture_output=True, text=True).stdout
    packaged = {line.split()[0] for line in names.splitlines()[1:]
                if line.split() and line.split()[0].endswith(".py")}
    sources = {n for n in tracked if n.endswith(".py") and n.split("/")[0] in ("warmup", "cache_tools")}
    assert packaged == sources, f"the wheel's modules differ from the tree's: {packaged ^ sources}"
    plans = {line.split()[0] for line in names.splitlines()[1:]
             if line.split() and line.split()[0].startswith("warmup/plans/")}
    assert plans == {f"warmup/plans/{p.name}" for p in (REPO / "plans").iterdir()
                     if p.suffix in (".yaml", ".json")}
    env_dir = root / "venv"
    # No pip of its own (ensurepip costs 5 s): this pip installs into it (--python runs pip
    # with the new environment's interpreter, as its own pip would).
    venv.EnvBuilder(with_pip=False).create(env_dir)
    pip = [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
           "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, cwd=root)
    return env_dir


def run(env_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARMUP_", "PYTHON"))}
    return subprocess.run([str(env_dir / "bin" / "sglang-warmup"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_installed_wheel_lists_and_expands_its_shipped_plans(installed, tmp_path):
    listed = run(installed, "plan", "list", "--format", "json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [p["name"] for p in json.loads(listed.stdout)] == ["deepseek_v4_serving_shapes",
                                                             "default"]
    assert all("site-packages" in p["file"] for p in json.loads(listed.stdout))
    facts = tmp_path / "facts.json"
    facts.write_text(F.dump(_facts_cache.pr44627()))
    shown = run(installed, "plan", "show", "default", "--facts", str(facts), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("plan default: ")
    version = run(installed, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("sglang-warmup 0.1.0")


def test_the_installed_wheel_plans_a_launch_without_writing(installed, tmp_path):
    state = tmp_path / "state"
    dry = run(installed, "serve", "--plan", "deepseek_v4_serving_shapes", "--state-dir",
              str(state), "--dry-run", "--", "--model-path", "/models/m", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "--warmups deepseek_v4_serving_shapes" in dry.stderr
    assert "WARMUP_PLAN=" in dry.stderr and "site-packages" in dry.stderr
    assert not state.exists()  # --dry-run writes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_package_list_is_the_tree():
    """pyproject.toml lists every package (the plans' data package mapped from plans/)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {str(p.parent.relative_to(REPO)).replace("/", ".")
            for root in ("warmup", "cache_tools") for p in (REPO / root).rglob("__init__.py")}
    assert set(config["packages"]) == tree | {"warmup.plans"}
    assert config["package-dir"] == {"warmup.plans": "plans"}


def test_a_checkout_finds_its_plans_at_the_top():
    from warmup.plan import shipped

    assert shipped.DIR == REPO / "plans"
    assert shipped.names() == ["deepseek_v4_serving_shapes", "default"]
