"""cache_tools.replay.kernels: replay runs only installed code, checked before it is imported.

Every hostile record here names a module whose import would leave a marker file; the marker
must never appear unless the module is installed and its kernel's source hashes to the
recorded value.  A record's own text is never executed, with or without --dry-run."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import triton
import triton.language as tl

from cache_tools import replay
from cache_tools.replay import kernels
from cache_tools.replay.kernels import Unresolved

KERNEL_MODULE = textwrap.dedent('''\
    import pathlib
    import triton
    import triton.language as tl

    pathlib.Path({marker!r}).write_text("imported")


    @triton.autotune(configs=[triton.Config({{"BLOCK": 16}})], key=["n"])
    @triton.jit(do_not_specialize=["n"])
    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        # a comment inside the body
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2.0, mask=offs < n)


    class Holder:
        @triton.jit
        def inner(x_ptr, BLOCK: tl.constexpr):
            tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)


    def plain(x):
        return x
    ''')


@triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})
@triton.jit
def local_kernel(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)

    tl.store(x_ptr + offs, 3.0)  # trailing comment


def write_package(root: Path, marker: Path, name: str = "replay_evil") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.py"
    path.write_text(KERNEL_MODULE.format(marker=str(marker)))
    return path


def record_for(module: str, qualname: str, sha: str, **kernel) -> dict:
    """A compile-log record as the recorder writes one (fields the precheck looks at)."""
    return {"v": 1, "event": "miss", "compiler": "triton", "phase": "serving",
            "kernel": {"module": module, "name": qualname.split(".")[-1], "qualname": qualname,
                       "source_sha256": sha, **kernel},
            "hash": hashlib.sha256(f"{module}:{qualname}:{sha}".encode()).hexdigest(),
            "signature": {"x_ptr": "*fp32"}, "constexprs": [], "attrs": [],
            "options": {"num_warps": 4}, "target": {"backend": "cuda", "arch": 90,
                                                     "warp_size": 32},
            "triton_version": triton.__version__}


def write_log(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def unimported():
    """Forget the test modules this file makes importable."""
    yield
    for name in [n for n in sys.modules if n.startswith("replay_evil")]:
        del sys.modules[name]


def test_the_kernel_source_is_cut_from_the_file_as_triton_cuts_it(tmp_path, unimported,
                                                                   monkeypatch):
    marker = tmp_path / "marker"
    path = write_package(tmp_path / "pkg", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    import replay_evil

    text = path.read_text()
    tree = __import__("ast").parse(text)
    for qualname, jit in (("kernel", replay_evil.kernel.fn),
                          ("Holder.inner", replay_evil.Holder.inner)):
        node = kernels.find_definition(tree, qualname)
        assert kernels.kernel_source(text, node) == jit.src
    here = Path(__file__).read_text()
    node = kernels.find_definition(__import__("ast").parse(here), "local_kernel")
    assert kernels.kernel_source(here, node) == local_kernel.fn.src


def test_a_module_in_the_working_directory_is_never_imported(tmp_path, monkeypatch, unimported):
    """A compile log shared on a volume, next to a planted module, replayed from there."""
    marker = tmp_path / "marker"
    source = write_package(tmp_path / "shared", marker)
    monkeypatch.chdir(tmp_path / "shared")
    monkeypatch.syspath_prepend(str(tmp_path / "shared"))  # as `python -m` puts it first
    sha = kernels.source_sha256(
        kernels.kernel_source(source.read_text(), kernels.find_definition(
            __import__("ast").parse(source.read_text()), "kernel")))
    log = write_log(tmp_path / "compiles-1.jsonl", record_for("replay_evil", "kernel", sha))
    for dry_run in (True, False):
        report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1, dry_run=dry_run)
        [result] = report.results
        assert (result.status, result.reason) == ("skipped", "not-installed")
        assert result.detail == ("replay_evil is not installed here (looked on the installed "
                                 "search path, never in the working directory)")
    assert not marker.exists() and "replay_evil" not in sys.modules


def test_a_different_source_is_refused_before_import(tmp_path, monkeypatch, unimported):
    marker = tmp_path / "marker"
    write_package(tmp_path / "site", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    log = write_log(tmp_path / "compiles-1.jsonl",
                    record_for("replay_evil", "kernel", "0" * 64),
                    record_for("replay_evil", "plain", "1" * 64),
                    record_for("replay_evil", "missing", "2" * 64),
                    record_for("antigravity", "fly", "3" * 64))
    for dry_run in (True, False):
        report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1, dry_run=dry_run)
        assert [r.reason for r in report.results] == \
            ["source-mismatch", "not-a-kernel", "not-a-kernel", "not-a-kernel"]
        assert report.results[1].detail == (
            "plain is not decorated as a Triton kernel (@triton.jit, @triton.autotune, "
            "@triton.heuristics)")
    assert not marker.exists()
    assert "replay_evil" not in sys.modules and "antigravity" not in sys.modules


def test_dry_run_imports_nothing_even_for_an_installed_kernel(tmp_path, monkeypatch, unimported):
    marker = tmp_path / "marker"
    source = write_package(tmp_path / "site", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    text = source.read_text()
    sha = kernels.source_sha256(kernels.kernel_source(
        text, kernels.find_definition(__import__("ast").parse(text), "kernel")))
    log = write_log(tmp_path / "compiles-1.jsonl", record_for("replay_evil", "kernel", sha))
    report = replay.replay([log], cache_dir=tmp_path / "out", dry_run=True)
    assert [(r.status, r.reason) for r in report.results] == [("planned", "")]
    assert not marker.exists() and "replay_evil" not in sys.modules
    assert not (tmp_path / "out").exists()
    # The same record, replayed for real: the installed module is imported (installed code).
    replay.replay([log], cache_dir=tmp_path / "out", jobs=1)
    assert marker.read_text() == "imported"


def test_a_record_that_carries_code_is_skipped_and_its_code_never_runs(tmp_path, unimported):
    marker = tmp_path / "marker"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    generated = record_for("torch._inductor.runtime.compile_tasks.cabc", "triton_poi_0",
                           "4" * 64, generated=True)
    carried = record_for("replay_evil_carried", "kernel", "5" * 64,
                         source={"file": "k.py", "text": code, "sha256": "x"})
    log = write_log(tmp_path / "compiles-1.jsonl", generated, carried)
    for dry_run in (True, False):
        report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1, dry_run=dry_run)
        assert [(r.status, r.reason) for r in report.results] == [("skipped", "generated")] * 2
    assert not marker.exists()


@pytest.mark.parametrize("name", ["os;rm", "a..b", "", "x" * 40 + ".y" * 40, ".rel", "1abc"])
def test_names_that_are_not_module_names(name):
    with pytest.raises(Unresolved) as err:
        kernels.locate(name)
    assert err.value.reason == "not-installed"


def test_a_large_module_file_is_not_read(tmp_path, monkeypatch):
    (tmp_path / "replay_evil_big.py").write_bytes(b"#" * (kernels.MAX_MODULE_BYTES + 1))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Unresolved) as err:
        kernels.find("replay_evil_big", "kernel", "0" * 64)
    assert err.value.reason == "not-a-kernel"
    assert "more than a kernel module" in err.value.detail


# --- fuzz: whatever a record says, a replay reports it and runs nothing it names ---------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_NAMES = st.sampled_from(["replay_evil", "os", "antigravity", "this", "replay_evil.sub",
                          "cache_kernels", "", "a.b.c", "__main__"])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(module=_NAMES | st.text(max_size=30), qualname=st.text(max_size=30) | _NAMES,
       sha=st.text(max_size=64) | st.sampled_from(["0" * 64]), extra=_JSON,
       dry_run=st.booleans())
def test_fuzzed_records_run_nothing(tmp_path, monkeypatch, module, qualname, sha, extra,
                                    dry_run):
    marker = tmp_path / "marker"
    write_package(tmp_path / "site", marker)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    rec = record_for(module, qualname, sha)
    if isinstance(extra, dict):
        rec["kernel"].update(extra)
        rec.update({k: v for k, v in extra.items() if k not in ("compiler", "event")})
    log = write_log(tmp_path / "compiles-1.jsonl", rec)
    report = replay.replay([log], cache_dir=tmp_path / "out", jobs=1, dry_run=dry_run)
    assert all(r.status in ("skipped", "planned", "present") for r in report.results)
    assert not marker.exists()
    assert "antigravity" not in sys.modules and "this" not in sys.modules
    sys.modules.pop("replay_evil", None)
