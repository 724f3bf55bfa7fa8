"""remote.py against a real Redis (scripts/test.sh starts one and sets WARMUP_TEST_REDIS_URL):
push, pull into another path (a Triton hit), create-if-absent, conflicts, tampering."""

from __future__ import annotations

import io
import json
import os
import tarfile
import shutil
import uuid

import pytest

from cache_helpers import compile_into, triton_location
from cache_tools import remote
from cache_tools.errors import IncompatibleError, RemoteError
from cache_tools.fingerprint import Fingerprint
from cache_tools.render import plan_text, push_text, result_text

URL = os.environ.get("WARMUP_TEST_REDIS_URL")
pytestmark = pytest.mark.skipif(
    not URL, reason="WARMUP_TEST_REDIS_URL is unset: no Redis to test against "
                    "(scripts/test.sh starts one on 127.0.0.1:6391 and sets it)")


@pytest.fixture
def ns():
    """A private key namespace, deleted afterwards."""
    import redis

    name = f"sgw-test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(URL)
    keys = list(client.scan_iter(f"{name}:*"))
    if keys:
        client.delete(*keys)


def test_push_then_pull_elsewhere_is_a_triton_hit(triton_cache, tmp_path, fp, ns):
    first = remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    assert (first.pushed, first.present, first.conflicts) == (3, 0, ())
    assert push_text(first).startswith("Pushed 3 entries (")
    again = remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    assert (again.pushed, again.present, again.bytes_sent) == (0, 3, 0)

    import redis

    r = redis.Redis.from_url(URL)
    prefix = f"{ns}:{fp.hash}"
    assert r.scard(f"{prefix}:index") == 3
    assert Fingerprint.from_dict(json.loads(r.get(f"{prefix}:meta"))) == fp
    first_key = sorted(m.decode() for m in r.smembers(f"{prefix}:index"))[0]
    record = json.loads(r.get(f"{prefix}:{first_key}"))
    assert r.exists(f"{prefix}:blob:{record['sha256']}")

    shutil.rmtree(triton_cache)
    dest = tmp_path / "node2"
    plan = remote.plan_pull(URL, dest=dest, namespace=ns, local=fp)
    assert [i.action for i in plan.items] == ["add"] * 3
    result = plan.execute()
    assert [o.status for o in result.outcomes] == ["added"] * 3
    assert result_text(result, verb="Pulled").startswith("Pulled 3 entries (")
    assert compile_into(dest / "triton") == [True, True, True]
    again = remote.plan_pull(URL, dest=dest, namespace=ns, local=fp)
    assert again.nothing_to_do and [i.action for i in again.items] == ["skip"] * 3


def test_identical_content_is_stored_once_and_first_writer_wins(triton_cache, tmp_path, fp, ns):
    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    victim = sorted(triton_cache.iterdir())[0]
    ttir = next(victim.glob("*.ttir"))
    ttir.write_text(ttir.read_text() + "\n")
    second = remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    assert second.conflicts == (f"triton:{victim.name}",) and second.present == 2
    assert push_text(second).splitlines()[1] == (f"warning: triton:{victim.name}: the store "
                                                 "holds different content (kept the store's)")
    import redis

    r = redis.Redis.from_url(URL)
    blobs = list(r.scan_iter(f"{ns}:{fp.hash}:blob:*"))
    assert len(blobs) == 3


def test_a_tampered_blob_is_rejected_and_nothing_is_written(triton_cache, tmp_path, fp, ns):
    import redis

    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    r = redis.Redis.from_url(URL)
    key = sorted(r.scan_iter(f"{ns}:{fp.hash}:blob:*"))[0]
    blob = bytearray(r.get(key))
    with tarfile.open(fileobj=io.BytesIO(bytes(blob))) as tar:
        member = tar.getmembers()[-1]
    blob[member.offset_data] ^= 0xFF     # first byte of the entry's last file
    r.set(key, bytes(blob))
    dest = tmp_path / "dest"
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=dest, namespace=ns, local=fp).execute()
    records = [json.loads(r.get(k)) for k in r.scan_iter(f"{ns}:{fp.hash}:triton:*")]
    record = next(rec for rec in records if key.decode().endswith(rec["sha256"]))
    assert err.value.message == (f"{key.decode()}: file {member.name!r} of "
                                 f"triton:{record['name']} fails its sha256 check")
    assert not dest.exists()


def test_another_toolchain_is_refused_unless_forced(triton_cache, tmp_path, fp, ns):
    old = Fingerprint(tuple(sorted((fp.software_map | {"torch": "2.9.0"}).items())))
    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=old)
    with pytest.raises(IncompatibleError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp,
                         fingerprint_hash=old.hash)
    assert err.value.message == (f"the shared store {ns}:{old.hash} was built by another "
                                 f"toolchain: torch 2.9.0 (cache) vs "
                                 f"{fp.software_map['torch']} (here)")
    plan = remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp,
                            fingerprint_hash=old.hash, force=True)
    assert len(plan.to_write) == 3


def test_an_empty_store_is_a_sentence(tmp_path, fp, ns):
    plan = remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert plan.nothing_to_do
    assert plan_text(plan, plan.namespace) == (f"Nothing to pull: the shared store holds no "
                                               f"entries under {ns}:{fp.hash}.")


def test_unreachable_store():
    with pytest.raises(RemoteError) as err:
        remote.connect("redis://127.0.0.1:1/0")
    assert err.value.message.startswith("cannot reach Redis at redis://127.0.0.1:1/0: ")
    assert err.value.exit_code == 5


# --- hostile stores (issue 17 items 5 and 6) ---------------------------------------------------


import hashlib  # noqa: E402

from cache_helpers import tree  # noqa: E402
from cache_tools.manifest import EntryRecord, FileRecord  # noqa: E402


def _client():
    import redis

    return redis.Redis.from_url(URL)


def _publish(r, ns: str, fp: Fingerprint, kind: str, name: str, is_dir: bool,
             files: dict[str, bytes]) -> EntryRecord:
    """Write a record, its blob and the index entry by hand (what push would write)."""
    rec = EntryRecord(kind, name, is_dir, tuple(
        FileRecord(p, len(d), hashlib.sha256(d).hexdigest(), 0o644)
        for p, d in sorted(files.items())))
    prefix = f"{ns}:{fp.hash}"
    r.set(f"{prefix}:meta", json.dumps(fp.to_dict()), nx=True)
    r.set(f"{prefix}:{rec.key}", json.dumps(rec.to_dict()))
    r.set(f"{prefix}:blob:{rec.digest}",
          remote.entry_blob(rec, [files[f.path] for f in rec.files]))
    r.sadd(f"{prefix}:index", rec.key)
    return rec


def test_pull_into_a_relative_dest_hits_from_anywhere(triton_cache, tmp_path, fp, ns,
                                                      monkeypatch):
    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    monkeypatch.chdir(tmp_path)
    plan = remote.plan_pull(URL, dest="node", namespace=ns, local=fp)
    assert plan.roots == {"triton": tmp_path / "node" / "triton"}
    plan.execute()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert compile_into(tmp_path / "node" / "triton") == [True, True, True]


def test_incomplete_records_are_refused(tmp_path, fp, ns):
    r = _client()
    _publish(r, ns, fp, "sglang_jit", "sm90/topk/build-k/deps-k", True, {"topk.so": b"elf"})
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message == (
        f"{ns}:{fp.hash}:sglang_jit:sm90/topk/build-k/deps-k: sglang_jit entry "
        "'sm90/topk/build-k/deps-k' is incomplete: no sgl_deps.json yet (being built or "
        "interrupted)")
    assert not (tmp_path / "d").exists()


def test_overlapping_records_are_refused_before_anything_is_written(tmp_path, fp, ns):
    r = _client()
    _publish(r, ns, fp, "cute_aot", "fp/a.o", True, {"x": b"outer"})
    _publish(r, ns, fp, "cute_aot", "fp/a.o/b.o", False, {"": b"inner"})
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message == (f"{ns}:{fp.hash}:index: entries cute_aot:fp/a.o and "
                                 "cute_aot:fp/a.o/b.o overlap ('fp/a.o/b.o' lies inside "
                                 "'fp/a.o')")
    assert not (tmp_path / "d").exists()


def test_a_group_naming_another_entry_is_refused(tmp_path, fp, ns):
    r = _client()
    grp = json.dumps({"child_paths": {"k.cubin": "/etc/passwd"}}).encode()
    rec = _publish(r, ns, fp, "triton", "ABC", True, {"__grp__k.json": grp, "k.cubin": b"x"})
    plan = remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    with pytest.raises(RemoteError) as err:
        plan.execute()
    assert err.value.message == (f"{ns}:{fp.hash}:blob:{rec.digest}: entry triton:ABC: group "
                                 "file __grp__k.json names 'k.cubin' outside its entry")
    assert tree(tmp_path / "d") == {}
