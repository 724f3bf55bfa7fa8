"""prune.py: least recently used first; a strategy states its effect before it executes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cache_helpers import triton_location
from cache_tools.errors import CacheError
from cache_tools.fingerprint import Fingerprint
from cache_tools.locations import Location, kind
from cache_tools.prune import parse_duration, parse_size, plan_prune
from cache_tools.render import prune_result_text, prune_text
from cache_tools.scan import scan_kind, size_str

DAY = 86400.0


def _age(entry_dir: Path, seconds_ago: float, now: float) -> None:
    for f in entry_dir.rglob("*"):
        os.utime(f, (now - seconds_ago, now - seconds_ago))


@pytest.fixture
def aged(triton_cache):
    """The three entries last used 10 days, 3 days and 1 hour ago (oldest first)."""
    now = time.time()
    dirs = sorted(p for p in triton_cache.iterdir())
    for d, age in zip(dirs, (10 * DAY, 3 * DAY, 3600.0)):
        _age(d, age, now)
    sizes = [sum(f.stat().st_size for f in d.iterdir()) for d in dirs]
    return triton_cache, dirs, sizes, now


def test_dry_run_then_execute_older_than(aged):
    cache, dirs, sizes, now = aged
    before = sorted(cache.rglob("*"))    # names only: reading would bump the access times
    strategy = plan_prune([triton_location(cache)], older_than=7 * DAY, now=now)
    assert [c.entry.path for c in strategy.candidates] == [dirs[0]]
    assert strategy.candidates[0].reasons == ("last used 10.0d ago",)
    assert strategy.expected_freed_size == sizes[0]
    assert strategy.size_before == sum(sizes) and strategy.size_after == sum(sizes[1:])
    text = prune_text(strategy)
    assert text.splitlines()[-1] == (f"Will delete 1 entry, freeing {size_str(sizes[0])} "
                                     f"({size_str(sum(sizes))} -> {size_str(sum(sizes[1:]))}).")
    assert prune_text(strategy, dry_run=True).splitlines()[-1] == (
        f"Would delete 1 entry, freeing {size_str(sizes[0])} ({size_str(sum(sizes))} -> "
        f"{size_str(sum(sizes[1:]))}); --dry-run: nothing deleted.")
    assert sorted(cache.rglob("*")) == before           # planning deletes nothing
    result = strategy.execute()
    assert (result.removed, result.freed, result.failed) == (1, sizes[0], ())
    assert prune_result_text(result) == f"Deleted 1 entries, freed {size_str(sizes[0])}."
    assert sorted(p.name for p in cache.iterdir()) == [dirs[1].name, dirs[2].name]


def test_max_size_deletes_least_recently_used_first(aged):
    cache, dirs, sizes, now = aged
    loc = [triton_location(cache)]
    s = plan_prune(loc, max_size=sizes[1] + sizes[2], now=now)
    assert [c.entry.path for c in s.candidates] == [dirs[0]]
    s = plan_prune(loc, max_size=sizes[2], now=now)
    assert [c.entry.path for c in s.candidates] == [dirs[0], dirs[1]]
    assert s.candidates[1].reasons == (f"least recently used beyond {size_str(sizes[2])}",)
    s = plan_prune(loc, max_size=10 << 30, now=now)
    assert s.candidates == () and prune_text(s).startswith("Nothing to prune: no entry matches")
    # Criteria combine as a union: old entries plus LRU until the size fits.
    s = plan_prune(loc, older_than=2 * DAY, max_size=0, now=now)
    assert [c.entry.path for c in s.candidates] == dirs


def test_other_toolchain_uses_what_the_entries_record(aged, fp, tmp_path):
    cache, dirs, sizes, now = aged
    newer = Fingerprint(tuple(sorted((fp.software_map | {"triton": "9.9.9"}).items())))
    tile = tmp_path / "tilelang"
    (tile / "k1").mkdir(parents=True)
    (tile / "k1" / "kernel_lib.so").write_bytes(b"\x7fELF")
    locs = [triton_location(cache), Location(kind("tilelang"), tile, "test")]
    s = plan_prune(locs, other_toolchain=True, local=newer, now=now)
    assert [c.entry.path for c in s.candidates] == dirs
    assert {c.reasons for c in s.candidates} == {("built by Triton 3.8.0",)}
    assert s.unknown_toolchain == 1
    assert prune_text(s).splitlines()[-1] == ("1 entries do not record the toolchain that built "
                                              "them; --fingerprint other keeps them.")
    assert plan_prune(locs, other_toolchain=True, local=fp, now=now).candidates == ()


def test_incomplete_entries_age_out_too(aged):
    cache, dirs, sizes, now = aged
    next(dirs[0].glob("__grp__*.json")).unlink()
    s = plan_prune([triton_location(cache)], older_than=7 * DAY, now=now)
    assert [(c.entry.path, c.entry.complete) for c in s.candidates] == [(dirs[0], False)]
    s.execute()
    info = scan_kind(triton_location(cache))
    assert len(info.entries) == 2 and not info.warnings


def test_a_criterion_is_required():
    with pytest.raises(CacheError) as err:
        plan_prune([])
    assert err.value.message == "nothing to prune by"
    assert err.value.hint == "give --older-than 7d, --max-size 10G and/or --fingerprint other"


def test_sizes_and_durations():
    assert parse_size("10G") == 10 << 30
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("500m") == 500 << 20
    assert parse_size("123") == 123
    assert parse_duration("7d") == 7 * DAY
    assert parse_duration("12h") == 43200
    assert parse_duration("2w") == 14 * DAY
    with pytest.raises(CacheError) as err:
        parse_size("ten gigs")
    assert err.value.message == "--max-size 'ten gigs': not a size"
    with pytest.raises(CacheError) as err:
        parse_duration("7 days")
    assert err.value.message == "--older-than '7 days': not a duration"


def test_packing_does_not_make_entries_look_recently_used(aged, fp, tmp_path):
    from cache_tools import archive

    cache, dirs, sizes, now = aged
    archive.pack(tmp_path / "c.tar", [triton_location(cache)], fingerprint=fp)
    strategy = plan_prune([triton_location(cache)], older_than=7 * DAY, now=now)
    assert [c.entry.path for c in strategy.candidates] == [dirs[0]]
