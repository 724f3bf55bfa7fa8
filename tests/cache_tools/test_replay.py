"""cache_tools.replay: kernels compiled through the real @triton.jit path (CPU, target sm_90)
with sglang-warmup's events recording the compile log, replayed into an empty cache, then looked up
again through the JIT path: the replayed entries must be the very ones the JIT finds on disk."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl
from prometheus_client import CollectorRegistry
from triton import knobs
from triton.runtime.jit import MockTensor

from cache_tools import replay
from cache_tools.errors import CacheError
from cache_tools import compile_log
from warmup.observe import events, phase
from warmup.observe.doctor import compile_only_target

REPO = Path(__file__).resolve().parents[2]
TRITON = triton.__version__


@triton.jit
def spec_kernel(x_ptr, y_ptr, n, stride, BLOCK: tl.constexpr, OUT_DTYPE: tl.constexpr,
                SCALE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs * stride, mask=mask) * SCALE
    tl.store(y_ptr + offs, v.to(OUT_DTYPE), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1),
                          triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


def make_nested_kernel():
    @triton.jit
    def nested_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2.0)

    return nested_kernel


class Misaligned(MockTensor):
    """A tensor argument whose address is not a multiple of 16 bytes (no ``tt.divisibility``)."""

    def data_ptr(self):
        return 8


F32, F16 = MockTensor(tl.float32), MockTensor(tl.float16)

# (args, constexpr kwargs, options): one entry each
#   1: n % 16 == 0, stride == 1 (baked in as a constexpr), aligned pointers
#   2: n "other", stride % 16 == 0, a misaligned x pointer
#   3: n == 1 (constexpr), stride "other", a misaligned y pointer, num_warps=8
SPECS = [
    ((F32, F16, 4096, 1), {"BLOCK": 128, "OUT_DTYPE": tl.float16, "SCALE": 2.0}, {}),
    ((Misaligned(tl.float32), F32, 4097, 16),
     {"BLOCK": 64, "OUT_DTYPE": tl.float32, "SCALE": 0.5}, {}),
    ((F32, Misaligned(tl.bfloat16), 1, 3),
     {"BLOCK": 256, "OUT_DTYPE": tl.bfloat16, "SCALE": 1.0}, {"num_warps": 8}),
]


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """Triton's hook slots, our events installation and the phase are put back (the whole
    environment too, which a kernel module that imports sglang changes: tests/conftest.py).
    Replays run from a working directory of their own: replay never imports from the working
    directory, and spawned workers (a thread left by another test makes a fork unsafe) import
    this module, which imports the project found through the checkout."""
    monkeypatch.chdir(tmp_path)
    saved = (knobs.compilation.listener, knobs.runtime.jit_cache_hook,
             knobs.runtime.jit_post_compile_hook,
             list(knobs.runtime.kernel_load_start_hook.calls),
             list(knobs.runtime.kernel_load_end_hook.calls))
    monkeypatch.delenv("WARMUP_STATE_DIR", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    phase.reset()
    yield
    events.uninstall()
    phase.reset()
    knobs.compilation.listener, knobs.runtime.jit_cache_hook, \
        knobs.runtime.jit_post_compile_hook = saved[:3]
    knobs.runtime.kernel_load_start_hook.calls[:] = saved[3]
    knobs.runtime.kernel_load_end_hook.calls[:] = saved[4]


def clear_jit(*kernels) -> None:
    """Forget in-process compiled kernels so the next launch asks triton.compile again."""
    for k in kernels:
        while not isinstance(k, triton.runtime.jit.JITFunction):
            k = k.fn
        k.device_caches.clear()


def jit_compile(cache_dir: Path, calls, *, state_dir: Path | None = None) -> list:
    """Run ``calls`` (each a no-argument function doing ``kernel.warmup(...)``) with the
    Triton cache at ``cache_dir``, the active driver's target patched to cuda:90 and, with a
    ``state_dir``, sglang-warmup's events recording the compile log.  Returns what Triton's
    compilation listener saw: ``(kernel name, cache_hit, hash)`` per triton.compile call."""
    seen = []
    previous = knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        seen.append((src.name, cache_hit, metadata["hash"]))

    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    knobs.compilation.listener = listener
    try:
        if state_dir is not None:
            events.uninstall()  # an installation left by another test would keep its own dir
            events.install(registry=CollectorRegistry(), state_dir=state_dir)
        with compile_only_target():
            for call in calls:
                call()
    finally:
        events.uninstall()
        knobs.compilation.listener = previous
    return seen


def spec_calls():
    return [lambda a=a, c=c, o=o: spec_kernel.warmup(*a, **c, **o, grid=(1,))
            for a, c, o in SPECS]


def entries(cache_dir: Path) -> set[str]:
    """Triton cache entries (hash directories holding a group file)."""
    return {p.parent.name for p in cache_dir.glob("*/__grp__*.json")}


def metadata_hashes(cache_dir: Path) -> set[str]:
    return {json.loads(p.read_text())["hash"] for p in cache_dir.glob("*/spec_kernel.json")}


def records(state_dir: Path) -> list[dict]:
    return [r for r in compile_log.read_dir(state_dir) if r["event"] == "miss"]


@pytest.fixture
def recorded(tmp_path):
    """SPECS compiled through the JIT path into tmp_path/jit-cache, recorded in tmp_path/state."""
    clear_jit(spec_kernel)
    state, cache = tmp_path / "state", tmp_path / "jit-cache"
    seen = jit_compile(cache, spec_calls(), state_dir=state)
    assert [hit for _, hit, _ in seen] == [False, False, False]
    return state, cache, seen


# --- key fidelity ------------------------------------------------------------------------------

@pytest.mark.parametrize("jobs", [1, 2])
def test_replayed_entries_are_the_ones_the_jit_finds(recorded, tmp_path, jobs):
    state, jit_cache, seen = recorded
    # The compile log covers what this test claims: int classes, alignment, constexprs.
    recs = records(state)
    assert len(recs) == 3
    assert recs[0]["constexprs"][0] == {"path": [3], "name": "stride", "value": 1}
    assert {"path": [2], "name": "n", "attrs": [["tt.divisibility", 16]]} in recs[0]["attrs"]
    assert {"path": [0], "name": "x_ptr", "attrs": [["tt.divisibility", 16]]} in recs[0]["attrs"]
    assert {"path": [0], "name": "x_ptr", "attrs": []} in recs[1]["attrs"]
    assert {"path": [3], "name": "stride", "attrs": [["tt.divisibility", 16]]} in recs[1]["attrs"]
    assert {"path": [2], "name": "n", "value": 1} in recs[2]["constexprs"]
    assert {"path": [1], "name": "y_ptr", "attrs": []} in recs[2]["attrs"]
    assert {"path": [5], "name": "OUT_DTYPE", "value": "bf16"} in recs[2]["constexprs"]
    assert recs[2]["options"]["num_warps"] == 8

    empty = tmp_path / "replayed"
    report = replay.replay([state], cache_dir=empty, jobs=jobs)
    assert [(r.status, r.reason) for r in report.results] == [("rebuilt", "")] * 3
    assert [r.hash for r in report.results] == [h for _, _, h in seen]
    assert report.counts == {"rebuilt": 3, "present": 0, "planned": 0, "skipped": 0,
                             "failed": 0}
    assert report.jobs == jobs and report.triton_version == TRITON
    # Two jobs: workers forked after the kernels' modules were imported here.
    assert report.pool == {1: "in-process", 2: "fork"}[jobs]
    assert gc.get_freeze_count() == 0  # the imported heap is frozen only while compiling
    # Same entry directories, same metadata hashes, same cubins.
    assert entries(empty) == entries(jit_cache) and len(entries(empty)) == 3
    assert metadata_hashes(empty) == metadata_hashes(jit_cache) == {h for _, _, h in seen}
    for cubin in jit_cache.glob("*/spec_kernel.cubin"):
        assert (empty / cubin.parent.name / cubin.name).read_bytes() == cubin.read_bytes()

    # A fresh process-state JIT launch against the replayed cache: every lookup a disk hit.
    clear_jit(spec_kernel)
    again = jit_compile(empty, spec_calls())
    assert again == [(name, True, h) for name, _, h in seen]


def test_a_second_replay_finds_everything_present_and_dry_run_writes_nothing(recorded,
                                                                            tmp_path):
    state, _, seen = recorded
    out = tmp_path / "replayed"
    replay.replay([state], cache_dir=out, jobs=1)
    again = replay.replay([state / "compile_log"], cache_dir=out, jobs=1)
    assert [r.status for r in again.results] == ["present"] * 3

    dry_dir = tmp_path / "dry"
    dry = replay.replay(sorted((state / "compile_log").glob("*.jsonl")), cache_dir=dry_dir,
                        jobs=2, dry_run=True)
    assert [r.status for r in dry.results] == ["planned"] * 3
    assert not dry_dir.exists()
    assert replay.summary_line(dry).startswith("3 would rebuild, 0 already present, 0 skipped")


def test_hits_and_repeated_misses_collapse_into_one_entry(recorded, tmp_path):
    state, _, _ = recorded
    log = next((state / "compile_log").glob("*.jsonl"))
    lines = log.read_text().splitlines()
    hit = dict(json.loads(lines[0]), event="hit", phase="serving", pid=1)
    load = {"event": "load", "compiler": "triton", "hash": "h", "kernel": {"name": "x"}}
    log.write_text("\n".join(lines + [json.dumps(hit), json.dumps(load), '{"torn']) + "\n")
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1)
    assert [r.records for r in report.results] == [2, 1, 1]
    assert report.results[0].phases == ("init", "serving")
    assert report.ignored == 1
    assert report.warnings == (f"{log}:{len(lines) + 3}: not a JSON object, skipped",)


# --- what cannot be replayed, and why ----------------------------------------------------------

def test_skips_name_their_reason(recorded, tmp_path):
    state, _, _ = recorded
    log = next((state / "compile_log").glob("*.jsonl"))
    base = [json.loads(x) for x in log.read_text().splitlines()]

    def variant(**changes) -> dict:
        rec = json.loads(json.dumps(base[0]))
        for key, value in changes.items():
            if value is None:
                del rec[key]
            else:
                rec[key] = value
        return rec

    cases = [
        variant(triton_version="3.6.0"),
        variant(kernel={**base[0]["kernel"], "module": "no_such_module_for_replay"}),
        variant(kernel={**base[0]["kernel"], "qualname": "gone_kernel"}),
        variant(kernel={**base[0]["kernel"], "qualname": "make_nested_kernel"}),
        variant(kernel={**base[0]["kernel"], "qualname": "make.<locals>.inner"}),
        variant(kernel={**base[0]["kernel"], "module": "__main__"}),
        variant(options=None, target=None),
        variant(kernel={"module": None, "name": "k", "qualname": None, "path": "/x/k.ttir"}),
        variant(options={**base[0]["options"], "extern_libs": [["mylib", "/nowhere/lib.bc"]]}),
        variant(kernel={**base[0]["kernel"], "source_sha256": "0" * 64}),
        variant(kernel={k: v for k, v in base[0]["kernel"].items() if k != "source_sha256"}),
    ]
    changed = json.loads(json.dumps(base[0]))
    changed["constexprs"][1]["value"] = 64  # BLOCK differs from what gave the recorded key
    for number, case in enumerate(cases):
        case["hash"] = f"{base[0]['hash']}-{number}"  # distinct entries, not one
    cases.append(changed)
    log.write_text("".join(json.dumps(c) + "\n" for c in cases))

    report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1)
    got = [(r.status, r.reason, r.detail) for r in report.results]
    assert got == [
        ("skipped", "triton-version",
         f"recorded with Triton 3.6.0, this interpreter has Triton {TRITON}: the cache key "
         "hashes Triton itself; replay with an interpreter that has Triton 3.6.0 (--python)"),
        ("skipped", "not-installed",
         "no_such_module_for_replay is not installed here (looked on the installed search "
         "path, never in the working directory)"),
        ("skipped", "not-a-kernel",
         "no def of gone_kernel in the installed module (a different release of its package "
         "than recorded?)"),
        ("skipped", "not-a-kernel",
         "make_nested_kernel is not decorated as a Triton kernel (@triton.jit, "
         "@triton.autotune, @triton.heuristics)"),
        ("skipped", "nested-function",
         "make.<locals>.inner is defined inside a function (a closure or nested kernel): it "
         "cannot be imported by name"),
        ("skipped", "not-installed",
         "spec_kernel was defined in a script run as __main__: move it into an importable "
         "module"),
        ("skipped", "missing-fields", "the record lacks options, target"),
        ("skipped", "ir-source",
         "compiled from the IR file /x/k.ttir, not from a Python kernel: nothing to re-import"),
        ("skipped", "extern-lib",
         "extern library mylib was /nowhere/lib.bc on the recording machine and is not there "
         "here"),
        ("skipped", "source-mismatch", got[9][2]),
        ("skipped", "missing-fields",
         "the record lacks kernel.source_sha256 (older compile logs lack it: re-record)"),
        ("skipped", "key-mismatch", got[-1][2]),
    ]
    assert got[9][2] == (f"the installed {__name__}:spec_kernel ({Path(__file__)}) hashes to "
                         f"{base[0]['kernel']['source_sha256'][:12]}, recorded 000000000000: "
                         "another release of its package than the recording machine's")
    assert got[-1][2].startswith("the cache key here is ")
    assert got[-1][2].endswith(f", recorded {base[0]['hash'][:12]}: the kernel source or what "
                               "it calls, the Triton build (Python version), ptxas or the "
                               "cache-invalidating environment differ from the recording "
                               "machine")
    assert not list((tmp_path / "out").glob("*/__grp__*.json"))
    assert report.skip_reasons == {"extern-lib": 1, "ir-source": 1, "key-mismatch": 1,
                                   "missing-fields": 2, "nested-function": 1,
                                   "not-a-kernel": 2, "not-installed": 2,
                                   "source-mismatch": 1, "triton-version": 1}


def test_a_nested_kernel_is_recorded_and_skipped(tmp_path):
    nested = make_nested_kernel()
    state = tmp_path / "state"
    jit_compile(tmp_path / "c", [lambda: nested.warmup(F32, BLOCK=16, grid=(1,))],
                state_dir=state)
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1)
    (result,) = report.results
    assert (result.status, result.reason, result.kernel) == (
        "skipped", "nested-function",
        f"{__name__}:make_nested_kernel.<locals>.nested_kernel")


def test_another_release_is_refused_before_import_or_at_the_key(tmp_path, monkeypatch):
    """What a compile log from another SGLang release looks like: same module, other source.
    The kernel's own source changed: refused on disk, the module is never imported.  Only a
    helper it calls changed: the kernel's source matches, the module is imported (installed
    code), and the recomputed key differs."""
    package = tmp_path / "pkg"
    package.mkdir()
    source = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
              "def helper(v):\n"
              "    return v + {helper}\n\n\n@triton.jit\n"
              "def k(x_ptr, BLOCK: tl.constexpr):\n"
              "    offs = tl.arange(0, BLOCK)\n"
              "    tl.store(x_ptr + offs, helper(tl.load(x_ptr + offs)) + {add})\n")
    (package / "replay_release.py").write_text(source.format(helper="1.0", add="1.0"))
    monkeypatch.syspath_prepend(str(package))
    import replay_release

    state = tmp_path / "state"
    jit_compile(tmp_path / "c", [lambda: replay_release.k.warmup(F32, BLOCK=32, grid=(1,))],
                state_dir=state)
    monkeypatch.delitem(sys.modules, "replay_release")
    (package / "replay_release.py").write_text(source.format(helper="1.0", add="2.0"))
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1)
    assert [(r.status, r.reason) for r in report.results] == [("skipped", "source-mismatch")]
    assert "replay_release" not in sys.modules
    assert entries(tmp_path / "out") == set()

    (package / "replay_release.py").write_text(source.format(helper="2.0", add="1.0"))
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1)
    assert [(r.status, r.reason) for r in report.results] == [("skipped", "key-mismatch")]
    assert entries(tmp_path / "out") == set()


def test_the_recorded_cache_invalidating_environment_is_the_one_replayed(tmp_path):
    clear_jit(spec_kernel)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # changes the key (and the code)
    state = tmp_path / "state"
    seen = jit_compile(tmp_path / "jit", spec_calls()[:2], state_dir=state)
    del os.environ["TRITON_DISABLE_LINE_INFO"]
    assert {json.dumps(r["env"]) for r in records(state)} == {
        '{"TRITON_DISABLE_LINE_INFO": "true"}'}
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1)
    assert [(r.status, r.hash) for r in report.results] == [("rebuilt", h) for _, _, h in seen]
    assert "TRITON_DISABLE_LINE_INFO" not in os.environ  # put back after the compile

    # The same kernels recorded without it: every key differs, which names the toolchain.
    log = next((state / "compile_log").glob("*.jsonl"))
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(dict(r, env={})) + "\n" for r in lines))
    report = replay.replay([state], cache_dir=tmp_path / "out2", jobs=1)
    assert [r.reason for r in report.results] == ["key-mismatch"] * 2
    assert report.warnings == (
        "all 2 recomputed cache keys differ from the recorded ones: the toolchain differs from "
        "the recording machine's (the Triton wheel or Python version, ptxas, the "
        "cache-invalidating environment), not single kernels",)


def test_target_filter(recorded, tmp_path):
    state, _, _ = recorded
    report = replay.replay([state], cache_dir=tmp_path / "out", target="cuda:100", jobs=1)
    assert {(r.status, r.reason, r.detail) for r in report.results} == {
        ("skipped", "other-target", "recorded for cuda:90, replaying cuda:100 only")}
    report = replay.replay([state], cache_dir=tmp_path / "out", target="cuda:90:32",
                           jobs=1, dry_run=True)
    assert [r.status for r in report.results] == ["planned"] * 3


def test_autotuned_kernels_replay_and_report_unrecorded_configs(tmp_path):
    clear_jit(tuned_kernel)
    state_all, state_one = tmp_path / "all", tmp_path / "one"
    jit_compile(tmp_path / "c1", [lambda: tuned_kernel.warmup(F32, 4096, grid=(1,))],
                state_dir=state_all)
    clear_jit(tuned_kernel)
    jit_compile(tmp_path / "c2", [lambda: tuned_kernel.fn.warmup(F32, 4096, BLOCK=64,
                                                                  num_warps=2, grid=(1,))],
                state_dir=state_one)

    full = replay.replay([state_all], cache_dir=tmp_path / "out", jobs=1)
    assert [(r.status, r.kernel) for r in full.results] == [
        ("rebuilt", f"{__name__}:tuned_kernel")] * 2
    assert full.warnings == ()
    partial = replay.replay([state_one], cache_dir=tmp_path / "out", jobs=1)
    assert [r.status for r in partial.results] == ["present"]
    assert partial.warnings == (
        f"{__name__}:tuned_kernel: autotuned, 1 of its 2 configs recorded for one "
        "specialization; a cold serving process that benchmarks the others compiles them "
        "(fewer if the autotuner prunes its configs)",)
    clear_jit(tuned_kernel)
    assert [hit for _, hit, _ in jit_compile(
        tmp_path / "out", [lambda: tuned_kernel.warmup(F32, 4096, grid=(1,))])] == [True, True]


def test_a_real_sglang_kernel(tmp_path):
    """SGLang's own kv-indices kernel, imported from the installed SGLang, round trip."""
    from sglang.kernels.ops.kvcache.kv_indices import create_flashinfer_kv_indices_triton as k

    clear_jit(k)
    i32 = MockTensor(tl.int32)
    state = tmp_path / "state"
    calls = [lambda: k.warmup(i32, i32, i32, i32, None, i32, 4096, grid=(1,)),
             lambda: k.warmup(i32, i32, i32, i32, i32, i32, 4097, ENTRY_PAGE_SIZE=16,
                              TOKEN_BLOCK_PARALLEL=True, grid=(1,))]
    first = jit_compile(tmp_path / "jit", calls, state_dir=state)
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=1, target="cuda:90")
    assert [(r.status, r.kernel) for r in report.results] == [
        ("rebuilt", "sglang.kernels.ops.kvcache.kv_indices:"
                    "create_flashinfer_kv_indices_triton")] * 2
    clear_jit(k)
    assert jit_compile(tmp_path / "out", calls) == [(n, True, h) for n, _, h in first]


# --- inputs, the interpreter switch and the command ---------------------------------------------

def test_bad_inputs_are_cache_errors(tmp_path):
    with pytest.raises(CacheError) as err:
        replay.replay([tmp_path / "missing"], cache_dir=tmp_path / "out")
    assert err.value.message == f"{tmp_path / 'missing'}: no such file or directory"
    assert err.value.hint == ("pass a compiles-<pid>.jsonl file, the compile_log/ directory or the "
                              "WARMUP_STATE_DIR above it")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CacheError) as err:
        replay.replay([tmp_path / "empty"], cache_dir=tmp_path / "out")
    assert err.value.message == (f"{tmp_path / 'empty'}: no compiles-*.jsonl files here or in "
                                 f"{tmp_path / 'empty' / 'compile_log'}")
    log = tmp_path / "m.jsonl"
    log.write_text("")
    for target, message in (("cuda", "--target 'cuda': expected BACKEND:ARCH[:WARP_SIZE]"),
                            ("cuda:90:x", "--target 'cuda:90:x': warp size 'x' is not a "
                                          "number")):
        with pytest.raises(CacheError) as err:
            replay.replay([log], cache_dir=tmp_path / "out", target=target)
        assert err.value.message == message
    with pytest.raises(CacheError) as err:
        replay.replay([log], cache_dir=tmp_path / "out", jobs=0)
    assert err.value.message == "--jobs 0: expected 1 or more"
    with pytest.raises(CacheError) as err:
        replay.replay([log], cache_dir=tmp_path / "out", python=tmp_path / "nopython")
    assert err.value.message == f"--python {tmp_path / 'nopython'}: not an executable file"
    report = replay.replay([log], cache_dir=tmp_path / "out")
    assert report.results == ()
    assert replay.report_text(report).splitlines()[0] == f"No Triton compile records in {log}."


def test_another_interpreter_runs_the_same_replay(recorded, tmp_path):
    state, jit_cache, _ = recorded
    out = tmp_path / "elsewhere"
    # sys.path of this test run (the test module holds the kernel) for the other interpreter.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    report = replay.replay([state], cache_dir=out, jobs=1, python=sys.executable)
    assert [r.status for r in report.results] == ["rebuilt"] * 3, report.results[0].detail
    assert report.python == sys.executable
    assert entries(out) == entries(jit_cache)


def test_the_cli_command(recorded, tmp_path):
    state, jit_cache, _ = recorded
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("TRITON_CACHE_DIR", None)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "warmup", "cache", "replay", *args],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=300)

    done = cli(str(state), "--target", "cuda:90", "--cache-dir", str(tmp_path / "out"),
               "--jobs", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["STATUS", "KERNEL", "SPECIALIZATION", "KEY", "TARGET", "TIME",
                                "WHY"]
    assert lines[2].startswith(f"rebuilt  {__name__}:spec_kernel  stride=1, BLOCK=128, "
                               "OUT_DTYPE=fp16, SCALE=2.0; w4 s3")
    assert lines[-1].startswith("3 rebuilt, 0 already present, 0 skipped, 0 failed in ")
    assert done.stderr.splitlines()[0] == f"[1/3] rebuilt {__name__}:spec_kernel"
    assert entries(tmp_path / "out") == entries(jit_cache)

    done = cli(str(state), "--cache-dir", str(tmp_path / "out"), "--json", "--jobs", "1",
               "--target", "cuda:100", "--strict")
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["counts"]["skipped"] == 3 and data["skip_reasons"] == {"other-target": 3}
    assert done.stderr.splitlines()[-2:] == [
        "error: 3 of 3 recorded kernels were not rebuilt",
        "hint: the WHY column says why for each; --strict also counts skipped ones"]

    done = cli(str(tmp_path / "nothing"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: {tmp_path / 'nothing'}: no such file or directory",
        "hint: pass a compiles-<pid>.jsonl file, the compile_log/ directory or the "
        "WARMUP_STATE_DIR above it"]


def test_the_module_stays_standard_library_only():
    code = ("import json, sys\nimport cache_tools.replay\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules}"
            " - set(sys.stdlib_module_names) - {'cache_tools', '__main__'})))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


# --- damaged records ---------------------------------------------------------------------------

def test_damaged_records_are_skipped_with_their_reason_never_run(recorded, tmp_path):
    state, _, _ = recorded
    log = next((state / "compile_log").glob("*.jsonl"))
    base = json.loads(log.read_text().splitlines()[0])
    cases = [
        dict(base, kernel="spec_kernel"),
        dict(base, kernel={**base["kernel"], "qualname": 7}),
        dict(base, options=[["num_warps", 4]], target="cuda:90"),
        dict(base, constexprs={"BLOCK": 128}),
        dict(base, env=["TRITON_DISABLE_LINE_INFO"]),
        dict(base, toolchain="ptxas"),
        dict(base, kernel={**base["kernel"], "source": "raise SystemExit('never run')"}),
        dict(base, hash=12345),
    ]
    for number, case in enumerate(cases):
        if number != 7:
            case["hash"] = f"{base['hash']}-{number}"
    log.write_text("".join(json.dumps(c) + "\n" for c in cases))
    report = replay.replay([log], cache_dir=tmp_path / "out", jobs=2)
    assert [(r.status, r.reason, r.detail) for r in report.results] == [
        ("skipped", "missing-fields", "the record lacks kernel.module, kernel.qualname, "
         "kernel.source_sha256 (older compile logs lack it: re-record)"),
        ("skipped", "missing-fields", "the record's kernel.qualname has the wrong JSON type"),
        ("skipped", "missing-fields", "the record's options, target have the wrong JSON type"),
        ("skipped", "missing-fields", "the record's constexprs has the wrong JSON type"),
        ("skipped", "missing-fields", "the record's env has the wrong JSON type"),
        ("skipped", "missing-fields", "the record's toolchain has the wrong JSON type"),
        ("skipped", "generated", f"{__name__}:spec_kernel was generated at run time "
         "(Inductor): replay never runs code from a compile log; the Inductor and Triton cache "
         "entries travel in a cache archive (cache pack / restore)"),
        ("skipped", "missing-fields", "the record's hash has the wrong JSON type"),
    ]
    assert [r.kernel for r in report.results][:2] == ["?:?", f"{__name__}:7"]
    assert report.results[-1].hash == "12345"
    assert report.pool == "in-process"  # nothing was left to compile
    assert replay.summary_line(report).startswith("0 rebuilt, 0 already present, 8 skipped")


# --- worker processes: how many, how started, what they share -----------------------------------

def test_the_default_job_count_rule(tmp_path, monkeypatch):
    from cache_tools.replay import pool

    monkeypatch.setattr(pool, "usable_cpus", lambda: 8)
    assert replay.default_jobs(20, fork=True) == 8   # one per usable CPU
    assert replay.default_jobs(3, fork=True) == 3    # never more than records to compile
    assert replay.default_jobs(0, fork=True) == 1
    assert replay.default_jobs(20, fork=False) == 1  # spawned workers would import again
    monkeypatch.undo()

    affinity = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # a container limited to 1.5 CPUs
    assert replay.usable_cpus(str(quota)) == min(affinity, 2)
    quota.write_text("max 100000\n")
    assert replay.usable_cpus(str(quota)) == affinity
    assert replay.usable_cpus(str(tmp_path / "none")) == affinity


def test_a_python_thread_makes_the_workers_spawned_and_the_default_one_job(recorded,
                                                                          tmp_path):
    import threading

    state, jit_cache, _ = recorded
    assert replay.fork_is_safe()
    go = threading.Event()
    thread = threading.Thread(target=go.wait, daemon=True)
    thread.start()
    try:
        assert not replay.fork_is_safe()
        default = replay.replay([state], cache_dir=tmp_path / "default", dry_run=True)
        assert (default.jobs, default.pool) == (1, "in-process")
        spawned = replay.replay([state], cache_dir=tmp_path / "out", jobs=2)
    finally:
        go.set()
        thread.join()
    assert (spawned.jobs, spawned.pool) == (2, "spawn")
    assert [r.status for r in spawned.results] == ["rebuilt"] * 3, spawned.results[0].detail
    assert entries(tmp_path / "out") == entries(jit_cache)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_toolchain_is_read_once_per_run(recorded, tmp_path, jobs):
    """Every ``ptxas --version`` of the run, in every process, goes through a logging
    wrapper: one read for the replay's own table, one for Triton's own per-path cache, however
    many records and workers (before: one more per record)."""
    state, jit_cache, _ = recorded
    from triton.backends.nvidia import compiler as nvidia

    before = nvidia.get_ptxas_version(90)
    calls = tmp_path / "ptxas-calls"
    wrapper = tmp_path / "bin" / "ptxas"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {nvidia.get_ptxas(90).path} "$@"\n')
    wrapper.chmod(0o755)
    os.environ["TRITON_PTXAS_PATH"] = str(wrapper)
    report = replay.replay([state], cache_dir=tmp_path / "out", jobs=jobs)
    assert [r.status for r in report.results] == ["rebuilt"] * 3
    assert report.pool == {1: "in-process", 2: "fork"}[jobs]
    assert entries(tmp_path / "out") == entries(jit_cache)
    lines = calls.read_text().splitlines()
    assert lines.count("--version") == 2
    assert len(lines) == 2 + 3  # and one ptxas compile per record
    assert nvidia.get_ptxas_version(90) == before  # Triton's own function and cache are back


def test_reports_written_before_the_compile_log_had_its_name_still_read():
    old = {"manifests": ["/s/compile_log/compiles-1.jsonl"], "cache_dir": "/c", "target": None,
           "python": "/usr/bin/python3", "triton_version": "3.6.0", "dry_run": False,
           "jobs": 2, "results": []}
    report = replay.ReplayReport.from_json(old)
    assert (report.logs, report.pool) == (("/s/compile_log/compiles-1.jsonl",), "in-process")
    again = replay.ReplayReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again == report


def test_an_import_that_starts_a_thread_turns_the_fork_into_a_spawn(tmp_path, monkeypatch):
    """The fork is decided before the kernels' modules are imported; a module that starts a
    thread on import makes forking unsafe, and the workers are spawned instead."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "replay_threaded.py").write_text(
        "import os\nimport threading\n\nimport triton\nimport triton.language as tl\n\n"
        "stop = threading.Event()\n"
        "if os.environ.get('REPLAY_TEST_THREAD'):\n"
        "    threading.Thread(target=stop.wait, daemon=True).start()\n\n\n"
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 3.0)\n")
    monkeypatch.syspath_prepend(str(package))
    import replay_threaded

    state = tmp_path / "state"
    calls = [lambda b=b: replay_threaded.k.warmup(F32, BLOCK=b, grid=(1,)) for b in (16, 32)]
    seen = jit_compile(tmp_path / "jit", calls, state_dir=state)
    monkeypatch.delitem(sys.modules, "replay_threaded")
    os.environ["REPLAY_TEST_THREAD"] = "1"  # the isolated fixture puts the environment back
    try:
        report = replay.replay([state], cache_dir=tmp_path / "out", jobs=2)
    finally:
        sys.modules.pop("replay_threaded").stop.set()
    assert report.pool == "spawn"
    assert [(r.status, r.hash) for r in report.results] == [("rebuilt", h) for _, _, h in seen]
