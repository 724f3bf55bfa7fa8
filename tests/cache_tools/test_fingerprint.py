"""fingerprint.py: what is recorded, how it is hashed, and the one compatibility rule."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys

import pytest

from cache_tools.errors import CacheError, IncompatibleError
from cache_tools.fingerprint import (Fingerprint, canonical_json, compare, current,
                                     require_compatible)


def _fp(**soft) -> Fingerprint:
    base = {"python": "cpython-3.11", "machine": "x86_64", "torch": "2.14.1",
            "triton": "3.8.0", "cuda": "13.0", "sglang": "0.5.22"}
    base.update({k: v for k, v in soft.items() if not k.startswith("hw_")})
    base = {k: v for k, v in base.items() if v is not None}
    hard = {k[3:]: v for k, v in soft.items() if k.startswith("hw_")}
    return Fingerprint(tuple(sorted(base.items())), tuple(sorted(hard.items())))


def test_current_reads_versions_from_metadata_without_importing_heavy_packages():
    code = ("import json, sys; from cache_tools.fingerprint import current; "
            "fp = current(); print(json.dumps([fp.to_dict(), "
            "[m for m in ('torch', 'triton', 'sglang') if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    data, heavy = json.loads(out)
    assert heavy == []
    soft = data["software"]
    assert soft["torch"] == importlib.metadata.version("torch")
    assert soft["triton"] == importlib.metadata.version("triton")
    assert soft["sglang"] == importlib.metadata.version("sglang")
    assert soft["python"] == f"cpython-{sys.version_info.major}.{sys.version_info.minor}"
    assert "flashinfer" not in soft   # not installed in the CPU profile: absent, not "None"
    import torch

    assert soft["cuda"] == torch.version.cuda
    # No GPU on this machine: no architecture is invented.
    assert "gpu_arch" not in data["hardware"]


def test_hash_is_sha256_of_canonical_json_of_the_software_fields():
    fp = _fp()
    assert fp.hash == hashlib.sha256(canonical_json(fp.software_map)).hexdigest()
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    same = _fp(hw_gpu_arch="sm90")
    assert same.hash == fp.hash and same.full_hash != fp.full_hash
    assert Fingerprint.from_dict(json.loads(json.dumps(fp.to_dict()))) == fp


def test_a_tampered_fingerprint_is_rejected():
    data = _fp().to_dict()
    data["software"]["triton"] = "3.6.0"
    with pytest.raises(CacheError) as err:
        Fingerprint.from_dict(data)
    assert err.value.message == "fingerprint.hash does not match its fields"


def test_a_lone_surrogate_is_not_a_string_of_a_fingerprint():
    """JSON's \\ud800 escape reads as a lone surrogate, which the hash's UTF-8 spelling cannot
    encode: a CacheError naming the section (it was a UnicodeEncodeError out of the Redis and
    OCI readers; the manifest's reader caught any exception to hide it)."""
    for section, text in (("software", '{"triton": "\\ud800"}'), ("hardware", '{"\\udfff": "x"}')):
        data = json.loads(f'{{"{section}": {text}}}')
        with pytest.raises(CacheError) as err:
            Fingerprint.from_dict(data, "meta")
        assert err.value.message == f"meta.{section}: expected an object of strings"


def test_software_mismatch_refuses_unless_forced():
    theirs, ours = _fp(triton="3.6.0", sglang="0.5.17"), _fp()
    verdict = compare(theirs, ours)
    assert not verdict.ok
    assert verdict.mismatches == (("triton", "3.6.0", "3.8.0"), ("sglang", "0.5.17", "0.5.22"))
    with pytest.raises(IncompatibleError) as err:
        require_compatible(theirs, ours, force=False, what="archive a.tar")
    assert err.value.message == ("archive a.tar was built by another toolchain: triton 3.6.0 "
                                 "(cache) vs 3.8.0 (here); sglang 0.5.17 (cache) vs 0.5.22 "
                                 "(here)")
    assert "--force" in err.value.hint
    assert require_compatible(theirs, ours, force=True, what="x").mismatches == \
        verdict.mismatches


def test_architecture_difference_is_only_a_note():
    verdict = compare(_fp(hw_gpu_arch="sm100"), _fp(hw_gpu_arch="sm90"))
    assert verdict.ok
    assert verdict.notes == ("gpu_arch differs: sm100 (cache) vs sm90 (here); entries for "
                             "another target are kept but not hit",)


def test_unknown_fields_cannot_be_checked_and_are_noted():
    verdict = compare(_fp(flashinfer="0.7.1"), _fp(torch=None))
    assert verdict.ok
    assert verdict.notes == ("torch 2.14.1 cannot be checked here (not installed)",
                             "flashinfer 0.7.1 cannot be checked here (not installed)")
    assert compare(_fp(torch=None), _fp()).notes == (
        "the cache does not record torch (here: 2.14.1)",)
    assert compare(_fp(), _fp(torch=None)).notes == (
        "torch 2.14.1 cannot be checked here (not installed)",)


def test_current_is_stable(fp):
    assert current(probe_gpu=False) == fp
