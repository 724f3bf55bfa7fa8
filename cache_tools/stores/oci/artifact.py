"""The cache as an OCI artifact: an OCI image manifest whose config is the fingerprint and whose
layers are one archive per cache kind, each an archive of this project's own format (a tar, or
a tar.zst, ``manifest.json`` first) holding that kind's entries only, so that the reader that
verifies and restores ``cache pack`` archives checks each layer too.

* manifest ``application/vnd.oci.image.manifest.v1+json``, ``artifactType``
  ``application/vnd.sglang-warmup.cache.v1``, annotation ``org.sglang-warmup.cache.fingerprint``;
* config ``application/vnd.sglang-warmup.cache.config.v1+json``: format, version, the archive's
  fingerprint and producer, entries, files and bytes per kind (canonical JSON);
* layers ``application/vnd.sglang-warmup.cache.layer.v1.tar`` (or ``.tar+zstd``), in kind
  order, annotated ``org.sglang-warmup.cache.kind`` and ``org.opencontainers.image.title``
  (``<kind>.tar``: ORAS and similar tools save a layer under that name).

Everything is deterministic: the same archive gives the same layers, config and manifest, byte
for byte, so a kind whose entries did not change has the same digest and is not sent again.

Parsing is strict and bounded: a manifest of another media type (an image, an index, a Docker
manifest), another config type, more layers than there are kinds, a kind twice, an unknown
kind, a digest that is not sha256 or a size out of bounds is refused naming the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cache_tools.archive import tarfmt
from cache_tools.errors import CacheError, RemoteError, printable
from cache_tools.fingerprint import Fingerprint, canonical_json
from cache_tools.locations import KIND_NAMES
from cache_tools.archive.manifest import Manifest
from cache_tools.archive.reader import CHUNK, ArchiveReader, Limits
from cache_tools.archive.writer import ArchiveWriter

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.sglang-warmup.cache.v1"
CONFIG_TYPE = "application/vnd.sglang-warmup.cache.config.v1+json"
LAYER_TYPE = "application/vnd.sglang-warmup.cache.layer.v1.tar"
LAYER_ZSTD_TYPE = LAYER_TYPE + "+zstd"
KIND_KEY = "org.sglang-warmup.cache.kind"
FINGERPRINT_KEY = "org.sglang-warmup.cache.fingerprint"
TITLE_KEY = "org.opencontainers.image.title"
CONFIG_FORMAT = "sglang-warmup-cache-artifact"
CONFIG_VERSION = 1
#: What pull asks for; any other type answered is named in the refusal.
ACCEPT = (MANIFEST_TYPE, "application/vnd.oci.image.index.v1+json",
          "application/vnd.docker.distribution.manifest.v2+json",
          "application/vnd.docker.distribution.manifest.list.v2+json")
#: a manifest above this is refused before it is read (the distribution registry's own cap)
MAX_MANIFEST_BYTES = 4 << 20
#: the config blob: refused above this, from the size its descriptor declares
MAX_CONFIG_BYTES = 1 << 20
#: one layer, and all the layers a pull fetches: refused above this, from the manifest
MAX_LAYER_BYTES = Limits().max_total_bytes
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
HINT = "the registry holds something else than an sglang-warmup cache at this reference"


@dataclass(frozen=True)
class Blob:
    """A descriptor: media type, digest, size; ``kind`` for a layer, '' for the config."""

    media_type: str
    digest: str
    size: int
    kind: str = ""

    def descriptor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest,
                               "size": self.size}
        if self.kind:
            out["annotations"] = {KIND_KEY: self.kind, TITLE_KEY: f"{self.kind}.tar"}
        return out


@dataclass(frozen=True)
class Layer:
    """A layer written for a push: its descriptor and its file."""

    blob: Blob
    path: Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


# -- writing -----------------------------------------------------------------------------------


def split(archive: str | Path, out_dir: Path, advance: Callable[[int], None] | None = None
          ) -> tuple[Manifest, list[Layer]]:
    """Read ``archive`` through the checking reader (every member verified; an ArchiveError
    otherwise) and write one archive per kind into ``out_dir``, compressed as it is."""
    layers: list[Layer] = []
    with ArchiveReader(archive) as reader:
        manifest = reader.read_manifest()
        writer: ArchiveWriter | None = None
        current = ""
        try:
            for member in reader.members():
                if writer is None or member.entry.kind != current:
                    if writer is not None:
                        layers.append(_finish(writer, manifest, current, reader.compressed))
                    current = member.entry.kind
                    writer = _start(out_dir, manifest, current, reader.compressed)
                f = member.file
                writer.write(tarfmt.header(member.name, f.size, f.mode))
                for chunk in member.chunks():
                    writer.write(chunk)
                    if advance is not None:
                        advance(len(chunk))
                writer.write(tarfmt.padding(f.size))
            if writer is not None:
                layers.append(_finish(writer, manifest, current, reader.compressed))
                writer = None
        finally:
            if writer is not None:
                writer.close()
    return manifest, layers


def _kind_manifest(manifest: Manifest, kind: str) -> Manifest:
    return Manifest(manifest.fingerprint, tuple(e for e in manifest.entries if e.kind == kind),
                    manifest.created_by)


def _start(out_dir: Path, manifest: Manifest, kind: str, zstd: bool) -> ArchiveWriter:
    data = _kind_manifest(manifest, kind).to_json()
    return ArchiveWriter(out_dir / f"{kind}.tar", len(data), zstd, 3, 1)


def _finish(writer: ArchiveWriter, manifest: Manifest, kind: str, zstd: bool) -> Layer:
    try:
        writer.finish(_kind_manifest(manifest, kind).to_json())
    finally:
        writer.close()
    path = writer.out
    return Layer(Blob(LAYER_ZSTD_TYPE if zstd else LAYER_TYPE, sha256_file(path),
                      path.stat().st_size, kind), path)


def config_json(manifest: Manifest) -> bytes:
    """The config blob: the fingerprint, the producer and each kind's totals."""
    kinds: dict[str, dict[str, int]] = {}
    for e in manifest.entries:
        k = kinds.setdefault(e.kind, {"entries": 0, "files": 0, "bytes": 0})
        k["entries"] += 1
        k["files"] += len(e.files)
        k["bytes"] += e.size
    return canonical_json({"format": CONFIG_FORMAT, "version": CONFIG_VERSION,
                           "fingerprint": manifest.fingerprint.to_dict(),
                           "created_by": manifest.created_by, "kinds": kinds})


def manifest_json(config: Blob, layers: list[Blob], fingerprint: Fingerprint) -> bytes:
    return canonical_json({"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                           "artifactType": ARTIFACT_TYPE, "config": config.descriptor(),
                           "layers": [b.descriptor() for b in layers],
                           "annotations": {FINGERPRINT_KEY: fingerprint.hash}})


# -- reading -----------------------------------------------------------------------------------


def parse_manifest(body: bytes, media_type: str, where: str) -> tuple[Blob, tuple[Blob, ...]]:
    """The config and layers of an artifact manifest (its bytes already bounded and their
    digest checked); a RemoteError naming ``where`` and the field otherwise."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise RemoteError(f"{where}: the manifest is not valid JSON", hint=HINT) from None
    declared = doc.get("mediaType") if isinstance(doc, dict) else None
    for said in (media_type, declared):
        if said and said != MANIFEST_TYPE:
            raise RemoteError(f"{where}: a manifest of type {_short(said)}, not an sglang-warmup "
                              f"cache ({MANIFEST_TYPE} of artifact type {ARTIFACT_TYPE})",
                              hint=HINT)
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2:
        raise RemoteError(f"{where}: not an OCI image manifest (schemaVersion 2)", hint=HINT)
    config = _blob(doc.get("config"), f"{where}: config", MAX_CONFIG_BYTES)
    artifact = doc.get("artifactType")
    if config.media_type != CONFIG_TYPE or artifact not in (None, ARTIFACT_TYPE):
        shown = config.media_type if config.media_type != CONFIG_TYPE else artifact
        raise RemoteError(f"{where}: an artifact of type {_short(shown)}, not an sglang-warmup "
                          f"cache ({ARTIFACT_TYPE})", hint=HINT)
    raw = doc.get("layers")
    if not isinstance(raw, list):
        raise RemoteError(f"{where}: layers: expected a list", hint=HINT)
    if len(raw) > len(KIND_NAMES):
        raise RemoteError(f"{where}: {len(raw)} layers, more than the {len(KIND_NAMES)} cache "
                          "kinds", hint=HINT)
    layers = tuple(_layer(x, f"{where}: layers[{i}]") for i, x in enumerate(raw))
    kinds = [b.kind for b in layers]
    if len(set(kinds)) != len(kinds):
        raise RemoteError(f"{where}: layers: a kind appears twice", hint=HINT)
    return config, layers


def _short(text: Any) -> str:
    return f"'{printable(str(text))[:120]}'"


def _blob(raw: Any, where: str, limit: int) -> Blob:
    if not isinstance(raw, dict):
        raise RemoteError(f"{where}: expected a descriptor object", hint=HINT)
    media, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
    if not isinstance(media, str):
        raise RemoteError(f"{where}: mediaType: expected a string", hint=HINT)
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise RemoteError(f"{where}: digest {_short(digest)} is not a sha256 digest", hint=HINT)
    if type(size) is not int or size < 0:
        raise RemoteError(f"{where}: size: expected a byte count", hint=HINT)
    if size > limit:
        raise RemoteError(f"{where}: {size} bytes exceeds the limit of {limit} bytes",
                          hint=HINT)
    return Blob(media, digest, size)


def _layer(raw: Any, where: str) -> Blob:
    blob = _blob(raw, where, MAX_LAYER_BYTES)
    if blob.media_type not in (LAYER_TYPE, LAYER_ZSTD_TYPE):
        raise RemoteError(f"{where}: media type {_short(blob.media_type)}, not a cache layer "
                          f"({LAYER_TYPE}[+zstd])", hint=HINT)
    notes = raw.get("annotations")
    kind = notes.get(KIND_KEY) if isinstance(notes, dict) else None
    if kind not in KIND_NAMES:
        raise RemoteError(f"{where}: annotation {KIND_KEY} {_short(kind)} is not a cache kind",
                          hint=HINT)
    return Blob(blob.media_type, blob.digest, blob.size, kind)


def parse_config(body: bytes, where: str) -> Fingerprint:
    """The fingerprint of a config blob (bytes already bounded and their digest checked)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise RemoteError(f"{where}: not valid JSON", hint=HINT) from None
    if not isinstance(doc, dict) or doc.get("format") != CONFIG_FORMAT:
        raise RemoteError(f"{where}: not an sglang-warmup cache config", hint=HINT)
    if doc.get("version") != CONFIG_VERSION:
        raise RemoteError(f"{where}: unsupported version {_short(doc.get('version'))} (this "
                          f"sglang-warmup reads version {CONFIG_VERSION})",
                          hint="use the sglang-warmup release that pushed the cache")
    try:
        return Fingerprint.from_dict(doc.get("fingerprint"), f"{where}: fingerprint")
    except CacheError as exc:
        raise RemoteError(exc.message, hint=HINT) from None
