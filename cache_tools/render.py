"""Rendering for people (tables, sentences) and scripts (JSON, env files): the one table
renderer of the project, and every cache_tools result as text or JSON-ready data.  Pure
functions; nothing here does work.  Text renderers return the data only: the ``*_warnings``
functions return the ``warning:`` lines a command prints on stderr."""

from __future__ import annotations

import datetime
import json
import shlex
from typing import TYPE_CHECKING, Any, Sequence

from cache_tools.fingerprint import HARDWARE_FIELDS, SOFTWARE_FIELDS
from cache_tools.scan import age_str, size_str

if TYPE_CHECKING:  # annotations only: importing the archive machinery here would make every
    # user of table() (the driver, in SGLang's main process) pay for tarfile and hashlib.
    from cache_tools.archive import (MergeResult, PackResult, RestorePlan, RestoreResult,
                                     VerifyReport)
    from cache_tools.fingerprint import Compatibility, Fingerprint
    from cache_tools.locations import Exports, SGLangProfile
    from cache_tools.stores.oci import OciPullPlan, OciPushResult
    from cache_tools.prune import PruneResult, PruneStrategy
    from cache_tools.stores.redis import PullPlan, PushResult
    from cache_tools.scan import CacheInfo


# --- tables -------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str = "",
          width: int | None = None, drop: Sequence[int] = ()) -> str:
    """A fixed-width table: header, a dashed rule, one line per row, trailing spaces stripped.

    ``align`` holds one of ``l``/``r`` per column; by default numbers go right and text left.
    Cells: ``None`` is ``-``, ints get thousands separators, floats one decimal.

    ``width``: the widest line allowed (a terminal's columns).  Past it, the columns named in
    ``drop`` (indices, least useful first) are left out one at a time, then the widest text
    columns are cut, their cells ending in ``…`` (never below 8 characters)."""
    cells = [[_cell(v) for v in row] for row in rows]
    keep = list(range(len(headers)))
    widths = [max([len(headers[i])] + [len(row[i]) for row in cells]) for i in keep]

    def total(cols: list[int]) -> int:
        return sum(widths[i] for i in cols) + 2 * (len(cols) - 1)

    if width is not None:
        for i in drop:
            if total(keep) <= width:
                break
            if i in keep and len(keep) > 1:
                keep.remove(i)
        while total(keep) > width:
            text_cols = [i for i in keep if not _right(align, i, rows)]
            widest = max(text_cols, key=lambda i: widths[i], default=None)
            if widest is None or widths[widest] <= 8:
                break
            widths[widest] = max(8, widths[widest] - (total(keep) - width))
            cells = [[_cut(c, widths[i]) if i == widest else c for i, c in enumerate(row)]
                     for row in cells]

    def just(i: int, text: str, raw: Sequence[Any]) -> str:
        right = _right(align, i, [raw])
        return text.rjust(widths[i]) if right else text.ljust(widths[i])

    lines = ["  ".join(_cut(headers[i], widths[i]).ljust(widths[i]) for i in keep).rstrip(),
             "  ".join("-" * widths[i] for i in keep)]
    for raw, row in zip(rows, cells):
        lines.append("  ".join(just(i, row[i], raw) for i in keep).rstrip())
    return "\n".join(lines)


def lines(parts: Sequence[str], width: int | None = None) -> str:
    """``parts`` one per line; with ``width``, a sentence longer than it is wrapped (its next
    lines indented), a table or a block of lines is kept as it is."""
    if width is None:
        return "\n".join(parts)
    import textwrap

    return "\n".join(p if "\n" in p or len(p) <= width else
                     textwrap.fill(p, width, subsequent_indent="    ", break_long_words=False,
                                   break_on_hyphens=False) for p in parts)


def _right(align: str, i: int, rows: Sequence[Sequence[Any]]) -> bool:
    """Column ``i`` is aligned right: as ``align`` says, else when its first row holds a
    number."""
    if i < len(align):
        return align[i] == "r"
    return bool(rows) and isinstance(rows[0][i], (int, float))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def bar(value: float, maximum: float, width: int = 24) -> str:
    """A horizontal bar for a value out of ``maximum`` (per-class timings)."""
    if maximum <= 0:
        return ""
    return "█" * int(round(width * min(value, maximum) / maximum))


def _warnings_json(warnings: Sequence[Any]) -> list[dict[str, str]]:
    """Scan warnings (``CacheWarning``) as data."""
    return [{"kind": w.kind, "path": str(w.path), "message": w.message} for w in warnings]


def _iso(ts: float) -> str | None:
    if not ts:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds")


# --- env ----------------------------------------------------------------------------------------


def env_text(ex: Exports, fmt: str) -> str:
    if fmt == "sh":
        lines = [f"# {c}" for c in ex.comments]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in ex.pairs]
        return "\n".join(lines)
    if fmt == "dockerfile":
        lines = [f"# {c}" for c in ex.comments]
        lines += [f"ENV {k}={json.dumps(v)}" for k, v in ex.pairs]
        return "\n".join(lines)
    if fmt == "k8s":
        lines = [f"# {c}" for c in ex.comments] + ["env:"]
        for k, v in ex.pairs:
            lines += [f"  - name: {k}", f"    value: {json.dumps(v)}"]
        return "\n".join(lines)
    raise AssertionError(fmt)


# --- ls -----------------------------------------------------------------------------------------


def ls_json(info: CacheInfo, profile: SGLangProfile | None = None) -> dict[str, Any]:
    kinds = []
    for k in info.kinds:
        loc = k.location
        kinds.append({
            "kind": k.kind.name,
            "path": str(loc.path) if loc.path else None,
            "source": loc.source,
            "active": loc.active,
            "note": loc.note,
            "exists": k.exists,
            "entries": len(k.complete_entries),
            "incomplete": len(k.entries) - len(k.complete_entries),
            "size_on_disk": k.size_on_disk,
            "size_on_disk_str": k.size_on_disk_str,
            "last_used": _iso(k.last_used),
            "items": [{"name": e.name, "size_on_disk": e.size_on_disk, "files": len(e.files),
                       "last_used": _iso(e.last_used), "complete": e.complete,
                       "problem": e.problem} for e in k.entries],
        })
    return {"sglang": (profile.version if profile else None),
            "size_on_disk": info.size_on_disk, "size_on_disk_str": info.size_on_disk_str,
            "kinds": kinds, "warnings": _warnings_json(info.warnings)}


def ls_text(info: CacheInfo, profile: SGLangProfile | None = None) -> str:
    rows = []
    for k in info.kinds:
        loc = k.location
        status = "" if loc.active else "(unused) "
        if not k.exists:
            status += "absent"
        rows.append([k.kind.name, str(loc.path) if loc.path else "-",
                     str(len(k.complete_entries)), k.size_on_disk_str, str(k.size_on_disk),
                     age_str(k.last_used) if k.exists else "-",
                     (status + " " + loc.note).strip()])
    out = [table(["KIND", "PATH", "ENTRIES", "SIZE", "BYTES", "LAST USED", "NOTE"], rows)]
    if info.is_empty:
        checked = sum(1 for k in info.kinds if k.location.path)
        out.append(f"\nNo JIT cache entries found in the {checked} locations checked.")
    else:
        n = sum(len(k.complete_entries) for k in info.kinds)
        out.append(f"\n{n} complete entries, {info.size_on_disk_str} "
                   f"({info.size_on_disk} bytes) in total.")
    if profile is not None and profile.version is None:
        out.append("SGLang is not installed here: locations follow the SGLang 0.5.22 rules.")
    return "\n".join(out)


def ls_warnings(info: CacheInfo) -> list[str]:
    return [f"warning: {w}" for w in info.warnings]


# --- fingerprint --------------------------------------------------------------------------------


def fingerprint_text(fp: Fingerprint) -> str:
    soft, hard = fp.software_map, fp.hardware_map
    rows = [[f, soft.get(f, "(not installed)")] for f in SOFTWARE_FIELDS]
    rows += [[f, hard.get(f, "(no GPU visible)" if f != "driver" else "(none)")]
             for f in HARDWARE_FIELDS]
    return table(["FIELD", "VALUE"], rows) + f"\n\ntoolchain hash: {fp.hash}\n" \
                                              f"full hash:      {fp.full_hash}"


def compat_lines(c: Compatibility) -> list[str]:
    lines = []
    for f, theirs, ours in c.mismatches:
        lines.append(f"mismatch: {f} {theirs} (archive) vs {ours} (here)")
    for n in c.notes:
        lines.append(f"note: {n}")
    if c.ok and not c.notes:
        lines.append("fingerprint: matches this machine")
    elif c.ok:
        lines.append("fingerprint: compatible with this machine")
    return lines


def fingerprint_compare_table(theirs: Fingerprint, ours: Fingerprint) -> str:
    a, b = theirs.software_map | theirs.hardware_map, ours.software_map | ours.hardware_map
    rows = []
    for f in SOFTWARE_FIELDS + HARDWARE_FIELDS:
        x, y = a.get(f, "-"), b.get(f, "-")
        rows.append([f, x, y, "" if x == y else "differs"])
    return table(["FIELD", "ARCHIVE", "THIS MACHINE", ""], rows)


# --- pack / verify / restore / merge ----------------------------------------------------------


def pack_text(r: PackResult) -> str:
    m = r.manifest
    if r.is_empty:
        head = (f"No complete cache entries found; wrote an empty archive {r.path} "
                f"({size_str(r.archive_bytes)}).")
    else:
        head = (f"Packed {len(m.entries)} entries ({m.nb_files} files, {size_str(m.size)}) into "
                f"{r.path}: {size_str(r.archive_bytes)} in {r.seconds:.1f}s.")
    return head


def pack_warnings(r: PackResult) -> list[str]:
    return [f"warning: {w}" for w in r.warnings]


def pack_json(r: PackResult) -> dict[str, Any]:
    m = r.manifest
    return {"path": str(r.path), "archive_bytes": r.archive_bytes, "entries": len(m.entries),
            "files": m.nb_files, "bytes": m.size, "seconds": round(r.seconds, 3),
            "fingerprint": m.fingerprint.hash,
            "warnings": _warnings_json(r.warnings)}


def verify_text(r: VerifyReport) -> str:
    m = r.manifest
    kinds: dict[str, int] = {}
    for e in m.entries:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    lines = [f"{r.path}: OK - {len(m.entries)} entries, {m.nb_files} files, {size_str(m.size)} "
             f"verified ({'zstd' if r.compressed else 'tar'}, {size_str(r.archive_bytes)})",
             "kinds: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"),
             f"made by: {m.created_by}", "",
             fingerprint_compare_table(m.fingerprint, r.local), ""]
    lines += compat_lines(r.compatibility)
    if not r.compatibility.ok:
        lines.append("restore would refuse this archive here unless --force is given")
    return "\n".join(lines)


def verify_json(r: VerifyReport) -> dict[str, Any]:
    m = r.manifest
    return {"path": str(r.path), "ok": True, "compressed": r.compressed,
            "archive_bytes": r.archive_bytes, "entries": len(m.entries), "files": m.nb_files,
            "bytes": m.size, "fingerprint": m.fingerprint.to_dict(),
            "local_fingerprint": r.local.to_dict(), "compatible": r.compatibility.ok,
            "mismatches": [list(x) for x in r.compatibility.mismatches],
            "notes": list(r.compatibility.notes)}


def plan_text(plan: RestorePlan | PullPlan | OciPullPlan, source: str) -> str:
    if getattr(plan, "namespace", None) is not None and plan.fingerprint is None:  # a PullPlan
        return f"Nothing to pull: the shared store holds no entries under {plan.namespace}."
    items = plan.items
    if not items and getattr(plan, "layers", None) is not None:     # an OciPullPlan
        return f"Nothing to pull: {source} holds no entries of the kinds asked for."
    if not items:
        return f"Nothing to restore: {source} holds no entries."
    count = {a: len(plan.by_action(a)) for a in ("add", "fill", "skip", "blocked", "nowhere")}
    added = sum(i.entry.size for i in plan.by_action("add"))
    lines = [f"Plan for {source}:",
             f"  add      {count['add']} entries ({size_str(added)})",
             f"  complete {count['fill']} incomplete Triton entries",
             f"  skip     {count['skip']} entries already complete",
             f"  bytes to write: {size_str(plan.bytes_to_write)} ({plan.bytes_to_write} bytes)"]
    if count["blocked"]:
        lines.append(f"  leave    {count['blocked']} entries: an incomplete copy is in place "
                     "(another process is writing it, or it was abandoned)")
    if count["nowhere"]:
        lines.append(f"  drop     {count['nowhere']} entries of kinds with no persistent "
                     "directory here")
    for k, root in sorted(plan.roots.items()):
        lines.append(f"  {k} -> {root}")
    if plan.compatibility is not None:
        lines += ["  " + x for x in compat_lines(plan.compatibility)]
    if plan.nothing_to_do:
        lines.append("Nothing to do: every entry is already in place.")
    return "\n".join(lines)


def plan_json(plan: RestorePlan | PullPlan) -> dict[str, Any]:
    return {"entries": [{"kind": i.entry.kind, "name": i.entry.name, "bytes": i.entry.size,
                         "action": i.action, "target": str(i.target) if i.target else None}
                        for i in plan.items],
            "bytes_to_write": plan.bytes_to_write,
            "roots": {k: str(v) for k, v in plan.roots.items()}}


def outcomes_json(r: RestoreResult) -> list[dict[str, Any]]:
    return [{"kind": o.entry.kind, "name": o.entry.name, "status": o.status,
             "target": str(o.target), "detail": o.detail,
             "rebuilt_by_ninja": o.rebuilt_by_ninja} for o in r.outcomes]


def result_text(r: RestoreResult, verb: str = "Restored") -> str:
    added, filled = r.count("added"), r.count("completed")
    present = r.count("present")
    written = sum(o.entry.size for o in r.outcomes if o.status in ("added", "completed"))
    return (f"{verb} {added} entries ({size_str(written)}), completed {filled}, "
            f"{present} appeared meanwhile (left as they are) in {r.seconds:.1f}s.")


def result_warnings(r: RestoreResult) -> list[str]:
    blocked = [o for o in r.outcomes if o.status == "blocked"]
    rebuilt = [o for o in r.outcomes if o.rebuilt_by_ninja]
    lines = []
    if blocked:
        lines += ([f"warning: {len(blocked)} entries left alone: an incomplete copy is in place."]
                  + [f"  {o.target}" for o in blocked])
    if rebuilt:
        lines += ([f"warning: {len(rebuilt)} FlashInfer op(s) without ninja's records: FlashInfer's "
                   "ninja builds each again at its first load (restore where the server runs, "
                   "with its ninja on PATH)"]
                  + [f"  {o.target}: {o.detail}" for o in rebuilt])
    return lines


def merge_text(r: MergeResult) -> str:
    m = r.manifest
    lines = [f"Merged into {r.path}: {len(m.entries)} entries ({size_str(m.size)}), "
             f"{r.duplicates} duplicates kept once; {size_str(r.archive_bytes)}."]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def merge_json(r: MergeResult) -> dict[str, Any]:
    m = r.manifest
    return {"path": str(r.path), "archive_bytes": r.archive_bytes, "entries": len(m.entries),
            "files": m.nb_files, "bytes": m.size, "duplicates": r.duplicates,
            "fingerprint": m.fingerprint.hash, "notes": list(r.notes)}


# --- prune / push -------------------------------------------------------------------------------


def prune_text(s: PruneStrategy, *, dry_run: bool = False) -> str:
    """The entries a prune deletes, and what it frees; with ``dry_run``, what it would."""
    if not s.candidates:
        text = (f"Nothing to prune: no entry matches ({size_str(s.size_before)} in the "
                "caches).")
    else:
        rows = [[c.entry.kind, c.entry.name or ".", c.entry.size_on_disk_str,
                 age_str(c.entry.last_used), "; ".join(c.reasons)] for c in s.candidates]
        text = table(["KIND", "ENTRY", "SIZE", "LAST USED", "WHY"], rows)
        n = len(s.candidates)
        text += (f"\n\n{'Would delete' if dry_run else 'Will delete'} {n} "
                 f"{'entry' if n == 1 else 'entries'}, freeing {s.expected_freed_size_str} "
                 f"({size_str(s.size_before)} -> {size_str(s.size_after)})"
                 + ("; --dry-run: nothing deleted." if dry_run else "."))
    if s.unknown_toolchain:
        text += (f"\n{s.unknown_toolchain} entries do not record the toolchain that built them; "
                 "--fingerprint other keeps them.")
    return text


def prune_json(s: PruneStrategy) -> dict[str, Any]:
    return {"candidates": [{"kind": c.entry.kind, "name": c.entry.name,
                            "size_on_disk": c.entry.size_on_disk,
                            "last_used": _iso(c.entry.last_used), "reasons": list(c.reasons)}
                           for c in s.candidates],
            "size_before": s.size_before, "size_after": s.size_after,
            "expected_freed_size": s.expected_freed_size,
            "unknown_toolchain": s.unknown_toolchain}


def prune_result_text(r: PruneResult) -> str:
    return f"Deleted {r.removed} entries, freed {size_str(r.freed)}."


def prune_result_warnings(r: PruneResult) -> list[str]:
    return [f"warning: {path}: {err}" for path, err in r.failed]


def prune_result_json(r: PruneResult) -> dict[str, Any]:
    return {"removed": r.removed, "freed": r.freed,
            "failed": [{"path": str(path), "error": err} for path, err in r.failed]}


def push_text(r: PushResult) -> str:
    if not r.pushed and not r.present and not r.conflicts and not r.too_large:
        text = f"Nothing to push: no complete cache entries here (store {r.namespace})."
    else:
        text = (f"Pushed {r.pushed} entries ({size_str(r.bytes_sent)}) to {r.namespace}; "
                f"{r.present} were already there; {r.seconds:.1f}s.")
    return text


def push_warnings(r: PushResult) -> list[str]:
    return ([f"warning: {key}: the store holds different content (kept the store's)"
             for key in r.conflicts]
            + [f"warning: {key}: larger than the per-entry limit; not pushed"
               for key in r.too_large]
            + [f"warning: {w}" for w in r.warnings])


def push_json(r: PushResult) -> dict[str, Any]:
    return {"namespace": r.namespace, "pushed": r.pushed, "present": r.present,
            "bytes_sent": r.bytes_sent, "conflicts": list(r.conflicts),
            "too_large": list(r.too_large), "seconds": round(r.seconds, 3),
            "warnings": _warnings_json(r.warnings)}



def oci_push_text(r: OciPushResult, archive: str) -> str:
    """What ``cache push ARCHIVE oci://...`` did, and how to pull exactly that artifact."""
    if not r.layers:
        return f"Nothing to push: {archive} holds no entries."
    sent = [b for b in r.layers if b.sent]
    rows = [(b.blob.kind, size_str(b.blob.size), "sent" if b.sent else "already there",
             b.blob.digest[:19]) for b in r.layers]
    return "\n".join([
        f"Pushed {archive} to {r.reference}: {len(sent)} of {len(r.layers)} layers sent "
        f"({size_str(sum(b.blob.size for b in sent))}), the others unchanged; "
        f"{r.seconds:.1f}s.",
        table(["kind", "size", "sent", "digest"], rows),
        f"tags: {', '.join(r.tags)}",
        f"pull with: sglang-warmup cache pull {r.pinned}"])


def oci_push_json(r: OciPushResult) -> dict[str, Any]:
    return {"reference": r.reference, "digest": r.digest, "pinned": r.pinned,
            "tags": list(r.tags), "fingerprint": r.fingerprint, "bytes_sent": r.bytes_sent,
            "layers": [{"kind": b.blob.kind, "digest": b.blob.digest, "bytes": b.blob.size,
                        "media_type": b.blob.media_type, "sent": b.sent} for b in r.layers],
            "seconds": round(r.seconds, 3)}
