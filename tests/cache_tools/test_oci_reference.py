"""cache_tools/oci: references, Docker's credentials, challenges and the artifact's documents,
without a network: every refusal is one line naming the reference or the field."""

from __future__ import annotations

import base64
import json
import os

import pytest

from cache_tools.errors import CacheError, RemoteError
from cache_tools.stores.oci import artifact, auth
from cache_tools.stores.oci.reference import Reference, is_loopback, parse

DIGEST = "sha256:" + "ab" * 32


def test_references_parse_with_port_tag_and_digest():
    ref = parse("oci://registry.example.com:5000/ml/sglang-jit:v1")
    assert ref == Reference(False, "registry.example.com", 5000, "ml/sglang-jit", "v1", None)
    assert ref.api("manifests/v1") == "https://registry.example.com:5000/v2/ml/sglang-jit/" \
                                      "manifests/v1"
    assert str(ref) == "oci://registry.example.com:5000/ml/sglang-jit:v1"
    ref = parse(f"oci+http://127.0.0.1:5391/a/b__c.d-e@{DIGEST}")
    assert (ref.plain_http, ref.tag, ref.digest, ref.base_url) == \
        (True, None, DIGEST, "http://127.0.0.1:5391")
    assert parse(f"oci://h/r:t@{DIGEST}").tag == "t"
    assert parse("oci+http://[::1]:5000/r").netloc == "[::1]:5000"
    assert parse("oci+http://localhost/r").port is None


@pytest.mark.parametrize("text, problem", [
    ("redis://h/r", "not an OCI reference"),
    ("oci://h", "no repository after the registry"),
    ("oci://h/", "no repository after the registry"),
    ("oci://h/Upper", "repository 'Upper' is not a valid name"),
    ("oci://h/a//b", "repository 'a//b' is not a valid name"),
    ("oci://h/r:-x", "tag '-x' is not a valid tag"),
    ("oci://h/r:" + "t" * 129, "is not a valid tag"),
    ("oci://h/r@md5:abc", "digest 'md5:abc': only sha256 digests are accepted"),
    ("oci://h/r@sha256:ABC", "a sha256 digest is 64 lowercase hex digits"),
    ("oci://h:0/r", "port '0' is not a port number"),
    ("oci://h:99999/r", "port '99999' is not a port number"),
    ("oci://h:/r", "empty port"),
    ("oci://user:pw@h/r", "credentials do not go in the reference"),
    ("oci://h_x/r", "'h_x' is not a registry host"),
    ("oci://h/r\x1b[31m", "repository 'r\\x1b[31m' is not a valid name"),
    ("oci+http://registry.example.com/r", "plain HTTP (oci+http://) is allowed for a registry "
                                          "on loopback only, not registry.example.com"),
    ("oci+http://10.1.2.3:5000/r", "on loopback only, not 10.1.2.3"),
    ("oci://h/" + "a" * 2000, "an OCI reference of 2008 characters (at most 1024)"),
])
def test_bad_references_are_one_line_naming_them(text, problem):
    with pytest.raises(CacheError) as err:
        parse(text)
    assert problem in err.value.message and "\n" not in err.value.message
    assert err.value.exit_code == 1 and err.value.hint


def test_loopback_is_by_name_or_literal_only():
    assert is_loopback("localhost") and is_loopback("127.9.9.9") and is_loopback("[::1]")
    assert not is_loopback("localhost.example.com") and not is_loopback("10.0.0.1")


def _config(tmp_path, doc) -> dict[str, str]:
    (tmp_path / "config.json").write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return {"DOCKER_CONFIG": str(tmp_path)}


def test_docker_config_auths_are_found_by_host_and_port(tmp_path):
    auth_b64 = base64.b64encode(b"alice:pa:ss").decode()
    env = _config(tmp_path, {"auths": {
        "https://reg.example.com:5000/v1/": {"auth": auth_b64},
        "other.example.com": {"username": "bob", "password": "pw"},
        "https://index.docker.io/v1/": {"identitytoken": "refresh"},
        "tok.example.com": {"registrytoken": "bearer-1"}}, "credsStore": "desktop"})
    found = auth.lookup("reg.example.com:5000", env)
    assert (found.username, found.password) == ("alice", "pa:ss")
    assert found.basic() == "Basic " + auth_b64
    assert "pa:ss" not in repr(found)
    assert auth.lookup("other.example.com", env).username == "bob"
    assert auth.lookup("docker.io", env).identity_token == "refresh"
    assert auth.lookup("tok.example.com", env).registry_token == "bearer-1"
    missing = auth.lookup("reg.example.com", env)     # another port: not the same registry
    assert not missing.usable and missing.helper == "desktop"
    assert auth.lookup("x", {"DOCKER_CONFIG": str(tmp_path / "none")}) == \
        auth.Credentials(source=str(tmp_path / "none" / "config.json"))


def test_home_docker_config_is_the_default(tmp_path):
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text(json.dumps(
        {"auths": {"h": {"username": "u", "password": "p"}}}))
    assert auth.lookup("h", {"HOME": str(tmp_path)}).username == "u"


@pytest.mark.parametrize("doc, problem", [
    ("{not json", "not valid JSON"),
    ("[]", "not a JSON object"),
    ({"auths": {"h": {"auth": "%%%"}}}, "auths entry for h: auth is not base64 of user:password"),
    ({"auths": {"h": {"auth": base64.b64encode(b"nocolon").decode()}}}, "holds no ':'"),
    ({"auths": {"h": {"username": 5}}}, "auths entry for h: username is not a string"),
])
def test_a_bad_docker_config_is_one_line(tmp_path, doc, problem):
    with pytest.raises(CacheError) as err:
        auth.lookup("h", _config(tmp_path, doc))
    assert err.value.message == f"{tmp_path / 'config.json'}: {problem}" or \
        problem in err.value.message


def test_a_huge_or_special_docker_config_is_refused_unread(tmp_path):
    (tmp_path / "config.json").write_bytes(b" " * (auth.MAX_CONFIG_BYTES + 1))
    with pytest.raises(CacheError, match="exceeds the limit of 4194304 bytes"):
        auth.lookup("h", {"DOCKER_CONFIG": str(tmp_path)})
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")           # nobody writes it: never waited on
    with pytest.raises(CacheError, match="not a regular file"):
        auth.lookup("h", {"DOCKER_CONFIG": str(tmp_path)})


def test_challenges_are_parsed_like_registry_clients_do():
    found = auth.challenges([
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
        'scope="repository:ml/a:pull,push"', 'Basic realm="x, y"'])
    assert found == [auth.Challenge("bearer", {"realm": "https://auth.example.com/token",
                                               "service": "registry.example.com",
                                               "scope": "repository:ml/a:pull,push"}),
                     auth.Challenge("basic", {"realm": "x, y"})]
    assert auth.challenges(['Basic realm="a", Bearer realm="b"'])[1].params == {"realm": "b"}
    assert auth.challenges(["Basic"]) == [auth.Challenge("basic", {})]
    assert auth.challenges(['Bearer realm="' + "x" * 9000 + '"']) == []
    assert auth.challenges(['"unterminated']) == []


# --- the manifest and config documents ---------------------------------------------------------


def _manifest(**change) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": artifact.MANIFEST_TYPE,
           "artifactType": artifact.ARTIFACT_TYPE,
           "config": {"mediaType": artifact.CONFIG_TYPE, "digest": DIGEST, "size": 10},
           "layers": [{"mediaType": artifact.LAYER_TYPE, "digest": DIGEST, "size": 100,
                       "annotations": {artifact.KIND_KEY: "triton"}}]}
    doc.update(change)
    return json.dumps(doc).encode()


def _layer(**change) -> dict:
    layer = {"mediaType": artifact.LAYER_TYPE, "digest": DIGEST, "size": 100,
             "annotations": {artifact.KIND_KEY: "triton"}}
    layer.update(change)
    return layer


def test_an_artifact_manifest_parses():
    config, layers = artifact.parse_manifest(_manifest(), artifact.MANIFEST_TYPE, "R")
    assert config == artifact.Blob(artifact.CONFIG_TYPE, DIGEST, 10)
    assert layers == (artifact.Blob(artifact.LAYER_TYPE, DIGEST, 100, "triton"),)


@pytest.mark.parametrize("body, media, problem", [
    (b"{", artifact.MANIFEST_TYPE, "R: the manifest is not valid JSON"),
    (b"[" * 100000, artifact.MANIFEST_TYPE, "R: the manifest is not valid JSON"),
    (_manifest(), "application/vnd.docker.distribution.manifest.v2+json",
     "R: a manifest of type 'application/vnd.docker.distribution.manifest.v2+json', not an "
     "sglang-warmup cache"),
    (_manifest(mediaType="application/vnd.oci.image.index.v1+json"), "",
     "R: a manifest of type 'application/vnd.oci.image.index.v1+json'"),
    (_manifest(schemaVersion=1), "", "R: not an OCI image manifest (schemaVersion 2)"),
    (_manifest(config={"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": DIGEST, "size": 5}), artifact.MANIFEST_TYPE,
     "R: an artifact of type 'application/vnd.oci.image.config.v1+json', not an "
     "sglang-warmup cache"),
    (_manifest(artifactType="application/vnd.cncf.helm.config.v1+json"), "",
     "R: an artifact of type 'application/vnd.cncf.helm.config.v1+json'"),
    (_manifest(config={"mediaType": artifact.CONFIG_TYPE, "digest": DIGEST,
                       "size": (1 << 20) + 1}), "",
     "R: config: 1048577 bytes exceeds the limit of 1048576 bytes"),
    (_manifest(layers="x"), "", "R: layers: expected a list"),
    (_manifest(layers=[_layer()] * 12), "", "R: 12 layers, more than the 11 cache kinds"),
    (_manifest(layers=[_layer(), _layer()]), "", "R: layers: a kind appears twice"),
    (_manifest(layers=[_layer(digest="sha512:00")]), "",
     "R: layers[0]: digest 'sha512:00' is not a sha256 digest"),
    (_manifest(layers=[_layer(size=-1)]), "", "R: layers[0]: size: expected a byte count"),
    (_manifest(layers=[_layer(size=True)]), "", "R: layers[0]: size: expected a byte count"),
    (_manifest(layers=[_layer(size=(256 << 30) + 1)]), "",
     "R: layers[0]: 274877906945 bytes exceeds the limit of 274877906944 bytes"),
    (_manifest(layers=[_layer(mediaType="application/vnd.oci.image.layer.v1.tar+gzip")]), "",
     "R: layers[0]: media type 'application/vnd.oci.image.layer.v1.tar+gzip', not a cache "
     "layer"),
    (_manifest(layers=[_layer(annotations={artifact.KIND_KEY: "../etc"})]), "",
     "R: layers[0]: annotation org.sglang-warmup.cache.kind '../etc' is not a cache kind"),
    (_manifest(layers=[_layer(annotations=None)]), "",
     "R: layers[0]: annotation org.sglang-warmup.cache.kind 'None' is not a cache kind"),
])
def test_hostile_manifests_are_refused_naming_the_field(body, media, problem):
    with pytest.raises(RemoteError) as err:
        artifact.parse_manifest(body, media, "R")
    assert err.value.message.startswith(problem), err.value.message
    assert err.value.exit_code == 5 and "\n" not in err.value.message


def test_config_documents(fp):
    from cache_tools.archive.manifest import Manifest

    body = artifact.config_json(Manifest(fp, ()))
    assert artifact.parse_config(body, "C") == fp
    for bad, problem in [(b"{", "C: not valid JSON"),
                         (b'{"format": "x"}', "C: not an sglang-warmup cache config"),
                         (json.dumps({"format": artifact.CONFIG_FORMAT, "version": 9}).encode(),
                          "C: unsupported version '9'"),
                         (json.dumps({"format": artifact.CONFIG_FORMAT, "version": 1,
                                      "fingerprint": {"software": {"a": 1}}}).encode(),
                          "C: fingerprint.software: expected an object of strings")]:
        with pytest.raises(RemoteError) as err:
            artifact.parse_config(bad, "C")
        assert err.value.message.startswith(problem), err.value.message
