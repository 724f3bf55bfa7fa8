"""Sources from files and live objects, the known-hash tables of both SGLang releases, the
structural detectors on edited copies of the real files, and the guarded rewrite's guards."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from warmup.patches import registry
from warmup.patches import (
    fix1_low_ratio_window as fix1,
    fix2_live_rows as fix2,
    fix3_async_lengths as fix3,
    fix4_hoisted_rows as fix4,
    fix5_context_cap as fix5,
)
from warmup.patches.source import (
    MARK, FileView, LiveView, RewriteRefused, TargetMissing, rewrite_function, source_hash,
)

from .conftest import BACKEND, HOOK, SGLANG_0523, SPARSE

FILES = {BACKEND: "srt/layers/attention/deepseek_v4_backend.py",
         SPARSE: "srt/layers/attention/dsv4/sparse_prefill_utils.py",
         HOOK: "srt/arg_groups/deepseek_v4_hook.py"}
FIXES = (fix1, fix2, fix3, fix4, fix5)


def tables(which: str) -> dict[tuple[str, str], str]:
    return {(fix.MODULE, path): digest for fix in FIXES
            for path, digest in getattr(fix, which).items()}


def view_0523(module: str) -> FileView:
    return FileView(module, SGLANG_0523 / "sglang" / FILES[module])


def test_file_hashes_are_the_known_0522_sources():
    for (module, path), digest in tables("BUGGY").items():
        assert source_hash(FileView.of(module).source(path)) == digest, path


def test_file_hashes_are_the_known_0523_sources():
    for (module, path), digest in tables("FIXED").items():
        assert source_hash(view_0523(module).source(path)) == digest, path


def test_live_and_file_sources_agree(backend, sparse_utils, hook):
    for (module, path), _ in tables("BUGGY").items():
        live = LiveView(importlib.import_module(module))
        assert live.source(path) == FileView.of(module).source(path), path


def edited_copy(tmp_path: Path, view: FileView, path: str, old: str, new: str) -> FileView:
    """The real file with one edit inside ``path``'s lines (so only its hash changes)."""
    node = view.member(path)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = list(view.lines)
    segment = "".join(lines[first - 1:node.end_lineno])
    assert segment.count(old) == 1
    lines[first - 1:node.end_lineno] = [segment.replace(old, new)]
    target = tmp_path / Path(view.path).name
    target.write_text("".join(lines))
    return FileView(view.name, target)


@pytest.mark.parametrize("fix, path, old, new", [
    (fix1, "DeepseekV4AttnBackend.low_ratio_prefill_graph",
     "bool(self.low_ratios)", "bool(self.low_ratios)  # edited"),
    (fix2, "DeepseekV4AttnBackend._low_ratio_compress_fused",
     "kv_cache = pool.get_extra_key_buffer(layer_id)",
     "kv_cache = pool.get_extra_key_buffer(layer_id)  # edited"),
    (fix3, "SparsePrefillChunkCache.ensure_compressed",
     "total_compressed = sum(lengths_cpu)", "total_compressed = sum(lengths_cpu)  # edited"),
    (fix4, "DeepseekV4AttnBackend.forward_low_ratio_sources",
     "meta = self.forward_metadata", "meta = self.forward_metadata  # edited"),
    (fix5, "validate_deepseek_v41_features",
     "prefill_graph = cfg.cuda_graph_config.prefill",
     "prefill_graph = cfg.cuda_graph_config.prefill  # edited"),
])
def test_an_unknown_0522_like_source_is_a_structural_match(tmp_path, fix, path, old, new):
    edited = edited_copy(tmp_path, FileView.of(fix.MODULE), path, old, new)
    detection = fix.detect(edited, registry.Context({}))
    assert (detection.needed, detection.match) == (True, "structural")


@pytest.mark.parametrize("fix, path, old, new", [
    (fix1, "DeepseekV4AttnBackend.low_ratio_prefill_graph",
     "ratio-1/2 sources run in the prefill graph", "ratio-1/2 sources (edited)"),
    (fix3, "SparsePrefillChunkCache.ensure_compressed",
     "total_compressed = sum(lengths_cpu)", "total_compressed = sum(lengths_cpu)  # edited"),
    (fix4, "DeepseekV4AttnBackend.forward_low_ratio_sources",
     "meta = self.forward_metadata", "meta = self.forward_metadata  # edited"),
    (fix2, "DeepseekV4AttnBackend._low_ratio_compress_fused",
     "kv_cache = pool.get_extra_key_buffer(layer_id)",
     "kv_cache = pool.get_extra_key_buffer(layer_id)  # edited"),
    (fix5, "validate_deepseek_v41_features",
     "cfg = resolving_view(server_args)", "cfg = resolving_view(server_args)  # edited"),
])
def test_an_unknown_0523_like_source_is_structurally_clean(tmp_path, fix, path, old, new):
    edited = edited_copy(tmp_path, view_0523(fix.MODULE), path, old, new)
    detection = fix.detect(edited, registry.Context({}))
    assert (detection.needed, detection.match) == (False, "structural")


def test_missing_member_names_the_path():
    with pytest.raises(TargetMissing,
                       match=f"^{BACKEND} has no DeepseekV4AttnBackend.no_such_method$"):
        FileView.of(BACKEND).source("DeepseekV4AttnBackend.no_such_method")


# --- the guarded rewrite ------------------------------------------------------------------------

SAMPLE = '''
from __future__ import annotations

FACTOR = 2


def once(values: list[int]) -> list[int]:
    """Doubles."""
    out = [v * FACTOR for v in values]
    return out


def twice(values):
    out = [v * FACTOR for v in values]
    out = [v * FACTOR for v in values]
    return out


class Child(dict):
    def keys(self):
        out = [v * FACTOR for v in super().keys()]
        return out


def outer():
    factor = 3

    def inner(values):
        out = [v * factor for v in values]
        return out
    return inner
'''
OLD = "out = [v * FACTOR for v in values]"
NEW = "out = __sglang_warmup_scale__(values)"


@pytest.fixture
def sample(tmp_path, monkeypatch):
    name = f"rewrite_sample_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(SAMPLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    import sys

    sys.modules.pop(name, None)


def test_rewrite_replaces_one_line_and_keeps_line_numbers(sample):
    new = rewrite_function(sample.once, old=OLD, new=NEW,
                           inject={"__sglang_warmup_scale__": lambda v: [x * 10 for x in v]},
                           fix=9)
    assert new([1, 2]) == [10, 20]
    assert sample.once([1, 2]) == [2, 4]  # the original is untouched
    assert getattr(new, MARK) == 9 and new.__sglang_warmup_original__ is sample.once
    assert new.__doc__ == "Doubles." and new.__qualname__ == "once"
    assert new.__code__.co_firstlineno == sample.once.__code__.co_firstlineno
    assert inspect.getsource(new) == inspect.getsource(sample.once).replace(OLD, NEW)
    assert new.__annotations__ == {"values": "list[int]", "return": "list[int]"}


def test_rewrite_reads_live_module_globals(sample):
    new = rewrite_function(sample.once, old="FACTOR for v in values]",
                           new="FACTOR + __sglang_warmup_bias__ for v in values]",
                           inject={"__sglang_warmup_bias__": 1}, fix=9)
    sample.FACTOR = 5
    assert new([1]) == [6]


@pytest.mark.parametrize("target, old, new, inject, message", [
    ("twice", OLD, NEW, {}, "expected exactly one occurrence of "
     "'out = [v * FACTOR for v in values]' in twice, found 2"),
    ("once", "no such line", NEW, {}, "expected exactly one occurrence of 'no such line' in "
     "once, found 0"),
    ("once", OLD, NEW + "\n", {}, "a rewrite must keep the line count (tracebacks stay aligned)"),
    ("once", OLD, NEW, {"scale": None}, "injected name 'scale' must start with __sglang_warmup_"),
])
def test_rewrite_guards(sample, target, old, new, inject, message):
    with pytest.raises(RewriteRefused) as info:
        rewrite_function(getattr(sample, target), old=old, new=new, inject=inject, fix=9)
    assert str(info.value) == message


def test_rewrite_refuses_super_and_closures(sample):
    with pytest.raises(RewriteRefused) as info:
        rewrite_function(sample.Child.keys, old="out = [v * FACTOR for v in super().keys()]",
                         new="out = []", inject={}, fix=9)
    assert str(info.value) == "Child.keys uses super() or __class__"
    with pytest.raises(RewriteRefused) as info:
        rewrite_function(sample.outer(), old="v * factor", new="v * 2", inject={}, fix=9)
    assert str(info.value) == "outer.<locals>.inner uses a closure"
