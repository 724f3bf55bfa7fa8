"""Test configuration shared by every package: run from the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _repo_root_cwd():
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)
