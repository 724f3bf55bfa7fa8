"""The OCI pull against a registry that lies, hangs or refuses (a small fake registry, for fault
injection): a wrong digest, a missing layer, a manifest of another type, a huge manifest, a
refused login, a hang, a hostile layer.  Each is one line naming the reference and the problem,
the documented exit status, nothing under the destination and no download left behind."""

from __future__ import annotations

import io
import json
import tarfile
import time

import pytest

from cache_helpers import compile_into, tree, triton_location
from cache_tools import archive
from cache_tools.errors import ArchiveError, CacheError, RemoteError
from cache_tools.locations import Location, kind
from cache_tools.stores.oci import artifact, client, plan_pull, push
from cache_tools.stores.oci.client import Registry
from cache_tools.stores.oci.reference import parse
from oci_helpers import FakeRegistry, basic_auth, digest_of, docker_config, spool  # noqa: F401


@pytest.fixture
def fake():
    registry = FakeRegistry().start()
    yield registry
    registry.stop()


@pytest.fixture
def published(fake, valid_archive, tmp_path):
    """The valid archive published at ``v1``; (the ref, the manifest's digest)."""
    return fake.ref(), fake.publish(valid_archive, tmp_path / "layers")


def _pull(ref: str, dest, fp, env=None, **kw):
    """Plan and execute with short time bounds."""
    parsed = parse(ref)
    if not parsed.tag and not parsed.digest:
        parsed = parsed.at(tag=fp.hash)             # what plan_pull asks for
    registry = Registry(parsed, env=env or {"HOME": "/nonexistent"}, socket_timeout_s=0.5,
                        document_deadline_s=1.5)
    with plan_pull(ref, dest=dest, local=fp, registry=registry, env=env, **kw) as plan:
        return plan.execute()


def _refused(ref, dest, fp, error=RemoteError, env=None, **kw) -> str:
    with pytest.raises(CacheError) as err:
        _pull(ref, dest, fp, env=env, **kw)
    assert type(err.value) is error, err.value
    assert "\n" not in err.value.message and err.value.hint
    assert not dest.exists(), sorted(str(x) for x in dest.rglob("*"))
    return err.value.message


def test_the_fake_serves_a_real_pull(published, tmp_path, fp, spool):
    ref, digest = published
    result = _pull(ref, tmp_path / "dest", fp)
    assert [o.status for o in result.outcomes] == ["added"] * 3
    assert compile_into(tmp_path / "dest" / "triton") == [True, True, True]
    ref_at = ref.rsplit(":", 1)[0] + "@" + digest
    assert _pull(ref_at, tmp_path / "dest", fp).outcomes == ()


def test_a_layer_with_the_wrong_digest(fake, published, tmp_path, fp, spool):
    ref, _ = published
    layer = fake.document()["layers"][0]
    data = bytearray(fake.blobs[layer["digest"]])
    data[-2000] ^= 1
    fake.blobs[layer["digest"]] = bytes(data)
    message = _refused(ref, tmp_path / "dest", fp)
    assert message == (f"{ref}: layer triton: the content's digest is "
                       f"{digest_of(bytes(data))[:23]}..., not the {layer['digest'][:23]}... "
                       "the manifest names")


def test_a_layer_longer_or_shorter_than_declared(fake, published, tmp_path, fp, spool):
    ref, _ = published
    layer = fake.document()["layers"][0]
    good = fake.blobs[layer["digest"]]
    fake.blobs[layer["digest"]] = good + b"\0" * 512
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: layer triton: the registry sends {len(good) + 512} bytes, the manifest "
        f"declares {len(good)}")

    def no_length(handler):         # no Content-Length: read to one byte past the size only
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(good + b"more")

    fake.override["blob"] = no_length
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: config: the registry sends more than the {fake.document()['config']['size']} "
        "bytes the manifest declares")


def test_a_manifest_that_is_not_the_digest_asked_for(fake, published, tmp_path, fp, spool):
    ref, digest = published
    other = fake.document()
    other["annotations"]["x"] = "y"
    fake.manifests[digest] = (artifact.MANIFEST_TYPE, json.dumps(other).encode())
    by_digest = ref.rsplit(":", 1)[0] + "@" + digest
    assert _refused(by_digest, tmp_path / "dest", fp).startswith(
        f"{by_digest}: the manifest's content has digest sha256:")

    def lying(handler):
        body = fake.manifests["v1"][1]
        handler._send(200, body, {"Content-Type": artifact.MANIFEST_TYPE,
                                  "Docker-Content-Digest": "sha256:" + "0" * 64})

    fake.override["manifest"] = lying
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: the registry says the manifest's digest is sha256:{'0' * 64}, its content's "
        f"is {digest[:23]}...")


def test_a_missing_layer_or_config(fake, published, tmp_path, fp, spool):
    ref, _ = published
    doc = fake.document()
    del fake.blobs[doc["layers"][0]["digest"]]
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: layer triton: missing from the registry (404 BLOB_UNKNOWN: blob unknown to "
        "registry)")
    del fake.blobs[doc["config"]["digest"]]
    assert _refused(ref, tmp_path / "dest", fp).startswith(f"{ref}: config: missing from the")


def test_a_missing_tag(fake, tmp_path, fp, spool):
    ref = fake.ref(suffix="")
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}:{fp.hash}: GET manifest: no such manifest in the registry (404 "
        "MANIFEST_UNKNOWN: manifest unknown)")


_NOT_OURS = f"not an sglang-warmup cache ({artifact.MANIFEST_TYPE} of artifact type " \
    f"{artifact.ARTIFACT_TYPE})"


@pytest.mark.parametrize("media, change, problem", [
    ("application/vnd.docker.distribution.manifest.v2+json", {},
     f"a manifest of type 'application/vnd.docker.distribution.manifest.v2+json', {_NOT_OURS}"),
    ("application/vnd.oci.image.index.v1+json",
     {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []},
     f"a manifest of type 'application/vnd.oci.image.index.v1+json', {_NOT_OURS}"),
    (artifact.MANIFEST_TYPE, {"artifactType": None, "config": {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": "sha256:" + "1" * 64, "size": 100}},
     "an artifact of type 'application/vnd.oci.image.config.v1+json', not an sglang-warmup "
     f"cache ({artifact.ARTIFACT_TYPE})"),
])
def test_a_manifest_of_another_type(fake, published, tmp_path, fp, spool, media, change,
                                    problem):
    ref, _ = published
    doc = {k: v for k, v in {**fake.document(), **change}.items() if v is not None}
    fake.put_manifest("v1", json.dumps(doc).encode(), media)
    assert _refused(ref, tmp_path / "dest", fp) == f"{ref}: {problem}"


def test_a_huge_manifest_is_refused_before_it_is_read(fake, tmp_path, fp, spool):
    sent = []

    def huge(handler, length=True):
        handler.send_response(200)
        handler.send_header("Content-Type", artifact.MANIFEST_TYPE)
        if length:
            handler.send_header("Content-Length", str(1 << 30))
        handler.send_header("Connection", "close")
        handler.end_headers()
        try:
            for _ in range(64):              # 64 MiB at most, whoever reads it
                handler.wfile.write(b" " * (1 << 20))
                sent.append(1)
        except OSError:
            pass

    fake.override["manifest"] = huge
    ref = fake.ref()
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: GET manifest: the answer declares 1073741824 bytes, more than the limit of "
        "4194304 bytes")
    fake.override["manifest"] = lambda h: huge(h, length=False)
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: GET manifest: the answer holds more than the limit of 4194304 bytes")


def test_a_hostile_layer_list(fake, published, tmp_path, fp, spool):
    ref, _ = published
    doc = fake.document()
    doc["layers"][0]["annotations"][artifact.KIND_KEY] = "../../etc"
    fake.put_manifest("v1", json.dumps(doc).encode())
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: layers[0]: annotation org.sglang-warmup.cache.kind '../../etc' is not a cache "
        "kind")
    doc["layers"] = [dict(doc["layers"][0], annotations={artifact.KIND_KEY: "triton"},
                          size=(256 << 30) + 1)]
    fake.put_manifest("v1", json.dumps(doc).encode())
    assert _refused(ref, tmp_path / "dest", fp).endswith(
        "274877906945 bytes exceeds the limit of 274877906944 bytes")


def _flip_last_member(data: bytes) -> bytes:
    """One bit of the last member's content flipped (the layer's digest follows)."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    out = bytearray(data)
    out[last.offset_data] ^= 1
    return bytes(out)


def test_a_layer_whose_archive_is_hostile_exits_3(fake, valid_archive, tmp_path, fp, spool):
    """The digest matches (the pusher pushed it so): the reader's checks still refuse it."""
    def flip(kind_name: str, data: bytes) -> bytes:
        return _flip_last_member(data)

    fake.publish(valid_archive, tmp_path / "layers", change=flip)
    ref = fake.ref()
    message = _refused(ref, tmp_path / "dest", fp, error=ArchiveError)
    assert message.startswith(f"{ref}: layer triton: archive member 'triton/") and \
        "sha256 mismatch" in message


def _two_kinds(tmp_path, fp, valid_archive):
    tl = tmp_path / "tl"
    tl.mkdir()
    (tl / "kernel_abc.so").write_bytes(b"tilelang kernel")
    out = tmp_path / "two.tar"
    archive.pack(out, [triton_location(valid_archive.parent / "src" / "triton"),
                       Location(kind("tilelang"), tl, "test")], fingerprint=fp)
    return out


def test_nothing_is_half_installed_when_a_later_layer_fails(fake, valid_archive, tmp_path, fp,
                                                            spool):
    two = _two_kinds(tmp_path, fp, valid_archive)

    def flip_triton(kind_name: str, data: bytes) -> bytes:
        return _flip_last_member(data) if kind_name == "triton" else data

    fake.publish(two, tmp_path / "layers", change=flip_triton)
    ref = fake.ref()
    assert [x["annotations"][artifact.KIND_KEY] for x in fake.document()["layers"]] == \
        ["tilelang", "triton"]
    _refused(ref, tmp_path / "dest", fp, error=ArchiveError)     # tilelang was staged first
    result = _pull(ref, tmp_path / "dest", fp, kinds=["tilelang"])
    assert [o.entry.key for o in result.outcomes] == ["tilelang:kernel_abc.so"]
    assert fake.kinds_fetched()[-1] == fake.document()["layers"][0]["digest"]


def test_a_layer_holding_another_kind(fake, valid_archive, tmp_path, fp, spool):
    two = _two_kinds(tmp_path, fp, valid_archive)
    (tmp_path / "split").mkdir()
    _, layers = artifact.split(two, tmp_path / "split")
    triton_bytes = layers[1].path.read_bytes()
    fake.publish(two, tmp_path / "layers",
                 change=lambda k, d: triton_bytes if k == "tilelang" else d)
    ref = fake.ref()
    assert _refused(ref, tmp_path / "dest", fp).startswith(
        f"{ref}: layer tilelang: holds entry triton:")


def test_a_login_refused_or_missing(fake, published, tmp_path, fp, spool):
    ref, _ = published
    fake.auth = "basic"
    none = docker_config(tmp_path / "none", {})
    assert _refused(ref, tmp_path / "dest", fp, env=none) == (
        f"{ref}: GET manifest: the registry requires a login and "
        f"{tmp_path / 'none' / 'config.json'} holds no credentials for {fake.netloc}")
    wrong = docker_config(tmp_path / "wrong", {fake.netloc: basic_auth("alice", "guess")})
    assert _refused(ref, tmp_path / "dest", fp, env=wrong) == (
        f"{ref}: GET manifest: the registry refused the credentials for {fake.netloc} from "
        f"{tmp_path / 'wrong' / 'config.json'} (401)")
    fake.auth = "bearer"
    assert _refused(ref, tmp_path / "dest", fp, env=wrong) == (
        f"{ref}: token from http://{fake.netloc}/token: the registry refused the credentials "
        f"for {fake.netloc} from {tmp_path / 'wrong' / 'config.json'} (401)")
    good = docker_config(tmp_path / "good", {fake.netloc: basic_auth("alice", "secret")})
    assert len(_pull(ref, tmp_path / "dest", fp, env=good).outcomes) == 3
    tokens = [w for m, k, w in fake.seen if k == "token"]
    assert tokens, fake.seen


def test_an_expired_token_is_renewed(fake, published, tmp_path, fp, spool):
    """Tokens expire (a pull of large layers outlives them): a Bearer challenge to a request
    that sent a token gets a fresh one, once."""
    ref, _ = published
    fake.auth = "bearer"
    fake.token_uses = 1                          # every request needs a new token
    good = docker_config(tmp_path / "good", {fake.netloc: basic_auth("alice", "secret")})
    assert len(_pull(ref, tmp_path / "dest", fp, env=good).outcomes) == 3
    assert len(fake.tokens) == 3                 # manifest, config, layer
    fake.token_uses = 0                          # a token that never works: refused, no loop
    assert _refused(ref, tmp_path / "other", fp, env=good) == (
        f"{ref}: GET manifest: the registry refused the credentials for {fake.netloc} from "
        f"{tmp_path / 'good' / 'config.json'} (401)")


def test_a_token_realm_in_clear_off_loopback_is_refused(fake, published, tmp_path, fp, spool):
    ref, _ = published
    fake.auth = "bearer"
    fake.realm = "http://auth.example.com/token"
    good = docker_config(tmp_path / "good", {fake.netloc: basic_auth("alice", "secret")})
    assert _refused(ref, tmp_path / "dest", fp, env=good) == (
        f"{ref}: the registry's token realm http://auth.example.com/token is plain HTTP off "
        "loopback: refused (credentials would travel in clear)")


def test_push_does_the_token_dance_with_push_scope(fake, valid_archive, tmp_path, fp, spool):
    fake.auth = "bearer"
    good = docker_config(tmp_path / "good", {fake.netloc: basic_auth("alice", "secret")})
    ref = fake.ref(suffix=":pushed")
    pushed = push(valid_archive, ref, env=good)
    assert fake.manifests["pushed"][1] == fake.manifests[fp.hash][1]
    assert digest_of(fake.manifests["pushed"][1]) == pushed.digest
    assert _pull(ref, tmp_path / "dest", fp, env=good).outcomes


@pytest.mark.parametrize("where", ["v2", "manifest", "blob"])
def test_a_registry_that_hangs(fake, published, tmp_path, fp, spool, where):
    ref, _ = published
    fake.hang.add(where)
    started = time.monotonic()
    if where == "v2":
        registry = Registry(parse(ref), env={}, socket_timeout_s=0.5)
        with pytest.raises(RemoteError) as err:
            registry.login()
        message = err.value.message
    else:
        message = _refused(ref, tmp_path / "dest", fp)
    assert time.monotonic() - started < 5
    what = {"v2": "GET /v2/", "manifest": "GET manifest", "blob": "config"}[where]
    assert message == f"{ref}: {what}: no answer within 0.5 s"


@pytest.mark.parametrize("where", ["manifest", "blob"])
def test_a_registry_that_trickles_is_cut_at_the_deadline(fake, published, tmp_path, fp, spool,
                                                         monkeypatch, where):
    ref, _ = published
    monkeypatch.setattr(client, "BLOB_DEADLINE_S", 1.0)
    monkeypatch.setattr(client, "MIN_BLOB_RATE", 1 << 60)
    fake.drip.add(where)                         # a byte every 0.2 s: never silent for 0.5 s
    started = time.monotonic()
    message = _refused(ref, tmp_path / "dest", fp)
    assert time.monotonic() - started < 5
    what = "GET manifest: no complete answer within 1.5 s" if where == "manifest" else \
        "config: no complete answer within 1 s"
    assert message == f"{ref}: {what}"


def test_redirects_to_plain_http_or_in_circles_are_refused(fake, published, tmp_path, fp,
                                                           spool):
    ref, _ = published
    fake.override["blob"] = lambda h: h._send(307, b"", {"Location": "http://10.255.255.1/b"})
    assert _refused(ref, tmp_path / "dest", fp) == (
        f"{ref}: config: a redirect to plain HTTP (http://10.255.255.1/b) refused")
    fake.override["blob"] = lambda h: h._send(302, b"", {"Location": h.path})
    assert _refused(ref, tmp_path / "dest", fp) == f"{ref}: config: more than 5 redirects"


def test_the_cli_says_one_line_and_the_documented_status(fake, published, tmp_path, spool,
                                                         capsys):
    from warmup.cli import main

    ref, _ = published
    del fake.blobs[fake.document()["layers"][0]["digest"]]
    with pytest.raises(SystemExit) as code:
        main(["cache", "pull", ref, "--dest", str(tmp_path / "dest"), "-q"])
    out, err = capsys.readouterr()
    assert (code.value.code, out) == (5, "")
    assert err.splitlines() == [
        f"error: {ref}: layer triton: missing from the registry (404 BLOB_UNKNOWN: blob "
        "unknown to registry)", "hint: the artifact is incomplete; push it again"]
    assert not (tmp_path / "dest").exists() and tree(tmp_path / "dest") == {}


def test_a_push_refused_mid_way_is_one_line(fake, valid_archive, tmp_path, spool):
    """A 401 to the upload's PUT (whose body is not sent twice) or a 403 to the manifest."""
    def refuse_put(handler):
        if handler.command == "POST":
            handler._send(202, b"", {"Location": "/v2/x/blobs/uploads/1"})
        else:
            handler._send(401, b"", {"WWW-Authenticate": 'Basic realm="fake"'})

    fake.override["upload"] = refuse_put
    ref = fake.ref(suffix=":p")
    env = docker_config(tmp_path / "none", {})
    with pytest.raises(RemoteError) as err:
        push(valid_archive, ref, env=env)
    assert err.value.message.startswith(f"{ref}: upload layer triton sha256:")
    assert err.value.message.endswith(f": the registry requires a login and "
                                      f"{tmp_path / 'none' / 'config.json'} holds no "
                                      f"credentials for {fake.netloc}")
    del fake.override["upload"]
    fake.override["manifest"] = lambda h: h._error(403, "DENIED", "requested access to the "
                                                                  "resource is denied")
    with pytest.raises(RemoteError) as err:
        push(valid_archive, ref, env=env)
    assert err.value.message.startswith(f"{ref}: PUT manifest ")
    assert err.value.message.endswith(": access denied (403 DENIED: requested access to the "
                                      "resource is denied)")
