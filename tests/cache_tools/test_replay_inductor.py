"""Inductor-generated kernels: recorded with their source, replayed without it.

The kernel module under ``data/inductor/`` is one Inductor wrote on a GPU serving host.  Here it
is compiled by torch's own compile-worker function (``_worker_compile_triton``: torch's loader,
``CachingAutotuner.precompile(warm_cache_only=True)``, sm_90, no GPU) in a separate process with
sglang-warmup's events recording the compile log, exactly as in an Inductor worker of a server.
The generated file is then deleted: the replay has only the compile-log line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import triton
from _interpreter import python

from cache_tools import replay
from cache_tools import compile_log
from warmup.observe import triton_record

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


def entries(cache: Path) -> dict[str, tuple[list[str], int]]:
    """Entry key -> (its files, the cubin's size).  The cubins' bytes differ in one place: the
    debug line table names the directory the module was executed from (the worker's Inductor
    cache there, the replay's private directory here)."""
    return {p.parent.name: (sorted(f.name for f in p.parent.iterdir()), p.stat().st_size)
            for p in cache.glob(f"*/{NAME}.cubin")}


def version(ptxas: Path) -> str:
    return subprocess.run([str(ptxas), "--version"], capture_output=True, check=True).stdout.decode()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inductor")
    records = run_worker(tmp, tmp / "jit-cache")
    return tmp, records


def test_the_compile_log_carries_the_generated_source_and_the_ptxas(recorded):
    tmp, records = recorded
    text = SOURCE.read_text()
    assert [r["event"] for r in records] == ["miss", "miss"]  # two autotuner configs
    for r in records:
        assert r["kernel"]["module"] == MODULE and r["kernel"]["qualname"] == NAME
        assert r["kernel"]["source"] == {"file": f"{KEY}.py", "text": text,
                                         "sha256": hashlib.sha256(text.encode()).hexdigest()}
        assert r["toolchain"] == {"ptxas": str(TRITON_BIN / "ptxas"),
                                  "ptxas_version": version(TRITON_BIN / "ptxas")}
        assert r["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_inductor_kernel_replays_from_its_recorded_source(recorded, tmp_path, jobs):
    tmp, records = recorded
    out = tmp_path / "replayed"
    report = replay.replay([tmp / "state"], cache_dir=out, jobs=jobs)
    assert [(r.status, r.reason, r.kernel) for r in report.results] == \
        [("rebuilt", "", f"{MODULE}:{NAME}")] * 2
    assert sorted(r.hash for r in report.results) == sorted(r["hash"] for r in records)
    assert entries(out) == entries(tmp / "jit-cache") and len(entries(out)) == 2
    # The module was executed here, under its recorded name: in this process with one job,
    # before the workers were forked with two.
    assert report.pool == ("in-process" if jobs == 1 else "fork")
    assert sys.modules.pop(MODULE).__name__ == MODULE

    # The same worker task against the replayed cache: both configs are disk hits.
    again = run_worker(tmp_path, out)
    assert [(r["event"], r["hash"]) for r in again] == \
        [("hit", r["hash"]) for r in records]


def test_a_damaged_source_is_not_run(recorded, tmp_path):
    tmp, records = recorded
    line = json.loads(json.dumps(records[0]))
    line["kernel"]["source"]["text"] += "\nraise SystemExit('never run')\n"
    log = tmp_path / "compiles-1.jsonl"
    log.write_text(json.dumps(line) + "\n")
    report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1)
    [result] = report.results
    assert (result.status, result.reason) == ("skipped", "not-importable")
    assert result.detail == (f"the source recorded for {MODULE} does not match its sha256: "
                             "the compile-log line is damaged")
    assert MODULE not in sys.modules


def test_the_ptxas_the_worker_used_is_found_again(tmp_path, monkeypatch):
    """Inductor's workers compile with the ptxas shipped in torch (``TRITON_PTXAS_PATH``), the
    key hashes its version.  Here the worker gets another CUDA release's ptxas, under a
    ``site-packages/torch/bin`` path like torch's."""
    other = TRITON_BIN / "ptxas-blackwell"
    assert version(other) != version(TRITON_BIN / "ptxas")
    torch_bin = tmp_path / "a" / "site-packages" / "torch" / "bin"
    torch_bin.mkdir(parents=True)
    (torch_bin / "ptxas").symlink_to(other)
    records = run_worker(tmp_path / "rec", tmp_path / "jit-cache", ptxas=torch_bin / "ptxas")
    assert {r["toolchain"]["ptxas"] for r in records} == {str(torch_bin / "ptxas")}
    # (ptxas prints the name it was run as: the version string is that of .../torch/bin/ptxas)
    wanted = version(torch_bin / "ptxas")
    assert {r["toolchain"]["ptxas_version"] for r in records} == {wanted}
    state = tmp_path / "rec" / "state"

    # Found at its recorded path.
    report = replay.replay([state], cache_dir=tmp_path / "out1", jobs=1)
    assert [r.status for r in report.results] == ["rebuilt", "rebuilt"]
    assert sorted(r.hash for r in report.results) == sorted(r["hash"] for r in records)
    sys.modules.pop(MODULE, None)

    # Gone from there: found below another site-packages on sys.path.
    (torch_bin / "ptxas").unlink()
    moved = tmp_path / "b" / "site-packages"
    (moved / "torch" / "bin").mkdir(parents=True)
    (moved / "torch" / "bin" / "ptxas").symlink_to(other)
    monkeypatch.syspath_prepend(str(moved))
    report = replay.replay([state], cache_dir=tmp_path / "out2", jobs=1)
    assert [r.status for r in report.results] == ["rebuilt", "rebuilt"]
    assert entries(tmp_path / "out2") == entries(tmp_path / "jit-cache")
    sys.modules.pop(MODULE, None)

    # Nowhere: skipped, with the release it needs and the variable to set.
    (moved / "torch" / "bin" / "ptxas").unlink()
    report = replay.replay([state], cache_dir=tmp_path / "out3", jobs=1)
    assert [(r.status, r.reason) for r in report.results] == [("skipped", "ptxas-version")] * 2
    detail = report.results[0].detail
    release = wanted.split("release ")[1].split(",")[0]
    assert detail.startswith(f"recorded with the ptxas at {torch_bin / 'ptxas'} (CUDA {release} (V")
    assert f"tried: {TRITON_BIN / 'ptxas'} (CUDA " in detail
    assert detail.endswith("set TRITON_PTXAS_PATH to a ptxas of that release")
    assert not list((tmp_path / "out3").glob("*/*.cubin"))
    sys.modules.pop(MODULE, None)
    # The in-process replays left Triton's cached ptxas version as it was.
    from triton.backends.nvidia import compiler as nvidia

    assert nvidia.get_ptxas_version(90) == version(TRITON_BIN / "ptxas")


def test_generated_source_only_for_modules_made_at_run_time(tmp_path):
    assert triton_record.generated_source(run_worker) is None  # an importable module

    path = tmp_path / "gen.py"
    path.write_text("def f():\n    return 1\n")
    made = types.ModuleType("made.at.run.time")
    made.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), made.__dict__)
    got = triton_record.generated_source(made.f)
    assert got == {"file": "gen.py", "text": path.read_text(),
                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}

    script = types.ModuleType("__main__")
    script.__file__ = str(path)
    exec("def g():\n    pass\n", script.__dict__)
    assert triton_record.generated_source(script.g) is None

    big = tmp_path / "big.py"
    big.write_text("def h():\n    pass\n" + "#" * (256 * 1024))
    huge = types.ModuleType("made.big")
    huge.__file__ = str(big)
    exec("def h():\n    pass\n", huge.__dict__)
    assert triton_record.generated_source(huge.h) is None
    assert triton_record.generated_source(object()) is None
