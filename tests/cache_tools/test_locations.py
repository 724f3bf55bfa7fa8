"""locations.py: the kind table, directory resolution (checked against the real SGLang 0.5.22
and 0.5.23 code in subprocesses), layouts and the `cache env` exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _interpreter import python

from cache_tools import locations as L
from cache_tools.errors import CacheError
from cache_tools.render import env_text

REPO = Path(__file__).resolve().parents[2]
DEPS_0523 = REPO / ".deps" / "sglang-0.5.23"
#: The environment before any fixture changed it (read at collection).
_SESSION_ENV = dict(os.environ)


def _paths(env, profile=L.LATEST_KNOWN):
    return {loc.kind.name: (str(loc.path) if loc.path else None, loc.source, loc.active)
            for loc in L.resolve(env=env, profile=profile)}


def test_every_required_kind_is_in_the_table():
    assert L.KIND_NAMES == ("triton", "inductor", "sglang_jit", "tvm_ffi", "flashinfer",
                            "deep_gemm", "tilelang", "cuda_ptx", "cute_aot", "cute_dsl",
                            "flash_attn_4")
    for k in L.KINDS:
        assert k.variables and k.default and k.layout.rules and k.layout.entry


def test_defaults_follow_sglang_0522_rules():
    env = {"HOME": "/h", "USER": "u"}
    got = _paths(env)
    assert got["triton"] == ("/h/.cache/sglang/triton", "SGLANG_CACHE_DIR redirect", True)
    assert got["inductor"] == ("/h/.cache/sglang/inductor", "SGLANG_CACHE_DIR redirect", True)
    assert got["sglang_jit"] == ("/h/.cache/sglang/jit", "default", True)
    assert got["tvm_ffi"] == ("/h/.cache/tvm-ffi", "default", True)
    assert got["flashinfer"] == ("/h/.cache/sglang/.cache/flashinfer",
                                 "SGLANG_CACHE_DIR redirect", True)
    assert got["deep_gemm"] == ("/h/.cache/sglang/deep_gemm", "SGLANG_CACHE_DIR redirect", True)
    assert got["tilelang"] == ("/h/.cache/sglang/tilelang", "SGLANG_CACHE_DIR redirect", True)
    assert got["cuda_ptx"] == ("/h/.cache/sglang/nv", "SGLANG_CACHE_DIR redirect", True)
    assert got["cute_aot"] == ("/h/.cache/sglang/cute_aot", "SGLANG_CACHE_DIR redirect", True)
    assert got["cute_dsl"] == ("/tmp/u/cutlass_python_cache", "default", True)
    assert got["flash_attn_4"] == ("/tmp/u/flash_attention_cute_dsl_cache", "default", False)


def test_sglang_cache_dir_redirect_is_setdefault_and_jit_ignores_it():
    env = {"HOME": "/h", "SGLANG_CACHE_DIR": "/data/c", "TRITON_CACHE_DIR": "/mine/triton",
           "DG_JIT_CACHE_DIR": "/ignored/dg"}
    got = _paths(env)
    assert got["triton"] == ("/mine/triton", "TRITON_CACHE_DIR", True)   # set first: kept
    assert got["inductor"][0] == "/data/c/inductor"
    assert got["cuda_ptx"][0] == "/data/c/nv"
    assert got["flashinfer"][0] == "/data/c/.cache/flashinfer"
    assert got["sglang_jit"][0] == "/h/.cache/sglang/jit"                  # hard-coded default
    assert got["deep_gemm"] == ("/data/c/deep_gemm", "SGLANG_CACHE_DIR redirect", True)


def test_explicit_variables_and_legacy_sgl_prefix():
    env = {"HOME": "/h", "SGLANG_JIT_CACHE_DIR": "~/jit", "SGLANG_DG_CACHE_DIR": "/dg",
           "SGL_CACHE_DIR": "/legacy", "SGLANG_CACHE_DIR": "/new",
           "SGLANG_CUTE_AOT_CACHE_DIR": "", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
           "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/fa4"}
    got = _paths(env)
    assert got["sglang_jit"] == ("/h/jit", "SGLANG_JIT_CACHE_DIR", True)
    assert got["deep_gemm"] == ("/dg", "SGLANG_DG_CACHE_DIR", True)
    assert got["triton"][0] == "/legacy/triton"   # SGLang rewrites SGL_* over SGLANG_*
    assert got["cute_aot"] == (None, "SGLANG_CUTE_AOT_CACHE_DIR", False)
    assert got["flash_attn_4"] == ("/fa4", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", True)


def test_sglang_0517_rules_have_no_redirect():
    env = {"HOME": "/h", "SGLANG_CACHE_DIR": "/data/c"}
    got = _paths(env, L.SGLANG_0_5_17)
    assert got["triton"] == ("/h/.triton/cache", "default", True)
    assert got["deep_gemm"] == ("/h/.cache/deep_gemm", "default", True)
    assert got["flashinfer"] == ("/h/.cache/flashinfer", "default", True)
    assert got["sglang_jit"] == ("/h/.cache/sglang/jit", "default", False)
    tvm = [loc for loc in L.resolve(env=env, profile=L.SGLANG_0_5_17) if loc.kind.name == "tvm_ffi"]
    assert tvm[0].note == "SGLang's JIT modules"
    env["TRITON_HOME"] = "/th/"
    assert _paths(env, L.SGLANG_0_5_17)["triton"][0] == "/th/.triton/cache"


def test_root_puts_every_kind_under_one_directory():
    got = {loc.kind.name: str(loc.path) for loc in L.resolve(root="/cache")}
    assert got == {"triton": "/cache/triton", "inductor": "/cache/inductor",
                   "sglang_jit": "/cache/jit", "tvm_ffi": "/cache/tvm-ffi",
                   "flashinfer": "/cache/.cache/flashinfer", "deep_gemm": "/cache/deep_gemm",
                   "tilelang": "/cache/tilelang", "cuda_ptx": "/cache/nv",
                   "cute_aot": "/cache/cute_aot", "cute_dsl": "/cache/cute_dsl",
                   "flash_attn_4": "/cache/flash_attn_4"}


_PROBE = r"""
import json, os, sys
cases = json.loads(sys.argv[1])
# SGLang's environment from its import on: PATH, PYTHONPATH and HOME only (sys.argv[2]; set
# here rather than at the start, so that the start can come from the test zygote).
os.environ.clear()
os.environ.update(json.loads(sys.argv[2]))
import sglang.srt.environ as environ
from sglang.kernels.jit.utils.compile import cache
out = []
base_env = dict(os.environ)
for case in cases:
    os.environ.clear()
    os.environ.update({k: v for k, v in base_env.items() if k in ("PATH", "PYTHONPATH", "HOME")})
    os.environ.update(case)
    environ.redirect_third_party_caches()
    got = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
           "CUDA_CACHE_PATH", "TILELANG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")}
    got["SGLANG_DG_CACHE_DIR"] = environ.envs.SGLANG_DG_CACHE_DIR.get()
    got["JIT"] = str(cache.cache_root())
    got["CUTE_AOT"] = environ.envs.SGLANG_CUTE_AOT_CACHE_DIR.get()
    out.append(got)
print("RESULT" + json.dumps(out))
"""

_CASES = [
    {"HOME": "/h"},
    {"HOME": "/h", "SGLANG_CACHE_DIR": "/data/c"},
    {"HOME": "/h", "SGLANG_CACHE_DIR": "/data/c", "TRITON_CACHE_DIR": "/t",
     "SGLANG_JIT_CACHE_DIR": "/j", "SGLANG_DG_CACHE_DIR": "/dg", "CUDA_CACHE_PATH": "/nv"},
]


@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_resolution_matches_the_installed_sglang(version):
    """Run SGLang's own redirect and cache-root code and compare with resolve()."""
    # SGLang evaluates its SGLANG_CACHE_DIR default (expanduser) at import: HOME is set first.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": "/h"}
    if version == "0.5.23":
        if not DEPS_0523.is_dir():
            pytest.fail(f"{DEPS_0523} missing: run scripts/setup.sh")
        env["PYTHONPATH"] = str(DEPS_0523)
    # Started in the session's environment (PYTHONPATH aside), which the zygote can serve;
    # the probe itself narrows it to ``env`` before it imports SGLang.
    start = {k: v for k, v in _SESSION_ENV.items() if k != "PYTHONPATH"}
    if "PYTHONPATH" in env:
        start["PYTHONPATH"] = env["PYTHONPATH"]
    proc = subprocess.run([python(), "-c", _PROBE, json.dumps(_CASES), json.dumps(env)],
                          env=start, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT", 1)[1])
    profile_env = dict(env)
    profile = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from cache_tools import locations as L; "
         "p = L.detect_profile(); print(json.dumps([p.version, sorted(p.redirect), "
         "p.sglang_jit, p.deep_gemm_under_cache_dir, p.cute_aot]))"],
        env=profile_env | {"PYTHONPATH": os.pathsep.join(
            [env.get("PYTHONPATH", ""), str(REPO)]).strip(os.pathsep)},
        capture_output=True, text=True, check=True).stdout)
    assert profile[0] == version
    p = L.SGLangProfile(profile[0], frozenset(profile[1]), profile[2], False, profile[3],
                        profile[4])
    assert p.redirect == L.LATEST_KNOWN.redirect
    for case, got in zip(_CASES, results):
        ours = {loc.kind.name: loc for loc in L.resolve(env=case, profile=p)}
        assert str(ours["triton"].path) == got["TRITON_CACHE_DIR"]
        assert str(ours["inductor"].path) == got["TORCHINDUCTOR_CACHE_DIR"]
        assert str(ours["cuda_ptx"].path) == got["CUDA_CACHE_PATH"]
        assert str(ours["tilelang"].path) == got["TILELANG_CACHE_DIR"]
        assert str(ours["flashinfer"].path) == got["FLASHINFER_WORKSPACE_BASE"] + \
            "/.cache/flashinfer"
        assert str(ours["deep_gemm"].path) == got["SGLANG_DG_CACHE_DIR"]
        assert str(ours["sglang_jit"].path) == got["JIT"]
        assert str(ours["cute_aot"].path) == got["CUTE_AOT"]


def test_layout_entries_and_in_flight_names():
    triton = L.kind("triton").layout
    assert triton.match(("ABC",), True) == ("entry", triton.rules[0])
    assert triton.is_temp("tmp.pid_12_0a1b")
    jit = L.kind("sglang_jit").layout
    assert jit.match(("sm90",), True)[0] == "descend"
    assert jit.entry_rule(("sm90", "mod", "build-1", "deps-2"), True) is not None
    assert jit.entry_rule(("sm90", "mod", "build-1"), True) is None
    assert jit.is_temp(".staging-0f0f") and jit.is_ignored(".lock")
    inductor = L.kind("inductor").layout
    assert inductor.match(("triton", "0"), True)[0] == "descend"
    assert inductor.entry_rule(("triton", "0", "HASH"), True).complete == "triton"
    assert inductor.entry_rule(("fxgraph", "ab"), True).complete == "any"
    fi = L.kind("flashinfer").layout
    assert fi.entry_rule(("0.7.1", "90", "cached_ops", "norm"), True).complete == \
        "marker:{name}.so"
    assert fi.entry_rule(("cubins", "a", "b", "k.cubin"), False) is not None
    assert fi.is_ignored("tmp")
    aot = L.kind("cute_aot").layout
    assert aot.entry_rule(("fp", "abc.o"), False) is not None
    assert aot.entry_rule(("fp", "name", "abc.o"), False) is not None
    assert aot.is_temp(".abc.tmp.o")
    assert L.kind("cuda_ptx").layout.entry_rule((), True) is not None
    assert L.kind("triton").layout.is_ignored(".sgw-staging-host-1-abc")


def test_unknown_kind_is_an_error_listing_the_kinds():
    with pytest.raises(CacheError) as err:
        L.parse_kinds(["triton,nope"])
    assert err.value.message == "unknown cache kind 'nope'"
    assert err.value.hint == "known kinds: " + ", ".join(L.KIND_NAMES)
    assert [k.name for k in L.parse_kinds(["deep_gemm,triton", "triton"])] == [
        "triton", "deep_gemm"]


def test_env_with_root_in_three_formats():
    ex = L.exports("/cache")
    assert ex.pairs == (
        ("SGLANG_CACHE_DIR", "/cache"), ("TRITON_CACHE_DIR", "/cache/triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "/cache/inductor"), ("SGLANG_JIT_CACHE_DIR", "/cache/jit"),
        ("TVM_FFI_CACHE_DIR", "/cache/tvm-ffi"), ("FLASHINFER_WORKSPACE_BASE", "/cache"),
        ("SGLANG_DG_CACHE_DIR", "/cache/deep_gemm"), ("DG_JIT_CACHE_DIR", "/cache/deep_gemm"),
        ("TILELANG_CACHE_DIR", "/cache/tilelang"), ("CUDA_CACHE_PATH", "/cache/nv"),
        ("SGLANG_CUTE_AOT_CACHE_DIR", "/cache/cute_aot"), ("CUTE_DSL_CACHE_DIR", "/cache/cute_dsl"),
        ("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "/cache/flash_attn_4"))
    sh = env_text(ex, "sh").splitlines()
    assert sh[0].startswith("# flash-attn-4 keeps no persistent cache unless")
    assert sh[1] == "export SGLANG_CACHE_DIR=/cache"
    assert env_text(ex, "dockerfile").splitlines()[2] == 'ENV TRITON_CACHE_DIR="/cache/triton"'
    k8s = env_text(ex, "k8s").splitlines()
    assert k8s[1:4] == ["env:", "  - name: SGLANG_CACHE_DIR", '    value: "/cache"']
    assert env_text(L.exports("/c d"), "sh").splitlines()[1] == "export SGLANG_CACHE_DIR='/c d'"


def test_env_root_must_be_absolute():
    with pytest.raises(CacheError) as err:
        L.exports("cache")
    assert err.value.message == "--root 'cache' is not an absolute path"


def test_env_without_root_pins_the_current_locations():
    env = {"HOME": "/h", "SGLANG_CACHE_DIR": "/data/c"}
    pairs = dict(L.exports(env=env, profile=L.LATEST_KNOWN).pairs)
    assert pairs["SGLANG_CACHE_DIR"] == "/data/c"
    assert pairs["TRITON_CACHE_DIR"] == "/data/c/triton"
    assert pairs["FLASHINFER_WORKSPACE_BASE"] == "/data/c"
    assert pairs["SGLANG_JIT_CACHE_DIR"] == "/h/.cache/sglang/jit"


def test_environment_puts_the_whole_environment_back(monkeypatch):
    """Variables given are set or unset for the block; on exit everything is as on entry,
    including what the block itself set, changed or removed."""
    monkeypatch.setenv("SGW_KEPT", "1")
    monkeypatch.setenv("SGW_CHANGED", "a")
    monkeypatch.setenv("SGW_UNSET", "x")
    monkeypatch.delenv("SGW_GIVEN", raising=False)
    monkeypatch.delenv("SGW_ADDED", raising=False)
    before = dict(os.environ)
    with L.environment({"SGW_GIVEN": "g", "SGW_UNSET": None}):
        assert os.environ["SGW_GIVEN"] == "g" and "SGW_UNSET" not in os.environ
        os.environ["SGW_ADDED"] = "new"          # as a library resolving settings would
        os.environ["SGW_CHANGED"] = "b"
        del os.environ["SGW_KEPT"]
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError), L.environment():
        os.environ["SGW_ADDED"] = "new"
        raise RuntimeError
    assert dict(os.environ) == before


@pytest.mark.parametrize("env", [
    {},
    {"XDG_CACHE_HOME": "/xdg"},
    {"HF_HOME": "~/hf", "XDG_CACHE_HOME": "/xdg"},
    {"HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HOME": "/hf"},
    {"HF_HUB_CACHE": "/hub", "HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HOME": "/hf"},
])
def test_the_hugging_face_cache_is_where_huggingface_hub_looks(env, tmp_path):
    """huggingface_hub's own constants, read in a fresh interpreter with the same variables."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME")}
    full.update(env, HOME=str(tmp_path))
    theirs = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; "
                             "print(constants.HF_HUB_CACHE)"], env=full, capture_output=True,
                            text=True, check=True).stdout.strip()
    assert L.hf_hub_cache(full) == Path(theirs)


@pytest.mark.parametrize("name", ["norm", "a[b]", "rope*", "x?y"])
def test_a_marker_names_the_entry_s_own_file_whatever_characters_its_name_holds(name):
    """The entry's name comes from disk: its [, * and ? are characters, not wildcards."""
    import fnmatch

    rule = next(r for r in L.kind("flashinfer").layout.rules if r.ninja)
    glob = rule.marker(name)
    assert fnmatch.fnmatchcase(f"{name}.so", glob)
    assert not fnmatch.fnmatchcase("b.so", glob) and not fnmatch.fnmatchcase(f"{name}2.so", glob)
