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
from cache_tools.stores import redis as remote
from cache_tools.errors import IncompatibleError, RemoteError
from cache_tools.fingerprint import Fingerprint
from cache_tools.render import plan_text, push_text, push_warnings, result_text

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
    assert push_warnings(second) == [f"warning: triton:{victim.name}: the store holds "
                                     "different content (kept the store's)"]
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


def test_pull_refuses_a_linked_kind_directory(triton_cache, tmp_path, fp, ns):
    """Pull stages and installs as restore does: never through a symbolic link below --dest."""
    from cache_tools.errors import CacheError

    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "triton").symlink_to(elsewhere)
    with pytest.raises(CacheError) as err:
        remote.plan_pull(URL, dest=dest, namespace=ns, local=fp)
    assert err.value.message == (f"{dest / 'triton'}: a symbolic link (to {elsewhere}); nothing "
                                 "was written")
    assert list(elsewhere.iterdir()) == []


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


# --- hostile stores and failing connections (issue 17 items 1, 5, 6, 7) -----------------------


import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from cache_helpers import tree  # noqa: E402
from cache_tools.archive.manifest import EntryRecord, FileRecord  # noqa: E402


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


def test_a_wrong_redis_type_is_one_line(tmp_path, fp, ns):
    r = _client()
    prefix = f"{ns}:{fp.hash}"
    r.set(f"{prefix}:meta", json.dumps(fp.to_dict()))
    r.set(f"{prefix}:index", "not a set")
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message.startswith(f"{prefix}:index: holds another Redis type than "
                                        "sglang-warmup writes (WRONGTYPE ")


def test_a_blob_over_the_limit_is_refused_before_it_is_fetched(tmp_path, fp, ns):
    r = _client()
    rec = _publish(r, ns, fp, "tilelang", "k", True, {"k.so": b"x" * 65536})
    plan = remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    small = dataclasses.replace(plan, max_entry_bytes=1024)
    key = f"{ns}:{fp.hash}:blob:{rec.digest}"
    size = r.strlen(key)
    with pytest.raises(RemoteError) as err:
        small.execute()
    assert err.value.message == (f"{key}: {size} bytes exceeds the limit of "
                                 f"{1024 + 2048 * 9} bytes")


def test_a_record_over_the_limit_is_refused(tmp_path, fp, ns, monkeypatch):
    r = _client()
    _publish(r, ns, fp, "tilelang", "k", True, {"k.so": b"x"})
    key = f"{ns}:{fp.hash}:tilelang:k"
    monkeypatch.setattr(remote, "MAX_RECORD_BYTES", r.strlen(key) - 1)
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message == (f"{key}: {r.strlen(key)} bytes exceeds the limit of "
                                 f"{r.strlen(key) - 1} bytes")
    monkeypatch.setattr(remote, "MAX_RECORD_BYTES", r.strlen(key))   # at the limit: accepted
    assert len(remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp).items) == 1


def test_garbage_in_the_index_and_meta_is_one_line(tmp_path, fp, ns):
    r = _client()
    prefix = f"{ns}:{fp.hash}"
    r.set(f"{prefix}:meta", json.dumps(fp.to_dict()))
    r.sadd(f"{prefix}:index", b"\xff\xfe")
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message == f"{prefix}:index: member b'\\xff\\xfe' is not UTF-8"
    r.delete(f"{prefix}:index")
    r.set(f"{prefix}:meta", b"[" * 50_000)
    with pytest.raises(RemoteError) as err:
        remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    assert err.value.message == f"{prefix}:meta: not valid JSON"


def test_wrong_credentials_are_one_line_without_the_password():
    parts = urlsplit(URL)
    url = f"redis://nobody:s3cret@{parts.hostname}:{parts.port}/0"
    with pytest.raises(RemoteError) as err:
        remote.connect(url)
    assert err.value.message.startswith(
        f"Redis at redis://nobody:***@{parts.hostname}:{parts.port}/0 refused the credentials: ")
    assert "s3cret" not in err.value.message and err.value.exit_code == 5


def test_a_user_without_write_access_gets_one_line(triton_cache, fp, ns):
    r = _client()
    user = f"sgw-ro-{ns[-6:]}"
    r.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@read", "+ping")
    try:
        parts = urlsplit(URL)
        url = f"redis://{user}:pw@{parts.hostname}:{parts.port}/0"
        with pytest.raises(RemoteError) as err:
            remote.push(url, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
        assert err.value.message.startswith(
            f"Redis at redis://{user}:***@{parts.hostname}:{parts.port}/0 does not allow SET "
            f"{ns}:{fp.hash}:meta: ")
        assert "no permissions" in err.value.message
    finally:
        r.execute_command("ACL", "DELUSER", user)


class _Proxy:
    """A TCP proxy in front of the test Redis that cuts (``mode="reset"``) or stops answering
    (``"stall"``) after ``after`` bytes from the server on each connection."""

    def __init__(self, mode: str, after: int) -> None:
        parts = urlsplit(URL)
        self.upstream = (parts.hostname, parts.port)
        self.mode, self.after = mode, after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.open: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.open += [client, server]
            for args in ((client, server, None), (server, client, self.after)):
                thread = threading.Thread(target=self._pump, args=args, daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pump(self, src, dst, limit) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[:limit - sent])
                    if self.mode == "reset":
                        for s in (dst, src):
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                         b"\x01\x00\x00\x00\x00\x00\x00\x00")
                            s.shutdown(socket.SHUT_RDWR)    # wakes the other pump's recv
                            s.close()
                    return                      # stall: nothing more is forwarded
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass

    def close(self) -> None:
        """Stop every thread (a test process with threads alive may not fork: later tests
        would see them)."""
        for s in [self.sock, *self.open]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept() or recv()
            except OSError:
                pass
            s.close()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.mark.parametrize("mode,expect", [
    ("reset", "lost the connection to Redis at {url} (GET {key}): "),
    ("stall", "Redis at {url} did not answer in time (GET {key}): "),
    ("reset-early", "lost the connection to Redis at {url} (STRLEN {key}): "),
])
def test_a_connection_that_fails_mid_transfer_is_one_line(triton_cache, tmp_path, fp, ns,
                                                          mode, expect):
    import redis

    remote.push(URL, [triton_location(triton_cache)], namespace=ns, fingerprint=fp)
    plan = remote.plan_pull(URL, dest=tmp_path / "d", namespace=ns, local=fp)
    # the connection's handshake and STRLEN's answer pass, the blob is cut; or nothing passes
    proxy = _Proxy(mode.split("-")[0], after=0 if mode.endswith("early") else 2000)
    try:
        client = redis.Redis.from_url(proxy.url, socket_timeout=0.3,
                                      socket_connect_timeout=1)
        with pytest.raises(RemoteError) as err:
            dataclasses.replace(plan, client=client).execute()
    finally:
        proxy.close()
    key = f"{ns}:{fp.hash}:blob:{plan.to_write[0].entry.digest}"
    assert err.value.message.startswith(expect.format(url=URL, key=key)), err.value.message
    assert not (tmp_path / "d" / "triton").exists() or \
        not any((tmp_path / "d" / "triton").iterdir())
