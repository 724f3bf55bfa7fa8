"""Where an offline expansion finds a model's ``config.json`` for a ``--model-path`` that is not a
local directory: the local Hugging Face cache (found the way ``huggingface_hub`` finds a cached
file offline, ``try_to_load_from_cache``, without importing it), else a stand-in shipped in
``warmup/plan/model_configs/``; else one line naming ``--model-config``."""

from __future__ import annotations

import re
from pathlib import Path

from cache_tools.locations import hf_hub_cache
from warmup.errors import FactsError

#: A Hugging Face model id (``org/name``) and a revision name, as they may name a cache folder.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
_REVISION = re.compile(r"[\w.-]{1,200}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_config_dir(model_id: str, revision: str | None = None) -> Path | None:
    """The snapshot directory of ``model_id`` in the local Hugging Face cache when it holds the
    model's ``config.json``, found the way huggingface_hub finds a file offline:
    ``<cache>/models--ORG--NAME/refs/<revision>`` (default ``main``) names the commit, or the
    revision is a commit, and ``snapshots/<commit>/config.json`` is the file.  None otherwise."""
    if not _HUB_ID.fullmatch(model_id) or ".." in model_id:
        return None
    rev = revision or "main"
    if not _REVISION.fullmatch(rev) or rev.strip(".") == "":
        return None
    repo = hf_hub_cache() / ("models--" + model_id.replace("/", "--"))
    ref = repo / "refs" / rev
    try:
        if ref.is_file():
            with open(ref, encoding="utf-8") as fh:
                rev = fh.read(100).strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not _COMMIT.fullmatch(rev):
        return None
    snapshot = repo / "snapshots" / rev
    return snapshot if (snapshot / "config.json").is_file() else None


#: Stand-in configs shipped for offline expansion of well-known hub models.
STAND_IN_DIR = Path(__file__).with_name("model_configs")


def stand_in_config(model_path: str) -> Path | None:
    """The shipped stand-in config directory for a hub id such as ``org/Name``, if any."""
    cand = STAND_IN_DIR / model_path.strip("/").replace("/", "--")
    return cand if (cand / "config.json").is_file() else None


def find(model_path: str, revision: str | None = None) -> tuple[Path, str]:
    """The directory holding ``model_path``'s config (the Hugging Face cache first: the real
    config, then a shipped stand-in) and the line that says which, for the facts' assumptions;
    a FactsError naming ``--model-config`` when neither has it."""
    cached = hub_config_dir(model_path, revision)
    if cached is not None:
        return cached, f"model config from the Hugging Face cache: {cached}"
    standin = stand_in_config(model_path)
    if standin is not None:
        return standin, (f"model config: the shipped stand-in for {model_path} "
                         f"(warmup/plan/model_configs/{standin.name}); layer sizes approximate")
    raise FactsError(f"--model-path {model_path}: no local directory and no config.json in the "
                     f"Hugging Face cache ({hf_hub_cache()}); pass --model-config DIR, a "
                     "directory with the model's config.json",
                     hint="offline expansion downloads nothing: `huggingface-cli download "
                          f"{model_path} config.json` fills the cache, or use --url on a live "
                          "server")
