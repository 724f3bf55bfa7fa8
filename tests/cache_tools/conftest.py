"""Fixtures for cache_tools: real Triton caches (CPU compiles for sm_90), an isolated
environment and this machine's fingerprint.  Helpers live in cache_helpers.py (importing
``conftest`` by name is ambiguous with one conftest.py per test package)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_helpers import compile_into, triton_location
from cache_tools.fingerprint import Fingerprint, current

# Variables that choose cache directories: cleared so no test reads the developer's caches.
_CACHE_VARS = ("SGLANG_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR",
               "SGLANG_JIT_CACHE_DIR", "TVM_FFI_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
               "SGLANG_DG_CACHE_DIR", "DG_JIT_CACHE_DIR", "TILELANG_CACHE_DIR", "CUDA_CACHE_PATH",
               "SGLANG_CUTE_AOT_CACHE_DIR", "CUTE_DSL_CACHE_DIR",
               "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
               "SGL_CACHE_DIR", "SGL_JIT_CACHE_DIR", "SGL_DG_CACHE_DIR", "TMPDIR")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """HOME in a tmp dir and no cache variables: every default lands under tmp_path/home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in _CACHE_VARS:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(scope="session")
def fp() -> Fingerprint:
    """This machine's fingerprint without the GPU probe (stable within the session)."""
    return current(probe_gpu=False)


@pytest.fixture
def triton_cache(tmp_path) -> Path:
    """A Triton cache with three real entries (``cache_kernels.SPECS``) at tmp_path/src/triton."""
    path = tmp_path / "src" / "triton"
    assert compile_into(path) == [False, False, False]
    return path


@pytest.fixture(scope="session")
def valid_archive(tmp_path_factory, fp) -> Path:
    """A real archive of three Triton entries, packed once per session (read-only: tests that
    change it copy it first)."""
    from cache_tools import archive

    base = tmp_path_factory.mktemp("valid-archive")
    assert compile_into(base / "src" / "triton") == [False, False, False]
    out = base / "valid.tar"
    archive.pack(out, [triton_location(base / "src" / "triton")], fingerprint=fp)
    return out
