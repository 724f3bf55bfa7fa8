"""The OCI store against a real registry (Debian's docker-registry: scripts/test.sh starts one
on loopback and sets WARMUP_TEST_REGISTRY; the login and TLS variants are started here): push,
pull elsewhere into Triton hits, layers not sent twice, one kind alone, pull by digest, the
toolchain rule, Basic login through DOCKER_CONFIG, TLS verified by default."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from cache_helpers import compile_into, tree, triton_location
from cache_tools import archive
from cache_tools.stores import oci
from cache_tools.errors import IncompatibleError, RemoteError
from cache_tools.fingerprint import Fingerprint
from cache_tools.locations import Location, kind
from cache_tools.stores.oci import artifact
from _cli import cli
from oci_helpers import (BINARY, REGISTRY, RealRegistry, basic_auth, docker_config,
                         self_signed, spool, unique_repo)  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(
    not REGISTRY, reason="WARMUP_TEST_REGISTRY is unset: no OCI registry to test against "
                         "(scripts/test.sh starts Debian's docker-registry on 127.0.0.1:5391 "
                         "and sets it)")
needs_binary = pytest.mark.skipif(not BINARY, reason="docker-registry is not installed "
                                                     "(scripts/test.sh installs it)")


def _two_kinds(base, fp, triton=None):
    """An archive of the Triton cache ``triton`` plus one TileLang entry."""
    tl = base / "tilelang"
    tl.mkdir(parents=True, exist_ok=True)
    (tl / "kernel_abc.so").write_bytes(b"\x7fELF tilelang kernel")
    out = base / "two.tar"
    archive.pack(out, [triton_location(triton), Location(kind("tilelang"), tl, "test")],
                 fingerprint=fp)
    return out


def test_push_then_pull_elsewhere_is_a_triton_hit(triton_cache, tmp_path, fp, spool):
    packed = _two_kinds(tmp_path / "a", fp, triton_cache)
    ref = f"oci+http://{REGISTRY}/{unique_repo()}:v1"
    first = oci.push(packed, ref)
    assert [(b.blob.kind, b.sent) for b in first.layers] == [("tilelang", True), ("triton", True)]
    assert first.tags == (fp.hash, "v1") and first.config.sent
    assert [b.blob.media_type for b in first.layers] == [artifact.LAYER_TYPE] * 2
    again = oci.push(packed, ref)
    assert again.digest == first.digest and again.bytes_sent == 0
    assert not any(b.sent for b in again.layers) and not again.config.sent

    shutil.rmtree(triton_cache)
    dest = tmp_path / "node2"
    with oci.plan_pull(ref.rsplit(":", 1)[0], dest=dest, local=fp) as plan:   # by fingerprint
        assert plan.digest == first.digest
        assert [i.action for i in plan.items] == ["add"] * 4
        assert not dest.exists()                    # downloaded and verified, nothing written
        result = plan.execute()
    assert sorted(o.status for o in result.outcomes) == ["added"] * 4
    assert compile_into(dest / "triton") == [True, True, True]
    assert (dest / "tilelang" / "kernel_abc.so").read_bytes() == b"\x7fELF tilelang kernel"
    with oci.plan_pull(first.pinned, dest=dest, local=fp) as plan:             # by digest
        assert plan.nothing_to_do and {i.action for i in plan.items} == {"skip"}


def test_an_unchanged_kind_is_not_sent_again_and_a_kind_pulls_alone(triton_cache, tmp_path, fp,
                                                                    spool):
    repo = unique_repo()
    first = oci.push(_two_kinds(tmp_path / "a", fp, triton_cache), f"oci+http://{REGISTRY}/{repo}")
    assert first.tags == (fp.hash,)
    import cache_kernels

    compile_into(triton_cache, cache_kernels.EXTRA)                  # Triton changed
    second = oci.push(_two_kinds(tmp_path / "b", fp, triton_cache), f"oci+http://{REGISTRY}/{repo}")
    assert [(b.blob.kind, b.sent) for b in second.layers] == [("tilelang", False),
                                                              ("triton", True)]
    assert second.layers[0].blob == first.layers[0].blob and second.digest != first.digest
    dest = tmp_path / "dest"
    with oci.plan_pull(f"oci+http://{REGISTRY}/{repo}", dest=dest, kinds=["tilelang"],
                       local=fp) as plan:
        assert [lp.manifest.entries[0].kind for lp in plan.layers] == ["tilelang"]
        plan.execute()
    assert sorted(tree(dest)) == ["tilelang", "tilelang/kernel_abc.so"]


def test_a_zstd_archive_travels_as_zstd_layers(valid_archive, tmp_path, fp, spool):
    pytest.importorskip("zstandard")
    zst = tmp_path / "v.tar.zst"
    src = tmp_path / "src"
    shutil.copytree(valid_archive.parent / "src", src)
    archive.pack(zst, [triton_location(src / "triton")], fingerprint=fp, zstd=True)
    pushed = oci.push(zst, f"oci+http://{REGISTRY}/{unique_repo()}:z")
    assert [b.blob.media_type for b in pushed.layers] == [artifact.LAYER_ZSTD_TYPE]
    with oci.plan_pull(pushed.pinned, dest=tmp_path / "d", local=fp) as plan:
        plan.execute()
    assert compile_into(tmp_path / "d" / "triton") == [True, True, True]


def test_another_toolchain_is_refused_unless_forced(valid_archive, tmp_path, fp, spool):
    old = Fingerprint(tuple(sorted((fp.software_map | {"torch": "2.9.0"}).items())))
    packed = tmp_path / "old.tar"
    archive.pack(packed, [triton_location(valid_archive.parent / "src" / "triton")],
                 fingerprint=old)
    ref = f"oci+http://{REGISTRY}/{unique_repo()}:old"
    oci.push(packed, ref)
    with pytest.raises(IncompatibleError) as err:
        oci.plan_pull(ref, dest=tmp_path / "d", local=fp)
    assert err.value.message == (f"{ref} was built by another toolchain: torch 2.9.0 (cache) "
                                 f"vs {fp.software_map['torch']} (here)")
    with oci.plan_pull(ref, dest=tmp_path / "d", local=fp, force=True) as plan:
        assert len(plan.to_write) == 3
    with oci.plan_pull(f"oci+http://{REGISTRY}/{ref.split('/', 3)[3].split(':')[0]}",
                       fingerprint_hash=old.hash, dest=tmp_path / "d", local=fp,
                       force=True) as plan:
        assert plan.fingerprint == old


def test_the_cli_pushes_and_pulls(valid_archive, tmp_path, fp, spool, capsys):
    ref = f"oci+http://{REGISTRY}/{unique_repo()}:cli"
    code, out, err = cli(capsys, "cache", "push", str(valid_archive), ref, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["tags"] == [fp.hash, "cli"] and doc["layers"][0]["sent"] is True
    code, out, err = cli(capsys, "cache", "push", str(valid_archive), ref, "-q")
    assert code == 0 and ": 0 of 1 layers sent (0 B), the others unchanged; " in out
    assert out.splitlines()[-1] == f"pull with: sglang-warmup cache pull {doc['pinned']}"
    dest = tmp_path / "dest"
    code, out, err = cli(capsys, "cache", "pull", ref, "--dest", str(dest), "--dry-run")
    assert code == 0 and out.startswith(f"Plan for {ref}:\n  add      3 entries")
    assert not dest.exists()
    code, out, err = cli(capsys, "cache", "pull", "--url", doc["pinned"], "--dest", str(dest),
                         "-q")
    assert code == 0 and out.splitlines()[-1].startswith("Pulled 3 entries")
    code, out, err = cli(capsys, "cache", "pull", ref + "-missing", "--dest", str(tmp_path / "x"))
    assert (code, out) == (5, "")
    assert err.splitlines()[0] == (f"error: {ref}-missing: GET manifest: no such manifest in the "
                                   "registry (404 MANIFEST_UNKNOWN: manifest unknown)")
    code, out, err = cli(capsys, "cache", "push", str(valid_archive), ref, "--kinds", "triton")
    assert code == 2 and err.startswith("error: --kinds: for --url redis://... only")


@needs_binary
def test_a_login_comes_from_docker_config(valid_archive, tmp_path, fp, spool):
    reg = RealRegistry(tmp_path / "reg", users={"alice": "s3cret"})
    try:
        ref = f"oci+http://{reg.netloc}/{unique_repo()}:v1"
        with pytest.raises(RemoteError) as err:
            oci.push(valid_archive, ref, env=docker_config(tmp_path / "none", {}))
        assert err.value.message == (
            f"{ref}: GET /v2/: the registry requires a login and "
            f"{tmp_path / 'none' / 'config.json'} holds no credentials for {reg.netloc}")
        wrong = docker_config(tmp_path / "wrong", {reg.netloc: basic_auth("alice", "nope")})
        with pytest.raises(RemoteError) as err:
            oci.push(valid_archive, ref, env=wrong)
        assert err.value.message == (
            f"{ref}: GET /v2/: the registry refused the credentials for {reg.netloc} from "
            f"{tmp_path / 'wrong' / 'config.json'} (401)")
        assert err.value.exit_code == 5 and "nope" not in err.value.message
        good = docker_config(tmp_path / "good", {f"http://{reg.netloc}": basic_auth("alice",
                                                                                   "s3cret")})
        oci.push(valid_archive, ref, env=good)
        with oci.plan_pull(ref, dest=tmp_path / "d", local=fp, env=good) as plan:
            plan.execute()
        assert compile_into(tmp_path / "d" / "triton") == [True, True, True]
        with pytest.raises(RemoteError, match="requires a login"):
            oci.plan_pull(ref, dest=tmp_path / "e", local=fp,
                          env=docker_config(tmp_path / "none", {}))
        assert not (tmp_path / "e").exists()
    finally:
        reg.stop()


@needs_binary
@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl makes the test certificate")
def test_tls_is_verified_by_default(valid_archive, tmp_path, fp, spool, monkeypatch):
    cert, key = self_signed(tmp_path)
    reg = RealRegistry(tmp_path / "reg", tls=(cert, key))
    try:
        ref = f"oci://{reg.netloc}/{unique_repo()}:tls"
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(RemoteError) as err:
            oci.push(valid_archive, ref)
        assert err.value.message.startswith(f"{ref}: GET /v2/: TLS certificate not trusted (")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        pushed = oci.push(valid_archive, ref)
        with oci.plan_pull(pushed.pinned, dest=tmp_path / "d", local=fp) as plan:
            plan.execute()
        with pytest.raises(RemoteError) as err:     # plain HTTP against a TLS registry
            oci.plan_pull(f"oci+http://{reg.netloc}/x:y", dest=tmp_path / "e", local=fp)
        assert err.value.message.startswith(f"oci+http://{reg.netloc}/x:y: GET manifest: ")
    finally:
        reg.stop()
    assert compile_into(tmp_path / "d" / "triton") == [True, True, True]
    assert not (tmp_path / "e").exists()
    assert os.environ.get("SSL_CERT_FILE") == str(cert)
