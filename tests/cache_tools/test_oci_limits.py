"""docs/limits.md for the OCI store: each bound at its edge (at the limit accepted, one above
refused, with its one line); the large ones with the module's constant patched small (the code
reads it at call time), against the fake registry."""

from __future__ import annotations

import io
import json
from collections import namedtuple

import pytest

from cache_tools.errors import CacheError, RemoteError
from cache_tools.locations import KIND_NAMES
from cache_tools.stores.oci import artifact, auth, client, plan_pull, pull, reference
from cache_tools.stores.oci.client import Registry
from cache_tools.stores.oci.reference import parse
from oci_helpers import FakeRegistry, basic_auth, docker_config, spool  # noqa: F401

DIGEST = "sha256:" + "cd" * 32


@pytest.fixture
def fake():
    registry = FakeRegistry().start()
    yield registry
    registry.stop()


def _registry(fake, tag="v1"):
    return Registry(parse(fake.ref(suffix=f":{tag}")), env={"HOME": "/nonexistent"},
                    socket_timeout_s=2, document_deadline_s=5)


def _layers(n: int, size: int = 1) -> list[dict]:
    return [{"mediaType": artifact.LAYER_TYPE, "digest": DIGEST, "size": size,
             "annotations": {artifact.KIND_KEY: k}} for k in KIND_NAMES[:n]]


def _doc(layers, config_size=10) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": artifact.MANIFEST_TYPE,
                       "config": {"mediaType": artifact.CONFIG_TYPE, "digest": DIGEST,
                                  "size": config_size}, "layers": layers}).encode()


def test_layers_one_per_kind_and_their_sizes():
    assert len(artifact.parse_manifest(_doc(_layers(len(KIND_NAMES))), "", "R")[1]) == 11
    too_many = _layers(len(KIND_NAMES)) + _layers(1)
    with pytest.raises(RemoteError, match=r"^R: 12 layers, more than the 11 cache kinds$"):
        artifact.parse_manifest(_doc(too_many), "", "R")
    artifact.parse_manifest(_doc(_layers(1, artifact.MAX_LAYER_BYTES)), "", "R")
    with pytest.raises(RemoteError) as err:
        artifact.parse_manifest(_doc(_layers(1, artifact.MAX_LAYER_BYTES + 1)), "", "R")
    assert err.value.message == ("R: layers[0]: 274877906945 bytes exceeds the limit of "
                                 "274877906944 bytes")
    artifact.parse_manifest(_doc(_layers(1), artifact.MAX_CONFIG_BYTES), "", "R")
    with pytest.raises(RemoteError, match=r"^R: config: 1048577 bytes exceeds the limit of "
                                          r"1048576 bytes$"):
        artifact.parse_manifest(_doc(_layers(1), artifact.MAX_CONFIG_BYTES + 1), "", "R")


def test_the_layers_of_one_pull_together(fake, monkeypatch, tmp_path, spool):
    monkeypatch.setattr(artifact, "MAX_LAYER_BYTES", 100)
    blobs = [artifact.Blob(artifact.LAYER_TYPE, DIGEST, 50, k) for k in KIND_NAMES[:2]]
    reg = _registry(fake)
    pull.shutil.rmtree(pull._spool(reg, blobs), ignore_errors=True)   # 100: accepted
    with pytest.raises(RemoteError) as err:
        pull._spool(reg, blobs + [artifact.Blob(artifact.LAYER_TYPE, DIGEST, 1, "tilelang")])
    assert err.value.message == (f"{reg.ref}: the layers to pull declare 101 bytes, more than "
                                 "the limit of 100 bytes")


def test_free_space_for_the_downloads(fake, monkeypatch, spool):
    usage = namedtuple("usage", "total used free")
    need = 1000 + pull.SPOOL_MARGIN_BYTES
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda p: usage(0, 0, need))
    reg = _registry(fake)
    blob = artifact.Blob(artifact.LAYER_TYPE, DIGEST, 1000, "triton")
    pull.shutil.rmtree(pull._spool(reg, [blob]))
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda p: usage(0, 0, need - 1))
    with pytest.raises(CacheError) as err:
        pull._spool(reg, [blob])
    assert err.value.message == (f"{reg.ref}: the layers need 1000 bytes in {spool}, "
                                 f"{need - 1} bytes are free")


def test_the_manifest_bytes(fake, monkeypatch, fp):
    body = _doc(_layers(1))
    fake.put_manifest("v1", body)
    monkeypatch.setattr(artifact, "MAX_MANIFEST_BYTES", len(body))
    reg = _registry(fake)
    got = reg.get_manifest("v1", artifact.ACCEPT, artifact.MAX_MANIFEST_BYTES, "GET manifest")
    assert got[1] == body
    monkeypatch.setattr(artifact, "MAX_MANIFEST_BYTES", len(body) - 1)
    with pytest.raises(RemoteError) as err:
        plan_pull(fake.ref(), registry=reg, local=fp)
    assert err.value.message == (f"{reg.ref}: GET manifest: the answer declares {len(body)} "
                                 f"bytes, more than the limit of {len(body) - 1} bytes")


def test_a_token_answer(fake, monkeypatch, tmp_path):
    fake.auth = "bearer"
    env = docker_config(tmp_path / "c", {fake.netloc: basic_auth("alice", "secret")})
    size = len(json.dumps({"token": "token-0"}))
    monkeypatch.setattr(client, "MAX_TOKEN_BYTES", size)
    Registry(parse(fake.ref()), env=env).login()
    monkeypatch.setattr(client, "MAX_TOKEN_BYTES", size - 1)
    with pytest.raises(RemoteError) as err:
        Registry(parse(fake.ref()), env=env).login()
    assert err.value.message == (f"{fake.ref()}: token from http://{fake.netloc}/token: the "
                                 f"answer declares {size} bytes, more than the limit of "
                                 f"{size - 1} bytes")


def test_redirects(fake):
    hops = {"n": 0}

    def redirect(handler):
        hops["n"] += 1
        if hops["n"] <= hops["limit"]:
            handler._send(307, b"", {"Location": f"/v2/{hops['n']}/blobs/{DIGEST}"})
        else:
            handler._send(200, b"x", {})

    fake.override["blob"] = redirect
    hops.update(n=0, limit=client.MAX_REDIRECTS)
    reg = _registry(fake)
    out = io.BytesIO()
    reg.get_blob("sha256:2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
                 1, out, "blob")
    assert out.getvalue() == b"x"
    hops.update(n=0, limit=client.MAX_REDIRECTS + 1)
    with pytest.raises(RemoteError, match=r": blob: more than 5 redirects$"):
        reg.get_blob(DIGEST, 1, io.BytesIO(), "blob")


def test_docker_config_bytes(tmp_path):
    doc = b'{"auths": {"h": {"username": "u", "password": "p"}}}'
    (tmp_path / "config.json").write_bytes(doc.ljust(auth.MAX_CONFIG_BYTES))
    assert auth.lookup("h", {"DOCKER_CONFIG": str(tmp_path)}).username == "u"
    (tmp_path / "config.json").write_bytes(doc.ljust(auth.MAX_CONFIG_BYTES + 1))
    with pytest.raises(CacheError) as err:
        auth.lookup("h", {"DOCKER_CONFIG": str(tmp_path)})
    assert err.value.message == (f"{tmp_path / 'config.json'}: 4194305 bytes exceeds the limit "
                                 "of 4194304 bytes")


def test_a_challenge_header_and_a_reference():
    header = 'Bearer realm="' + "r" * (auth.MAX_CHALLENGE_CHARS - 15) + '"'
    assert len(header) == auth.MAX_CHALLENGE_CHARS and len(auth.challenges([header])) == 1
    assert auth.challenges([header + " "]) == []
    at = "oci://h/" + "a" * (reference.MAX_REFERENCE_CHARS - 8)
    with pytest.raises(CacheError, match="is not a valid name"):     # past the length check
        parse(at)
    with pytest.raises(CacheError, match=r"an OCI reference of 1025 characters \(at most "
                                         r"1024\)$"):
        parse(at + "a")
