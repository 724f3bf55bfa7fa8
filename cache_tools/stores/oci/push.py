"""Push an archive to an OCI registry as a cache artifact (``artifact.py``): the archive is read
through the checking reader and split into one archive per kind in a temporary directory
before anything is sent (a damaged archive sends nothing); each blob the registry already
holds (a kind that did not change, the same config) is not sent again; the manifest is put
last, under the toolchain's fingerprint hash as its tag and under the reference's tag if it
names one, so a puller finds a complete artifact or none.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from cache_tools.errors import CacheError, os_errors, printable
from cache_tools.stores.oci import artifact, reference
from cache_tools.stores.oci.artifact import Blob
from cache_tools.stores.oci.client import Registry
from cache_tools.progress import Progress


@dataclass(frozen=True)
class SentBlob:
    """One layer (or the config) and whether it was sent (False: the registry had it)."""

    blob: Blob
    sent: bool


@dataclass(frozen=True)
class OciPushResult:
    """What ``push`` did."""

    reference: str
    #: the manifest's digest, and the reference that pulls exactly this artifact
    digest: str
    pinned: str
    tags: tuple[str, ...]
    fingerprint: str
    layers: tuple[SentBlob, ...]
    config: SentBlob | None
    seconds: float

    @property
    def bytes_sent(self) -> int:
        blobs = [*self.layers, *([self.config] if self.config else [])]
        return sum(b.blob.size for b in blobs if b.sent)


def push(archive: str | os.PathLike[str], ref_text: str, *,
         env: Mapping[str, str] | None = None, progress: Progress | None = None,
         registry: Registry | None = None) -> OciPushResult:
    """Push ``archive`` to ``ref_text`` (``oci://HOST[:PORT]/REPO[:TAG]``)."""
    started = time.monotonic()
    progress = progress or Progress.null()
    ref = reference.parse(ref_text)
    if ref.digest:
        raise CacheError(f"{ref}: a push names a tag, not a digest",
                         hint="drop @sha256:...; the artifact is tagged by its fingerprint "
                              "(and by :TAG if given)")
    with os_errors("push", "check free space in TMPDIR and that the archive is readable"):
        spool = Path(tempfile.mkdtemp(prefix="sglang-warmup-oci-"))
        try:
            return _push(Path(archive), ref, spool, env, progress, registry, started)
        finally:
            shutil.rmtree(spool, ignore_errors=True)


def check_access(ref_text: str, env: Mapping[str, str] | None = None) -> reference.Reference:
    """Parse ``ref_text`` for a push and log in to its registry: a bad reference or a refused
    login is found before a long job whose archive it would push (prebake)."""
    ref = reference.parse(ref_text)
    if ref.digest:
        raise CacheError(f"{ref}: a push names a tag, not a digest",
                         hint="drop @sha256:...; the artifact is tagged by its fingerprint "
                              "(and by :TAG if given)")
    Registry(ref, ("pull", "push"), env=env).login()
    return ref


def _push(archive: Path, ref: reference.Reference, spool: Path,
          env: Mapping[str, str] | None, progress: Progress, registry: Registry | None,
          started: float) -> OciPushResult:
    progress.start("split", os.stat(archive).st_size)
    manifest, layers = artifact.split(archive, spool, progress.advance)
    progress.finish()
    fp = manifest.fingerprint
    if not layers:
        return OciPushResult(str(ref), "", "", (), fp.hash, (), None,
                             time.monotonic() - started)
    reg = registry or Registry(ref, ("pull", "push"), env=env)
    reg.login()
    config_path = spool / "config.json"
    config_path.write_bytes(artifact.config_json(manifest))
    config = Blob(artifact.CONFIG_TYPE, artifact.sha256_file(config_path),
                  config_path.stat().st_size)
    progress.start("push", sum(x.blob.size for x in layers))
    sent = [_send(reg, x.blob, x.path, f"layer {x.blob.kind}", progress) for x in layers]
    config_sent = _send(reg, config, config_path, "config", progress)
    progress.finish()
    body = artifact.manifest_json(config, [x.blob for x in layers], fp)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    tags = tuple(dict.fromkeys([fp.hash, *([ref.tag] if ref.tag else [])]))
    for tag in tags:
        said = reg.put_manifest(tag, body, artifact.MANIFEST_TYPE, f"PUT manifest {tag}")
        if said is not None and said.strip() != digest:
            raise reg.error(f"PUT manifest {tag}: the registry recorded digest "
                            f"{printable(said[:80])}, not {digest}")
    return OciPushResult(str(ref), digest, str(ref.at(digest=digest)), tags, fp.hash,
                         tuple(sent), config_sent, time.monotonic() - started)


def _send(reg: Registry, blob: Blob, path: Path, label: str, progress: Progress) -> SentBlob:
    what = f"{label} {blob.digest[:19]}"
    if reg.has_blob(blob.digest, f"HEAD {what}"):
        progress.advance(blob.size if blob.kind else 0)
        return SentBlob(blob, False)
    reg.put_blob(blob.digest, blob.size, path, f"upload {what}")
    progress.advance(blob.size if blob.kind else 0)
    return SentBlob(blob, True)
