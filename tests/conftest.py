"""Test configuration shared by every package: run from the repository root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Helper modules every test package shares (_loopback) sit next to this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True, scope="session")
def _repo_root_cwd():
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)
