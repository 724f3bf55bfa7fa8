"""cache_tools.versions: installed versions from package metadata, without importing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cache_tools.versions import dist_version


def test_installed_and_missing_distributions():
    import triton

    assert dist_version("triton") == triton.__version__
    assert dist_version("no-such-distribution-sglang-warmup") is None


def test_asking_imports_nothing():
    code = ("import sys\nfrom cache_tools.versions import dist_version\n"
            "assert dist_version('sglang')\nprint('sglang' in sys.modules, 'triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          check=True)
    assert done.stdout.split() == ["False", "False"]


def test_the_direct_read_agrees_with_importlib_metadata():
    """``dist_version`` reads a dist-info directory itself (importlib.metadata's import is start-
    up time of every command): the same answer for every installed distribution, by its name
    and by other spellings of it."""
    from importlib import metadata

    names = {d.metadata["Name"] for d in metadata.distributions()}
    assert len(names) > 20
    for name in names:
        for spelling in (name, name.upper(), name.replace("-", "_"), name.replace("_", ".")):
            assert dist_version(spelling) == metadata.version(spelling), spelling


def test_what_the_direct_read_cannot_say_is_asked_of_importlib_metadata(tmp_path, monkeypatch):
    """Two metadata directories of one name, a version folded over two lines, an egg-info file:
    importlib.metadata's answer, whatever it is."""
    from importlib import metadata

    from cache_tools import versions

    for name, layout in {
        "twice": {"twice-1.0.dist-info/METADATA": "Name: twice\nVersion: 1.0\n\n",
                  "twice-2.0.dist-info/METADATA": "Name: twice\nVersion: 2.0\n\n"},
        "folded": {"folded-1.0.dist-info/METADATA": "Name: folded\nVersion: 1.0\n 2\n\n"},
        "plainegg": {"plainegg-3.0.egg-info": "Name: plainegg\nVersion: 3.0\n\n"},
        "eggdir": {"eggdir-4.0.egg-info/PKG-INFO": "Name: eggdir\nVersion: 4.0\n\n"},
    }.items():
        root = tmp_path / name
        for rel, text in layout.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        monkeypatch.syspath_prepend(str(root))
        expected = metadata.version(name)
        assert dist_version(name) == expected, name
        if name == "eggdir":
            assert versions._dist_info_version(name) == "4.0"
        else:
            assert versions._dist_info_version(name) is versions._UNSURE, name
