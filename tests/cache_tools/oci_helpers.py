"""Registries for the OCI store's tests: the real one (Debian's ``docker-registry``, started by
scripts/test.sh, or here with a login or TLS), and a small fake one for fault injection."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest

from cache_tools.stores.oci import artifact

REGISTRY = os.environ.get("WARMUP_TEST_REGISTRY")
BINARY = shutil.which("docker-registry")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealRegistry:
    """A ``docker-registry`` of our own on a free loopback port: with an htpasswd login, with
    TLS, or both.  ``netloc`` is ``127.0.0.1:PORT``; ``stop()`` ends the process."""

    def __init__(self, workdir: Path, *, users: dict[str, str] | None = None,
                 tls: tuple[Path, Path] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.netloc = f"127.0.0.1:{self.port}"
        lines = ["version: 0.1", "log: {level: error}",
                 f"storage: {{filesystem: {{rootdirectory: {workdir / 'data'}}}}}"]
        http = f"addr: {self.netloc}"
        if tls:
            http += f", tls: {{certificate: {tls[0]}, key: {tls[1]}}}"
        lines.append(f"http: {{{http}}}")
        if users:
            htpasswd = workdir / "htpasswd"
            htpasswd.write_text("".join(f"{u}:{_bcrypt(p)}\n" for u, p in users.items()))
            lines.append(f"auth: {{htpasswd: {{realm: test, path: {htpasswd}}}}}")
        (workdir / "config.yml").write_text("\n".join(lines) + "\n")
        self.log = open(workdir / "log", "wb")
        self.proc = subprocess.Popen([BINARY, "serve", str(workdir / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self._wait(tls is not None)

    def _wait(self, tls: bool) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not start: {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _bcrypt(password: str) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


def self_signed(workdir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and localhost), with its key, made by openssl."""
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def docker_config(directory: Path, auths: dict[str, dict]) -> dict[str, str]:
    """A DOCKER_CONFIG directory holding ``{"auths": auths}``; the environment naming it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"auths": auths}))
    return {"DOCKER_CONFIG": str(directory), "HOME": str(directory)}


def basic_auth(user: str, password: str) -> dict:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def unique_repo() -> str:
    return f"sgw-test/{uuid.uuid4().hex[:12]}"


# --- the fake registry ------------------------------------------------------------------------


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeRegistry:
    """A registry that serves what the test puts in it, and misbehaves on request.

    ``manifests``: reference (tag or digest) -> (content type, body); ``blobs``: digest ->
    bytes.  ``auth``: None, ``basic`` or ``bearer`` (a token endpoint at ``/token`` that wants
    ``users``' Basic credentials); ``hang``: request kinds (``v2``, ``manifest``, ``blob``,
    ``token``) that never answer; ``drip``: those that answer a byte at a time; ``override``:
    a request kind -> a function of the handler that answers instead."""

    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    auth: str | None = None
    users: dict[str, str] = field(default_factory=lambda: {"alice": "secret"})
    realm: str = ""
    hang: set[str] = field(default_factory=set)
    drip: set[str] = field(default_factory=set)
    override: dict[str, Callable] = field(default_factory=dict)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    #: how many requests one token serves (then it has expired)
    token_uses: int = 1000
    tokens: dict[str, int] = field(default_factory=dict)

    def start(self) -> "FakeRegistry":
        fake = self

        class Handler(_Handler):
            registry = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.netloc = f"127.0.0.1:{self.port}"
        self.realm = self.realm or f"http://{self.netloc}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def ref(self, repo: str = "team/cache", suffix: str = ":v1") -> str:
        return f"oci+http://{self.netloc}/{repo}{suffix}"

    def publish(self, archive: Path, workdir: Path, tag: str = "v1",
                change: Callable[[str, bytes], bytes] | None = None) -> str:
        """``archive`` as our push lays it out; ``change(kind, layer) -> layer`` alters a layer
        (its descriptor follows the new bytes).  Returns the manifest's digest."""
        workdir.mkdir(parents=True, exist_ok=True)
        manifest, layers = artifact.split(archive, workdir)
        blobs = []
        for layer in layers:
            data = layer.path.read_bytes()
            if change is not None:
                data = change(layer.blob.kind, data)
            d = digest_of(data)
            self.blobs[d] = data
            blobs.append(artifact.Blob(layer.blob.media_type, d, len(data), layer.blob.kind))
        config = artifact.config_json(manifest)
        self.blobs[digest_of(config)] = config
        body = artifact.manifest_json(artifact.Blob(artifact.CONFIG_TYPE, digest_of(config),
                                                    len(config)), blobs, manifest.fingerprint)
        return self.put_manifest(tag, body)

    def put_manifest(self, tag: str, body: bytes,
                     media: str = artifact.MANIFEST_TYPE) -> str:
        d = digest_of(body)
        self.manifests[tag] = self.manifests[d] = (media, body)
        return d

    def document(self, tag: str = "v1") -> dict:
        return json.loads(self.manifests[tag][1])

    def kinds_fetched(self) -> list[str]:
        return [what for method, kind, what in self.seen if method == "GET" and kind == "blob"]


class _Handler(BaseHTTPRequestHandler):
    registry: FakeRegistry
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _kind(self) -> tuple[str, str]:
        path = self.path.split("?")[0]
        if path == "/v2/":
            return "v2", ""
        if path.startswith("/token"):
            return "token", ""
        if "/manifests/" in path:
            return "manifest", path.rsplit("/manifests/", 1)[1]
        if "/blobs/uploads/" in path:
            return "upload", path
        if "/blobs/" in path:
            return "blob", path.rsplit("/blobs/", 1)[1]
        return "other", path

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              kind: str = "") -> None:
        self.close_connection = True
        if kind in self.registry.drip:
            raw = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            for i in range(len(raw)):
                if self.registry.released.wait(0.2):
                    return
                self.wfile.write(raw[i:i + 1])
                self.wfile.flush()
            return
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
        self._send(status, body, {"Content-Type": "application/json"})

    def _authorized(self, kind: str) -> bool:
        reg = self.registry
        if reg.auth is None or kind == "token":
            return True
        given = self.headers.get("Authorization", "")
        if reg.auth == "basic":
            if given in {"Basic " + base64.b64encode(f"{u}:{p}".encode()).decode()
                         for u, p in reg.users.items()}:
                return True
            self._send(401, b"", {"WWW-Authenticate": 'Basic realm="fake"'})
            return False
        token = given.removeprefix("Bearer ")
        if given.startswith("Bearer ") and reg.tokens.get(token, reg.token_uses) < reg.token_uses:
            reg.tokens[token] += 1
            return True
        self._send(401, b"", {"WWW-Authenticate": f'Bearer realm="{reg.realm}",'
                                                  'service="fake",scope="repository:x:pull"'})
        return False

    def _handle(self) -> None:
        reg = self.registry
        kind, what = self._kind()
        reg.seen.append((self.command, kind, what))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length and kind != "upload" else b""
        if kind in reg.hang:
            reg.released.wait(30)
            return
        if kind in reg.override:
            reg.override[kind](self)
            return
        if not self._authorized(kind):
            return
        getattr(self, f"_do_{kind}", self._do_other)(what, body)

    do_GET = do_HEAD = do_POST = do_PUT = _handle

    def _do_v2(self, what: str, body: bytes) -> None:
        self._send(200, b"{}", {"Content-Type": "application/json"}, "v2")

    def _do_token(self, what: str, body: bytes) -> None:
        reg = self.registry
        good = {"Basic " + base64.b64encode(f"{u}:{p}".encode()).decode()
                for u, p in reg.users.items()}
        if self.headers.get("Authorization") not in good:
            self._error(401, "UNAUTHORIZED", "bad credentials")
            return
        token = f"token-{len(reg.tokens)}"
        reg.tokens[token] = 0
        self._send(200, json.dumps({"token": token}).encode(), {}, "token")

    def _do_manifest(self, what: str, body: bytes) -> None:
        found = self.registry.manifests.get(what)
        if self.command == "PUT":
            self.registry.put_manifest(what, body, self.headers.get("Content-Type", ""))
            self._send(201, b"", {"Docker-Content-Digest": digest_of(body)})
            return
        if found is None:
            self._error(404, "MANIFEST_UNKNOWN", "manifest unknown")
            return
        self._send(200, found[1], {"Content-Type": found[0],
                                   "Docker-Content-Digest": digest_of(found[1])}, "manifest")

    def _do_blob(self, what: str, body: bytes) -> None:
        data = self.registry.blobs.get(what)
        if data is None:
            self._error(404, "BLOB_UNKNOWN", "blob unknown to registry")
            return
        self._send(200, data, {"Content-Type": "application/octet-stream"}, "blob")

    def _do_upload(self, what: str, body: bytes) -> None:
        if self.command == "POST":
            self._send(202, b"", {"Location": f"/v2/x/blobs/uploads/{uuid.uuid4().hex}"})
            return
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        digest = self.path.split("digest=")[1].replace("%3A", ":")
        if digest_of(data) != digest:
            self._error(400, "DIGEST_INVALID", "digest did not match")
            return
        self.registry.blobs[digest] = data
        self._send(201, b"", {"Docker-Content-Digest": digest})

    def _do_other(self, what: str, body: bytes) -> None:
        self._error(404, "NOT_FOUND", what)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


@pytest.fixture
def spool(tmp_path, monkeypatch):
    """TMPDIR for the downloads, checked empty afterwards (nothing left behind)."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    assert list(path.iterdir()) == []
