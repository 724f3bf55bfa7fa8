"""Pull a cache artifact from an OCI registry: plan, then execute, as ``cache restore`` does.

``plan_pull`` fetches the manifest (by tag, by default the toolchain's fingerprint hash, or by
digest) and checks its digest and type, fetches the config and applies the compatibility rule,
then downloads the layers of the kinds asked for into a temporary directory (``TMPDIR``, never
under the destination), each checked against its size and sha256 digest as it arrives.  Only
then is each layer, an archive of this project's format, planned against the destination like
an archive to restore (its manifest read and validated by the reader).  ``execute`` stages
every layer through the reader's checks (``restore.stage``) and commits them all once every
layer has been read and found good: nothing is half installed, and a layer that fails leaves
the destination as it was.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Callable, Iterable, Mapping

from cache_tools import fingerprint as fp_mod
from cache_tools import forks
from cache_tools.errors import CacheError, RemoteError, os_errors, printable
from cache_tools.fingerprint import Compatibility, Fingerprint
from cache_tools.archive.manifest import paused_gc
from cache_tools.stores.oci import artifact, reference
from cache_tools.stores.oci.answer import Sink
from cache_tools.stores.oci.artifact import Blob
from cache_tools.stores.oci.client import Registry
from cache_tools.progress import Progress
from cache_tools.archive.restore import (EntryPlanView, PlannedEntry, RestorePlan, RestoreResult,
                                 plan_restore, stage)
from cache_tools.archive.staging import Installer, Outcome

#: free space kept in TMPDIR beyond the layers a pull downloads
SPOOL_MARGIN_BYTES = 64 << 20


@dataclass(frozen=True)
class OciPullPlan(EntryPlanView):
    """What a pull would do; the layers are downloaded and verified, nothing is written under
    the destination yet.  ``execute()`` does it; ``close()`` removes the downloads (execute
    does too)."""

    reference: str
    digest: str
    fingerprint: Fingerprint
    compatibility: Compatibility
    roots: Mapping[str, Path]
    items: tuple[PlannedEntry, ...]
    layers: tuple[RestorePlan, ...]
    spool: Path | None = field(default=None, compare=False)

    def close(self) -> None:
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)

    def __enter__(self) -> "OciPullPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def execute(self, *, progress: Progress | None = None,
                on_entry: Callable[[Outcome], None] | None = None,
                jobs: int | None = None) -> RestoreResult:
        """Stage every layer through the reader's checks, then commit them all."""
        try:
            with os_errors("pull", "check free space and permissions of the destination; no "
                                   "partial entry is visible, rerun to finish"), paused_gc():
                return self._execute(progress or Progress.null(), on_entry,
                                     forks.jobs_for(jobs))
        finally:
            self.close()

    def _execute(self, progress: Progress, on_entry: Callable[[Outcome], None] | None,
                 jobs: int) -> RestoreResult:
        started = time.monotonic()
        installers: list[Installer] = []
        outcomes: list[Outcome] = []
        read = 0
        try:
            for layer in self.layers:
                installer = Installer(layer.roots)
                installer.clean_stale()
                installers.append(installer)
                installers[-1], size = _stage(self, layer, installer, progress, jobs)
                read += size
            progress.finish()
            for installer in installers:
                outcomes.extend(installer.commit_all(on_entry))
        finally:
            for installer in reversed(installers):   # the first made the directories above
                installer.cleanup()
        return RestoreResult(tuple(outcomes), time.monotonic() - started, read)


def _stage(plan: OciPullPlan, layer: RestorePlan, installer: Installer, progress: Progress,
           jobs: int) -> tuple[Installer, int]:
    kind = layer.manifest.entries[0].kind if layer.manifest.entries else "?"
    with _LayerErrors(plan.reference, kind):
        return stage(layer, installer, progress, jobs)


class _LayerErrors:
    """A layer's archive refused by the reader: the same error, naming the reference and the
    layer (the archive's path is a temporary file)."""

    def __init__(self, ref: str, kind: str) -> None:
        self.prefix = f"{ref}: layer {kind}: "

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, CacheError) and not exc.message.startswith(self.prefix):
            raise type(exc)(self.prefix + exc.message, hint=exc.hint) from None


def plan_pull(ref_text: str, *, dest: str | os.PathLike[str] | None = None,
              kinds: Iterable[str] | None = None, fingerprint_hash: str | None = None,
              force: bool = False, env: Mapping[str, str] | None = None,
              local: Fingerprint | None = None, registry: Registry | None = None,
              progress: Progress | None = None) -> OciPullPlan:
    """Fetch and verify the artifact at ``ref_text`` (the layers of ``kinds``), then plan it
    against the destination."""
    progress = progress or Progress.null()
    local = local or fp_mod.current()
    ref = reference.parse(ref_text)
    if fingerprint_hash and (ref.tag or ref.digest):
        raise CacheError(f"{ref}: --fingerprint chooses the tag; the reference names one "
                         "already", hint="give either :TAG / @DIGEST or --fingerprint")
    if not ref.tag and not ref.digest:
        ref = ref.at(tag=fingerprint_hash or local.hash)
    reg = registry or Registry(ref, ("pull",), env=env)
    digest, config, layers = _manifest(reg, ref)
    remote_fp = _config(reg, ref, config)
    compat = fp_mod.require_compatible(remote_fp, local, force=force, what=str(ref))
    wanted = set(kinds) if kinds is not None else None
    chosen = [b for b in layers if wanted is None or b.kind in wanted]
    spool = _spool(reg, chosen)
    try:
        paths = _download(reg, chosen, spool, progress)
        plans = tuple(_plan_layer(str(ref), b, p, remote_fp, dest, env, local)
                      for b, p in zip(chosen, paths))
    except BaseException:  # the spool is removed on any way out (Ctrl-C too), then raised
        shutil.rmtree(spool, ignore_errors=True)
        raise
    roots = {k: v for p in plans for k, v in p.roots.items()}
    items = tuple(i for p in plans for i in p.items)
    plan = OciPullPlan(str(ref), digest, remote_fp, compat, roots, items, plans, spool)
    weakref.finalize(plan, shutil.rmtree, spool, True)
    return plan


def _manifest(reg: Registry, ref: reference.Reference) -> tuple[str, Blob, tuple[Blob, ...]]:
    name = ref.digest or ref.tag or ""
    media, body, said = reg.get_manifest(name, artifact.ACCEPT, artifact.MAX_MANIFEST_BYTES,
                                         "GET manifest")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if ref.digest and digest != ref.digest:
        raise reg.error(f"the manifest's content has digest {digest[:23]}..., not the one "
                        "asked for", hint="the registry is damaged or hostile; nothing was "
                                          "written")
    if said is not None and said.strip() != digest:
        raise reg.error(f"the registry says the manifest's digest is "
                        f"{printable(said[:80])}, its content's is {digest[:23]}...",
                        hint="the registry is damaged or hostile; nothing was written")
    config, layers = artifact.parse_manifest(body, media, str(ref))
    return digest, config, layers


def _config(reg: Registry, ref: reference.Reference, config: Blob) -> Fingerprint:
    out = io.BytesIO()
    reg.get_blob(config.digest, config.size, out, "config")
    return artifact.parse_config(out.getvalue(), f"{ref}: config")


def _spool(reg: Registry, chosen: list[Blob]) -> Path:
    """A temporary directory (``TMPDIR``) with room for the layers to download."""
    total = sum(b.size for b in chosen)
    if total > artifact.MAX_LAYER_BYTES:
        raise reg.error(f"the layers to pull declare {total} bytes, more than the limit of "
                        f"{artifact.MAX_LAYER_BYTES} bytes", hint=artifact.HINT)
    with os_errors("pull", "check TMPDIR"):
        spool = Path(tempfile.mkdtemp(prefix="sglang-warmup-oci-"))
        free = shutil.disk_usage(spool).free
    if free < total + SPOOL_MARGIN_BYTES:
        shutil.rmtree(spool, ignore_errors=True)
        raise CacheError(f"{reg.ref}: the layers need {total} bytes in {spool.parent}, "
                         f"{free} bytes are free", hint="point TMPDIR at a larger file system "
                                                        "(outside the destination)")
    return spool


def _download(reg: Registry, chosen: list[Blob], spool: Path, progress: Progress
              ) -> list[Path]:
    paths = []
    progress.start("download", sum(b.size for b in chosen))
    for b in chosen:
        path = spool / f"{b.kind}.tar"
        with os_errors("pull", "check free space in TMPDIR"), open(path, "xb") as out:
            reg.get_blob(b.digest, b.size, _Advancing(out, progress), f"layer {b.kind}")
        paths.append(path)
    progress.finish()
    return paths


class _Advancing:
    """A file that reports what is written to it as progress."""

    def __init__(self, out: Sink, progress: Progress) -> None:
        self.out = out
        self.progress = progress

    def write(self, data: bytes) -> int:
        self.out.write(data)
        self.progress.advance(len(data))
        return len(data)


def _plan_layer(ref: str, blob: Blob, path: Path, remote_fp: Fingerprint,
                dest: str | os.PathLike[str] | None, env: Mapping[str, str] | None,
                local: Fingerprint) -> RestorePlan:
    """A verified layer planned as an archive to restore (the compatibility rule was applied
    to the artifact's config; the layer must carry that same fingerprint)."""
    with _LayerErrors(ref, blob.kind):
        plan = plan_restore(path, dest=dest, force=True, env=env, local=local)
        if plan.manifest.fingerprint != remote_fp:
            raise RemoteError("its manifest's fingerprint is not the artifact's config's",
                              hint=artifact.HINT)
        other = next((e for e in plan.manifest.entries if e.kind != blob.kind), None)
        if other is not None:
            raise RemoteError(f"holds entry {other.key} of another kind", hint=artifact.HINT)
    return plan
