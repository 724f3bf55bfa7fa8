"""warmup.plan.model_config: a model's config found offline in the local Hugging Face cache (as
huggingface_hub finds it) or among the shipped stand-ins, else one line naming --model-config."""

from __future__ import annotations

from pathlib import Path

import _facts_cache
import pytest

from warmup.errors import FactsError
from warmup.plan.model_config import find, hub_config_dir


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return _facts_cache.tiny_model_dir()


def hub_cache(root: Path, model_id: str, config: Path, *, ref: str = "main") -> Path:
    """A Hugging Face cache as huggingface_hub lays it out: refs/<ref> names the commit whose
    snapshot holds config.json."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + model_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(config.read_text())
    return snapshot


def test_the_hugging_face_cache_lookup_follows_the_revision_and_stays_inside(
        tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snapshot = hub_cache(tmp_path, "org/model", tiny_dir / "config.json", ref="v2")
    assert hub_config_dir("org/model") is None                 # no refs/main
    assert hub_config_dir("org/model", "v2") == snapshot
    assert hub_config_dir("org/model", snapshot.name) == snapshot  # a commit itself
    for bad in ("../x", "org/..", "/abs/path", "a/b/c", "org/model/../../etc"):
        assert hub_config_dir(bad) is None, bad
    assert hub_config_dir("org/model", "../../etc") is None
    (tmp_path / "models--org--model" / "refs" / "main").write_text("../../../etc")
    assert hub_config_dir("org/model") is None                 # a ref that is no commit


def test_the_cache_comes_before_the_stand_in_and_nothing_is_one_line(tiny_dir, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    model = "deepseek-ai/DeepSeek-V4.1-Flash"           # a model with a shipped stand-in
    path, how = find(model)
    assert path.name == "deepseek-ai--DeepSeek-V4.1-Flash" and "shipped stand-in" in how
    snapshot = hub_cache(tmp_path, model, tiny_dir / "config.json")
    assert find(model) == (snapshot, f"model config from the Hugging Face cache: {snapshot}")
    with pytest.raises(FactsError) as info:
        find("org/absent")
    assert "pass --model-config DIR" in info.value.message
    assert info.value.hint.startswith("offline expansion downloads nothing: `huggingface-cli "
                                      "download org/absent config.json`")
