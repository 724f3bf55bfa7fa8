"""Inductor-generated kernels in the compile log, and the ptxas a compile worker used.

The kernel module under ``data/inductor/`` is one Inductor wrote on a GPU serving host.  Here it
is compiled by torch's own compile-worker function (``_worker_compile_triton``: torch's loader,
``CachingAutotuner.precompile(warm_cache_only=True)``, sm_90, no GPU) in a separate process with
sglang-warmup's events recording the compile log, exactly as in an Inductor worker of a server.
Its records are marked ``generated`` and carry no code; replay skips them and runs nothing (the
Inductor and Triton caches travel as an archive instead).  Inductor's workers compile with the
ptxas shipped in torch: a kernel compiled with another ptxas is found again by its version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from _interpreter import python

from cache_tools import replay
from cache_tools import compile_log

REPO = Path(__file__).resolve().parents[2]
KEY = "c7sjgqkucgntvi4c7l4fatcxeoi5bycejlefszjayi3rew3kwsy6"
SOURCE = Path(__file__).parent / "data" / "inductor" / f"{KEY}.py"
MODULE = f"torch._inductor.runtime.compile_tasks.{KEY}"
NAME = "triton_poi_fused_copy__mul_sum_0"
TRITON_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
#: HOME before any fixture changed it (read at collection).
_HOME = os.environ.get("HOME")

# One Inductor compile-worker task, as torch runs it: load the generated module with torch's
# loader and precompile every config (sm_90 from the kernel's DeviceProperties).
WORKER = """
import sys
from prometheus_client import CollectorRegistry
from torch._inductor.runtime.compile_tasks import _reload_python_module, _worker_compile_triton
from warmup.observe import events
state, key, path, name, ptxas = sys.argv[1:6]
events.install(registry=CollectorRegistry(), state_dir=state)
extra_env = {"TRITON_PTXAS_PATH": ptxas} if ptxas else {}
_worker_compile_triton(lambda: getattr(_reload_python_module(key, path), name), extra_env, {})
"""


def run_worker(tmp: Path, cache: Path, *, ptxas: Path | None = None) -> list[dict]:
    """The generated module compiled in an Inductor worker into ``cache``; the compile-log lines
    (misses and hits).  The module file is gone afterwards."""
    generated = tmp / "inductor" / KEY[1:3] / f"{KEY}.py"
    generated.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE, generated)
    state = tmp / "state"
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_PTXAS_PATH", "WARMUP_STATE_DIR", "PROMETHEUS_MULTIPROC_DIR")}
    env["TRITON_CACHE_DIR"] = str(cache)
    # The worker gets the session's HOME, not the isolated one of cache_tools' conftest (every
    # run then sees the HOME the module-scoped recording saw, and starts from the test zygote,
    # whose preloaded Triton read HOME): it writes only to TRITON_CACHE_DIR and the state dir.
    if _HOME is None:
        env.pop("HOME", None)
    else:
        env["HOME"] = _HOME
    done = subprocess.run([python(), "-c", WORKER, str(state), KEY, str(generated),
                           NAME, str(ptxas or "")], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    generated.unlink()
    return [r for r in compile_log.read_dir(state) if r.get("compiler") == "triton"]


def version(ptxas: Path) -> str:
    return subprocess.run([str(ptxas), "--version"], capture_output=True, check=True).stdout.decode()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inductor")
    records = run_worker(tmp, tmp / "jit-cache")
    return tmp, records


def test_generated_kernels_are_marked_and_carry_no_code(recorded):
    tmp, records = recorded
    assert [r["event"] for r in records] == ["miss", "miss"]  # two autotuner configs
    for r in records:
        assert r["kernel"]["module"] == MODULE and r["kernel"]["qualname"] == NAME
        assert r["kernel"]["generated"] is True and "source" not in r["kernel"]
        assert "@triton.jit" not in json.dumps(r) and "def triton_" not in json.dumps(r)
        assert r["toolchain"] == {"ptxas": str(TRITON_BIN / "ptxas"),
                                  "ptxas_version": version(TRITON_BIN / "ptxas")}
        assert r["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}


@pytest.mark.parametrize("dry_run", [False, True])
def test_generated_kernels_are_skipped_and_nothing_runs(recorded, tmp_path, dry_run):
    tmp, records = recorded
    out = tmp_path / "replayed"
    report = replay.replay([tmp / "state"], cache_dir=out, jobs=2, dry_run=dry_run)
    assert [(r.status, r.reason) for r in report.results] == [("skipped", "generated")] * 2
    assert report.results[0].detail.startswith(f"{MODULE}:{NAME} was generated at run time")
    assert MODULE not in sys.modules
    assert not out.exists() or not list(out.glob("*/*"))


# One compile of an installed kernel with the ptxas given, recorded as a server records it.
PTXAS_WORKER = """
import sys
import triton.language as tl
from prometheus_client import CollectorRegistry
from triton.runtime.jit import MockTensor
from warmup.observe import events
from warmup.observe.doctor import compile_only_target
import cache_kernels
events.install(registry=CollectorRegistry(), state_dir=sys.argv[1])
f32 = MockTensor(tl.float32)
with compile_only_target():
    cache_kernels.add_kernel.warmup(f32, f32, f32, 4096, BLOCK=64, grid=(1,))
"""


def record_with_ptxas(state: Path, cache: Path, ptxas: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WARMUP_STATE_DIR", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(TRITON_CACHE_DIR=str(cache), TRITON_PTXAS_PATH=str(ptxas),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(REPO)]))
    done = subprocess.run([python(), "-c", PTXAS_WORKER, str(state)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [r for r in compile_log.read_dir(state) if r.get("compiler") == "triton"]


def entries(cache: Path) -> set[str]:
    return {p.parent.name for p in cache.glob("*/__grp__*.json")}


def test_the_ptxas_the_worker_used_is_found_again(tmp_path, monkeypatch):
    """Inductor's workers compile with the ptxas shipped in torch (``TRITON_PTXAS_PATH``), the
    key hashes its version.  Here the compile gets another CUDA release's ptxas, under a
    ``site-packages/torch/bin`` path like torch's."""
    other = TRITON_BIN / "ptxas-blackwell"
    assert version(other) != version(TRITON_BIN / "ptxas")
    torch_bin = tmp_path / "a" / "site-packages" / "torch" / "bin"
    torch_bin.mkdir(parents=True)
    (torch_bin / "ptxas").symlink_to(other)
    state = tmp_path / "rec" / "state"
    records = record_with_ptxas(state, tmp_path / "jit-cache", torch_bin / "ptxas")
    assert {r["toolchain"]["ptxas"] for r in records} == {str(torch_bin / "ptxas")}
    # (ptxas prints the name it was run as: the version string is that of .../torch/bin/ptxas)
    wanted = version(torch_bin / "ptxas")
    assert {r["toolchain"]["ptxas_version"] for r in records} == {wanted}

    # Found at its recorded path.
    report = replay.replay([state], cache_dir=tmp_path / "out1", jobs=1)
    assert [r.status for r in report.results] == ["rebuilt"]
    assert sorted(r.hash for r in report.results) == sorted(r["hash"] for r in records)

    # Gone from there: found below another site-packages on sys.path.
    (torch_bin / "ptxas").unlink()
    moved = tmp_path / "b" / "site-packages"
    (moved / "torch" / "bin").mkdir(parents=True)
    (moved / "torch" / "bin" / "ptxas").symlink_to(other)
    monkeypatch.syspath_prepend(str(moved))
    report = replay.replay([state], cache_dir=tmp_path / "out2", jobs=1)
    assert [r.status for r in report.results] == ["rebuilt"]
    assert entries(tmp_path / "out2") == entries(tmp_path / "jit-cache")

    # Nowhere: skipped, with the release it needs and the variable to set.
    (moved / "torch" / "bin" / "ptxas").unlink()
    report = replay.replay([state], cache_dir=tmp_path / "out3", jobs=1)
    assert [(r.status, r.reason) for r in report.results] == [("skipped", "ptxas-version")]
    detail = report.results[0].detail
    release = wanted.split("release ")[1].split(",")[0]
    assert detail.startswith(f"recorded with the ptxas at {torch_bin / 'ptxas'} (CUDA {release} (V")
    assert f"tried: {TRITON_BIN / 'ptxas'} (CUDA " in detail
    assert detail.endswith("set TRITON_PTXAS_PATH to a ptxas of that release")
    assert not list((tmp_path / "out3").glob("*/*.cubin"))
    # The in-process replays left Triton's cached ptxas version as it was.
    from triton.backends.nvidia import compiler as nvidia

    assert nvidia.get_ptxas_version(90) == version(TRITON_BIN / "ptxas")
